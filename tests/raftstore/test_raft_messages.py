"""A peer's Raft message holds what pysyncobj sends, or is dropped (`raftstore.messages`).

pysyncobj takes a message's fields as they come: one `request_vote` or `append_entries` whose
term was a float or an integer the journal cannot write, from a stranger posing as a member (no
cluster secret), left every member that heard it unable to elect or append for good. The
integration test below stalled before the check ("no answer", terms 1e300 and 2**70 on both
members); the unit tests hold the check to what pysyncobj and xr send.
"""

from __future__ import annotations

import asyncio
import logging
import pickle
from pathlib import Path
from typing import Any

import pytest
from pysyncobj.node import TCPNode

from raftstore.messages import INT_MAX, BadMessage, check
from raftstore.store import RaftStore
from tests.raftstore.one_member import leader_of, send_as, two_of_three
from xrcore.commands import KvPut

_CALL = b"\x00" + pickle.dumps((0, (b"group",)), protocol=5)

# What pysyncobj 0.3.17 and xr send, field for field (syncobj.py's `'type': ...` literals).
SENT: dict[str, dict[str, Any]] = {
    "request_vote": {"type": "request_vote", "term": 4, "last_log_index": 9, "last_log_term": 3},
    "response_vote": {"type": "response_vote", "term": 4},
    "timeout_now": {"type": "timeout_now", "term": 4},
    "append_entries": {
        "type": "append_entries",
        "term": 4,
        "commit_index": 7,
        "entries": [(_CALL, 9, 3), (b"\x01", 10, 4)],
        "prevLogIdx": 8,
        "prevLogTerm": 3,
    },
    "heartbeat": {
        "type": "append_entries",
        "term": 4,
        "commit_index": 7,
        "entries": [],
        "prevLogIdx": 8,
        "prevLogTerm": 3,
    },
    "snapshot chunk": {
        "type": "append_entries",
        "term": 4,
        "commit_index": 7,
        "serialized": (b"chunk", True, False),
    },
    "no snapshot": {"type": "append_entries", "term": 4, "commit_index": 7, "serialized": None},
    "next_node_idx": {"type": "next_node_idx", "next_node_idx": 9, "reset": False, "success": True},
    "apply_command": {"type": "apply_command", "command": _CALL, "request_id": 3},
    "apply_command, no answer": {"type": "apply_command", "command": _CALL},
    "apply_command_response": {
        "type": "apply_command_response",
        "request_id": 3,
        "log_idx": 9,
        "log_term": 4,
    },
    "apply_command_response, error": {
        "type": "apply_command_response",
        "request_id": 3,
        "error": 2,
    },
    "xr pre-vote": {"type": "xr_pre_vote", "term": 5, "last_log_index": 9, "last_log_term": 3},
    "xr pre-vote answer": {"type": "xr_pre_vote_response", "term": 5, "granted": True},
}


@pytest.mark.parametrize("label", SENT)
def test_what_members_send__passes(label: str) -> None:
    check(SENT[label])
    # Read back from a frame, in either protocol.
    for protocol in (2, 5):
        check(pickle.loads(pickle.dumps(SENT[label], protocol=protocol)))


def _with(label: str, **fields: Any) -> dict[str, Any]:
    return {**SENT[label], **fields}


REFUSED: dict[str, tuple[Any, str]] = {
    "not a dict": (["request_vote", 4], "not a dict"),
    "no type": ({"term": 4}, "type None"),
    "unknown type": ({"type": "install_snapshot", "term": 4}, "type 'install_snapshot'"),
    "a float term": (_with("request_vote", term=1e300), "term is not an integer"),
    "a term past 64 bits": (_with("request_vote", term=1 << 70), "term is not an integer"),
    "a negative index": (_with("request_vote", last_log_index=-1), "last_log_index"),
    "a bool for a term": (_with("response_vote", term=True), "term is not an integer"),
    "no term": ({"type": "timeout_now"}, "term is not an integer"),
    "a string commit index": (_with("append_entries", commit_index="7"), "commit_index"),
    "entries not a list": (_with("append_entries", entries="x"), "entries is not a list"),
    "an entry of two": (_with("append_entries", entries=[(_CALL, 9)]), "not \\(command"),
    "an entry's command a string": (
        _with("append_entries", entries=[("text", 9, 3)]),
        "not a non-empty byte string",
    ),
    "an empty entry": (_with("append_entries", entries=[(b"", 9, 3)]), "non-empty"),
    "an entry of a membership change that does not decode": (
        _with("append_entries", entries=[(b"\x02garbage", 9, 3)]),
        "does not unpickle",
    ),
    "an entry out of order": (
        _with("append_entries", entries=[(_CALL, 10, 3)]),
        "index is 10, not the next one, 9",
    ),
    "an entry of a later term": (
        _with("append_entries", entries=[(_CALL, 9, 5)]),
        "term is not an integer up to",
    ),
    "an entry in chunks": (
        _with("heartbeat", transmission="start", data=pickle.dumps((_CALL, 9, 4))[:8]),
        "no member sends an entry in chunks",
    ),
    "a snapshot chunk of two": (_with("snapshot chunk", serialized=(b"x", True)), "snapshot"),
    "a flag that is an int": (_with("next_node_idx", success=1), "success is not a boolean"),
    "a forwarded membership change": (
        _with("apply_command", command=b"\x02" + pickle.dumps(["add", "h:1", TCPNode("h:1")])),
        "must be a call of apply_group",
    ),
    "a forwarded call of nothing": (
        _with("apply_command", command=b"\x00" + pickle.dumps((7, (b"g",)))),
        "calls method 7",
    ),
    "an answer without an index": (
        {"type": "apply_command_response", "request_id": 3},
        "log_idx",
    ),
}


