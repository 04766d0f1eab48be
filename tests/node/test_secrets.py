"""Secrets are never shown: a node started with a known cluster secret (from a file, and from
`XR_RAFT_CLUSTER_SECRET`) and a bearer token never writes the secret, the token or the token's
digest to its log, nor answers them to any GET; `xr node run --check` and configuration errors
hide them too.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from node.cli import main
from node.config import hash_token
from node.localcluster import LocalCluster, LocalNode

SECRET_FROM_FILE = "xr-test-secret-from-file-4f1c9a"
SECRET_FROM_ENV = "xr-test-secret-from-env-8d2e7b"
TOKEN = "xr-test-admin-token-31a5c0"
TOKEN_DIGEST = hash_token(TOKEN)
CONFIG_TEXT = (
    f'[[auth.tokens]]\nname = "ops"\nsha256 = "{TOKEN_DIGEST}"\nrole = "admin"\ntenant = "ops"\n'
)
# Every GET a caller could use to learn about the node and the cluster.
PATHS = (
    "/healthz",
    "/readyz",
    "/metrics",
    "/v1/cluster/status",
    "/v1/cluster/members",
    "/v1/regions",
    "/v1/regions/r0",
    "/v1/tenants",
    "/v1/kv",
    "/v1/jobs",
    "/v1/ui/state",
    "/v1/openapi.json",
)
HIDDEN = (SECRET_FROM_FILE, SECRET_FROM_ENV, TOKEN, TOKEN_DIGEST)


def _get(node: LocalNode, path: str) -> tuple[int, str]:
    request = urllib.request.Request(
        f"{node.url}{path}", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10.0) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def _cluster(base_dir: Path, **settings: str) -> LocalCluster:
    return LocalCluster(
        base_dir, size=1, settings={"log.level": "debug", **settings}, config_text=CONFIG_TEXT
    )


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[LocalNode]]:
    """One node with the secret from a file, one with it from the environment."""
    secret_file = tmp_path_factory.mktemp("secret") / "cluster_secret"
    secret_file.write_text(SECRET_FROM_FILE + "\n")
    from_file = _cluster(
        tmp_path_factory.mktemp("from-file"), **{"raft.cluster_secret_file": str(secret_file)}
    )
    from_env = _cluster(tmp_path_factory.mktemp("from-env"))
    started = [from_file, from_env]
    try:
        from_file.nodes[0].start()
        # The child inherits the environment it is started with.
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("XR_RAFT_CLUSTER_SECRET", SECRET_FROM_ENV)
            from_env.nodes[0].start()
        for local in started:
            local.wait_ready(timeout_s=30.0)
        # The environment node really has the secret to hide.
        process = from_env.nodes[0].process
        assert process is not None
        environment = Path(f"/proc/{process.pid}/environ").read_bytes()
        assert f"XR_RAFT_CLUSTER_SECRET={SECRET_FROM_ENV}".encode() in environment
        yield [local.nodes[0] for local in started]
    finally:
        for local in started:
            local.kill()


@pytest.mark.integration
def test_get_answers__never_hold_the_cluster_secret_or_the_token(nodes: list[LocalNode]) -> None:
    for node in nodes:
        for path in PATHS:
            status, body = _get(node, path)
            assert status == 200, (node.region, path, status, body)
            for hidden in HIDDEN:
                assert hidden not in body, (node.region, path)


@pytest.mark.integration
def test_node_logs__from_start_to_stop__never_hold_the_cluster_secret_or_the_token(
    nodes: list[LocalNode],
) -> None:
    for node in nodes:
        node.terminate()
        assert node.exit_code == 0, node.log_tail()
        text = node.log_path.read_text()
        assert "serving http://" in text and "stopped" in text
        for hidden in HIDDEN:
            assert hidden not in text, node.region


def test_node_run_check__hides_the_secret_and_token_digests(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    config_path = tmp_path / "node.toml"
    config_path.write_text(CONFIG_TEXT)
    secret_file = tmp_path / "cluster_secret"
    secret_file.write_text(SECRET_FROM_FILE)
    base = ["node", "run", "--check", "--config", str(config_path), "--region", "r0"]
    base += ["--raft-address", "127.0.0.1:7001", "--data-dir", str(tmp_path)]
    assert main([*base, "--cluster-secret-file", str(secret_file)]) == 0
    from_file = capsys.readouterr()
    monkeypatch.setenv("XR_RAFT_CLUSTER_SECRET", SECRET_FROM_ENV)
    assert main(base) == 0
    from_env = capsys.readouterr()
    for shown in (from_file, from_env):
        assert "raft.cluster_secret " in shown.out and "(hidden)" in shown.out
        assert "ops (role admin, tenant ops)" in shown.out
        for hidden in HIDDEN:
            assert hidden not in shown.out + shown.err
    assert "XR_RAFT_CLUSTER_SECRET" in from_env.out


def test_node_run__an_invalid_configuration_with_a_secret__does_not_echo_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    secret_file = tmp_path / "cluster_secret"
    secret_file.write_text(SECRET_FROM_FILE)
    base = ["node", "run", "--check", "--region", "r0", "--raft-address", "127.0.0.1:7001"]
    base += ["--data-dir", str(tmp_path)]
    # The secret given twice, from the environment and from a file.
    monkeypatch.setenv("XR_RAFT_CLUSTER_SECRET", SECRET_FROM_ENV)
    assert main([*base, "--cluster-secret-file", str(secret_file)]) == 2
    monkeypatch.delenv("XR_RAFT_CLUSTER_SECRET")
    # A secret of the wrong type: the message names the setting, not the value.
    config_path = tmp_path / "node.toml"
    config_path.write_text(f'[raft]\ncluster_secret = ["{SECRET_FROM_FILE}"]\n')
    assert main([*base, "--config", str(config_path)]) == 2
    errors = capsys.readouterr().err
    assert "raft.cluster_secret or raft.cluster_secret_file, not both" in errors
    assert "setting raft.cluster_secret: Expected `str | null`" in errors
    for hidden in HIDDEN:
        assert hidden not in errors
