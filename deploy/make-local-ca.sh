#!/bin/sh
# Makes a local certificate authority and certificates for trying TLS and mutual TLS with xr
# (docs/security.md): DIR/ca.pem and DIR/ca-key.pem, and DIR/NAME.pem and DIR/NAME-key.pem for
# each NAME, valid for localhost and 127.0.0.1 (add more names or addresses with --host).
# Running it again reuses the CA in DIR, so it can add certificates later: the CA is valid for
# ten years, the certificates for a year (--days N), and none past the CA's end (`xr tls make-ca`
# cuts one that would be, with a warning). Not for production: there, use the organisation's CA.
#
#   deploy/make-local-ca.sh                          # certs/: r0 r1 r2 and client
#   deploy/make-local-ca.sh /etc/xr/tls eu-west --host 10.0.0.1
#
# XR names the xr command (default: xr on PATH, else this checkout's .venv/bin/xr).
set -eu
dir=${1:-certs}
[ $# -gt 0 ] && shift
[ $# -gt 0 ] || set -- r0 r1 r2 client
if [ -z "${XR:-}" ]; then
    if command -v xr >/dev/null 2>&1; then
        XR=xr
    else
        XR="$(dirname "$0")/../.venv/bin/xr"
    fi
fi
exec "$XR" tls make-ca --dir "$dir" "$@"