@pytest.mark.parametrize("label", REFUSED)
def test_what_no_member_sends__is_refused(label: str) -> None:
    message, reason = REFUSED[label]
    with pytest.raises(BadMessage, match=reason):
        check(message)


def test_the_largest_term_the_journal_writes__passes() -> None:
    check(_with("request_vote", term=INT_MAX))
    with pytest.raises(BadMessage):
        check(_with("request_vote", term=INT_MAX + 1))


# A pause for a member to read what a stranger sent: not a bound that is asserted.
HOLD_S = 0.5
# Each left every member that heard it unable to elect or append, for good.
STALLED = [
    _with("request_vote", term=1e300, last_log_index=10**9, last_log_term=10**9),
    _with("request_vote", term=1 << 70, last_log_index=10**9, last_log_term=1 << 70),
    _with("append_entries", term=1e300, entries=[], prevLogIdx=0, prevLogTerm=0),
]


@pytest.mark.integration
def test_raft_port__messages_no_member_sends__are_dropped_and_the_cluster_writes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario() -> None:
        async with two_of_three(tmp_path) as (absent, stores):
            leader = await leader_of(stores)
            (await leader.propose(KvPut(key="before", value=b"v"))).result.unwrap()
            for store in stores:
                await send_as(absent, store, STALLED, HOLD_S)
            # Before the check this timed out: no member could elect or append.
            leader = await leader_of(stores)
            (await leader.propose(KvPut(key="after", value=b"v"))).result.unwrap()
            terms = [store.replica.raftCurrentTerm for store in stores]
            assert all(type(term) is int and term < 100 for term in terms), terms

    with caplog.at_level(logging.WARNING, logger="raftstore.replica"):
        asyncio.run(scenario())
    assert caplog.text.count("dropped") == 2 * len(STALLED)


def _as_leader(store: RaftStore) -> list[dict[str, Any]]:
    """What a stranger posing as a leader of the next term sends `store`, a follower: entries
    that follow its log's last entry but carry an index out of place or a command that is not
    bytes, one of them in chunks."""
    replica: Any = store.replica
    last_index = replica._SyncObj__getCurrentLogIndex()
    base = {
        "type": "append_entries",
        "term": replica.raftCurrentTerm + 1,
        "commit_index": 0,
        "prevLogIdx": last_index,
        "prevLogTerm": replica._SyncObj__getCurrentLogTerm(),
    }
    chunked = pickle.dumps((b"\x01", last_index + 5, base["term"]))
    return [
        {**base, "entries": [(b"\x01", last_index + 5, base["term"])]},
        {**base, "entries": [("text", last_index + 1, base["term"])]},
        {**base, "transmission": "start", "data": chunked[:5]},
        {**base, "transmission": "finish", "data": chunked[5:]},
    ]


@pytest.mark.integration
def test_raft_port__a_posing_leaders_entries_out_of_place__are_dropped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Each of these stalled the cluster: the follower's log no longer matched its indexes."""
    sent: list[dict[str, Any]] = []

    async def scenario() -> None:
        async with two_of_three(tmp_path) as (absent, stores):
            leader = await leader_of(stores)
            (await leader.propose(KvPut(key="before", value=b"v"))).result.unwrap()
            follower = next(store for store in stores if store is not leader)
            sent.extend(_as_leader(follower))
            await send_as(absent, follower, sent, HOLD_S)
            leader = await leader_of(stores)
            (await leader.propose(KvPut(key="after", value=b"v"))).result.unwrap()
            async with asyncio.timeout(30):
                while len({store.replica.read(lambda m: m.index) for store in stores}) != 1:
                    await asyncio.sleep(0.05)

    with caplog.at_level(logging.WARNING, logger="raftstore.replica"):
        asyncio.run(scenario())
    assert caplog.text.count("dropped") == len(sent)
