"""A connection to the Raft port may identify itself only as a member (`raftstore.frames`).

pysyncobj 0.3.17 also takes, as an incoming connection's first message, a utility command (a
list: status, add or remove a member, set the code version, hand leadership over), which it runs,
and "readonly", which makes the connection a non-voting replica that the leader sends its log
to. xr uses neither, and both let whoever reaches the port (with a secret: whoever holds it) past
xr's authorization. These tests send each as pysyncobj's own tools do (`TcpUtility`, with the
secret where the cluster has one) and check the member answers nothing, closes the connection,
and keeps its member set and its commits. What a stranger can still do without a secret, pose as
a member, no longer lets it run code (`raftstore.pickling`, `raftstore.entries`): the last test
forwards the leader a command whose pickle calls a function, and sends one such pickle itself.
"""

from __future__ import annotations

import asyncio
import pickle
import struct
import zlib
from pathlib import Path

import pytest
from pysyncobj.utility import TcpUtility, UtilityException

from raftstore.store import RaftStore
from tests.raftstore.one_member import (
    leader_of,
    plain_frame,
    raft_port,
    start_member,
    two_of_three,
)
from xrcore.commands import KvPut

pytestmark = pytest.mark.integration

SECRET = "identity-cluster-secret"
# How long a stranger's connection is held open to see what the member sends: a pause for the
# member to act, not a bound that is asserted.
HOLD_S = 1.0


def _utility(address: str, command: list[object], secret: str | None) -> object:
    """What the member answers `command`, through pysyncobj's own client for them."""
    try:
        return TcpUtility(secret, timeout=5.0).executeCommand(address, command)
    except UtilityException as error:
        return error


async def _commits(store: RaftStore, key: str) -> None:
    async with asyncio.timeout(30):
        while not store.is_leader:
            await asyncio.sleep(0.05)
        applied = await store.propose(KvPut(key=key, value=b"v"))
        applied.result.unwrap()


@pytest.mark.parametrize("secret", [None, SECRET], ids=["no secret", "secret"])
def test_raft_port__utility_commands__are_refused_and_change_nothing(
    tmp_path: Path, secret: str | None
) -> None:
    async def scenario() -> None:
        store = await start_member(tmp_path, secret)
        address = store.config.self_address
        try:
            await _commits(store, "before")
            commands: list[list[object]] = [
                ["status"],
                ["add", "127.0.0.1:1"],
                ["remove", address],
                ["set_version", 7],
                ["transfer", "127.0.0.1:1"],
            ]
            for command in commands:
                answer = await asyncio.to_thread(_utility, address, command, secret)
                # pysyncobj answered each (a status dict, or "SUCCESS ..." / "FAIL ...").
                assert isinstance(answer, UtilityException), (command, answer)
            # Adding a member that does not exist would have left a one-member cluster
            # without a quorum.
            await _commits(store, "after")
            assert store.replica.read(lambda machine: sorted(machine.keys)) == ["after", "before"]
            status = store.replica.getStatus()
            assert (status["partner_nodes_count"], status["readonly_nodes_count"]) == (0, 0)
            assert status["enabled_code_version"] == 0
        finally:
            await store.stop()

    asyncio.run(scenario())


def test_raft_port__a_readonly_replica__is_refused_and_sent_nothing(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = await start_member(tmp_path, None)
        port = raft_port(store)
        try:
            await _commits(store, "before")
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            payload = zlib.compress(pickle.dumps("readonly", protocol=2))
            writer.write(struct.pack("i", len(payload)) + payload)
            received = bytearray()
            closed = False
            try:
                async with asyncio.timeout(HOLD_S):
                    await _commits(store, "meanwhile")
                    while chunk := await reader.read(65536):
                        received += chunk
                    closed = True
            except TimeoutError:
                pass
            finally:
                writer.close()
            # Without the check the leader sent the replica its log (the keys' values included)
            # and kept the connection open.
            assert (bytes(received), closed) == (b"", True)
        finally:
            await store.stop()

    asyncio.run(scenario())


RAN: list[str] = []


def _ran(label: str) -> str:
    RAN.append(label)
    return label


class _Canary:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (_ran, ("canary",))


def test_raft_port__a_stranger_posing_as_a_member__cannot_run_code_through_a_command(
    tmp_path: Path,
) -> None:
    """Without a secret a stranger that gives a member's address is taken for it. It forwards the
    leader a membership change (pysyncobj's command type 2) whose pickle calls a function, which
    the leader unpickled on receipt and ran before `raftstore.pickling` (now the leader drops it
    unread: a member forwards only calls of apply_group, `raftstore.entries`); and it sends a
    message that holds such a pickle itself, which the leader unpickles on receipt."""

    async def scenario() -> None:
        RAN.clear()
        async with two_of_three(tmp_path) as (absent, stores):
            leader = await leader_of(stores)
            await _commits(leader, "before")
            port = int(leader.config.self_address.rpartition(":")[2])
            forged = b"\x02" + pickle.dumps(_Canary(), protocol=2)
            for command in (forged, _Canary()):
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(
                    plain_frame(absent)
                    + plain_frame({"type": "apply_command", "command": command, "request_id": 1})
                )
                await writer.drain()
                await asyncio.sleep(HOLD_S)
                writer.close()
            await _commits(leader, "after")
            assert RAN == []

    asyncio.run(scenario())
