"""`xr-jepsen` on bad input: a one-line error and exit code 2 (a usage error) or 1 (a failure),
never a traceback, a hang, a run over an earlier run's files or a cluster started for nothing."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from click.testing import CliRunner, Result

import xr_jepsen.runner
from xr_jepsen.cli import cli, main
from xr_jepsen.history import HistoryRecorder

HISTORIES = Path(__file__).parent / "histories"
OP = '{"index":0,"type":"invoke","f":"write","process":0,"value":1,"time_ns":0}\n'


def _invoke(*arguments: str) -> Result:
    return CliRunner().invoke(cli, list(arguments))


def _refused(answer: Result, exit_code: int, *words: str) -> None:
    assert answer.exit_code == exit_code, answer.output
    assert isinstance(answer.exception, SystemExit), answer.exception
    assert "Traceback" not in answer.output
    error = [line for line in answer.output.splitlines() if line.startswith("Error:")]
    assert len(error) == 1, answer.output
    for word in words:
        assert word in error[0]


@pytest.mark.parametrize(
    ("text", "words"),
    [
        (b"root:x:0:0:root:/root:/bin/bash\n", ["line 1", "not JSON"]),
        (b"\xff\xfe\n", ["line 1", "not UTF-8"]),
        (OP + '{"index":1,"type":"ok","f":"wr', ["line 2", "not JSON"]),
        (b"[1, 2]\n", ["line 1", "JSON object"]),
        (OP.replace('"value":1,', ""), ["missing field 'value'"]),
        (OP.replace('"process":0', '"process":"a"'), ["process must be an integer"]),
        (OP.replace("invoke", "ok"), ["no outstanding invoke"]),
        (OP.replace('"value":1', '"value":NaN'), ["NaN"]),
        (OP.replace('"value":1', '"value":1e999'), ["too large"]),
        (b"[" * 100_000 + b"\n", ["nested too deeply"]),
        (
            # An unhashable token was a TypeError traceback and exit 1 ("anomaly found").
            '{"index":0,"type":"invoke","f":"enqueue","process":0,"value":"j1","time_ns":0}\n'
            '{"index":1,"type":"ok","f":"enqueue","process":0,"value":"j1","time_ns":1}\n'
            '{"index":2,"type":"invoke","f":"complete","process":1,'
            '"value":{"key":"j1","token":[1]},"time_ns":2}\n'
            '{"index":3,"type":"ok","f":"complete","process":1,'
            '"value":{"key":"j1","token":[1]},"time_ns":3}\n',
            ["op 2", "token must be an integer or null"],
        ),
        (
            '{"index":0,"type":"invoke","f":"acquire","process":0,"value":{"lock":"l"},'
            '"time_ns":0}\n'
            '{"index":1,"type":"ok","f":"acquire","process":0,'
            '"value":{"lock":"l","token":"7"},"time_ns":1}\n',
            ["op 1", "token must be an integer"],
        ),
        (
            OP.replace('"write"', '"cas"').replace("1,", '"x",')
            + OP.replace("invoke", "ok")
            .replace('"index":0', '"index":1')
            .replace('"write"', '"cas"'),
            ["cas value"],
        ),
    ],
)
def test_check__a_bad_history_is_a_one_line_usage_error(
    tmp_path: Path, text: str | bytes, words: list[str]
) -> None:
    history = tmp_path / "history.jsonl"
    if isinstance(text, str):
        history.write_text(text)
    else:
        history.write_bytes(text)
    _refused(_invoke("check", str(history)), 2, "HISTORY", *words)


@pytest.mark.parametrize(
    ("history", "workload", "words"),
    [
        (None, "register", ["the history is empty"]),
        (None, None, ["the history is empty"]),
        ("register_sequential.valid.jsonl", "locks", ["no operation of the locks workload"]),
        ("lock_fenced_handover.valid.jsonl", "queue", ["no operation of the queue workload"]),
        ("queue_exactly_once.valid.jsonl", "set", ["no operation of the set workload (add)"]),
    ],
)
def test_check__a_history_with_nothing_to_judge_is_not_valid(
    tmp_path: Path, history: str | None, workload: str | None, words: list[str]
) -> None:
    # Both were exit 0 "valid": the checker found no anomaly among operations it never judged.
    path = tmp_path / "history.jsonl"
    path.write_text("" if history is None else (HISTORIES / history).read_text())
    arguments = ["check", str(path)] + ([] if workload is None else ["--workload", workload])
    _refused(_invoke(*arguments), 2, *words)


def _run_dir(tmp_path: Path) -> Path:
    """A small run directory, as `xr-jepsen run` leaves it (less the nodes)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    ticks = iter(range(0, 10**12, 10**8))
    recorder = HistoryRecorder(clock=lambda: next(ticks), stream_path=run_dir / "history.jsonl")
    write = recorder.invoke(0, "write", 1, key="register/k0")
    recorder.nemesis({"phase": "start", "fault": "kill", "nodes": ["n1"]})
    recorder.complete(write, "ok", 1)
    recorder.close()
    results = {
        "workload": "register",
        "nemesis": "kill",
        "verdict": "valid",
        "check": {"valid": True, "anomalies": [], "window": None},
        "mechanism": {},
        "nemesis_events": [],
        "test_faults": [],
    }
    (run_dir / "results.json").write_text(json.dumps(results))
    (run_dir / "status.jsonl").write_text('{"time_ns": 0, "node": "n0", "state": "leader"}\n')
    return run_dir


