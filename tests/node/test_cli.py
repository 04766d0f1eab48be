"""The `xr` command line: help and parsing for every command (through click's CliRunner), the
connection settings, `xr node run --check`, `xr token hash`, and end to end against a cluster
started with `xr up` as a subprocess (KV, locks, `lock run`, jobs, regions, the cluster, error
lines and exit codes), ending with Ctrl-C to `xr up`, which must stop every node.

Waits on processes and the cluster have generous deadlines that only guard against a hung test;
nothing here asserts on how long anything takes.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib.metadata import version as package_version
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from node.cli import main, xr
from node.cli_common import (
    ClientOptions,
    FiniteFloatRange,
    one_line,
    resolve_settings,
    table,
)
from node.localcluster import SECRET_FILE
from node.up import RAFT_PORT_OFFSET, STATE_FILE, UpError, UpOptions, _read_state, run_up
from tests.raftstore.one_member import plain_frame

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
# Failsafes against a hung test, not assertions about speed.
UP_READY_S = 120.0
EVENTUALLY_S = 30.0
PROCESS_EXIT_S = 60.0


def _all_commands(
    group: click.Group, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    for name, command in sorted(group.commands.items()):
        yield (*path, name), command
        if isinstance(command, click.Group):
            yield from _all_commands(command, (*path, name))


ALL_COMMANDS = list(_all_commands(xr))


@pytest.mark.parametrize(
    "path", [path for path, _ in ALL_COMMANDS], ids=[" ".join(p) for p, _ in ALL_COMMANDS]
)
def test_help__every_command_has_help_text(path: tuple[str, ...]) -> None:
    result = CliRunner().invoke(xr, [*path, "--help"])
    assert result.exit_code == 0, result.output
    command = dict(ALL_COMMANDS)[path]
    assert command.help and command.help.strip(), f"xr {' '.join(path)} has no help text"
    assert f"Usage: xr {' '.join(path)}" in result.output


def test_options__every_float_option_refuses_nan_and_infinity() -> None:
    """click's FloatRange lets NaN through (it compares false with any bound), and infinity
    where there is no upper bound; the client would send either as JSON null. Every float
    option of xr and xr-jepsen uses FiniteFloatRange."""
    from xr_jepsen.cli import cli as jepsen

    floats = [
        (path, parameter.name)
        for group in (xr, jepsen)
        for path, command in _all_commands(group)
        for parameter in command.params
        if isinstance(parameter.type, click.FloatRange)
    ]
    assert len(floats) >= 10
    assert all(
        type(parameter.type) is FiniteFloatRange
        for group in (xr, jepsen)
        for _, command in _all_commands(group)
        for parameter in command.params
        if isinstance(parameter.type, click.FloatRange)
    ), floats
    for arguments in (
        ["job", "submit", "j", "--workload", "w", "--cost-weight", "nan"],
        ["tenant", "set", "t", "--weight", "NaN"],
        ["kv", "get", "k", "--timeout", "nan"],
        ["lock", "acquire", "l", "--wait", "inf"],
    ):
        refused = CliRunner().invoke(xr, arguments)
        assert refused.exit_code == 2 and "is not a finite number" in refused.output, arguments


def test_help__client_commands_take_the_connection_options() -> None:
    result = CliRunner().invoke(xr, ["kv", "get", "--help"])
    for option in ("--endpoints", "--token", "--token-file", "--config", "--json", "--timeout"):
        assert option in result.output


def test_help__job_logs_describes_the_captured_output() -> None:
    result = CliRunner().invoke(xr, ["job", "logs", "--help"])
    assert "captured output" in result.output and "--attempt" in result.output


@pytest.mark.parametrize(
    "arguments",
    [
        ["up", "--regions", "2", "--region", "a"],
        ["up", "--region", "a", "--region", "a"],
        ["up", "--region", "a/b"],
        ["up", "--regions", "0"],
        ["job", "submit", "train"],
        ["job", "submit", "train", "--workload", "w", "--entrypoint", "a.b:c"],
        ["job", "submit", "train", "--workload", "w", "--args", "[1]"],
        ["job", "submit", "train", "--workload", "w", "--args", "{nope"],
        ["job", "ls", "--state", "sleeping"],
        ["lock", "run", "name"],
        ["lock", "release", "name"],
        ["kv", "get", ""],
        ["kv", "get", "key", "--timeout", "0"],
        ["kv", "get", "key", "--token", "a", "--token-file", "b"],
        ["kv", "get", "key", "--endpoints", " , "],
        ["kv", "ls", "--limit", "0"],
        ["node", "run", "--set", "no-equals-sign"],
        ["no-such-command"],
        ["kv", "get", "key", "--endpoints", "http://[::1"],
        ["kv", "get", "key", "--endpoints", "127.0.0.1:99999"],
        ["kv", "get", "key", "--endpoints", "host:port"],
        ["kv", "get", "key", "--endpoints", "ftp://127.0.0.1:1"],
        ["tenant", "set", ""],
        ["job", "submit", "train", "--workload", "w", "--args", '{"a": NaN}'],
        ["job", "submit", "train", "--workload", "w", "--args", '{"a": 1e999}'],
        ["job", "submit", "train", "--workload", "w", "--args", "[" * 100_000],
    ],
)
def test_usage_errors__exit_two(arguments: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(arguments) == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    assert "Error" in captured.err


def test_settings__flags_then_environment_then_file_then_defaults(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("from-file-token\n")
    config = tmp_path / "client.toml"
    config.write_text(
        f'endpoints = ["10.0.0.1:8700", "http://10.0.0.2:8700/"]\n'
        f'token_file = "{token_file}"\ntimeout_s = 4\n'
    )
    from_file = resolve_settings(ClientOptions(config_file=str(config)), {})
    assert from_file.endpoints == ["http://10.0.0.1:8700", "http://10.0.0.2:8700"]
    assert from_file.token == "from-file-token"
    assert from_file.timeout_s == 4
    environment = {"XR_ENDPOINTS": "h:1", "XR_TOKEN": "env-token", "XR_CLIENT_CONFIG": str(config)}
    from_environment = resolve_settings(ClientOptions(), environment)
    assert from_environment.endpoints == ["http://h:1"]
    assert from_environment.token == "env-token"
    assert from_environment.timeout_s == 4
    from_flags = resolve_settings(
        ClientOptions(endpoints="f:1,f:2", token="flag-token", timeout_s=2.5), environment
    )
    assert from_flags.endpoints == ["http://f:1", "http://f:2"]
    assert from_flags.token == "flag-token"
    assert from_flags.timeout_s == 2.5
    defaults = resolve_settings(ClientOptions(), {})
    assert defaults.endpoints == ["http://127.0.0.1:8700"]
    assert defaults.token is None


def test_settings__unknown_client_config_setting_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "client.toml"
    config.write_text('endpoint = "typo:1"\n')
    assert main(["kv", "get", "key", "--config", str(config)]) == 2
    assert "unknown setting(s) endpoint" in capsys.readouterr().err


def test_settings__a_token_and_a_token_file_in_one_client_config_is_a_usage_error(
    tmp_path: Path,
) -> None:
    """The flags refused both; the file took the token and ignored the file."""
    (tmp_path / "token").write_text("from-file\n")
    config = tmp_path / "client.toml"
    config.write_text(f'token = "inline"\ntoken_file = "{tmp_path / "token"}"\n')
    with pytest.raises(click.UsageError, match="give token or token_file, not both"):
        resolve_settings(ClientOptions(config_file=str(config)), {})


def test_settings__files_that_are_not_utf8_or_a_nan_timeout_are_usage_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    not_text = tmp_path / "not-text"
    not_text.write_bytes(b"\xff\xfe token")
    nan_timeout = tmp_path / "client.toml"
    nan_timeout.write_text("timeout_s = nan\n")
    for option, path, message in [
        ("--token-file", not_text, "is not UTF-8 text"),
        ("--config", not_text, "is not UTF-8 text"),
        ("--config", nan_timeout, "timeout_s must be a positive, finite number"),
    ]:
        assert main(["kv", "get", "k", "--endpoints", "127.0.0.1:9", option, str(path)]) == 2
        error = capsys.readouterr().err
        assert message in error and "Traceback" not in error


def test_settings__an_empty_ca_file_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "ca.pem"
    empty.write_bytes(b"")
    assert (
        main(["kv", "get", "k", "--endpoints", "https://127.0.0.1:9", "--ca-file", str(empty)]) == 2
    )
    assert f"ca_file {str(empty)!r}: not PEM CA certificates" in capsys.readouterr().err


def test_arguments__not_utf8_is_a_usage_error_before_any_request(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Python hands on an argument that is not UTF-8 with surrogate escapes ('\\udcff' for the
    byte 0xff); no request can carry one. Also after `--`, where it is not checked up front."""
    assert main(["kv", "get", "key\udcff", "--endpoints", "127.0.0.1:9"]) == 2
    assert capsys.readouterr().err == "xr: usage: argument b'key\\xff' is not UTF-8\n"
    assert main(["kv", "get", "--endpoints", "127.0.0.1:9", "--", "key\udcff"]) == 2
    assert capsys.readouterr().err == "xr: usage: text b'key\\xff' is not UTF-8\n"


