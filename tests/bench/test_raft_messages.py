"""bench/raft_messages.py: Raft messages and members' CPU per put, the working tree against a
revision, in one run."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.bench._script import run_script

pytestmark = pytest.mark.integration


def _run(*arguments: str) -> subprocess.CompletedProcess[str]:
    return run_script("raft_messages.py", *arguments)


def test_counts_every_sides_messages_and_prints_this_tree_over_the_revision() -> None:
    ran = _run(
        "--against", "HEAD", "--durability", "write", "--concurrency", "4",
        "--duration", "1", "--warmup", "0", "--rounds", "1",
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.strip().splitlines()
    rows = [line for line in lines if line.startswith("| 4 |")]
    assert [row.split("|")[2].strip() for row in rows] == ["this tree", "HEAD"]
    assert "c=4: this tree / HEAD: messages per put " in ran.stdout
    figures = json.loads(lines[-1])
    assert figures["benchmark"] == "raft_messages" and figures["against"] == "HEAD"
    (cell,) = figures["cells"]
    for side in cell["sides"].values():
        assert side["puts"] > 0
        # Every put is replicated: each follower gets its entry and answers.
        assert side["by_type"]["append_entries"] > 0 and side["by_type"]["next_node_idx"] > 0
        assert side["messages_per_put"] == pytest.approx(sum(side["by_type"].values()))
        assert side["members_cpu_us_per_put"] > 0
        # Write mode makes no sync, and the count says so.
        assert side["syncs_per_put"] == 0
    assert cell["ratio_messages"] > 0 and cell["ratio_members_cpu"] > 0


def test_bad_arguments_and_an_unknown_revision_are_refused_without_a_traceback() -> None:
    ran = _run("--rounds", "0")
    assert ran.returncode == 2 and "must be above 0" in ran.stderr
    ran = _run("--warmup", "-1")
    assert ran.returncode == 2 and "--warmup must be 0 or more" in ran.stderr
    ran = _run("--against", "no-such-revision-x", "--rounds", "1")
    assert ran.returncode == 1
    assert "raft_messages: cannot read revision 'no-such-revision-x'" in ran.stderr
    assert "Traceback" not in ran.stderr


def test_a_sync_stand_in_changes_only_this_trees_nodes() -> None:
    # `hold` replaces the journal sync in this tree's nodes: they make no sync, while the
    # revision's nodes, run from their exported copy, sync as usual.
    ran = _run(
        "--against", "HEAD", "--durability", "fsync", "--concurrency", "4",
        "--duration", "1", "--warmup", "0", "--rounds", "1", "--sync-stand-in", "hold:0.0005",
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    figures = json.loads(ran.stdout.strip().splitlines()[-1])
    assert figures["sync_stand_in"] == "hold:0.0005"
    (cell,) = figures["cells"]
    this, revision = cell["sides"]["this tree"], cell["sides"]["HEAD"]
    assert this["puts"] > 0 and revision["puts"] > 0
    assert this["syncs_per_put"] == 0
    assert revision["syncs_per_put"] > 0


def test_a_bad_sync_stand_in_is_refused_without_a_traceback() -> None:
    for text in ("nap:0.001", "sleep:0", "hold:nan", "sleep:2", "sleep", "none:1", "nonesuch"):
        ran = _run("--sync-stand-in", text)
        assert ran.returncode == 2, text
        assert "give none, sleep:SECONDS or hold:SECONDS" in ran.stderr, text
    ran = _run("--durability", "write", "--sync-stand-in", "sleep:0.001")
    assert ran.returncode == 2 and "needs --durability fsync" in ran.stderr
    assert "Traceback" not in ran.stderr


def test_a_disk_latency_slows_both_sides_syncs() -> None:
    # At 1 in flight every put waits for at least one sync (a follower's, before it answers), so
    # 50 ms more per sync leaves at most 20 puts in a 1 s window on either side, whether the side
    # syncs on its event loop or in its sync helper.
    ran = _run(
        "--against", "HEAD", "--durability", "fsync", "--concurrency", "1",
        "--duration", "1", "--warmup", "0", "--rounds", "1", "--disk-latency", "0.05",
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    figures = json.loads(ran.stdout.strip().splitlines()[-1])
    assert figures["disk_latency_s"] == 0.05
    (cell,) = figures["cells"]
    for side in cell["sides"].values():
        assert 0 < side["puts"] <= 20 + 1, side["puts"]


def test_a_bad_disk_latency_is_refused_without_a_traceback() -> None:
    for text in ("0", "-1", "nan", "0.5", "soon"):
        ran = _run("--disk-latency", text)
        assert ran.returncode == 2 and "--disk-latency" in ran.stderr, text
    ran = _run("--durability", "write", "--disk-latency", "0.001")
    assert ran.returncode == 2 and "needs --durability fsync" in ran.stderr
    ran = _run("--disk-latency", "0.001", "--sync-stand-in", "sleep:0.001")
    assert ran.returncode == 2 and "no --sync-stand-in" in ran.stderr
    assert "Traceback" not in ran.stderr
