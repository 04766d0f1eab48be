"""The benchmark scripts refuse bad arguments with a usage error (exit 2, no traceback) before
any work starts: NaN passed the old `value <= 0` checks, some values had no check at all, and an
unwritable output path was found only when the run ended. The modules of bench/ that are not
scripts say so when run."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from bench._arguments import check_output_path, write_output
from tests.bench._script import ROOT, run_script


@pytest.mark.parametrize(
    ("script", "arguments"),
    [
        ("core_apply.py", ["--rounds", "0"]),
        ("core_apply.py", ["--entries", "-1"]),
        ("checker.py", ["--rounds", "0"]),
        ("checker.py", ["--sizes", "-5"]),
        ("api.py", ["--duration", "nan"]),
        ("api.py", ["--warmup", "nan"]),
        ("durability.py", ["--duration", "-1"]),
        ("durability.py", ["--duration", "nan"]),
        ("durability.py", ["--warmup", "inf"]),
        ("durability.py", ["--rounds", "0"]),
        ("raft_messages.py", ["--duration", "nan"]),
        ("raft_messages.py", ["--duration", "inf"]),
        ("raft_messages.py", ["--warmup", "nan"]),
        ("failover.py", ["--lease-ttl-s", "nan"]),
        ("failover.py", ["--steps", "0"]),
        ("gpu_check.py", ["--seconds", "nan"]),
        ("gpu_check.py", ["--gemm-n", "0"]),
        ("raftstore.py", ["--duration-s", "nan"]),
        ("raftstore.py", ["--concurrencies", "0"]),
        ("raftstore.py", ["--concurrencies", "x"]),
        ("durability.py", ["--concurrency", "abc"]),
        ("scheduler_pass.py", ["--against", "HEAD", "--pairs", "0"]),
        ("scheduler_pass.py", ["--against", "HEAD", "--tasks", "-1"]),
        ("overload.py", ["--duration", "nan"]),
        ("overload.py", ["--factor", "-1"]),
        ("overload.py", ["--members", "0"]),
        ("overload.py", ["--requests-in-flight-max", "0"]),
        ("scheduler.py", ["--hours", "nan"]),
        ("scheduler.py", ["--load", "inf"]),
        ("scheduler.py", ["--jobs", "-1"]),
        ("pickling.py", ["--puts", "0"]),
        ("pickling.py", ["--rounds", "x"]),
        ("sync_cost.py", ["--syncs", "0"]),
        ("sync_cost.py", ["--rounds", "-1"]),
        ("sync_cost.py", ["--dir", "no/such/directory"]),
    ],
)
def test_a_bad_argument_is_a_usage_error_before_any_work(script: str, arguments: list[str]) -> None:
    answer = run_script(script, *arguments)
    assert answer.returncode == 2, answer.stdout + answer.stderr
    assert "Traceback" not in answer.stderr
    last = answer.stderr.splitlines()[-1]
    assert "error:" in last
    # The message says what was expected, not a type's function name or a list of choices.
    assert "<lambda>" not in last and "invalid choice" not in last and "_concurrencies" not in last
    assert answer.stdout == ""


@pytest.mark.parametrize(
    ("script", "arguments", "expected"),
    [
        ("raftstore.py", ["--concurrencies", "x"], "expected whole numbers of at least 1"),
        ("durability.py", ["--concurrency", "abc"], "expected whole numbers of at least 1"),
        ("scheduler_pass.py", ["--against", "HEAD", "--pairs", "0"], "from 1 to 1,000"),
        ("scheduler_pass.py", ["--against", "HEAD", "--tasks", "-1"], "from 1 to 100,000"),
    ],
)
def test_a_bad_list_or_range_is_named_in_one_line(
    script: str, arguments: list[str], expected: str
) -> None:
    answer = run_script(script, *arguments)
    assert answer.returncode == 2
    assert expected in answer.stderr.splitlines()[-1]
    # The usage line and the error: no list of a thousand choices.
    assert len(answer.stderr) < 1_000, answer.stderr


def test_placement_view__help__describes_it_in_whole_sentences() -> None:
    answer = run_script("placement_view.py", "--help")
    assert answer.returncode == 0
    assert "with and without the bound on the pending tasks it looks at, in the same run." in (
        " ".join(answer.stdout.split())
    )


@pytest.mark.parametrize(
    ("script", "option", "where", "words"),
    [
        ("api.py", "--json", "missing/api.json", "does not exist"),
        ("api.py", "--json", ".", "is a directory"),
        ("durability.py", "--json", "missing/durability.json", "does not exist"),
        ("http_server.py", "--json", ".", "is a directory"),
        ("raft_messages.py", "--json", "file/raft_messages.json", "is not a directory"),
        ("pickling.py", "--json", ".", "is a directory"),
        ("run_all.py", "--out", "file/summary.md", "is not a directory"),
        ("run_all.py", "--out", ".", "is a directory"),
        ("scheduler.py", "--plot", "file/a/scheduler.png", "is not a directory"),
        # matplotlib chose the format from the ending: none wrote PATH.png, ".json" failed late.
        ("scheduler.py", "--plot", "scheduler", "must end in .png, .svg, .pdf"),
        ("scheduler.py", "--plot", "scheduler.json", "must end in .png, .svg, .pdf"),
        ("api.py", "--json", "pipe", "is a named pipe that nobody reads"),
        ("durability.py", "--json", "pipe", "is a named pipe that nobody reads"),
        ("scheduler.py", "--plot", "pipe.png", "is a named pipe that nobody reads"),
    ],
)
def test_an_output_path_that_cannot_be_written_is_a_usage_error_before_any_work(
    tmp_path: Path, script: str, option: str, where: str, words: str
) -> None:
    # The output was written only when the run ended, minutes later: its figures were lost
    # (and a named pipe that nobody reads made the run wait at its end forever).
    (tmp_path / "file").write_text("")
    os.mkfifo(tmp_path / "pipe")
    os.mkfifo(tmp_path / "pipe.png")
    answer = run_script(script, option, str(tmp_path / where))
    assert answer.returncode == 2, answer.stdout + answer.stderr
    assert "Traceback" not in answer.stderr
    last = answer.stderr.splitlines()[-1]
    assert "error:" in last and option in last and words in last
    assert answer.stdout == ""


def test_an_output_path_in_an_unwritable_directory_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The tests run as root, who may write anywhere, so the directory's mode would not show it:
    # os.access answers as it would for another user.
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    real_access = os.access
    monkeypatch.setattr(
        os, "access", lambda path, mode: Path(path) != locked and real_access(path, mode)
    )
    parser = argparse.ArgumentParser(prog="api.py")
    with pytest.raises(SystemExit) as exit_info:
        check_output_path(parser, "--json", locked / "api.json")
    assert exit_info.value.code == 2
    check_output_path(parser, "--json", tmp_path / "api.json")


@pytest.mark.parametrize(
    "name", sorted(path.name for path in (ROOT / "bench").glob("*.py") if path.stem != "__init__")
)
def test_every_file_in_bench_answers_help_or_says_which_script_it_belongs_to(name: str) -> None:
    # The library modules (scheduler_sim.py, _load.py) failed with ModuleNotFoundError.
    answer = run_script(name, "--help")
    assert "Traceback" not in answer.stderr, answer.stderr
    if answer.returncode == 0:
        assert answer.stdout.startswith("usage:"), answer.stdout
    else:
        assert answer.returncode == 2, answer.stderr
        assert answer.stdout == ""
        [line] = answer.stderr.splitlines()
        assert f"bench/{name} is " in line and "not a script: run " in line


def test_a_named_pipe_that_is_read_is_a_good_output(tmp_path: Path) -> None:
    # `--json /dev/stdout` piped to another program: the pipe has a reader.
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    reader = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)
    try:
        check_output_path(argparse.ArgumentParser(prog="api.py"), "--json", pipe)
    finally:
        os.close(reader)


def test_an_output_that_fails_when_written_is_one_line_on_stderr(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # /dev/full passes every check and fails the write: that was a traceback at the run's end.
    assert not write_output(Path("/dev/full"), "{}", program="api")
    assert capsys.readouterr().err == "api: cannot write /dev/full: No space left on device\n"


@pytest.mark.parametrize("arguments", [["--hours", "0.001"], ["--load", "1e-9"]])
def test_scheduler__a_trace_too_large_to_simulate_is_refused_at_once(arguments: list[str]) -> None:
    answer = run_script("scheduler.py", "--quick", "--no-plot", *arguments)
    assert answer.returncode == 2
    assert "Traceback" not in answer.stderr
    assert "more than the 10,000 a simulation here finishes" in answer.stderr