def test_node_run__config_not_utf8_or_nan_exits_two(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    arguments = ["node", "run", "--check", "--region", "r0", "--data-dir", str(tmp_path)]
    arguments += ["--raft-address", "127.0.0.1:7001"]
    not_text = tmp_path / "node.toml"
    not_text.write_bytes(b'[region]\nname = "r\xff"\n')
    assert main([*arguments, "--config", str(not_text)]) == 2
    assert "is not UTF-8 text" in capsys.readouterr().err
    assert main([*arguments, "--cluster-secret-file", str(not_text)]) == 2
    assert "raft.cluster_secret_file" in capsys.readouterr().err
    # NaN passes every range check (it compares false), so each number setting needs this.
    for setting in ("region.price_per_gpu_hour=nan", "http.wait_max_s=nan", "http.wait_max_s=inf"):
        assert main([*arguments, "--set", setting]) == 2, setting
        assert "must be a finite number" in capsys.readouterr().err


_UNREACHABLE = ["--endpoints", "127.0.0.1:9", "--timeout", "0.05"]
# Commands that make one request and end; None is where generated text goes. (No value of
# `kv put` is generated: `-` would read stdin.)
_FUZZED_COMMANDS = [
    ["kv", "get", None],
    ["kv", "put", None, "value"],
    ["kv", "del", None],
    ["kv", "ls", "--prefix", None],
    ["job", "show", None],
    ["job", "cancel", None, "--reason", None],
    ["job", "submit", None, "--workload", None],
    ["job", "submit", "name", "--workload", "w", "--args", None],
    ["lock", "show", None],
    ["lock", "release", None, "--session", None],
    ["session", "show", None],
    ["region", "show", None],
    ["tenant", "set", None],
    ["cluster", "transfer-leader", None],
]


@given(
    command=st.sampled_from(_FUZZED_COMMANDS),
    # Surrogates included: what Python makes of arguments that are not UTF-8.
    texts=st.lists(st.text(st.characters(exclude_categories=())), min_size=2, max_size=2),
)
@settings(max_examples=100, derandomize=True, deadline=None)
def test_arguments__any_text_gives_an_exit_code_and_no_traceback(
    command: list[str | None], texts: list[str]
) -> None:
    generated = iter(texts)
    arguments = [next(generated) if item is None else item for item in command]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([*arguments, *_UNREACHABLE])
    assert code in (1, 2, 3), (code, err.getvalue())
    assert err.getvalue().count("\n") <= 5 and "Traceback" not in err.getvalue()


def test_an_empty_session_is_a_usage_error_for_kv_put_as_for_the_lock_commands(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """It went to the cluster and came back as a definite error (exit 1)."""
    assert main(["kv", "put", "k", "v", "--session", "", *_UNREACHABLE]) == 2
    assert "'--session': must not be empty" in capsys.readouterr().err


@pytest.mark.parametrize("token", ["", "two\nlines", "caf\u00e9"])
def test_a_token_that_no_header_can_carry__is_a_usage_error_naming_the_token(
    token: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """It was reported as a TLS file that did not load (tls.invalid)."""
    assert main(["kv", "get", "a", "--token", token, *_UNREACHABLE]) == 2
    error = capsys.readouterr().err
    assert error.startswith("xr: usage: the token (--token, --token-file, XR_TOKEN"), error


def test_output_that_cannot_be_written_and_a_closed_stdin_are_one_line_errors() -> None:
    """`> /dev/full` and a closed stdin (`<&-`) ended in tracebacks."""
    with open("/dev/full", "w") as full:
        ran = subprocess.run(
            _xr_command("--help"), stdout=full, stderr=subprocess.PIPE, text=True,
            env=_environment(), cwd=ROOT, timeout=60,
        )  # fmt: skip
    assert ran.returncode == 1
    assert ran.stderr == "xr: io.failed: cannot write the output: No space left on device\n"
    ran = subprocess.run(
        _xr_command("kv", "get", "k"), capture_output=True, text=True, env=_environment(),
        cwd=ROOT, timeout=60, preexec_fn=lambda: os.close(1),
    )  # fmt: skip
    assert ran.returncode == 2
    assert ran.stderr == "xr: usage: standard output is closed\n", ran.stderr
    for arguments, said in [
        (["kv", "put", "k", "-"], "no standard input to read it from"),
        (["token", "hash"], "no standard input to read the token from"),
    ]:
        ran = subprocess.run(
            _xr_command(*arguments), stdin=subprocess.DEVNULL, capture_output=True, text=True,
            env=_environment(), cwd=ROOT, timeout=60,
            # Closes the child's stdin, as `<&-` does.
            preexec_fn=lambda: os.close(0),
        )  # fmt: skip
        assert ran.returncode == 2 and said in ran.stderr, ran.stderr
        assert "Traceback" not in ran.stderr


def test_entry__ctrl_c_while_the_cli_is_imported_exits_130(monkeypatch: pytest.MonkeyPatch) -> None:
    """The `xr` script imports `node.cli` (a few tenths of a second): a Ctrl-C then printed a
    KeyboardInterrupt traceback."""
    import builtins

    from node import entry

    imported = builtins.__import__

    def interrupted(name: str, *arguments: Any, **keywords: Any) -> Any:
        if name == "node.cli":
            raise KeyboardInterrupt
        return imported(name, *arguments, **keywords)

    monkeypatch.setattr(builtins, "__import__", interrupted)
    assert entry.main() == 130


def test_job_watch__shows_a_tasks_error_while_it_fails_or_waits_not_beside_a_new_attempt(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`--wait` printed the last attempt's error, traceback and all, beside the attempt that
    ran next, and again at every change."""
    from node.cli_job import _print_changes

    error = "ValueError: boom\nTraceback (most recent call last):\n  File ..."

    def job(state: str, attempts: int) -> dict[str, Any]:
        task = {
            "index": 0, "state": state, "region": "r0", "attempts": attempts, "error": error,
            "result": None,
        }  # fmt: skip
        return {"job_id": "job-1", "state": state, "tasks": [task]}

    with click.Context(click.Command("watch")):
        _print_changes(None, job("pending", 1))
        _print_changes(job("pending", 1), job("running", 2))
        _print_changes(job("running", 2), job("failed", 2))
    assert capsys.readouterr().out.splitlines() == [
        "job job-1: pending",
        "  task 0: pending in r0 (attempt 1): ValueError: boom (...)",
        "job job-1: running",
        "  task 0: running in r0 (attempt 2)",
        "job job-1: failed",
        "  task 0: failed in r0 (attempt 2): ValueError: boom (...)",
    ]


def test_table__aligns_columns_and_shows_none_as_dash() -> None:
    assert table(["A", "LONGER"], [["xyz", None], ["", True]]).splitlines() == [
        "A    LONGER",
        "xyz  -",
        "     yes",
    ]


def test_node_run_check__a_checkpoint_directory_or_python_that_cannot_work_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--check` passed both; the node then failed at start with "[Errno 17] File exists", or
    started and failed every task with "No such file or directory", naming neither."""
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    arguments = ["node", "run", "--check", "--region", "r0", "--raft-address", "127.0.0.1:7001"]
    arguments += ["--data-dir", str(tmp_path / "data")]
    for setting, named in [
        (f"executor.checkpoint_dir={a_file}", f"executor.checkpoint_dir: {a_file}: not a"),
        ("executor.python=/nonexistent/python", "executor.python: /nonexistent/python: no such"),
        (f"executor.python={a_file}", f"executor.python: {a_file}: not an executable file"),
    ]:
        capsys.readouterr()
        assert main([*arguments, "--set", setting]) == 2
        error = capsys.readouterr().err
        assert error.startswith(f"xr node run: invalid configuration: setting {named}"), error


def test_node_run__invalid_config_exits_two_naming_the_setting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    arguments = ["node", "run", "--region", "r0", "--raft-address", "127.0.0.1:7001"]
    arguments += ["--data-dir", str(tmp_path), "--set", "http.wait_max_s=-1"]
    assert main(arguments) == 2
    error = capsys.readouterr().err
    assert error.startswith("xr node run: invalid configuration: ")
    assert "http.wait_max_s" in error
    assert main(["node", "run", "--region", "r0", "--data-dir", str(tmp_path)]) == 2
    assert "raft" in capsys.readouterr().err


def test_node_run__check_prints_the_settings_and_hides_the_secret(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    secret = tmp_path / "secret"
    secret.write_text("do-not-print-me-0123456789\n")
    config = tmp_path / "node.toml"
    config.write_text(f'data_dir = "{tmp_path}"\n[region]\nname = "r7"\n[http]\nwait_max_s = 9\n')
    arguments = ["node", "run", "--check", "--config", str(config)]
    arguments += ["--raft-address", "127.0.0.1:7001", "--cluster-secret-file", str(secret)]
    assert main(arguments) == 0
    output = capsys.readouterr().out
    assert "do-not-print-me" not in output
    rows = {line.split()[0]: line.split()[1:] for line in output.splitlines()[2:]}
    assert rows["region.name"] == ['"r7"', str(config)]
    assert rows["http.wait_max_s"] == ["9.0", str(config)]
    assert rows["raft.address"] == ['"127.0.0.1:7001"', "flag"]
    assert rows["raft.cluster_secret"] == ["(hidden)", "flag"]
    assert rows["http.address"][1] == "default"


def test_token_hash__reads_stdin_or_generates() -> None:
    runner = CliRunner()
    result = runner.invoke(xr, ["token", "hash"], input="s3cret\n")
    assert result.exit_code == 0
    assert result.output.splitlines()[0] == hashlib.sha256(b"s3cret").hexdigest()
    generated = runner.invoke(xr, ["token", "hash", "--generate", "--name", "ci"])
    lines = generated.output.splitlines()
    token = next(line for line in lines if line.startswith("# the token")).split()[-1]
    assert lines[0] == hashlib.sha256(token.encode()).hexdigest()
    assert 'name = "ci"' in generated.output
    empty = runner.invoke(xr, ["token", "hash"], input="\n")
    assert empty.exit_code == 2


def test_files_and_stdin__past_their_bound__are_refused_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Token files, configurations, secrets and values on stdin were read whole, however large
    (a path to /dev/zero ran the process out of memory); each is now read up to its bound
    (`node.files`). Files just past the bounds stand in for the endless ones here."""
    config = tmp_path / "big.toml"
    config.write_text("# " + "a" * (1 << 20) + "\n")
    secret = tmp_path / "big-secret"
    secret.write_text("a" * (65 << 10))
    unreachable = ["--endpoints", "127.0.0.1:1", "--timeout", "0.5"]
    node = ["node", "run", "--check", "--region", "a", "--raft-address", "127.0.0.1:1"]
    cases = [
        (["kv", "get", "k", "--token-file", str(secret), *unreachable], 2),
        (["kv", "get", "k", "--config", str(config), *unreachable], 2),
        ([*node, "--data-dir", str(tmp_path), "--config", str(config)], 2),
        ([*node, "--data-dir", str(tmp_path), "--set", f"raft.cluster_secret_file={secret}"], 2),
    ]
    for arguments, code in cases:
        assert main(arguments) == code, arguments
        error = capsys.readouterr().err
        assert "larger than the maximum of" in error and "Traceback" not in error, arguments

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"v" * (64 << 10 | 1))))
    assert main(["kv", "put", "k", "-", *unreachable]) == 1
    error = capsys.readouterr().err
    # Refused before any request: the cluster is unreachable, and that is not what it says.
    assert error.startswith("xr: limit.payload_too_large: the value on stdin is larger than")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"t" * (65 << 10))))
    assert main(["token", "hash"]) == 2
    assert "the token on stdin is larger than the maximum of" in capsys.readouterr().err


def test_files__a_token_table_or_a_certificate_past_the_bound__is_refused(tmp_path: Path) -> None:
    from node.api.auth import TokensFileError, load_tokens_file
    from node.cli_tls import _load_ca
    from node.config import ConfigError
    from node.tls import _read
    from xrcore.client._transport import tls_context

    big = tmp_path / "big"
    big.write_text("# " + "a" * (1 << 20) + "\n")
    with pytest.raises(TokensFileError, match="larger than the maximum of"):
        load_tokens_file(big)
    with pytest.raises(ConfigError, match="larger than the maximum of"):
        _read("tls.cert_file", str(big))
    # The client library's own TLS files, and a CA that `xr tls` would reuse.
    with pytest.raises(ValueError, match=r"ca_file .* larger than the maximum of"):
        tls_context(ca_file=str(big))
    (tmp_path / "ca.pem").write_bytes(big.read_bytes())
    with pytest.raises(ValueError, match="larger than the maximum of"):
        _load_ca(tmp_path / "ca.pem", tmp_path / "ca-key.pem")


def test_up__a_state_file_past_the_bound__is_refused(tmp_path: Path) -> None:
    (tmp_path / "xr-up.json").write_text(" " * (1 << 20) + "{}")
    with pytest.raises(UpError, match="larger than the maximum of"):
        _read_state(tmp_path, ["r0"])


def test_nesting_past_the_decoders_depth__is_an_error_not_a_traceback(tmp_path: Path) -> None:
    # A RecursionError escaped both: a traceback from `xr up`, and from any client call that
    # got such an answer.
    from xrcore.client._transport import _decode

    nested = "[" * 100_000 + "]" * 100_000
    (tmp_path / "xr-up.json").write_text(nested)
    with pytest.raises(UpError, match="cannot be read"):
        _read_state(tmp_path, ["r0"])
    assert _decode(nested.encode()) is None


def test_lock_run__a_missing_command_exits_127_before_taking_the_lock(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The endpoint does not exist: the command is checked before any request is made.
    arguments = ["lock", "run", "l", "--endpoints", "127.0.0.1:9", "--", "no-such-command-xr"]
    assert main(arguments) == 127
    assert "xr: command.not_found: no-such-command-xr: command not found" in capsys.readouterr().err


def test_unreachable_cluster__one_error_line_and_no_traceback(
    capsys: pytest.CaptureFixture[str],
) -> None:
    port = _free_port()
    assert main(["kv", "get", "k", "--endpoints", f"127.0.0.1:{port}", "--timeout", "0.5"]) == 1
    error = capsys.readouterr().err
    assert error.startswith("xr: cluster.unavailable: ")
    assert error.count("\n") == 1
    assert "Traceback" not in error


# End to end, against `xr up`.


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _xr_command(*arguments: str) -> list[str]:
    return [sys.executable, "-m", "node.cli", *arguments]


def _interruptible() -> None:
    """Runs in the child before exec: Ctrl-C's default action, as in a foreground terminal. A
    test run started in the background by a non-interactive shell ignores SIGINT, children
    inherit that, and Python then never raises KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _environment() -> dict[str, str]:
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])
    )
    environment.pop("XR_ENDPOINTS", None)
    environment.pop("XR_TOKEN", None)
    return environment


class UpProcess:
    """`xr up` running in the background, its output read by a thread."""

    def __init__(self, base_dir: Path, *arguments: str) -> None:
        self.base_dir = base_dir
        self.process = subprocess.Popen(
            _xr_command("up", "--dir", str(base_dir), *arguments),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_environment(),
            cwd=ROOT,
        )
        self.lines: list[str] = []
        self.error_lines: list[str] = []
        self.printed_endpoints = threading.Event()
        self._readers = [
            threading.Thread(target=self._read, args=(self.process.stdout, self.lines)),
            threading.Thread(target=self._read, args=(self.process.stderr, self.error_lines)),
        ]
        for reader in self._readers:
            reader.start()

    def _read(self, stream: Any, lines: list[str]) -> None:
        for line in stream:
            lines.append(line.rstrip("\n"))
            if line.startswith("export XR_ENDPOINTS="):
                self.printed_endpoints.set()
        stream.close()

    def output(self) -> str:
        return "\n".join(self.lines) + "\n--- stderr\n" + "\n".join(self.error_lines)

    @property
    def endpoints(self) -> str:
        line = next(line for line in self.lines if line.startswith("export XR_ENDPOINTS="))
        return line.partition("=")[2]

    @property
    def pids(self) -> list[int]:
        """The PIDs in the table `xr up` printed."""
        start = next(i for i, line in enumerate(self.lines) if line.startswith("REGION  PID"))
        rows = []
        for line in self.lines[start + 1 :]:
            if not line.strip():
                break
            rows.append(int(line.split()[1]))
        return rows

    def wait(self, timeout_s: float = PROCESS_EXIT_S) -> int:
        code = self.process.wait(timeout_s)
        for reader in self._readers:
            reader.join(timeout_s)
        return code

    def kill(self) -> None:
        """Failsafe: SIGINT (so it stops its nodes), then SIGKILL."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(PROCESS_EXIT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.wait(10)


def _processes_under(path: Path) -> list[str]:
    found = subprocess.run(
        ["pgrep", "-af", str(path)], capture_output=True, text=True, check=False
    ).stdout
    return [line for line in found.splitlines() if "pgrep" not in line]


def _group_exists(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


def _eventually(check: Callable[[], Any], what: str) -> Any:
    deadline_s = time.monotonic() + EVENTUALLY_S
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline_s:
            raise AssertionError(f"not true within {EVENTUALLY_S} s: {what}")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    running = UpProcess(tmp_path_factory.mktemp("up") / "cluster", "--regions", "3")
    try:
        if not running.printed_endpoints.wait(UP_READY_S):
            raise AssertionError(f"xr up printed no endpoints:\n{running.output()}")
        yield running
    finally:
        running.kill()


@dataclass
class Ran:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


@pytest.fixture
def run(up: UpProcess, capsys: pytest.CaptureFixture[str]) -> Callable[..., Ran]:
    """`main([...])` against the `xr up` cluster; the exit code and what it printed."""

    def run_xr(*arguments: str) -> Ran:
        capsys.readouterr()
        # Options go before `--`, after which comes the command of `xr lock run`.
        split = arguments.index("--") if "--" in arguments else len(arguments)
        code = main([*arguments[:split], "--endpoints", up.endpoints, *arguments[split:]])
        captured = capsys.readouterr()
        assert "Traceback" not in captured.err, captured.err
        return Ran(code, captured.out, captured.err)

    return run_xr


def test_up__again_on_the_dir_of_a_running_cluster__is_refused(
    up: UpProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    """It printed "the cluster is up" (the running cluster answered its readiness checks) while
    its own nodes failed on the taken ports, then waited with no node, forever."""
    capsys.readouterr()
    assert main(["up", "--regions", "3", "--dir", str(up.base_dir)]) == 2
    error = capsys.readouterr().err
    assert error.startswith(
        f"xr: up.invalid: the cluster in {up.base_dir} is running: data_dir "
        f"{up.base_dir / 'r0'} is in use by another node (pid {up.pids[0]})"
    ), error


def test_up__exits_one_when_every_region_has_exited(tmp_path: Path) -> None:
    """It waited for Ctrl-C with no node left."""
    running = UpProcess(tmp_path / "cluster", "--regions", "1")
    try:
        assert running.printed_endpoints.wait(UP_READY_S), running.output()
        os.kill(running.pids[0], signal.SIGKILL)
        assert running.process.wait(PROCESS_EXIT_S) == 1
    finally:
        running.kill()
    assert "xr up: every region has exited" in running.error_lines, running.output()


def test_up__killed_with_sigkill__its_nodes_stop_by_themselves(tmp_path: Path) -> None:
    # They are in process groups of their own (Ctrl-C in a shell reaches `xr up` alone, which
    # stops them in order), so `kill -9` of `xr up` left them serving for ever.
    base_dir = tmp_path / "cluster"
    running = UpProcess(base_dir, "--regions", "2")
    try:
        assert running.printed_endpoints.wait(UP_READY_S), running.output()
        assert len(_processes_under(base_dir)) >= 2  # the nodes, and `xr up --dir` itself
        running.process.kill()
        running.process.wait(PROCESS_EXIT_S)
        deadline_s = time.monotonic() + PROCESS_EXIT_S
        while _processes_under(base_dir) and time.monotonic() < deadline_s:
            time.sleep(0.2)
        assert _processes_under(base_dir) == []
        log = (base_dir / "r0.log").read_text()
        assert "is gone: stopping" in log, log[-2000:]
    finally:
        running.kill()
        # Without the fix the nodes outlive the test.
        subprocess.run(["pkill", "-KILL", "-f", str(base_dir)], check=False)


def test_up__prints_a_row_and_an_endpoint_per_region(up: UpProcess) -> None:
    assert len(up.pids) == 3
    assert len(up.endpoints.split(",")) == 3
    assert all(f"{up.base_dir}/r{i}.log" in up.output() for i in range(3))


def test_kv__put_get_ls_del(run: Callable[..., Ran]) -> None:
    put = run("kv", "put", "cli/kv/a", "alpha")
    assert put.code == 0 and put.out.startswith("revision ")
    assert run("kv", "put", "cli/kv/b", "beta").code == 0
    assert run("kv", "get", "cli/kv/a").out == "alpha\n"
    listed = run("kv", "ls", "--prefix", "cli/kv/")
    assert [line.split()[:2] for line in listed.out.splitlines()] == [
        ["KEY", "VALUE"],
        ["cli/kv/a", "alpha"],
        ["cli/kv/b", "beta"],
    ]
    document = run("kv", "ls", "--prefix", "cli/kv/", "--json").json()
    assert [item["key"] for item in document["items"]] == ["cli/kv/a", "cli/kv/b"]
    assert document["items"][1]["value"] == "beta"
    first = run("kv", "ls", "--prefix", "cli/kv/", "--limit", "1", "--json").json()["items"]
    assert [item["key"] for item in first] == ["cli/kv/a"]
    got = run("kv", "get", "cli/kv/b", "--json").json()
    assert got["value"] == "beta" and got["version"] == 1
    assert run("kv", "del", "cli/kv/a").out.startswith("deleted cli/kv/a")
    missing = run("kv", "get", "cli/kv/a")
    assert missing.code == 1
    assert missing.err == "xr: not_found: key 'cli/kv/a' does not exist\n"


def test_kv__get_prints_a_value_as_stored_and_tables_escape_control_characters(
    run: Callable[..., Ran],
) -> None:
    """`xr kv get K > file` dropped escape sequences from the value (click.echo strips them when
    stdout is not a terminal); a table printed a key's or value's control characters raw, so
    they could break its lines and drive the reader's terminal."""
    value = "color \x1b[31mred\x1b[0m\rend"
    key = "cli/ctl/k\x1b[2J\ty"
    assert run("kv", "put", key, value).code == 0
    assert run("kv", "get", key).out == value + "\n"
    row = run("kv", "ls", "--prefix", "cli/ctl/").out.splitlines()[1]
    assert row.startswith("cli/ctl/k\\x1b[2J\\ty  color \\x1b[31mred\\x1b[0m\\rend  "), row


def test_one_line__escapes_controls_and_bidirectional_overrides_and_keeps_the_rest() -> None:
    assert one_line("a\nb\tc\x1b[31m\r\x00\x7f\x85 \u202eevil\u2066 é ß 中") == (
        "a\\nb\\tc\\x1b[31m\\r\\x00\\x7f\\x85 \\u202eevil\\u2066 é ß 中"
    )


def test_kv__a_failed_compare_and_set_is_a_definite_error(run: Callable[..., Ran]) -> None:
    revision = int(run("kv", "put", "cli/cas", "1").out.split()[1])
    assert run("kv", "put", "cli/cas", "2", "--expect-revision", str(revision)).code == 0
    stale = run("kv", "put", "cli/cas", "3", "--expect-revision", str(revision))
    assert stale.code == 1
    assert stale.err.startswith("xr: kv.compare_failed: ")
    assert run("kv", "get", "cli/cas").out == "2\n"


def test_kv_watch__prints_changes_and_exits_130_on_ctrl_c(
    up: UpProcess, run: Callable[..., Ran]
) -> None:
    watcher = subprocess.Popen(
        _xr_command("kv", "watch", "--prefix", "cli/watch/", "--endpoints", up.endpoints),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_environment(),
        preexec_fn=_interruptible,
        cwd=ROOT,
    )
    try:
        output = watcher.stdout
        assert output is not None
        # The watch starts after the current revision; keep writing until it shows a change.
        first_line: list[str] = []
        reader = threading.Thread(target=lambda: first_line.append(output.readline()))
        reader.start()
        _eventually(
            lambda: first_line or run("kv", "put", "cli/watch/k", "v").code != 0,
            "the watch printed a change",
        )
        reader.join(PROCESS_EXIT_S)
        assert first_line[0].split()[1:] == ["put", "cli/watch/k", "v"]
        watcher.send_signal(signal.SIGINT)
        _, error = watcher.communicate(timeout=PROCESS_EXIT_S)
        assert watcher.returncode == 130
        assert "Traceback" not in error
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.wait()


def test_lock__acquire_show_release(run: Callable[..., Ran]) -> None:
    acquired = run("lock", "acquire", "cli-lock", "--ttl", "30", "--json").json()
    assert acquired["token"] >= 1
    shown = run("lock", "show", "cli-lock", "--json").json()
    assert (shown["holder"], shown["token"]) == (acquired["session_id"], acquired["token"])
    taken = run("lock", "acquire", "cli-lock")
    assert taken.code == 1 and taken.err.startswith("xr: lock.not_granted: ")
    released = run("lock", "release", "cli-lock", "--session", acquired["session_id"])
    assert released.code == 0
    assert run("lock", "show", "cli-lock").out == "lock cli-lock is free\n"
    again = run("lock", "release", "cli-lock", "--session", acquired["session_id"])
    assert again.code == 1 and again.err.startswith("xr: lock.not_held: ")


def test_lock_run__passes_the_token_and_the_exit_code(
    run: Callable[..., Ran], tmp_path: Path
) -> None:
    written = tmp_path / "token"
    script = f'echo "$XR_LOCK_TOKEN $XR_LOCK_NAME" > {written}; exit 7'
    ran = run("lock", "run", "cli-run", "--", "sh", "-c", script)
    assert ran.code == 7
    token, name = written.read_text().split()
    assert int(token) >= 1 and name == "cli-run"
    # The lock was released when the command ended; the next holder gets a higher token.
    assert run("lock", "run", "cli-run", "--", "sh", "-c", script).code == 7
    assert int(written.read_text().split()[0]) > int(token)
    assert run("lock", "show", "cli-run").out == "lock cli-run is free\n"


def test_lock_run__a_lost_lock_stops_the_command(
    up: UpProcess, run: Callable[..., Ran], tmp_path: Path
) -> None:
    session_file, group_file = tmp_path / "session", tmp_path / "group"
    script = f"echo $$ > {group_file}; echo $XR_LOCK_SESSION > {session_file}; sleep 300"
    holder = subprocess.Popen(
        _xr_command(
            *("lock", "run", "cli-lost", "--ttl", "3", "--grace", "5"),
            *("--endpoints", up.endpoints, "--", "sh", "-c", script),
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_environment(),
        cwd=ROOT,
    )
    try:
        session_id = _eventually(
            lambda: session_file.exists() and session_file.read_text().strip(),
            "the command under the lock started",
        )
        group = int(group_file.read_text())
        assert run("session", "revoke", session_id).code == 0
        _, error = holder.communicate(timeout=PROCESS_EXIT_S)
        assert holder.returncode == 3
        assert error.startswith("xr: lock.lost: ")
        assert "Traceback" not in error
        # The command's whole process group is gone, `sleep` included (once init has reaped
        # the orphans).
        _eventually(lambda: not _group_exists(group), "the command's process group is gone")
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


def test_job_submit__price_and_carbon_weights_go_in_the_spec_only_when_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    submitted: list[dict[str, Any]] = []

    class Jobs:
        def submit(self, name: str, **fields: Any) -> str:
            submitted.append({"name": name, **fields})
            return "job-1"

    class Client:
        jobs = Jobs()

    @contextlib.contextmanager
    def connect() -> Iterator[Client]:
        yield Client()

    monkeypatch.setattr("node.cli_job.connect", connect)
    runner = CliRunner()
    base = ["job", "submit", "green", "--workload", "gemm"]
    given = runner.invoke(xr, [*base, "--cost-weight", "0", "--carbon-weight", "2.5"])
    assert (given.exit_code, given.output) == (0, "job-1\n")
    assert (submitted[-1]["cost_weight"], submitted[-1]["carbon_weight"]) == (0.0, 2.5)
    assert runner.invoke(xr, base).exit_code == 0
    assert "cost_weight" not in submitted[-1] and "carbon_weight" not in submitted[-1]
    for option, value in (("--cost-weight", "-1"), ("--carbon-weight", "1001")):
        refused = runner.invoke(xr, [*base, option, value])
        assert refused.exit_code == 2 and option in refused.output
        assert refused.exception is None or isinstance(refused.exception, SystemExit)
    assert len(submitted) == 2


def test_job__submit_ls_show_cancel_watch_logs(run: Callable[..., Ran]) -> None:
    submitted = run(
        "job",
        "submit",
        "cli-train",
        "--entrypoint",
        "tests.node.executor.fake_jobs:run_until_stopped",
    )
    assert submitted.code == 0
    job_id = submitted.out.strip()
    run("job", "submit", "cli-array", "--entrypoint", "pkg.mod:fn", "--array", "3", "--gpus", "1")
    listed = run("job", "ls", "--json").json()
    assert job_id in [item["job_id"] for item in listed["items"]]
    assert job_id in run("job", "ls").out
    shown = run("job", "show", job_id, "--json").json()
    assert shown["name"] == "cli-train" and len(shown["tasks"]) == 1
    assert shown["spec"]["entrypoint"] == "tests.node.executor.fake_jobs:run_until_stopped"
    assert (shown["spec"]["cost_weight"], shown["spec"]["gpus"]) == (None, 0)
    human = run("job", "show", job_id).out
    assert "weights:" in human and "price the tenant's, carbon the tenant's" in human
    green = run(
        "job",
        "submit",
        "cli-green",
        "--entrypoint",
        "pkg.mod:fn",
        "--gpus",
        "2",
        "--cost-weight",
        "0",
        "--carbon-weight",
        "2.5",
    ).out.strip()
    human = run("job", "show", green).out
    assert "price 0, carbon 2.5" in human and "2 GPUs" in human and "pkg.mod:fn" in human
    hello = run(
        "job", "submit", "cli-hello", "--entrypoint", "tests.node.executor.fake_jobs:succeed"
    ).out.strip()
    deadline_s = time.monotonic() + 60
    while run("job", "show", hello, "--json").json()["state"] != "succeeded":
        assert time.monotonic() < deadline_s, "the job did not succeed"
        time.sleep(0.1)
    logs = run("job", "logs", hello)
    assert logs.code == 0 and "hello from task 0 attempt 1" in logs.out
    assert run("job", "logs", hello, "--json").json()["attempt"] == 1
    cancelled = run("job", "cancel", job_id, "--reason", "test")
    assert cancelled.code == 0
    assert run("job", "show", job_id, "--json").json()["state"] == "cancelled"
    assert job_id in [
        item["job_id"]
        for item in run("job", "ls", "--state", "cancelled", "--json").json()["items"]
    ]
    again = run("job", "cancel", job_id)
    assert again.code == 1 and again.err.startswith("xr: job.invalid_transition: ")
    watched = run("job", "watch", job_id)
    assert watched.code == 1
    assert f"job {job_id}: cancelled" in watched.out
    assert watched.err.startswith("xr: job.cancelled: ")
    missing = run("job", "show", "job-does-not-exist")
    assert missing.code == 1 and missing.err.startswith("xr: not_found: ")


def test_region__ls_and_show(run: Callable[..., Ran]) -> None:
    regions = _eventually(
        lambda: len(items := run("region", "ls", "--json").json()["items"]) == 3 and items,
        "all three regions registered",
    )
    assert sorted(item["name"] for item in regions) == ["r0", "r1", "r2"]
    assert run("region", "ls").out.splitlines()[0].split()[:2] == ["REGION", "HEALTHY"]
    assert run("region", "show", "r1", "--json").json()["name"] == "r1"
    missing = run("region", "show", "nowhere")
    assert missing.code == 1 and missing.err.startswith("xr: not_found: ")


def test_cluster__status_members_transfer_leader(run: Callable[..., Ran]) -> None:
    status = run("cluster", "status", "--json").json()["endpoints"]
    assert len(status) == 3 and all("error" not in row for row in status)
    assert {row["version"] for row in status} == {package_version("xr")}
    shown = run("cluster", "status")
    assert shown.out.splitlines()[0].split()[-1] == "VERSION"
    assert package_version("xr") in shown.out.splitlines()[1] and shown.err == ""
    members = run("cluster", "members", "--json").json()["items"]
    assert sorted(member["region"] for member in members) == ["r0", "r1", "r2"]
    leader = next(row["region"] for row in status if row["state"] == "leader")
    target = next(name for name in ("r0", "r1", "r2") if name != leader)
    moved = run("cluster", "transfer-leader", target)
    assert moved.code == 0 and moved.out == f"{target} is now the leader\n"

    def leader_is_target() -> bool:
        rows = run("cluster", "status", "--json").json()["endpoints"]
        return any(row.get("state") == "leader" and row["region"] == target for row in rows)

    _eventually(leader_is_target, f"{target} leads")
    missing = run("cluster", "transfer-leader", "nowhere")
    assert missing.code == 1 and missing.err.startswith("xr: not_found: ")


def _a_base_port_of_two_regions_whose_first_is_taken() -> tuple[socket.socket, int]:
    """A listening socket on a port below the kernel's ephemeral range, whose neighbours that
    `xr up --regions 2` uses are free. From the ephemeral range (port 0) the next port was
    sometimes taken, by a connection of a test running beside this one, and the other region
    failed first."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for base in range(low - 2 * (RAFT_PORT_OFFSET + 2), 1024, -(RAFT_PORT_OFFSET + 2)):
        taken = socket.socket()
        try:
            taken.bind(("127.0.0.1", base))
            for port in (base + 1, base + RAFT_PORT_OFFSET, base + RAFT_PORT_OFFSET + 1):
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", port))
        except OSError:
            taken.close()
            continue
        taken.listen()
        return taken, base
    raise AssertionError("no free ports below the ephemeral range")


def test_up__a_node_that_cannot_start_shows_its_log_and_stops_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A port taken after `xr up` found it free (a race no check can close; a taken port is
    refused before any node starts) stands for any failure of a node at start."""
    monkeypatch.setattr("node.up._check_ports_free", lambda *arguments, **keywords: None)
    taken, port = _a_base_port_of_two_regions_whose_first_is_taken()
    lines: list[str] = []
    with taken:
        base_dir = tmp_path / "failing"
        options = UpOptions(region_names=["r0", "r1"], base_dir=base_dir, base_port=port)
        assert run_up(options, echo=lines.append, warn=lines.append) == 1
    assert "xr up: region r0 exited with code 1 at start" in lines
    assert "address already in use" in "\n".join(lines)
    assert _processes_under(base_dir) == []


def test_up__raft_is_authenticated_with_a_secret_it_makes_and_a_stranger_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without a secret a stranger on the host that gave a member's address was taken for it:
    the member answered it, and one `request_vote` of term 2**64 - 1 left that member a candidate
    for good, at terms past 2**64 that no other member takes (seen: 2**64 + 7); one to each
    member stops the cluster. `xr up` now makes a secret; the stranger's plain frames fail it."""
    base_dir = tmp_path / "cluster"
    cluster = UpProcess(base_dir, "--regions", "3")
    try:
        assert cluster.printed_endpoints.wait(UP_READY_S), cluster.output()
        secret = base_dir / SECRET_FILE
        assert stat.S_IMODE(secret.stat().st_mode) == 0o600
        assert len(secret.read_text().strip()) >= 32
        assert f"Raft traffic is authenticated with the secret in {secret}" in cluster.lines
        raft_ports = json.loads((base_dir / STATE_FILE).read_text())["raft_ports"]
        member = f"127.0.0.1:{raft_ports[1]}"
        vote = {"type": "request_vote", "term": (1 << 64) - 1}
        vote.update(last_log_index=1 << 40, last_log_term=(1 << 64) - 1)
        with socket.create_connection(("127.0.0.1", raft_ports[0])) as stranger:
            stranger.sendall(b"".join(plain_frame(message) for message in (member, vote)))
            stranger.settimeout(10)
            # Closed unanswered: the frame is not a Fernet token.
            with contextlib.suppress(ConnectionResetError):
                assert stranger.recv(1024) == b""
        assert main(["kv", "put", "after", "v", "--endpoints", cluster.endpoints]) == 0
        capsys.readouterr()
        assert main(["cluster", "status", "--json", "--endpoints", cluster.endpoints]) == 0
        rows = json.loads(capsys.readouterr().out)["endpoints"]
        assert max(row["term"] for row in rows) < 1000, rows
    finally:
        cluster.kill()


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        ("nosuch=1", "unknown setting 'nosuch'"),
        ("raft.durability=maybe", "raft.durability"),
        ("http.wait_max_s=nan", "http.wait_max_s"),
        # One value for every region: they would share one data directory (and journal).
        ("data_dir=/tmp/xr-shared", "data_dir: xr up gives each region its own (under --dir)"),
        ("raft.address=127.0.0.1:7001", "raft.address: xr up gives each region its own"),
    ],
)
def test_up__a_bad_setting_exits_two_before_any_node_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], setting: str, named: str
) -> None:
    """Each node used to start, fail on the setting and show its log (exit 1)."""
    base_dir = tmp_path / "cluster"
    assert main(["up", "--regions", "2", "--dir", str(base_dir), "--set", setting]) == 2
    error = capsys.readouterr().err
    assert error.startswith("xr: up.invalid: invalid setting: ") and named in error
    assert list(base_dir.iterdir()) == []