def test_report__rebuilds_the_report_of_a_good_run_directory(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path)
    answer = _invoke("report", str(run_dir))
    assert answer.exit_code == 0, answer.output
    assert (run_dir / "report.html").read_text().startswith("<!DOCTYPE html>")


def _results(**changes: Any) -> str:
    results: dict[str, Any] = {"workload": "register", "check": {}}
    results.update(changes)
    return json.dumps(results)


@pytest.mark.parametrize(
    ("name", "text", "words"),
    [
        ("results.json", None, ["no results.json"]),
        ("results.json", "", ["results.json", "not JSON"]),
        ("results.json", '{"workload": "regis', ["results.json", "not JSON"]),
        ("results.json", b"\xff", ["results.json", "not UTF-8"]),
        ("results.json", "[" * 100_000, ["results.json", "nested too deeply"]),
        ("results.json", "[]", ["results.json", "not a JSON object"]),
        ("results.json", _results(workload=None), ["unknown workload"]),
        ("results.json", _results(workload="zzz"), ["unknown workload 'zzz'"]),
        ("results.json", _results(check="x"), ["check must be an object"]),
        ("results.json", _results(mechanism=5), ["mechanism must be an object"]),
        ("results.json", _results(nemesis_events=5), ["nemesis_events must be a list"]),
        ("results.json", _results(test_faults=[1]), ["test_faults"]),
        ("results.json", _results(check={"anomalies": [1]}), ["check.anomalies"]),
        ("results.json", _results(check={"window": [[1], 2]}), ["check.window"]),
        ("history.jsonl", None, ["no history.jsonl"]),
        ("history.jsonl", "zz\n", ["history.jsonl: line 1: not JSON"]),
        ("history.jsonl", b"\xff\n", ["history.jsonl: line 1: not UTF-8"]),
        ("history.jsonl", OP.replace("invoke", "ok"), ["history.jsonl", "no outstanding invoke"]),
        ("status.jsonl", "zz\n", ["status.jsonl line 1", "not JSON"]),
        ("status.jsonl", b"\xff\n", ["status.jsonl is not UTF-8"]),
        ("status.jsonl", "[1]\n", ["status.jsonl line 1"]),
        ("status.jsonl", '{"node": "n0"}\n', ["status.jsonl line 1"]),
        ("status.jsonl", '{"node": 5, "time_ns": "x"}\n', ["status.jsonl line 1"]),
        ("status.jsonl", '{"node": "n0", "time_ns": 1e300}\n', ["status.jsonl line 1"]),
    ],
)
def test_report__a_missing_or_corrupt_file_is_a_one_line_usage_error(
    tmp_path: Path, name: str, text: str | bytes | None, words: list[str]
) -> None:
    run_dir = _run_dir(tmp_path)
    path = run_dir / name
    path.unlink()
    if isinstance(text, str):
        path.write_text(text)
    elif isinstance(text, bytes):
        path.write_bytes(text)
    _refused(_invoke("report", str(run_dir)), 2, "RUN_DIR", *words)
    assert not (run_dir / "report.html").exists()


