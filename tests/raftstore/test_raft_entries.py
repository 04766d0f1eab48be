"""No log entry can stop a cluster's log (`raftstore.entries`).

pysyncobj applies a committed entry by unpickling it then, on every member; an entry it cannot
decode raised on every tick and was never marked applied, so each member's log stopped there for
good (restarts too: the entry is in every journal). A leader logs, undecoded, whatever command a
peer forwards it, so without a cluster secret anyone on the host could stop the cluster with one
frame: the first test, which stalled ("no answer within 5.0 s") before the fix. The second puts
such entries into the log past the leader's check, as a forged leader or a member of another
version could, and checks every member skips them alike.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import pickle
from pathlib import Path

import pytest

from raftstore.store import RaftStore
from tests.raftstore.one_member import leader_of, send_as, two_of_three
from xrcore.commands import KvPut

pytestmark = pytest.mark.integration

# Commands no xr member forwards or logs, each of which stopped every member's log: a body that
# does not unpickle, a method that does not exist, apply_group called with the wrong arguments,
# a bare method id, a code version that does not unpickle.
BAD_COMMANDS = [
    b"\x00garbage",
    b"\x00" + pickle.dumps((7, (b"group",)), protocol=2),
    b"\x00" + pickle.dumps((0, (b"group", 1, 2)), protocol=2),
    b"\x00" + pickle.dumps((0, ("not bytes",)), protocol=2),
    b"\x00" + pickle.dumps(0, protocol=2),
    b"\x03garbage",
]

# ...and forwarded to a leader by a stranger posing as a member, with an empty entry and two that
# are not bytes.
FORWARDED = [
    {"type": "apply_command", "command": command, "request_id": number}
    for number, command in enumerate([*BAD_COMMANDS, b"", "text", 5])
]
# A pause for a member to read what a stranger sent: not a bound that is asserted.
HOLD_S = 0.5


async def _commits(store: RaftStore, key: str) -> None:
    applied = await store.propose(KvPut(key=key, value=b"v"))
    applied.result.unwrap()


def _state(store: RaftStore) -> tuple[int, str]:
    return store.replica.read(
        lambda machine: (machine.index, hashlib.sha256(machine.snapshot()).hexdigest())
    )


async def _all_commit_and_agree(stores: list[RaftStore], leader: RaftStore) -> None:
    await _commits(leader, "after")
    async with asyncio.timeout(30):
        while len({_state(store) for store in stores}) != 1:
            await asyncio.sleep(0.05)
    assert leader.replica.read(lambda machine: sorted(machine.keys)) == ["after", "before"]


def test_raft_port__commands_no_member_forwards__are_dropped_and_the_log_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario() -> None:
        async with two_of_three(tmp_path) as (absent, stores):
            leader = await leader_of(stores)
            await _commits(leader, "before")
            await send_as(absent, leader, FORWARDED, HOLD_S)
            await _all_commit_and_agree(stores, leader)

    with caplog.at_level(logging.WARNING, logger="raftstore.replica"):
        asyncio.run(scenario())
    assert caplog.text.count("dropped") == len(FORWARDED)
    assert "skipped" not in caplog.text


def test_entries_that_cannot_be_applied__are_skipped_on_every_member(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario() -> None:
        async with two_of_three(tmp_path) as (_, stores):
            leader = await leader_of(stores)
            await _commits(leader, "before")
            # Past the check on forwarded commands: straight into the leader's log.
            for command in BAD_COMMANDS:
                leader.replica._applyCommand(command, None)
            await _all_commit_and_agree(stores, leader)

    with caplog.at_level(logging.ERROR, logger="raftstore.replica"):
        asyncio.run(scenario())
    skipped = [record for record in caplog.records if "skipped" in record.getMessage()]
    # Each entry, once on each of the two members.
    assert len(skipped) == 2 * len(BAD_COMMANDS)
