"""TLS on the node's API: https with the cluster's CA, mutual TLS refused in the handshake for a
client without a certificate the CA signed, requests forwarded between TLS nodes, the client and
the CLI with their CA and certificate files, and files that do not load named by their setting.

The node-process tests share one two-node cluster that requires client certificates, with
certificates from `xr tls make-ca`.
"""

from __future__ import annotations

import datetime
import http.client
import inspect
import json
import logging
import os
import socket
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from node.api.cluster import forward_target
from node.cli import main
from node.cli_tls import CertificateFiles, make_ca
from node.config import ConfigError, NodeConfig, TlsConfig, load_config
from node.daemon import log_raft_security
from node.localcluster import LocalCluster, LocalNode, free_ports
from node.tls import certificate_warnings, client_context, server_context
from xrcore.client import AsyncClient, Client
from xrcore.client._transport import tls_context
from xrcore.errors import ClusterUnavailable

WAIT_S = 30.0


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> CertificateFiles:
    return make_ca(tmp_path_factory.mktemp("ca"), ["r0", "r1", "alice"])


@pytest.fixture(scope="module")
def stranger(tmp_path_factory: pytest.TempPathFactory) -> CertificateFiles:
    """A certificate from another CA, with the same names."""
    return make_ca(tmp_path_factory.mktemp("other-ca"), ["alice"])


def _tls(files: CertificateFiles, name: str, **changes: Any) -> TlsConfig:
    cert_path, key_path = files.certificates[name]
    settings: dict[str, Any] = {
        "cert_file": str(cert_path),
        "key_file": str(key_path),
        "ca_file": str(files.ca_cert),
        "client_certs": "required",
    }
    settings.update(changes)
    return TlsConfig(**settings)


def _config(tmp_path: Path, **overrides: str) -> NodeConfig:
    settings = {"region.name": "r0", "raft.address": "127.0.0.1:7001", "data_dir": str(tmp_path)}
    settings.update(overrides)
    return load_config(environ={}, overrides=settings)


# The contexts and the files they load.


def test_server_context__requires_client_certificates_from_the_ca_with_tls_1_2_or_later(
    certificates: CertificateFiles,
) -> None:
    context = server_context(_tls(certificates, "r0"))
    assert context is not None
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2
    # Only the cluster's CA is trusted for client certificates, not the system's.
    assert [item["subject"] for item in context.get_ca_certs()] == [
        ((("commonName", "xr local CA"),),)
    ]
    assert server_context(TlsConfig()) is None
    optional = server_context(_tls(certificates, "r0", client_certs="optional"))
    assert optional is not None and optional.verify_mode == ssl.CERT_OPTIONAL