@pytest.mark.parametrize("name", ["results.json", "history.jsonl", "status.jsonl"])
def test_report__a_directory_where_a_file_belongs_is_a_one_line_error(
    tmp_path: Path, name: str
) -> None:
    run_dir = _run_dir(tmp_path)
    (run_dir / name).unlink()
    (run_dir / name).mkdir()
    _refused(_invoke("report", str(run_dir)), 2, f"cannot read {name}: Is a directory")


def test_report__an_unwritable_report_is_a_one_line_failure(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path)
    (run_dir / "report.html").mkdir()
    _refused(_invoke("report", str(run_dir)), 1, "cannot write", "report.html")


def test_report__a_huge_time_has_a_bounded_number_of_axis_labels(tmp_path: Path) -> None:
    # The time axis had a label every 5 s up to the last op's time: 2e20 labels (a hang) for
    # 10**30 ns. 10**15 ns (200,000 labels before the fix) shows it without risking a hang.
    run_dir = _run_dir(tmp_path)
    lines = (run_dir / "history.jsonl").read_text().splitlines()
    last = json.loads(lines[-1])
    last["time_ns"] = 10**15
    (run_dir / "history.jsonl").write_text("\n".join([*lines[:-1], json.dumps(last)]) + "\n")
    answer = _invoke("report", str(run_dir))
    assert answer.exit_code == 0, answer.output
    assert (run_dir / "report.html").read_text().count(" s</text>") <= 1001


def test_report__nemesis_nodes_that_are_not_strings_are_drawn(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path)
    history = (run_dir / "history.jsonl").read_text()
    (run_dir / "history.jsonl").write_text(history.replace('"nodes":["n1"]', '"nodes":[1,2]'))
    answer = _invoke("report", str(run_dir))
    assert answer.exit_code == 0, answer.output
    assert "kill 1,2" in (run_dir / "report.html").read_text()


