"""TLS for the node's HTTP API: the server's `ssl.SSLContext`, and the client context a node uses
when it forwards a request to another node.

Both are built once at start from the `[tls]` settings (`node.config.TlsConfig`). The files are
checked one by one before `ssl` loads them, so a bad one stops the node with a `ConfigError` that
names the setting (`tls.cert_file: ... is not a PEM certificate`) rather than with OpenSSL's
reason alone, or a traceback.

Every node of a cluster has the same TLS settings: with TLS on, a node forwards over https, checks
the other node's certificate against `tls.ca_file` (the system's CAs when it is not set) and the
address the other node advertises (`http.advertise_address`, so that address must be in the
certificate's subject alternative names), and presents its own certificate, so mutual TLS between
the nodes works when they require client certificates.
"""

from __future__ import annotations

import datetime
import os
import ssl

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization

from node.config import ConfigError, TlsConfig
from node.files import CONFIG_BYTES_MAX, read_bounded

__all__ = ["certificate_warnings", "client_context", "server_context"]

_CLIENT_VERIFY_MODES = {
    "none": ssl.CERT_NONE,
    "optional": ssl.CERT_OPTIONAL,
    "required": ssl.CERT_REQUIRED,
}


def server_context(tls: TlsConfig) -> ssl.SSLContext | None:
    """The context the API is served with, or None when TLS is off (no `tls.cert_file`).
    TLS 1.2 or later; client certificates are verified against `tls.ca_file` as
    `tls.client_certs` says."""
    if tls.cert_file is None:
        return None
    # Not `create_default_context`: that also trusts the system's CAs, and so every client
    # certificate a public CA ever signed.
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_own_certificate(context, tls)
    if tls.ca_file is not None:
        _load_ca(context, tls.ca_file)
    context.verify_mode = _CLIENT_VERIFY_MODES[tls.client_certs]
    return context


def client_context(tls: TlsConfig) -> ssl.SSLContext | None:
    """The context for this node's requests to other nodes, or None when TLS is off. It
    verifies the other node against `tls.ca_file` and presents this node's certificate."""
    if tls.cert_file is None:
        return None
    if tls.ca_file is None:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    else:
        # Only the cluster's CA: a node is not whoever a public CA vouches for.
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        _load_ca(context, tls.ca_file)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_own_certificate(context, tls)
    return context


def _read(setting: str, path: str) -> bytes:
    try:
        return read_bounded(path, CONFIG_BYTES_MAX)
    except OSError as error:
        raise ConfigError(f"setting {setting}: cannot read {path!r}: {error.strerror}") from None


def _load_own_certificate(context: ssl.SSLContext, tls: TlsConfig) -> None:
    """Loads `tls.cert_file` and `tls.key_file` after checking each, and that they match."""
    assert tls.cert_file is not None and tls.key_file is not None, "checked by load_config"
    try:
        certificate = x509.load_pem_x509_certificates(_read("tls.cert_file", tls.cert_file))[0]
    except ValueError as error:
        raise ConfigError(
            f"setting tls.cert_file: {tls.cert_file!r} is not a PEM certificate ({error})"
        ) from None
    try:
        key = serialization.load_pem_private_key(_read("tls.key_file", tls.key_file), None)
    except TypeError:
        # The node starts unattended, so there is nobody to ask for a passphrase.
        raise ConfigError(
            f"setting tls.key_file: {tls.key_file!r} is encrypted; give the key unencrypted "
            "and protect the file with its permissions (mode 0600)"
        ) from None
    except (ValueError, UnsupportedAlgorithm) as error:
        raise ConfigError(
            f"setting tls.key_file: {tls.key_file!r} is not a PEM private key ({error})"
        ) from None
    public_format = (
        serialization.Encoding.DER,
        serialization.PublicFormat.SubjectPublicKeyInfo,
    )
    if key.public_key().public_bytes(*public_format) != certificate.public_key().public_bytes(
        *public_format
    ):
        raise ConfigError(
            f"setting tls.key_file: {tls.key_file!r} is not the key of the certificate in "
            f"tls.cert_file ({tls.cert_file!r})"
        )
    try:
        context.load_cert_chain(tls.cert_file, tls.key_file)
    except ssl.SSLError as error:
        raise ConfigError(
            f"settings tls.cert_file and tls.key_file: OpenSSL refused them ({error.reason})"
        ) from None


def _load_ca(context: ssl.SSLContext, ca_file: str) -> None:
    data = _read("tls.ca_file", ca_file)
    try:
        x509.load_pem_x509_certificates(data)
        context.load_verify_locations(cadata=data.decode("ascii"))
    except (ValueError, ssl.SSLError) as error:
        raise ConfigError(
            f"setting tls.ca_file: {ca_file!r} is not a PEM file of CA certificates ({error})"
        ) from None


def certificate_warnings(tls: TlsConfig, now: datetime.datetime) -> list[str]:
    """What may stop clients from connecting although the files load: `tls.cert_file` outside
    its validity period at `now`, and `tls.key_file` readable by other users. Read again here
    so a file that does not load says nothing (the contexts report it)."""
    if tls.cert_file is None or tls.key_file is None:
        return []
    warnings = []
    try:
        certificate = x509.load_pem_x509_certificates(_read("tls.cert_file", tls.cert_file))[0]
    except (ConfigError, ValueError):
        return []
    if now > certificate.not_valid_after_utc:
        warnings.append(
            f"tls.cert_file {tls.cert_file!r} expired on "
            f"{certificate.not_valid_after_utc:%Y-%m-%d %H:%M} UTC: clients will refuse it"
        )
    elif now < certificate.not_valid_before_utc:
        warnings.append(
            f"tls.cert_file {tls.cert_file!r} is not valid before "
            f"{certificate.not_valid_before_utc:%Y-%m-%d %H:%M} UTC: clients will refuse it"
        )
    try:
        mode = os.stat(tls.key_file).st_mode
    except OSError:
        return warnings
    if mode & 0o077:
        warnings.append(
            f"tls.key_file {tls.key_file!r} may be read by other users (mode {mode & 0o777:o}); "
            "make it 0600"
        )
    return warnings