def test_server_context__a_cert_file_that_is_not_pem__names_tls_cert_file(
    certificates: CertificateFiles, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate\n")
    with pytest.raises(ConfigError, match=r"tls\.cert_file.*bad\.pem.*not a PEM certificate"):
        server_context(_tls(certificates, "r0", cert_file=str(bad)))


def test_server_context__a_bad_or_mismatched_key__names_tls_key_file(
    certificates: CertificateFiles, tmp_path: Path
) -> None:
    bad = tmp_path / "bad-key.pem"
    bad.write_text("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
    with pytest.raises(ConfigError, match=r"tls\.key_file.*not a PEM private key"):
        server_context(_tls(certificates, "r0", key_file=str(bad)))
    other_key = str(certificates.certificates["alice"][1])
    with pytest.raises(ConfigError, match=r"tls\.key_file.*is not the key of the certificate"):
        server_context(_tls(certificates, "r0", key_file=other_key))


def test_server_context__a_ca_file_that_is_not_pem__names_tls_ca_file(
    certificates: CertificateFiles, tmp_path: Path
) -> None:
    bad = tmp_path / "bad-ca.pem"
    bad.write_text("nothing here\n")
    with pytest.raises(ConfigError, match=r"tls\.ca_file.*not a PEM file of CA certificates"):
        server_context(_tls(certificates, "r0", ca_file=str(bad)))
    with pytest.raises(ConfigError, match=r"tls\.ca_file"):
        client_context(_tls(certificates, "r0", ca_file=str(bad)))


def test_client_context__verifies_the_peer_against_the_ca_and_presents_this_nodes_certificate(
    certificates: CertificateFiles,
) -> None:
    context = client_context(_tls(certificates, "r0"))
    assert context is not None
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert len(context.get_ca_certs()) == 1
    assert client_context(TlsConfig()) is None


def test_forward_target__is_https_with_the_client_context_only_when_tls_is_on(
    certificates: CertificateFiles, tmp_path: Path
) -> None:
    plain = _config(tmp_path)
    assert forward_target(plain, "10.0.0.2:8700") == ("http://10.0.0.2:8700", None)
    cert_path, key_path = certificates.certificates["r0"]
    secured = _config(
        tmp_path,
        **{
            "tls.cert_file": str(cert_path),
            "tls.key_file": str(key_path),
            "tls.ca_file": str(certificates.ca_cert),
        },
    )
    assert secured.http_scheme == "https"
    url, context = forward_target(secured, "10.0.0.2:8700")
    assert url == "https://10.0.0.2:8700"
    assert isinstance(context, ssl.SSLContext) and context.verify_mode == ssl.CERT_REQUIRED
    loaded = ssl.create_default_context()
    assert forward_target(secured, "10.0.0.2:8700", loaded)[1] is loaded


# Raft off loopback.


def test_config__raft_off_loopback_without_a_secret_or_insecure__is_refused(
    tmp_path: Path,
) -> None:
    with pytest.raises(ConfigError, match=r"raft\.cluster_secret is required.*10\.0\.0\.2"):
        _config(tmp_path, **{"raft.peers": "10.0.0.2:7001"})
    insecure = _config(tmp_path, **{"raft.peers": "10.0.0.2:7001", "raft.insecure": "true"})
    assert insecure.raft.insecure and insecure.raft.cluster_secret is None
    secured = _config(tmp_path, **{"raft.peers": "10.0.0.2:7001", "raft.cluster_secret": "s" * 16})
    assert not secured.raft.insecure


def test_log_raft_security__warns_when_insecure_is_used_and_when_it_is_set_for_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="xr.node")
    log_raft_security(_config(tmp_path))
    assert caplog.records == []
    log_raft_security(_config(tmp_path, **{"raft.peers": "10.0.0.2:7001", "raft.insecure": "1"}))
    (used,) = caplog.records
    assert used.levelno == logging.WARNING
    assert "unauthenticated and unencrypted" in used.getMessage()
    assert "10.0.0.2:7001" in used.getMessage()
    caplog.clear()
    log_raft_security(_config(tmp_path, **{"raft.insecure": "true"}))
    (unused,) = caplog.records
    assert "has no effect (Raft is on loopback only)" in unused.getMessage()


# The client's TLS files.


def test_client_tls_context__names_the_file_that_does_not_load(
    certificates: CertificateFiles, tmp_path: Path
) -> None:
    assert tls_context() is None
    with pytest.raises(ValueError, match=r"ca_file '/nonexistent/ca\.pem': cannot read"):
        tls_context(ca_file="/nonexistent/ca.pem")
    cert_path, key_path = certificates.certificates["alice"]
    with pytest.raises(ValueError, match=r"key_file '/nonexistent/key\.pem': cannot read"):
        tls_context(cert_file=str(cert_path), key_file="/nonexistent/key.pem")
    with pytest.raises(ValueError, match="key_file needs cert_file"):
        tls_context(key_file=str(key_path))
    other_key = certificates.certificates["r0"][1]
    with pytest.raises(ValueError, match=r"not a PEM certificate and its unencrypted key"):
        tls_context(cert_file=str(cert_path), key_file=str(other_key))
    # A certificate alone, its key elsewhere: the message says to give key_file.
    with pytest.raises(ValueError, match=r"a key in a file of its own is given as key_file"):
        tls_context(cert_file=str(cert_path))
    context = tls_context(
        ca_file=str(certificates.ca_cert), cert_file=str(cert_path), key_file=str(key_path)
    )
    assert context is not None and len(context.get_ca_certs()) == 1


def test_clients__take_the_same_tls_arguments() -> None:
    def parameters(function: Any) -> list[tuple[str, Any]]:
        return [
            (item.name, item.default) for item in inspect.signature(function).parameters.values()
        ]

    assert parameters(AsyncClient.__init__) == parameters(Client.__init__)
    assert {"ca_file", "cert_file", "key_file"} <= set(inspect.signature(Client).parameters)


def test_cli__a_ca_file_that_does_not_load__is_one_line_and_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("XR_CLIENT_CONFIG", raising=False)
    bad = tmp_path / "ca.pem"
    bad.write_text("garbage\n")
    code = main(["region", "ls", "--endpoints", "https://127.0.0.1:1", "--ca-file", str(bad)])
    error = capsys.readouterr().err
    assert code == 2
    assert error.count("\n") == 1 and error.startswith("xr: tls.invalid: ca_file ")
    monkeypatch.setenv("XR_CA_FILE", str(tmp_path / "missing.pem"))
    assert main(["region", "ls", "--endpoints", "https://127.0.0.1:1"]) == 2
    assert "missing.pem" in capsys.readouterr().err


def test_node_run_check__loads_the_tls_files_and_names_the_one_that_does_not_load(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], certificates: CertificateFiles
) -> None:
    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate\n")
    arguments = [
        "node",
        "run",
        "--check",
        "--region",
        "a",
        "--raft-address",
        "127.0.0.1:7000",
        "--data-dir",
        str(tmp_path / "data"),
        "--set",
        f"tls.key_file={certificates.ca_key}",
    ]
    assert main([*arguments, "--set", f"tls.cert_file={bad}"]) == 2
    assert "invalid configuration: setting tls.cert_file" in capsys.readouterr().err
    assert main([*arguments, "--set", f"tls.cert_file={certificates.ca_cert}"]) == 0


