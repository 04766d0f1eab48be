"""The guards against pysyncobj's follower bugs, on one follower fed the leader's messages by hand.

Each test would fail without its guard: the first shows a follower keeping entries it has
acknowledged when the leader re-sends a prefix of them (pysyncobj alone deletes them and then
votes for a candidate that lacks them); the second a follower refusing to commit on a snapshot
chunk's commit index.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pysyncobj.node import TCPNode
from pysyncobj.transport import Transport

from raftstore.config import RaftConfig
from raftstore.guards import keep_matching_entries
from raftstore.replica import Replica

LEADER, OTHER, SELF = "127.0.0.1:9001", "127.0.0.1:9002", "127.0.0.1:9003"
# pysyncobj's no-op command type: entries that apply nothing, so only the log matters here.
NO_OP = struct.pack("B", 1)


class _Recording(Transport):
    def __init__(self) -> None:
        super().__init__(None, None, None)
        self.sent: list[Any] = []

    def send(self, node: Any, message: Any) -> bool:
        self.sent.append(message)
        return True


class _Follower:
    def __init__(self, data_dir: Path) -> None:
        self.transport = _Recording()
        config = RaftConfig(self_address=SELF, peers=(LEADER, OTHER), data_dir=data_dir)
        self.replica = Replica(config, transport=self.transport)
        self.replica.doTick(0)
        self.transport._onNodeConnected(TCPNode(LEADER))
        self.transport._onNodeConnected(TCPNode(OTHER))

    def deliver(self, source: str, message: dict[str, Any]) -> list[Any]:
        self.transport.sent.clear()
        self.transport._onMessageReceived(TCPNode(source), message)
        self.replica.doTick(0)
        return list(self.transport.sent)

    def log_end(self) -> int:
        return int(self.replica.getStatus()["log_len"])


@pytest.fixture
def follower(tmp_path: Path) -> Iterator[_Follower]:
    follower = _Follower(tmp_path)
    yield follower
    follower.replica.destroy()


def _append(previous: int, entries: list[Any], commit_index: int) -> dict[str, Any]:
    return {
        "type": "append_entries",
        "term": 1,
        "commit_index": commit_index,
        "prevLogIdx": previous,
        "prevLogTerm": 1 if previous > 1 else 0,
        "entries": entries,
    }


def test_resent_prefix__keeps_acknowledged_entries_and_refuses_a_shorter_candidate(
    follower: _Follower,
) -> None:
    entries = [(NO_OP, index, 1) for index in range(2, 12)]
    follower.deliver(LEADER, _append(1, entries, commit_index=11))
    end = follower.log_end()
    # The leader re-sends entries 7..8 only (the first batch of a re-send), then dies.
    follower.deliver(LEADER, _append(6, entries[5:7], commit_index=11))
    assert follower.log_end() == end
    vote = {"type": "request_vote", "term": 2, "last_log_index": 8, "last_log_term": 1}
    replies = follower.deliver(OTHER, vote)
    assert not any(reply.get("type") == "response_vote" for reply in replies)


def test_snapshot_chunk__does_not_carry_a_commit_index(follower: _Follower) -> None:
    entries = [(NO_OP, index, 1) for index in range(2, 6)]
    follower.deliver(LEADER, _append(1, entries, commit_index=1))
    commit_before = follower.replica.getStatus()["commit_idx"]
    chunk = {"type": "append_entries", "term": 1, "commit_index": 5, "serialized": None}
    follower.deliver(LEADER, chunk)
    assert follower.replica.getStatus()["commit_idx"] == commit_before


def test_resent_suffix_ending_at_the_last_entry__deletes_nothing(follower: _Follower) -> None:
    # pysyncobj would delete entries 7..11 and add them back, logging that it truncated applied
    # entries; the guard turns the message into an acknowledgement of what is there.
    entries = [(NO_OP, index, 1) for index in range(2, 12)]
    follower.deliver(LEADER, _append(1, entries, commit_index=11))
    rewritten = keep_matching_entries(follower.replica, _append(6, entries[5:], commit_index=11))
    assert (rewritten["prevLogIdx"], rewritten["entries"]) == (11, [])
    follower.deliver(LEADER, _append(6, entries[5:], commit_index=11))
    assert follower.log_end() == 11


def test_resent_prefix_running_past_the_last_entry__deletes_nothing_and_appends_the_rest(
    follower: _Follower,
) -> None:
    # The leader's next index went back to 7 while entries 12..14 were new: pysyncobj would
    # delete 7..11 (acknowledged, applied) and add them back with 12..14; a kill in between
    # would lose them. The guard keeps 7..11 and appends only 12..14.
    entries = [(NO_OP, index, 1) for index in range(2, 15)]
    follower.deliver(LEADER, _append(1, entries[:10], commit_index=11))
    journal: Any = follower.replica._SyncObj__raftLog  # type: ignore[attr-defined]
    deletions: list[int] = []
    delete_from = journal.deleteEntriesFrom

    def deleting(entry_from: int) -> None:
        deletions.append(entry_from)
        delete_from(entry_from)

    journal.deleteEntriesFrom = deleting
    message = _append(6, entries[5:], commit_index=11)
    rewritten = keep_matching_entries(follower.replica, message)
    assert rewritten["prevLogIdx"] == 11
    assert [entry[1] for entry in rewritten["entries"]] == [12, 13, 14]
    replies = follower.deliver(LEADER, message)
    assert deletions == []
    assert follower.log_end() == 14
    assert any(
        reply.get("type") == "next_node_idx" and reply["success"] and reply["next_node_idx"] == 15
        for reply in replies
    ), replies


def test_heartbeat_with_a_stale_previous_entry__deletes_nothing(follower: _Follower) -> None:
    entries = [(NO_OP, index, 1) for index in range(2, 12)]
    follower.deliver(LEADER, _append(1, entries, commit_index=11))
    rewritten = keep_matching_entries(follower.replica, _append(6, [], commit_index=11))
    assert (rewritten["prevLogIdx"], rewritten["entries"]) == (11, [])
    follower.deliver(LEADER, _append(6, [], commit_index=11))
    assert follower.log_end() == 11