@pytest.mark.parametrize("where", ["under a file", "/proc"])
def test_up_and_demo__a_dir_that_cannot_be_used_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    """Both gave a traceback: NotADirectoryError from mkdir under a file, FileNotFoundError
    writing into /proc (a directory in which no file can be made)."""
    a_file = tmp_path / "file"
    a_file.write_text("")
    directory = a_file / "cluster" if where == "under a file" else Path(where)
    assert main(["up", "--regions", "1", "--dir", str(directory)]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"xr: up.invalid: --dir {directory} cannot be used: ")
    assert main(["demo", "--dir", str(directory)]) == 1
    error = capsys.readouterr().err
    assert error.startswith(f"xr demo: --dir {directory} cannot be used: ")


def test_up__ctrl_c_stops_every_node_and_exits_zero(up: UpProcess) -> None:
    pids = up.pids
    up.process.send_signal(signal.SIGINT)
    assert up.wait() == 0
    assert "stopped r0 (0), r1 (0), r2 (0)" in up.lines
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert _processes_under(up.base_dir) == []
    assert (up.base_dir / "r0.log").exists()


def _read_in_time(fifo: Path, read: Callable[[], Any]) -> Any:
    """`read()` of a named pipe that nobody writes to, in a thread: what it returned. A read that
    waits for a writer fails the test (after a writer is let in to end the wait)."""
    outcome: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: outcome.setdefault("value", read()), daemon=True)
    thread.start()
    thread.join(timeout=10)
    if thread.is_alive():
        os.close(os.open(fifo, os.O_WRONLY))
        thread.join(timeout=10)
        pytest.fail("the read waited for a writer on the named pipe")
    return outcome["value"]