# `xr tls make-ca`.


def test_make_ca__writes_private_keys_0600_and_certificates_the_ca_signs_for_localhost(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from cryptography import x509

    assert main(["tls", "make-ca", "--dir", str(tmp_path), "n1", "--host", "10.0.0.9"]) == 0
    assert "made CA" in capsys.readouterr().out
    for name in ("ca-key.pem", "n1-key.pem"):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o600
    certificate = x509.load_pem_x509_certificate((tmp_path / "n1.pem").read_bytes())
    ca = x509.load_pem_x509_certificate((tmp_path / "ca.pem").read_bytes())
    certificate.verify_directly_issued_by(ca)
    names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {str(item.value) for item in names} == {"localhost", "127.0.0.1", "10.0.0.9", "n1"}
    # A second run reuses the CA, so certificates added later are signed by the same one.
    ca_bytes = (tmp_path / "ca.pem").read_bytes()
    assert main(["tls", "make-ca", "--dir", str(tmp_path), "n2"]) == 0
    assert "reused CA" in capsys.readouterr().out
    assert (tmp_path / "ca.pem").read_bytes() == ca_bytes
    assert main(["tls", "make-ca", "--dir", str(tmp_path), "../escape"]) == 2
    assert "xr: tls.invalid: name '../escape'" in capsys.readouterr().err


def test_make_ca__the_ca_outlives_its_certificates_and_none_outlives_the_ca(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The CA had the certificates' --days and later runs reuse it, so a certificate added
    later outlived its CA (clients refuse a chain whose CA has expired)."""
    from cryptography import x509

    from node.cli_tls import CA_DAYS

    issued = datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC)
    first = make_ca(tmp_path, ["r0"], days=30, now=issued)
    ca = x509.load_pem_x509_certificate(first.ca_cert.read_bytes())
    ca_end = ca.not_valid_after_utc
    assert ca_end == issued + datetime.timedelta(days=CA_DAYS)
    assert first.capped == {}
    # Ten days before the CA ends, a certificate for a year ends with the CA instead.
    late = ca_end - datetime.timedelta(days=10)
    second = make_ca(tmp_path, ["r1"], days=365, now=late)
    assert second.capped == {"r1": ca_end}
    leaf = x509.load_pem_x509_certificate(second.certificates["r1"][0].read_bytes())
    assert leaf.not_valid_after_utc == ca_end
    leaf.verify_directly_issued_by(ca)
    with pytest.raises(ValueError, match=r"expired on 2029-12-29: remove ca\.pem and ca-key\.pem"):
        make_ca(tmp_path, ["r2"], now=ca_end + datetime.timedelta(days=1))
    # The command says so.
    recent = make_ca(
        tmp_path / "recent",
        [],
        now=datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=CA_DAYS - 10),
    )
    assert recent.ca_created
    assert main(["tls", "make-ca", "--dir", str(tmp_path / "recent"), "n1"]) == 0
    error = capsys.readouterr().err
    assert "warning: n1's certificate ends with the CA on " in error, error
    assert "before --days 365" in error


# Real node processes.


def _https_context(
    files: CertificateFiles | None, name: str | None, *, ca: CertificateFiles
) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca.ca_cert))
    if files is not None and name is not None:
        cert_path, key_path = files.certificates[name]
        context.load_cert_chain(str(cert_path), str(key_path))
    return context


def _get(url: str, context: ssl.SSLContext, *, method: str = "GET", body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=10.0, context=context) as answer:
            return answer.status, json.load(answer)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


def _eventually(check: Any, what: str) -> Any:
    deadline_s = time.monotonic() + WAIT_S
    while time.monotonic() < deadline_s:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"not within {WAIT_S} s: {what}")


def _https_url(node: LocalNode) -> str:
    return f"https://{node.host}:{node.http_port}"


@pytest.fixture(scope="module")
def tls_cluster(
    tmp_path_factory: pytest.TempPathFactory, certificates: CertificateFiles
) -> Iterator[LocalCluster]:
    """Two nodes that serve https only and require client certificates from the CA."""
    region_settings = {}
    for name in ("r0", "r1"):
        cert_path, key_path = certificates.certificates[name]
        region_settings[name] = {"tls.cert_file": str(cert_path), "tls.key_file": str(key_path)}
    local = LocalCluster(
        tmp_path_factory.mktemp("tls-cluster"),
        size=2,
        settings={"tls.ca_file": str(certificates.ca_cert), "tls.client_certs": "required"},
        region_settings=region_settings,
    )
    for node in local.nodes:
        node.start()
    try:
        # LocalCluster speaks https to nodes given tls.* settings, with their own certificate.
        local.wait_ready(timeout_s=WAIT_S)
        yield local
    finally:
        local.kill()


def _handshake(port: int, context: ssl.SSLContext) -> ssl.SSLSocket:
    """A TLS 1.2 connection, handshake done: a refused client certificate fails the handshake
    itself (TLS 1.3 reports it only at the first read)."""
    context.maximum_version = ssl.TLSVersion.TLSv1_2
    raw = socket.create_connection(("127.0.0.1", port), timeout=10.0)
    try:
        return context.wrap_socket(raw, server_hostname="127.0.0.1")
    except BaseException:
        raw.close()
        raise


def _exchange(port: int, context: ssl.SSLContext) -> bytes:
    """GET /healthz over TLS 1.2: the start of the answer."""
    with _handshake(port, context) as secured:
        secured.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        return secured.recv(4096)


@pytest.mark.integration
def test_https__with_the_ca_and_a_client_certificate__answers(
    tls_cluster: LocalCluster, certificates: CertificateFiles
) -> None:
    node = tls_cluster.nodes[0]
    context = _https_context(certificates, "alice", ca=certificates)
    status, document = _get(f"{_https_url(node)}/v1/cluster/status", context)
    assert status == 200 and document["region"] == "r0"
    assert _exchange(node.http_port, _https_context(certificates, "alice", ca=certificates))[
        :12
    ] == (b"HTTP/1.1 200")
    assert "serving https://" in node.log_tail(20_000)


@pytest.mark.integration
def test_local_cluster__reaches_tls_nodes_over_https_with_their_certificates(
    tls_cluster: LocalCluster,
) -> None:
    assert all(node.url.startswith("https://") for node in tls_cluster.nodes)
    assert _eventually(tls_cluster.leader, "a leader seen over https") in tls_cluster.nodes


@pytest.mark.integration
def test_plain_http__to_the_tls_port__fails(tls_cluster: LocalCluster) -> None:
    node = tls_cluster.nodes[0]
    with pytest.raises((OSError, http.client.HTTPException)):
        urllib.request.urlopen(f"http://127.0.0.1:{node.http_port}/healthz", timeout=10.0)


@pytest.mark.integration
def test_mutual_tls__a_client_without_a_certificate__is_refused_in_the_handshake(
    tls_cluster: LocalCluster, certificates: CertificateFiles
) -> None:
    port = tls_cluster.nodes[0].http_port
    # The server ends the handshake (with no alert: asyncio's TLS closes at once).
    with pytest.raises(ssl.SSLError):
        _handshake(port, _https_context(None, None, ca=certificates))


@pytest.mark.integration
def test_mutual_tls__a_client_without_a_certificate__is_told_it_may_need_one(
    tls_cluster: LocalCluster, certificates: CertificateFiles
) -> None:
    # Under TLS 1.3 the refusal reaches aiohttp as a disconnection: the error says what it
    # most likely is. With a certificate, the same endpoint answers (the test above).
    urls = [_https_url(node) for node in tls_cluster.nodes]
    with (
        Client(urls, ca_file=str(certificates.ca_cert), timeout_s=5.0) as client,
        pytest.raises(ClusterUnavailable) as raised,
    ):
        client.health()
    assert "requires client certificates" in str(raised.value), raised.value
    # The same through failover over every endpoint, for a call that retries.
    with (
        Client(urls, ca_file=str(certificates.ca_cert), timeout_s=5.0) as client,
        pytest.raises(ClusterUnavailable) as raised,
    ):
        client.regions.list()
    assert "requires client certificates" in str(raised.value), raised.value
    assert "cert_file and key_file" in str(raised.value)


@pytest.mark.integration
def test_client__nodes_whose_certificate_it_cannot_verify__end_the_call_at_once(
    tls_cluster: LocalCluster, certificates: CertificateFiles, stranger: CertificateFiles
) -> None:
    # Retrying cannot make an untrusted certificate trusted: the call used to try until its
    # deadline and then report the nodes as unavailable. The message, not a timing, tells the
    # two apart: a call that ran to its deadline says "within 30 s".
    urls = [_https_url(node) for node in tls_cluster.nodes]
    cert_path, key_path = certificates.certificates["alice"]
    with (
        Client(
            urls,
            ca_file=str(stranger.ca_cert),
            cert_file=str(cert_path),
            key_file=str(key_path),
            timeout_s=30.0,
        ) as client,
        pytest.raises(ClusterUnavailable) as raised,
    ):
        client.regions.list()
    message = str(raised.value)
    assert "no endpoint's certificate could be verified" in message, message
    assert "--ca-file" in message and "within 30 s" not in message


@pytest.mark.integration
def test_mutual_tls__a_certificate_from_another_ca__is_refused_in_the_handshake(
    tls_cluster: LocalCluster, certificates: CertificateFiles, stranger: CertificateFiles
) -> None:
    port = tls_cluster.nodes[0].http_port
    with pytest.raises(ssl.SSLError):
        _handshake(port, _https_context(stranger, "alice", ca=certificates))


@pytest.mark.integration
def test_transfer_leader__sent_to_a_follower__is_forwarded_to_the_leader_over_mutual_tls(
    tls_cluster: LocalCluster, certificates: CertificateFiles
) -> None:
    context = _https_context(certificates, "alice", ca=certificates)

    def registered() -> bool:
        status, document = _get(f"{_https_url(tls_cluster.nodes[0])}/v1/regions", context)
        return status == 200 and len(document["items"]) == 2

    def states() -> dict[str, str]:
        found = {}
        for node in tls_cluster.nodes:
            status, document = _get(f"{_https_url(node)}/v1/cluster/status", context)
            found[node.region] = document["state"] if status == 200 else "unknown"
        return found

    _eventually(registered, "both regions registered")
    leader_region = _eventually(
        lambda: next((name for name, state in states().items() if state == "leader"), None),
        "a leader",
    )
    follower = next(node for node in tls_cluster.nodes if node.region != leader_region)
    status, document = _get(
        f"{_https_url(follower)}/v1/cluster/transfer-leader",
        context,
        method="POST",
        body={"region": follower.region},
    )
    assert status == 200, document
    assert document == {"leader_region": follower.region, "transferred": True}
    _eventually(lambda: states()[follower.region] == "leader", "the follower leads")


@pytest.mark.integration
def test_client_and_cli__with_the_ca_file_and_a_client_certificate__reach_the_cluster(
    tls_cluster: LocalCluster,
    certificates: CertificateFiles,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("XR_CLIENT_CONFIG", raising=False)
    cert_path, key_path = certificates.certificates["alice"]
    urls = [_https_url(node) for node in tls_cluster.nodes]
    with Client(
        urls, ca_file=str(certificates.ca_cert), cert_file=str(cert_path), key_file=str(key_path)
    ) as client:
        assert client.health().ready
        assert {region.name for region in client.regions.list()} <= {"r0", "r1"}
    flags = ["--ca-file", str(certificates.ca_cert), "--cert-file", str(cert_path)]
    flags += ["--key-file", str(key_path), "--endpoints", ",".join(urls), "--json"]
    assert main(["cluster", "members", *flags]) == 0, capsys.readouterr().err
    assert len(json.loads(capsys.readouterr().out)["items"]) == 2
    # The same from the environment.
    monkeypatch.setenv("XR_ENDPOINTS", urls[1])
    monkeypatch.setenv("XR_CA_FILE", str(certificates.ca_cert))
    monkeypatch.setenv("XR_CERT_FILE", str(cert_path))
    monkeypatch.setenv("XR_KEY_FILE", str(key_path))
    assert main(["region", "ls", "--json"]) == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)["items"]


@pytest.mark.integration
def test_node__a_cert_file_that_does_not_load__exits_2_naming_tls_cert_file(
    tmp_path: Path, certificates: CertificateFiles
) -> None:
    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate\n")
    local = LocalCluster(
        tmp_path,
        size=1,
        settings={"tls.cert_file": str(bad), "tls.key_file": str(certificates.ca_key)},
    )
    node = local.nodes[0]
    node.start()
    assert node.process is not None
    assert node.process.wait(WAIT_S) == 2
    tail = node.log_tail()
    assert "invalid configuration: setting tls.cert_file" in tail
    assert "Traceback" not in tail


@pytest.mark.integration
def test_node__started_with_insecure_and_raft_off_loopback__logs_the_warning(
    tmp_path: Path,
) -> None:
    # 0.0.0.0 is not a loopback address, and connecting to it reaches this host only: the peer
    # puts Raft "off loopback" without any traffic leaving the machine.
    (peer_port,) = free_ports(1)
    local = LocalCluster(
        tmp_path, size=1, settings={"raft.peers": f"0.0.0.0:{peer_port}", "raft.insecure": "true"}
    )
    node = local.nodes[0]
    node.start()
    try:
        line = _eventually(
            lambda: next(
                (
                    text
                    for text in node.log_tail(20_000).splitlines()
                    if "unauthenticated and unencrypted" in text
                ),
                None,
            ),
            "the insecure warning",
        )
        assert " WARNING " in line and f"0.0.0.0:{peer_port}" in line
    finally:
        node.kill()


def test_make_ca__an_output_that_is_not_a_regular_file_is_refused_before_writing(
    tmp_path: Path,
) -> None:
    """The files are written in place: a named pipe where a certificate goes made `xr tls
    make-ca` wait for a reader forever (and a device would have taken the key)."""
    import os
    import threading

    pipe = tmp_path / "a.pem"
    os.mkfifo(pipe)
    outcome: dict[str, BaseException | None] = {}

    def make() -> None:
        try:
            make_ca(tmp_path, ["a"])
            outcome["error"] = None
        except ValueError as error:
            outcome["error"] = error

    thread = threading.Thread(target=make, daemon=True)
    thread.start()
    thread.join(timeout=30)
    if thread.is_alive():
        # It waits to write the pipe: a reader lets it finish.
        os.close(os.open(pipe, os.O_RDONLY | os.O_NONBLOCK))
        thread.join(timeout=10)
        pytest.fail("make_ca waited on a named pipe")
    assert "a.pem exists and is not a regular file" in str(outcome["error"])
    assert not (tmp_path / "ca.pem").exists()  # nothing written


def test_certificate_warnings__an_expired_certificate_and_a_key_others_may_read(
    tmp_path: Path,
) -> None:
    # Both passed `--check` and the start silently; clients then refused the node.
    issued = datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC)
    files = make_ca(tmp_path / "old", ["r0"], days=30, now=issued)
    tls = _tls(files, "r0")
    assert certificate_warnings(tls, issued + datetime.timedelta(days=1)) == []
    [expired] = certificate_warnings(tls, issued + datetime.timedelta(days=365))
    assert "expired on 2020-01-31" in expired
    [early] = certificate_warnings(tls, issued - datetime.timedelta(days=2))
    assert "is not valid before" in early
    os.chmod(files.certificates["r0"][1], 0o644)
    [readable] = certificate_warnings(tls, issued + datetime.timedelta(days=1))
    assert "may be read by other users (mode 644)" in readable
