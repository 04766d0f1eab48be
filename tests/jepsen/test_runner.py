"""What a run says about itself, without starting one: the command that replays it, the faults
it injected, the refusals of runs that could test nothing, and what the report says of a run
that did less than was asked."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest

from xr_jepsen.report import render_report
from xr_jepsen.runner import (
    RunConfig,
    RunRefused,
    _partitions_refusal,
    faults_injected,
    no_fault_warning,
    replay_command,
    run,
)

CONFIG = RunConfig(workload="locks", nemesis="none", nodes=1, time_s=6, seed=1)


def test_replay_command__sets_the_deliberate_bug_variables_the_run_had() -> None:
    # They were dropped, so the replay of a run with a deliberate bug ran without it.
    environment = {"XR_TEST_RUN": "1", "XR_TEST_FAULTS": "unfenced-locks,x y", "HOME": "/root"}
    command = replay_command(CONFIG, environment=environment)
    assert command.startswith("XR_TEST_RUN=1 XR_TEST_FAULTS='unfenced-locks,x y' xr-jepsen run ")
    assert shlex.split(command)[:2] == ["XR_TEST_RUN=1", "XR_TEST_FAULTS=unfenced-locks,x y"]
    assert "HOME" not in command


def test_replay_command__without_the_variables_is_the_command_alone() -> None:
    command = replay_command(CONFIG, environment={})
    assert command == ("xr-jepsen run --workload locks --nemesis none --nodes 1 --time 6 --seed 1")


def test_faults_injected__counts_the_starts_that_did_not_fail() -> None:
    events: list[Any] = [
        {"phase": "start", "fault": "kill", "nodes": ["n1"]},
        {"phase": "heal", "fault": "kill", "nodes": ["n1"]},
        {"phase": "start", "fault": "pause", "error": "no such process"},
        {"phase": "heal", "fault": "all", "step": "final heal"},
        "kill",
    ]
    assert faults_injected(events) == 1


@pytest.mark.parametrize(
    ("nemesis", "faults", "warned"),
    [("none", 0, False), ("pause", 0, True), ("pause", 2, False)],
)
def test_no_fault_warning__only_for_a_nemesis_that_did_nothing(
    nemesis: str, faults: int, warned: bool
) -> None:
    warning = no_fault_warning(nemesis, faults)
    assert (warning is not None) is warned
    if warning is not None:
        assert f"nemesis {nemesis} injected no fault" in warning


@pytest.mark.parametrize(
    ("namespaces", "root", "expected", "unexpected"),
    [
        # Root asked for no namespaces was told to run it as root.
        (False, True, "drop --no-namespaces", "run it as root"),
        (True, True, "make `ip netns` and nftables work here", "run it as root"),
        (True, False, "run it as root", "drop --no-namespaces"),
    ],
)
def test_partitions_refusal__names_what_would_make_partitions_here(
    namespaces: bool, root: bool, expected: str, unexpected: str
) -> None:
    config = RunConfig(workload="set", nemesis="partition-one", namespaces=namespaces)
    message = _partitions_refusal(config, "loopback: partitions unavailable (why)", root=root)
    assert "needs partitions" in message and "--fault-transport" in message
    assert expected in message and unexpected not in message


def test_run__a_nemesis_that_could_inject_no_fault_is_refused_before_anything(
    tmp_path: Path,
) -> None:
    config = RunConfig(workload="set", nemesis="pause", time_s=5, run_dir=tmp_path / "run")
    with pytest.raises(RunRefused, match="can inject no fault in 5 s"):
        run(config, progress=lambda line: None)
    assert not (tmp_path / "run").exists()


def _report(**results: Any) -> str:
    base: dict[str, Any] = {"workload": "set", "nemesis": "pause", "verdict": "valid"}
    return render_report({**base, **results}, [], [], workers=4)


def test_report__says_a_nemesis_injected_no_fault() -> None:
    # "(0 faults)" runs were reported valid under the nemesis's name with no word of it.
    page = _report(nemesis_events=[], faults=0)
    assert "nemesis pause injected no fault" in page
    assert "<tr><th>faults injected</th><td>0</td></tr>" in page
    started = [{"phase": "start", "fault": "pause", "nodes": ["n1"]}]
    page = _report(nemesis_events=started)
    assert "injected no fault" not in page
    assert "<tr><th>faults injected</th><td>1</td></tr>" in page


def test_report__says_sigterm_stopped_the_run_early() -> None:
    assert "stopped early by SIGTERM" in _report(stopped_by="SIGTERM", faults=1)
    assert "stopped early" not in _report(stopped_by=None, faults=1)


def test_report__of_no_nemesis_warns_of_nothing() -> None:
    assert 'class="warning"' not in _report(nemesis="none", faults=0)