def test_files__a_named_pipe_nobody_writes_to_reads_as_empty_at_once(tmp_path: Path) -> None:
    """A path to a named pipe (a FIFO) that nobody writes to made every configuration, token,
    secret and certificate reader wait for a writer forever, `xr` and `xr node run` alike; it
    now reads as empty at once, which each reader refuses as it refuses an empty file."""
    from node.files import CONFIG_BYTES_MAX, read_bounded
    from xrcore.client._transport import _read

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert _read_in_time(fifo, lambda: read_bounded(fifo, CONFIG_BYTES_MAX)) == b""
    assert _read_in_time(fifo, lambda: _read("ca_file", str(fifo))) == b""


def test_files__a_pipe_with_a_writer_is_read_to_its_end(tmp_path: Path) -> None:
    # A shell's `--token-file <(command)`: a pipe whose writer is there and writes later.
    from node.files import SECRET_BYTES_MAX, read_bounded

    reader, writer = os.pipe()
    path = f"/proc/self/fd/{reader}"

    def write_late() -> None:
        time.sleep(0.05)
        os.write(writer, b"a-token\n")
        os.close(writer)

    threading.Thread(target=write_late, daemon=True).start()
    try:
        assert read_bounded(path, SECRET_BYTES_MAX) == b"a-token\n"
    finally:
        os.close(reader)


