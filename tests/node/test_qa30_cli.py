"""`xr` commands that said or did something other than what happens (found by the QA pass 30):
`xr token hash` printed snippets the node refuses, `xr snapshot save --help` gave another
timeout than it used, `xr lock run` named a holder "None", a command against the default
endpoint did not say how to name the cluster's, and `xr up` started nodes that could not work
(TLS, a bad tokens file, ports another cluster's nodes listen on).

No cluster runs here: the client commands meet scripted fake nodes or refused connections, and
each `xr up` case must exit before any node starts.
"""

from __future__ import annotations

import socket
from pathlib import Path

import msgspec
import pytest
from click.testing import CliRunner

from node.api.auth import Authenticator, load_tokens_file
from node.cli import main, xr
from node.cli_common import format_time_ms
from node.cli_job import _attempt_rows
from node.config import AuthConfig, ConfigError, load_config
from tests.client.fake_node import FakeNodes, Reply, refused_url
from xrcore.client import Job

pytestmark = pytest.mark.integration

_HINT = "set XR_ENDPOINTS or --endpoints (xr up prints them)"


@pytest.fixture
def no_client_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in ("XR_ENDPOINTS", "XR_CLIENT_CONFIG", "XR_TOKEN"):
        monkeypatch.delenv(variable, raising=False)


# xr token hash


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        (["--tenant", "a/b"], "--tenant: 'a/b' must be non-empty without '/'"),
        (["--tenant", ""], "--tenant: '' must be non-empty without '/'"),
        (["--name", ""], "--name: must not be empty"),
    ],
)
def test_token_hash__a_field_the_node_refuses_is_a_usage_error(
    arguments: list[str], named: str
) -> None:
    """`--tenant a/b` printed a snippet the node then refused at start, and `--name ""` one the
    tokens file refuses."""
    result = CliRunner().invoke(xr, ["token", "hash", "--generate", *arguments])
    assert result.exit_code == 2, result.output
    assert named in result.output
    # Refused before a token was made: none is shown, to be lost.
    assert "the token (shown once" not in result.output


def test_token_hash__the_snippet_loads_in_the_configuration_and_says_how_in_a_tokens_file(
    tmp_path: Path,
) -> None:
    """The snippet is `[[auth.tokens]]`; a tokens file needs `[[tokens]]` tables, and the output
    did not say so."""
    arguments = ["token", "hash", "--name", "ci", "--role", "operator", "--tenant", "team-1"]
    result = CliRunner().invoke(xr, arguments, input="s3cret\n")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "# (in a tokens file, auth.tokens_file, the table is [[tokens]] instead)" in lines
    snippet = "\n".join(lines[lines.index("[[auth.tokens]]") :]) + "\n"
    config_path = tmp_path / "node.toml"
    config_path.write_text(
        f'data_dir = "{tmp_path}"\n[region]\nname = "r0"\n'
        f'[raft]\naddress = "127.0.0.1:7001"\n{snippet}'
    )
    (token,) = load_config(path=config_path).auth.tokens
    assert (token.name, token.role, token.tenant) == ("ci", "operator", "team-1")
    tokens_path = tmp_path / "tokens.toml"
    tokens_path.write_text(snippet.replace("[[auth.tokens]]", "[[tokens]]"))
    assert load_tokens_file(tokens_path) == [token]


# xr snapshot save


def test_snapshot_save__help_gives_the_timeout_it_uses() -> None:
    """Its help said the default of every command (10 s) while it waits 60 s."""
    from node.cli_snapshot import _SAVE_TIMEOUT_S_DEFAULT

    save = CliRunner().invoke(xr, ["snapshot", "save", "--help"])
    assert f"[default {_SAVE_TIMEOUT_S_DEFAULT:g}]" in save.output
    assert "[default 10]" not in save.output
    assert "[default 10]" in CliRunner().invoke(xr, ["kv", "get", "--help"]).output


# xr lock run


def test_lock_run__a_wait_that_times_out_names_no_holder_none(
    fakes: FakeNodes, capsys: pytest.CaptureFixture[str]
) -> None:
    """`xr lock run held --wait 1 -- true` said "held by session None"."""
    session = {"session_id": "s1", "ttl_ms": 60_000, "remaining_ms": 60_000, "granted_at_ms": 0}
    timed_out = {"name": "held", "granted": False, "queued": False, "timed_out": True}
    node = fakes.add(
        {
            "POST /v1/sessions": [Reply(status=201, document=session)],
            "POST /v1/locks/held/acquire": [Reply(document=timed_out)],
            "POST /v1/sessions/s1/keepalive": [Reply(document=session)],
            "DELETE /v1/sessions/s1": [Reply(document={"session_id": "s1", "revoked": True})],
        }
    )
    arguments = ["lock", "run", "held", "--wait", "1", "--endpoints", node.url, "--", "true"]
    assert main(arguments) == 1
    error = capsys.readouterr().err
    assert error == "xr: lock.not_granted: lock 'held' was not granted within 1 s\n"


