"""The benchmark scripts refuse bad arguments with a usage error (exit 2, no traceback) before
any work starts: NaN passed the old `value <= 0` checks, and some values had no check at all."""

from __future__ import annotations

import pytest

from tests.bench._script import run_script


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
        ("overload.py", ["--duration", "nan"]),
        ("overload.py", ["--factor", "-1"]),
        ("overload.py", ["--members", "0"]),
        ("overload.py", ["--requests-in-flight-max", "0"]),
        ("scheduler.py", ["--hours", "nan"]),
        ("scheduler.py", ["--load", "inf"]),
        ("scheduler.py", ["--jobs", "-1"]),
    ],
)
def test_a_bad_argument_is_a_usage_error_before_any_work(script: str, arguments: list[str]) -> None:
    answer = run_script(script, *arguments)
    assert answer.returncode == 2, answer.stdout + answer.stderr
    assert "Traceback" not in answer.stderr
    assert "error:" in answer.stderr.splitlines()[-1]
    assert answer.stdout == ""