@pytest.fixture
def no_runs(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Replaces the runner: the commands here must refuse before a cluster starts."""
    started: list[Any] = []

    def run(config: Any, **_: Any) -> dict[str, Any]:
        started.append(config)
        raise AssertionError(f"a run started: {config}")

    monkeypatch.setattr(xr_jepsen.runner, "run", run)
    return started


RUN = ("run", "--workload", "register", "--no-namespaces", "--nodes", "1", "--time", "1")


def test_run__an_empty_dir_is_refused(no_runs: list[Any]) -> None:
    _refused(_invoke(*RUN, "--dir", ""), 2, "--dir", "must not be empty")
    assert not no_runs


def test_run__a_dir_that_holds_an_earlier_run_is_refused(
    tmp_path: Path, no_runs: list[Any]
) -> None:
    # A run there overwrote the earlier history and started its nodes on the earlier data.
    run_dir = _run_dir(tmp_path)
    before = (run_dir / "history.jsonl").read_bytes()
    _refused(_invoke(*RUN, "--dir", str(run_dir)), 2, "--dir", "not empty")
    assert (run_dir / "history.jsonl").read_bytes() == before
    assert not no_runs


def test_run__a_dir_under_a_file_is_refused(tmp_path: Path, no_runs: list[Any]) -> None:
    (tmp_path / "file").write_text("")
    _refused(_invoke(*RUN, "--dir", str(tmp_path / "file" / "run")), 2, "Not a directory")
    assert not no_runs


def test_run__a_bad_setting_is_refused_before_the_run_dir_is_made(
    tmp_path: Path, no_runs: list[Any]
) -> None:
    # The run directory was made first, and left behind empty.
    _refused(_invoke(*RUN, "--set", "foo", "--dir", str(tmp_path / "run")), 2, "NAME=VALUE")
    assert not (tmp_path / "run").exists()
    assert not no_runs


@pytest.mark.parametrize(
    ("nemesis", "nodes", "time_s", "words"),
    [
        # No fault fits in 6 s: 2 s of quiet, 3 s of fault and 1 s of tail at the least.
        ("pause", "3", "6", ["can inject no fault in 6 s", "--time over 6"]),
        ("clock-jump", "1", "5.5", ["can inject no fault"]),
        # On 1 or 2 nodes a partition cuts nothing off and a minority is the only node or half.
        ("partition-one", "2", "30", ["needs at least 3 nodes"]),
        ("kill", "1", "30", ["needs at least 3 nodes"]),
        ("mixed", "2", "30", ["needs at least 3 nodes"]),
    ],
)
def test_run__a_nemesis_that_could_inject_no_fault_is_refused(
    tmp_path: Path, no_runs: list[Any], nemesis: str, nodes: str, time_s: str, words: list[str]
) -> None:
    # Such runs were reported valid under the nemesis's name with 0 faults.
    run_dir = tmp_path / "run"
    arguments = ("run", "--workload", "set", "--nemesis", nemesis, "--nodes", nodes)
    _refused(_invoke(*arguments, "--time", time_s, "--dir", str(run_dir)), 2, *words)
    assert not run_dir.exists()
    assert not no_runs


def test_matrix__a_time_too_short_for_any_fault_is_refused_before_any_run(
    tmp_path: Path, no_runs: list[Any]
) -> None:
    arguments = ("matrix", "--workloads", "set,locks", "--nemeses", "pause,clock-jump")
    answer = _invoke(*arguments, "--nodes", "3", "--time", "6", "--dir", str(tmp_path / "m"))
    _refused(answer, 2, "'pause' can inject no fault in 6 s")
    assert not (tmp_path / "m").exists()
    assert not no_runs


def test_run__clock_faults_on_one_node_are_not_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    configs: list[Any] = []

    def run(config: Any, **_: Any) -> dict[str, Any]:
        configs.append(config)
        return _run_results(faults=1)

    monkeypatch.setattr(xr_jepsen.runner, "run", run)
    arguments = ("run", "--workload", "locks", "--nemesis", "clock-jump", "--nodes", "1")
    answer = _invoke(*arguments, "--time", "10", "--dir", str(tmp_path / "run"))
    assert answer.exit_code == 0, answer.output
    assert [(config.nemesis, config.nodes) for config in configs] == [("clock-jump", 1)]


@pytest.mark.parametrize(("verdict", "exit_code"), [("valid", 143), ("invalid", 1)])
def test_run__stopped_by_sigterm_exits_143_unless_an_anomaly_was_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, verdict: str, exit_code: int
) -> None:
    # A run SIGTERM cut short exited 0 "valid", as if it had run its whole time.
    def run(config: Any, **_: Any) -> dict[str, Any]:
        return _run_results(verdict, stopped_by="SIGTERM", command="xr-jepsen run")

    monkeypatch.setattr(xr_jepsen.runner, "run", run)
    answer = _invoke(*RUN, "--dir", str(tmp_path / "run"))
    assert answer.exit_code == exit_code, answer.output
    assert f"stopped early by SIGTERM; verdict on what ran: {verdict}" in answer.output
    assert '"stopped_by": "SIGTERM"' in answer.output


def test_run__a_cluster_that_does_not_start_is_a_one_line_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def run(config: Any, **_: Any) -> dict[str, Any]:
        raise RuntimeError("node n0 exited with 2:\nxr node run: unknown setting 'foo'")

    monkeypatch.setattr(xr_jepsen.runner, "run", run)
    answer = _invoke(*RUN, "--set", "foo=bar", "--dir", str(tmp_path / "run"))
    assert answer.exit_code == 2, answer.output
    assert isinstance(answer.exception, SystemExit)
    assert "Traceback" not in answer.output
    assert "the run failed: node n0 exited with 2" in answer.output


def test_run__an_unexpected_error_is_one_line_with_its_traceback_in_the_run_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # It was a traceback and exit 1, which says the history holds an anomaly.
    def run(config: Any, **_: Any) -> dict[str, Any]:
        raise KeyError("ops")

    monkeypatch.setattr(xr_jepsen.runner, "run", run)
    answer = _invoke(*RUN, "--dir", str(tmp_path / "run"))
    assert answer.exit_code == 2, answer.output
    assert isinstance(answer.exception, SystemExit)
    assert "Traceback" not in answer.output
    assert "the run failed: KeyError: 'ops' (traceback in " in answer.output
    assert (tmp_path / "run" / "error.txt").read_text().startswith("Traceback")


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--workloads", ""),
        ("--workloads", "zzz"),
        ("--workloads", "register,"),
        ("--nemeses", "kill,,pause"),
        ("--nemeses", "\udcff"),
    ],
)
def test_matrix__unknown_names_are_refused_before_any_run(
    tmp_path: Path, no_runs: list[Any], option: str, value: str
) -> None:
    answer = _invoke("matrix", option, value, "--time", "1", "--dir", str(tmp_path / "m"))
    _refused(answer, 2, option, "is not one of")
    assert not no_runs


def test_matrix__a_dir_with_earlier_runs_is_refused_before_any_run(
    tmp_path: Path, no_runs: list[Any]
) -> None:
    runs_dir = tmp_path / "m"
    shutil.copytree(_run_dir(tmp_path), runs_dir / "register-kill")
    answer = _invoke(
        "matrix", "--workloads", "register", "--nemeses", "kill", "--dir", str(runs_dir)
    )
    _refused(answer, 2, "--dir", "not empty")
    assert not no_runs


def _run_results(verdict: str = "valid", **changes: Any) -> dict[str, Any]:
    return {
        "ops": {"total": 10, "info": 0},
        "faults": 2,
        "anomalies": 0,
        "verdict": verdict,
        **changes,
    }


MATRIX = ("matrix", "--workloads", "register,set", "--nemeses", "kill,pause", "--time", "10")


def _matrix(runs_dir: Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((runs_dir / "matrix.json").read_text())
    return document


def test_matrix__writes_matrix_json_after_every_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A matrix takes tens of minutes and wrote matrix.json only at its end.
    runs_dir = tmp_path / "m"
    seen: list[dict[str, Any]] = []

    def run(config: Any, **_: Any) -> dict[str, Any]:
        seen.append(_matrix(runs_dir))
        return _run_results()

    monkeypatch.setattr(xr_jepsen.runner, "run", run)
    answer = _invoke(*MATRIX, "--dir", str(runs_dir))
    assert answer.exit_code == 0, answer.output
    assert [len(document["rows"]) for document in seen] == [0, 1, 2, 3]
    assert not any(document["complete"] for document in seen)
    final = _matrix(runs_dir)
    assert final["complete"] is True
    assert [row["run"] for row in final["rows"]] == [
        "register/kill",
        "register/pause",
        "set/kill",
        "set/pause",
    ]
    assert "run 4 of 4" in answer.output
    assert final["rows"][0]["faults"] == 2
    assert answer.output.splitlines()[-6].split()[:4] == ["RUN", "OPS", "INFO", "FAULTS"]
    assert not [path for path in runs_dir.iterdir() if path.name.startswith(".")]


def test_matrix__an_unexpected_error_in_one_run_is_its_row_and_the_matrix_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Only RuntimeError became a row: any other exception was a traceback that ended the matrix.
    runs_dir = tmp_path / "m"

    def run(config: Any, **_: Any) -> dict[str, Any]:
        if (config.workload, config.nemesis) == ("register", "pause"):
            raise KeyError("ops")
        return _run_results()

    monkeypatch.setattr(xr_jepsen.runner, "run", run)
    answer = _invoke(*MATRIX, "--dir", str(runs_dir))
    assert answer.exit_code == 2, answer.output
    assert isinstance(answer.exception, SystemExit)
    assert "Traceback" not in answer.output
    rows = _matrix(runs_dir)["rows"]
    assert [row["verdict"] for row in rows] == ["valid", "error", "valid", "valid"]
    assert rows[1]["error"].startswith("KeyError: 'ops' (traceback in ")
    assert "register/pause: error: KeyError: 'ops'" in answer.output
    error = (runs_dir / "register-pause" / "error.txt").read_text()
    assert error.startswith("Traceback") and "KeyError: 'ops'" in error
    assert _matrix(runs_dir)["complete"] is True


def test_matrix__an_invalid_run_outranks_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def run(config: Any, **_: Any) -> dict[str, Any]:
        if config.nemesis == "pause":
            raise RuntimeError("node n0 exited with 2:\nmore")
        return _run_results("invalid" if config.workload == "set" else "valid")

    monkeypatch.setattr(xr_jepsen.runner, "run", run)
    answer = _invoke(*MATRIX, "--dir", str(tmp_path / "m"))
    assert answer.exit_code == 1, answer.output
    assert "register/pause: error: RuntimeError: node n0 exited with 2" in answer.output


def test_matrix__ctrl_c_stops_it_and_keeps_the_finished_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs_dir = tmp_path / "m"
    started: list[str] = []

    def run(config: Any, **_: Any) -> dict[str, Any]:
        started.append(f"{config.workload}/{config.nemesis}")
        if len(started) == 3:
            raise KeyboardInterrupt
        return _run_results()

    monkeypatch.setattr(xr_jepsen.runner, "run", run)
    assert main([*MATRIX, "--dir", str(runs_dir)]) == 130
    assert started == ["register/kill", "register/pause", "set/kill"]
    document = _matrix(runs_dir)
    assert [row["run"] for row in document["rows"]] == ["register/kill", "register/pause"]
    assert document["complete"] is False
    assert document["stopped_by"] == "Ctrl-C"


def test_matrix__a_run_that_sigterm_shortened_ends_the_matrix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # SIGTERM ends the run it lands in early; the matrix went on to the next run.
    runs_dir = tmp_path / "m"
    started: list[str] = []

    def run(config: Any, **_: Any) -> dict[str, Any]:
        started.append(config.nemesis)
        return _run_results(stopped_by="SIGTERM")

    monkeypatch.setattr(xr_jepsen.runner, "run", run)
    answer = _invoke(*MATRIX, "--dir", str(runs_dir))
    assert answer.exit_code == 143, answer.output
    assert started == ["kill"]
    document = _matrix(runs_dir)
    assert document["complete"] is False
    assert document["stopped_by"] == "SIGTERM"
    assert document["rows"][0]["stopped_by"] == "SIGTERM"


def test_run__sigterm_is_recorded_as_what_stopped_the_run() -> None:
    # The matrix reads it from the results to stop after the run that SIGTERM shortened.
    state = SimpleNamespace(stopping=asyncio.Event(), stopped_by=None)

    async def signalled() -> None:
        xr_jepsen.runner._stop_on_signals(asyncio.get_running_loop(), cast(Any, state))
        os.kill(os.getpid(), signal.SIGTERM)
        await state.stopping.wait()

    asyncio.run(signalled())
    assert state.stopped_by == "SIGTERM"


def _in_time(fifo: Path, call: Any, *, unblock_flags: int) -> Any:
    """`call()` in a thread; one that waits on the named pipe `fifo` fails the test (after the
    other end is opened with `unblock_flags` to end the wait)."""
    import threading

    outcome: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: outcome.setdefault("value", call()), daemon=True)
    thread.start()
    thread.join(timeout=30)
    if thread.is_alive():
        os.close(os.open(fifo, unblock_flags))
        thread.join(timeout=10)
        pytest.fail(f"waited on the named pipe {fifo.name}")
    return outcome["value"]


def test_check__a_line_past_the_bound_is_refused_without_reading_it_all(
    tmp_path: Path,
) -> None:
    # /dev/zero, one endless line, was read until memory ran out (a MemoryError traceback).
    from xr_jepsen.history import LINE_BYTES_MAX

    history = tmp_path / "history.jsonl"
    history.write_bytes(b" " * (LINE_BYTES_MAX + 1) + b"\n")
    _refused(_invoke("check", str(history)), 2, "HISTORY", "line 1", "longer than")


def test_check__a_named_pipe_nobody_writes_to_is_an_empty_history(tmp_path: Path) -> None:
    from xr_jepsen.history import read_history

    fifo = tmp_path / "history.jsonl"
    os.mkfifo(fifo)
    assert _in_time(fifo, lambda: read_history(fifo), unblock_flags=os.O_WRONLY) == []


def test_report__an_input_past_the_bound_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import xr_jepsen.report

    run_dir = _run_dir(tmp_path)
    monkeypatch.setattr(xr_jepsen.report, "FILE_BYTES_MAX", 64)
    _refused(_invoke("report", str(run_dir)), 2, "results.json is larger than 64 bytes")


def test_report__a_named_pipe_as_the_report_is_refused(tmp_path: Path) -> None:
    from xr_jepsen.report import ReportError, write_report

    run_dir = _run_dir(tmp_path)
    fifo = run_dir / "report.html"
    os.mkfifo(fifo)

    def write() -> str:
        try:
            write_report(run_dir)
        except ReportError as error:
            return str(error)
        return "written"

    said = _in_time(fifo, write, unblock_flags=os.O_RDONLY | os.O_NONBLOCK)
    assert said == "report.html exists and is not a regular file"