def test_node_run__check_reads_the_tokens_file_and_checks_the_paths_it_writes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--check` said "configuration is valid" for a tokens file that did not exist, an audit
    log path naming a device or a directory, and a data directory that was a file, all of
    which `run` then refused (or, for a device, rotated it away)."""
    node = ["node", "run", "--check", "--region", "a", "--raft-address", "127.0.0.1:7001"]
    data_dir = tmp_path / "data"
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    device = tmp_path / "null"
    device.symlink_to("/dev/null")
    cases = [
        (["--set", f"auth.tokens_file={tmp_path / 'nope'}"], "setting auth.tokens_file"),
        (["--set", f"audit.path={device}"], "setting audit.path: " + str(device)),
        (["--set", f"audit.path={tmp_path}"], "not a regular file"),
        (["--data-dir", str(a_file)], "setting data_dir: " + str(a_file)),
    ]
    for extra, said in cases:
        arguments = [*node, "--data-dir", str(data_dir), *extra]
        assert main(arguments) == 2, extra
        error = capsys.readouterr().err
        assert error.startswith("xr node run: invalid configuration: ") and said in error, error
    assert main([*node, "--data-dir", str(data_dir)]) == 0


def test_audit_log__a_path_that_is_not_a_regular_file_is_refused(tmp_path: Path) -> None:
    # Rotation renames the log: with a device as the path it would move the device away.
    from node.api.audit import AuditLog
    from raftstore.clock import RealClock

    device = tmp_path / "null"
    device.symlink_to("/dev/null")
    with pytest.raises(OSError, match="not a regular file"):
        AuditLog(device, bytes_max=4096, files_max=2, clock=RealClock())
    assert os.path.exists("/dev/null") and not (tmp_path / "null.1").exists()
