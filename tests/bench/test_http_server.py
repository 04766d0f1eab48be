"""bench/http_server.py: aiohttp's CPU per request against a bare protocol, in one run."""

from __future__ import annotations

import json
import subprocess

from tests.bench._script import run_script


def _run(*arguments: str) -> subprocess.CompletedProcess[str]:
    return run_script("http_server.py", *arguments)


def test_both_servers_answer_every_put_and_the_table_gives_aiohttp_over_the_reference() -> None:
    ran = _run("--concurrency", "1,4", "--rounds", "2", "--warmup", "0.2", "--duration", "0.4")
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.strip().splitlines()
    assert lines[0].startswith("c=1 round 1/2: aiohttp ")
    assert sum(line.startswith("| c=") for line in lines) == 2
    figures = json.loads(lines[-1])
    assert figures["benchmark"] == "http_server" and figures["rounds"] == 2
    assert [cell["concurrency"] for cell in figures["cells"]] == [1, 4]
    for cell in figures["cells"]:
        # Requests were answered (a failed one fails the run) and each server used CPU for them.
        assert cell["aiohttp_per_s"] > 0 and cell["bare_per_s"] > 0
        assert cell["aiohttp_cpu_us"] > 0 and cell["bare_cpu_us"] > 0
        assert cell["cpu_ratio"] > 0


def test_bad_arguments_are_refused_without_a_traceback() -> None:
    for arguments, message in [
        (("--concurrency", "0"), "each must be from 1 to 1024"),
        (("--concurrency", "a"), "expected numbers such as 1,16,64"),
        (("--duration", "-1"), "must be over 0"),
        (("--rounds", "0"), "must be from 1 to 100"),
    ]:
        ran = _run(*arguments)
        assert ran.returncode == 2 and message in ran.stderr, ran.stderr
        assert "Traceback" not in ran.stderr