# The default endpoint


@pytest.mark.usefixtures("no_client_settings")
@pytest.mark.parametrize(
    "command", [["kv", "get", "k"], ["snapshot", "save", "backup.xr"]], ids=["kv", "snapshot"]
)
def test_an_unreachable_default_endpoint__says_how_to_name_the_cluster(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    command: list[str],
) -> None:
    """With no --endpoints, XR_ENDPOINTS or client configuration, nothing said that the command
    had asked 127.0.0.1:8700 for want of them."""
    monkeypatch.chdir(tmp_path)
    default = refused_url()
    monkeypatch.setattr("node.cli_common.DEFAULT_ENDPOINT", default)
    assert main([*command, "--timeout", "0.5"]) == 1
    error = capsys.readouterr().err
    assert error.startswith("xr: cluster.unavailable: ") and error.count("\n") == 1, error
    assert f"no endpoints were given, so the default {default} was asked: {_HINT}" in error
    # Named, the same endpoint is the caller's choice: no hint.
    assert main([*command, "--timeout", "0.5", "--endpoints", default]) == 1
    assert _HINT not in capsys.readouterr().err


# xr up


def test_up__tls_settings_exit_two_before_any_node_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It started the nodes, which served https, waited its whole start timeout on plain http
    readiness checks, then said "region r0 not ready"."""
    base_dir = tmp_path / "cluster"
    arguments = ["up", "--regions", "1", "--dir", str(base_dir), "--start-timeout", "5"]
    assert main([*arguments, "--set", "tls.client_certs=optional"]) == 2
    error = capsys.readouterr().err
    assert error.startswith(
        "xr: up.invalid: invalid setting: tls.client_certs (from --set): xr up does not start "
        "TLS nodes"
    ), error
    assert list(base_dir.iterdir()) == []


@pytest.mark.parametrize(
    "text",
    ['[[tokens]]\nname = "a"\nsha256 = "00"\n', "not toml ="],
    ids=["a bad digest", "not TOML"],
)
def test_up__a_tokens_file_the_nodes_refuse_exits_two_with_their_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str
) -> None:
    """Every node started, then exited 2 on the file."""
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(text)
    with pytest.raises(ConfigError) as refused:
        Authenticator(AuthConfig(tokens_file=str(tokens)))
    base_dir = tmp_path / "cluster"
    arguments = ["up", "--regions", "1", "--dir", str(base_dir)]
    assert main([*arguments, "--set", f"auth.tokens_file={tokens}"]) == 2
    error = capsys.readouterr().err
    assert error == f"xr: up.invalid: invalid setting: {refused.value}\n", error
    assert list(base_dir.iterdir()) == []


def test_up__a_port_something_listens_on_exits_two_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Another cluster's nodes on the ports of `--base-port` answered this one's readiness
    checks: it printed "the cluster is up", then its own nodes exited "address already in use"."""
    base_dir = tmp_path / "cluster"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        arguments = ["up", "--regions", "1", "--dir", str(base_dir), "--base-port", str(port)]
        assert main(arguments) == 2
    error = capsys.readouterr().err
    assert error.startswith(
        f"xr: up.invalid: API port 127.0.0.1:{port} cannot be used: Address already in use"
    ), error
    assert "choose another --base-port" in error
    assert list(base_dir.iterdir()) == []


def _attempt(number: int, region: str, token: int, **more: object) -> dict[str, object]:
    return {"number": number, "token": token, "region": region, "executor_id": "e", **more}


def test_job_show__lists_the_attempts_of_tasks_that_had_several() -> None:
    # The failover history (which region, which token, how each attempt ended, the step the next
    # was given) was in --json only, though the quickstart sends readers to `xr job show`.
    tasks = [
        {
            "index": 0,
            "state": "running",
            "attempts": [
                _attempt(
                    1, "us-east", 5, started_at_ms=2_000, ended_at_ms=9_000, outcome="lease_expired"
                ),
                _attempt(2, "eu-west", 9, started_at_ms=9_500, restored_step=30_000),
            ],
        },
        {"index": 1, "state": "running", "attempts": [_attempt(1, "us-east", 6, started_at_ms=1)]},
    ]
    job = msgspec.convert(
        {
            "job_id": "job-1", "name": "n", "tenant": "t", "state": "running", "priority": 0,
            "submitted_at_ms": 1_000, "array_size": 2, "tasks": tasks,
        },
        Job,
    )  # fmt: skip
    rows = _attempt_rows(job)
    assert [row[:4] + row[5:] for row in rows] == [
        [0, 1, "us-east", 5, format_time_ms(9_000), "lease_expired", None],
        [0, 2, "eu-west", 9, None, "running", 30_000],
    ]
    many = msgspec.structs.replace(
        job, tasks=[msgspec.structs.replace(job.tasks[0], index=n) for n in range(20)]
    )
    rows = _attempt_rows(many)
    assert len(rows) == 16 * 2 + 1 and "4 more tasks" in rows[-1][0]
