"""`xr tls make-ca`: a small certificate authority for a test or development cluster.

It writes `ca.pem` and `ca-key.pem` (made on the first run, reused afterwards, so more
certificates can be added later) and, for each name given, `NAME.pem` and `NAME-key.pem`: a
certificate the CA signs, good both for serving (a node) and as a client certificate (a node
forwarding to another, or a user), with subject alternative names for `localhost`, `127.0.0.1`,
the name itself and every `--host`. Keys are P-256 ECDSA, unencrypted, in files of mode 0600.
The CA is valid for ten years (`CA_DAYS`) whatever `--days` says, since later runs reuse it; a
certificate never outlives its CA: one that would is cut to end with it, and said so.

A production cluster should get its certificates from the organisation's own CA; this one is for
trying TLS and mutual TLS out (docs/security.md).
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import click

from node.cli_common import EXIT_USAGE, CommandFailed
from node.files import CONFIG_BYTES_MAX, read_bounded

# cryptography is imported where it is used, so `xr`'s other commands start without it.
if TYPE_CHECKING:
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric.ec import EllipticCurvePrivateKey

__all__ = ["CertificateFiles", "make_ca", "tls"]

CA_CERT_NAME = "ca.pem"
CA_KEY_NAME = "ca-key.pem"
_NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
_DEFAULT_HOSTS = ("localhost", "127.0.0.1")
# Certificates are valid from a little before now, so a peer whose clock is behind accepts them.
_BACKDATE = datetime.timedelta(minutes=5)
# The CA's life. Later runs reuse the CA, so it must outlive the certificates they add: with the
# certificates' --days it expired with the first ones, and a certificate added later outlived it
# (clients refuse a chain whose CA has expired).
CA_DAYS = 3650


@dataclass(frozen=True, kw_only=True)
class CertificateFiles:
    """What `make_ca` wrote: the CA's files, and each name's certificate and key."""

    ca_cert: Path
    ca_key: Path
    ca_created: bool
    certificates: dict[str, tuple[Path, Path]]
    # Names whose certificates were cut to end when the CA does, and that day.
    capped: dict[str, datetime.datetime] = field(default_factory=dict)


def make_ca(
    directory: Path,
    names: Sequence[str],
    *,
    hosts: Sequence[str] = (),
    days: int = 365,
    now: datetime.datetime | None = None,
) -> CertificateFiles:
    """Makes (or reuses) the CA in `directory` and a certificate and key for each name, valid
    for `days` but never past the CA's end. Raises ValueError for a name that cannot be a file
    name, a host that is not a DNS name or an IP address, and a reused CA that has expired."""
    for name in names:
        if not _NAME_PATTERN.fullmatch(name) or name in ("ca", "ca-key"):
            raise ValueError(
                f"name {name!r}: letters, digits, '.', '_' and '-' (not first), "
                "at most 63, and not 'ca'"
            )
    alternative_names = _alternative_names([*_DEFAULT_HOSTS, *hosts])
    moment = now or datetime.datetime.now(datetime.UTC)
    directory.mkdir(parents=True, exist_ok=True)
    ca_cert_path, ca_key_path = directory / CA_CERT_NAME, directory / CA_KEY_NAME
    if ca_cert_path.exists() != ca_key_path.exists():
        raise ValueError(
            f"{directory} has one of {CA_CERT_NAME} and {CA_KEY_NAME} without the other; "
            "remove it, or give another --dir"
        )
    for path in [
        ca_cert_path,
        ca_key_path,
        *(directory / f"{name}{ending}" for name in names for ending in (".pem", "-key.pem")),
    ]:
        # Written in place: a pipe would wait for a reader, a device would take the key.
        if path.exists() and not path.is_file():
            raise ValueError(
                f"{path} exists and is not a regular file; remove it, or give another --dir"
            )
    created = not ca_cert_path.exists()
    if created:
        ca_key, ca_cert = _new_ca(moment, max(days, CA_DAYS))
        _write_key(ca_key_path, ca_key)
        ca_cert_path.write_bytes(_pem(ca_cert))
    else:
        ca_key, ca_cert = _load_ca(ca_cert_path, ca_key_path)
    ca_end = ca_cert.not_valid_after_utc
    if names and ca_end <= moment:
        raise ValueError(
            f"the CA in {directory} expired on {ca_end:%Y-%m-%d}: remove {CA_CERT_NAME} and "
            f"{CA_KEY_NAME} to make a new one (and give the nodes and clients the new "
            f"{CA_CERT_NAME})"
        )
    end = moment + datetime.timedelta(days=days)
    capped: dict[str, datetime.datetime] = {}
    written: dict[str, tuple[Path, Path]] = {}
    for name in names:
        if end > ca_end:
            capped[name] = ca_end
        key, certificate = _new_leaf(
            name,
            alternative_names + _alternative_names([name]),
            ca_key,
            ca_cert,
            moment,
            min(end, ca_end),
        )
        cert_path, key_path = directory / f"{name}.pem", directory / f"{name}-key.pem"
        _write_key(key_path, key)
        cert_path.write_bytes(_pem(certificate))
        written[name] = (cert_path, key_path)
    return CertificateFiles(
        ca_cert=ca_cert_path,
        ca_key=ca_key_path,
        ca_created=created,
        certificates=written,
        capped=capped,
    )


def _alternative_names(hosts: Sequence[str]) -> list[x509.GeneralName]:
    from cryptography import x509

    found: list[x509.GeneralName] = []
    for host in hosts:
        entry: x509.GeneralName
        try:
            entry = x509.IPAddress(ipaddress.ip_address(host))
        except ValueError:
            if not re.fullmatch(r"[A-Za-z0-9*]([A-Za-z0-9.-]*[A-Za-z0-9])?", host):
                raise ValueError(f"host {host!r} is neither an IP address nor a DNS name") from None
            entry = x509.DNSName(host)
        if entry not in found:
            found.append(entry)
    return found


def _new_key() -> EllipticCurvePrivateKey:
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _new_ca(
    moment: datetime.datetime, days: int
) -> tuple[EllipticCurvePrivateKey, x509.Certificate]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import NameOID

    key = _new_key()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "xr local CA")])
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(moment - _BACKDATE)
        .not_valid_after(moment + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, certificate


def _new_leaf(
    name: str,
    alternative_names: list[x509.GeneralName],
    ca_key: EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    moment: datetime.datetime,
    end: datetime.datetime,
) -> tuple[EllipticCurvePrivateKey, x509.Certificate]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = _new_key()
    certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(moment - _BACKDATE)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        # Every certificate serves (a node) and identifies a client (a node forwarding, a user).
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.SubjectAlternativeName(alternative_names),
            critical=False,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return key, certificate


def _load_ca(cert_path: Path, key_path: Path) -> tuple[EllipticCurvePrivateKey, x509.Certificate]:
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    try:
        certificate = x509.load_pem_x509_certificate(read_bounded(cert_path, CONFIG_BYTES_MAX))
        key = serialization.load_pem_private_key(read_bounded(key_path, CONFIG_BYTES_MAX), None)
    except (OSError, ValueError, TypeError) as error:
        raise ValueError(f"the CA in {cert_path.parent} cannot be reused: {error}") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"the CA key {key_path} is not an ECDSA key this command made")
    return key, certificate


def _pem(certificate: x509.Certificate) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return certificate.public_bytes(serialization.Encoding.PEM)


def _write_key(path: Path, key: EllipticCurvePrivateKey) -> None:
    from cryptography.hazmat.primitives import serialization

    data = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    # Created 0600, and made 0600 if it existed with a wider mode, before the key is written.
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as file:
        os.fchmod(file.fileno(), 0o600)
        file.write(data)


@click.group()
def tls() -> None:
    """Make certificates for TLS between clients and nodes."""


@tls.command("make-ca")
@click.argument("names", nargs=-1)
@click.option(
    "--dir",
    "directory",
    metavar="DIR",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("certs"),
    show_default=True,
    help="Where the files go; a CA already there is reused.",
)
@click.option(
    "--host",
    "hosts",
    multiple=True,
    metavar="HOST",
    help="Another DNS name or IP address for every certificate (repeatable); localhost and "
    "127.0.0.1 are always in.",
)
@click.option(
    "--days",
    type=click.IntRange(1, 3650),
    default=365,
    show_default=True,
    help=f"Days the certificates are valid (never past the CA's end; a new CA is valid for "
    f"{CA_DAYS} days).",
)
def make_ca_command(
    names: tuple[str, ...], directory: Path, hosts: tuple[str, ...], days: int
) -> int:
    """Make a local CA and a certificate and key for each NAME (a node or a client).

    Writes DIR/ca.pem and DIR/ca-key.pem (once, valid for ten years; reused later) and
    DIR/NAME.pem and DIR/NAME-key.pem for each NAME, never valid past the CA's end. For testing
    and development: see docs/security.md.
    """
    try:
        files = make_ca(directory, names, hosts=hosts, days=days)
    except ValueError as error:
        raise CommandFailed("tls.invalid", str(error), exit_code=EXIT_USAGE) from None
    except OSError as error:
        raise CommandFailed(
            "tls.invalid", f"cannot write in {str(directory)!r}: {error.strerror}"
        ) from None
    verb = "made" if files.ca_created else "reused"
    click.echo(f"{verb} CA {files.ca_cert} (key {files.ca_key})")
    for name, (cert_path, key_path) in files.certificates.items():
        click.echo(f"made {name}: {cert_path} (key {key_path})")
    for name, ca_end in files.capped.items():
        click.echo(
            f"xr: warning: {name}'s certificate ends with the CA on {ca_end:%Y-%m-%d}, before "
            f"--days {days}; make a new CA (remove {files.ca_cert} and {files.ca_key}) for longer",
            err=True,
        )
    if files.certificates:
        # The first name's files for a node, the last one's for a client (`make-ca r0 r1 alice`).
        node_cert, node_key = next(iter(files.certificates.values()))
        client_cert, client_key = list(files.certificates.values())[-1]
        click.echo(
            f"\n# in a node's configuration:\n[tls]\ncert_file = {json.dumps(str(node_cert))}\n"
            f"key_file = {json.dumps(str(node_key))}\n"
            f"ca_file = {json.dumps(str(files.ca_cert))}\n"
            'client_certs = "required"\n'
            f"\n# for a client:\nexport XR_CA_FILE={shlex.quote(str(files.ca_cert))} "
            f"XR_CERT_FILE={shlex.quote(str(client_cert))} "
            f"XR_KEY_FILE={shlex.quote(str(client_key))}"
        )
    return 0
