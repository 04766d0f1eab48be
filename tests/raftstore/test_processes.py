"""Three real member processes on loopback: kill -9 the leader during writes, lose nothing.

Each member is `python -m raftstore.member`, driven through its control port. Client coroutines
write distinct keys, each with its own client id and increasing sequence numbers; an indefinite
error (a timeout, a lost leader, a dead member) is retried with the same sequence number on another
member, so a retried write must apply exactly once. Midway the leader is killed with SIGKILL.
Afterwards the survivors have a leader, every acknowledged write is present with version 1 and the
revision it was acknowledged with, the store's revision equals the number of writes (nothing
applied twice), and the killed member, restarted from its data directory, catches up to the same
state hash at the same index.

Everything waits on progress, never on time, with generous deadlines, so a slow machine only makes
the test slower. Child processes are always stopped by the fixture.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from raftstore.member import MemberClient, MemberProcess, MemberUnreachable, free_ports

pytestmark = pytest.mark.integration

T = TypeVar("T")

MEMBERS = 3
WRITERS = 8
# Writes each writer must have acknowledged before the kill, and again after the new leader.
WRITES_BEFORE_KILL = 100
WRITES_AFTER_KILL = 100
READY_TIMEOUT_S = 60.0
WAIT_S = 60.0
PUT_TIMEOUT_S = 2.0
CALL_TIMEOUT_S = 10.0
RETRY_PAUSE_S = 0.05
ATTEMPTS_MAX = 1_000
# Definite errors that say nothing was applied, so retrying them is as safe as at first.
RETRYABLE_DEFINITE_CODES = frozenset({"cluster.unavailable", "cluster.overloaded"})
KEY_PREFIX = "w/"


@dataclass(frozen=True, kw_only=True)
class Acknowledged:
    client_id: str
    seq: int
    key: str
    value: bytes
    revision: int
    attempts: int
    duplicate: bool


@pytest.fixture
def members(tmp_path: Path) -> Iterator[list[MemberProcess]]:
    ports = free_ports(2 * MEMBERS)
    raft_ports, control_ports = ports[:MEMBERS], ports[MEMBERS:]
    processes = [
        MemberProcess(
            raft_port=raft_port,
            peer_ports=[other for other in raft_ports if other != raft_port],
            control_port=control_port,
            data_dir=tmp_path / f"member-{position}",
        )
        for position, (raft_port, control_port) in enumerate(
            zip(raft_ports, control_ports, strict=True)
        )
    ]
    try:
        for process in processes:
            process.start()
        for process in processes:
            process.wait_ready(READY_TIMEOUT_S)
        yield processes
    finally:
        for process in processes:
            process.terminate(timeout_s=5.0)
        # Shown by pytest only when the test failed.
        for process in processes:
            print(f"--- {process.address} log tail\n{process.log_tail()}")


async def _eventually(check: Callable[[], Awaitable[T | None]], what: str) -> T:
    loop = asyncio.get_running_loop()
    deadline_s = loop.time() + WAIT_S
    while True:
        value = await check()
        if value is not None:
            return value
        if loop.time() > deadline_s:
            raise AssertionError(f"{what}: not reached in {WAIT_S} s")
        await asyncio.sleep(0.05)


class Cluster:
    """The member processes and a control client for each."""

    def __init__(self, processes: list[MemberProcess]) -> None:
        self.processes = processes
        self.clients = [MemberClient(process.control_port) for process in processes]

    def alive(self) -> list[int]:
        return [n for n, process in enumerate(self.processes) if process.running]

    async def status(self, member: int) -> dict[str, Any] | None:
        with contextlib.suppress(MemberUnreachable):
            return await self.clients[member].call({"op": "status"}, timeout_s=CALL_TIMEOUT_S)
        return None

    async def leader(self) -> int:
        """The member that leads with a quorum, once every live member names it."""

        async def check() -> int | None:
            alive = self.alive()
            statuses = [await self.status(member) for member in alive]
            if any(status is None for status in statuses):
                return None
            leaders = [
                member
                for member, status in zip(alive, statuses, strict=True)
                if status is not None and status["is_leader"] and status["has_quorum"]
            ]
            if len(leaders) != 1:
                return None
            address = self.processes[leaders[0]].address
            if all(status is not None and status["leader"] == address for status in statuses):
                return leaders[0]
            return None

        return await _eventually(check, "one leader named by every live member")

    async def kill(self, member: int) -> None:
        self.processes[member].kill()
        # Its connection is dead; a later call must open a new one to the restarted process.
        await self.clients[member].close()

    async def close(self) -> None:
        for client in self.clients:
            await client.close()


class Writer:
    """Writes distinct keys one at a time, retrying each until it is acknowledged."""

    def __init__(self, cluster: Cluster, number: int) -> None:
        self.cluster = cluster
        self.client_id = f"writer-{number}"
        self.member = number % MEMBERS
        self.acknowledged: list[Acknowledged] = []
        self.retried: list[tuple[int, str]] = []
        # Own connections: the cluster's clients carry one request at a time.
        self.clients = [MemberClient(process.control_port) for process in cluster.processes]

    async def run(self, stop: asyncio.Event) -> None:
        seq = 0
        try:
            while not stop.is_set():
                seq += 1
                self.acknowledged.append(await self._write(seq))
        finally:
            for client in self.clients:
                await client.close()

    async def _write(self, seq: int) -> Acknowledged:
        key = f"{KEY_PREFIX}{self.client_id}/{seq:08d}"
        value = f"{self.client_id}:{seq}".encode()
        request = {
            "op": "put",
            "key": key,
            "value": value,
            "client_id": self.client_id,
            "seq": seq,
            "timeout_s": PUT_TIMEOUT_S,
        }
        for attempt in range(1, ATTEMPTS_MAX + 1):
            try:
                answer = await self.clients[self.member].call(request, timeout_s=CALL_TIMEOUT_S)
            except MemberUnreachable as error:
                answer = {"ok": False, "code": "member.unreachable", "message": str(error)}
                answer["definite"] = False
            if answer["ok"]:
                return Acknowledged(
                    client_id=self.client_id,
                    seq=seq,
                    key=key,
                    value=value,
                    revision=answer["revision"],
                    attempts=attempt,
                    duplicate=answer["duplicate"],
                )
            if answer["definite"] and answer["code"] not in RETRYABLE_DEFINITE_CODES:
                raise AssertionError(f"{key} failed definitely: {answer}")
            # Same seq, another member: whichever attempt applies, the others are duplicates.
            self.retried.append((seq, answer["code"]))
            self.member = (self.member + 1) % MEMBERS
            await asyncio.sleep(RETRY_PAUSE_S)
        raise AssertionError(f"{key} not acknowledged after {ATTEMPTS_MAX} attempts")


async def _all_writes_reach(
    writers: list[Writer], tasks: list[asyncio.Task[None]], count: int, what: str
) -> None:
    async def check() -> bool | None:
        for task in tasks:
            if task.done():
                task.result()  # A writer that failed fails the test now, with its reason.
        return all(len(writer.acknowledged) >= count for writer in writers) or None

    await _eventually(check, what)


async def _read(client: MemberClient, request: dict[str, Any]) -> dict[str, Any]:
    """A read, repeated while it fails in a way that may pass (a member still catching up
    times out its read barrier)."""

    async def attempt() -> dict[str, Any] | None:
        try:
            answer = await client.call(request, timeout_s=CALL_TIMEOUT_S)
        except MemberUnreachable:
            return None
        if answer["ok"]:
            return answer
        if answer["definite"] and answer["code"] not in RETRYABLE_DEFINITE_CODES:
            raise AssertionError(f"{request} failed definitely: {answer}")
        return None

    return await _eventually(attempt, f"an answer to {request}")


async def _scan(client: MemberClient, prefix: str) -> tuple[int, dict[str, dict[str, Any]]]:
    """Every key under `prefix` through linearizable range reads, and the store's revision."""
    items: dict[str, dict[str, Any]] = {}
    after: str | None = None
    revision = 0
    while True:
        page = await _read(
            client, {"op": "range", "prefix": prefix, "after": after, "limit": 1_000}
        )
        revision = max(revision, page["revision"])
        items.update((item["key"], item) for item in page["items"])
        if page["next"] is None:
            return revision, items
        after = page["next"]


def _check_writes(
    acknowledged: list[Acknowledged], revision: int, items: dict[str, dict[str, Any]]
) -> None:
    assert set(items) == {write.key for write in acknowledged}, "lost or unexpected keys"
    for write in acknowledged:
        item = items[write.key]
        assert item["value"] == write.value, write
        # Version 1 at the acknowledged revision: the write applied exactly once.
        assert (item["version"], item["mod_revision"]) == (1, write.revision), (write, item)
    # Only these puts ever wrote, one revision each: a write applied twice would show here.
    assert revision == len(acknowledged)
    assert len({write.revision for write in acknowledged}) == len(acknowledged)


async def _same_state_at_same_index(cluster: Cluster, first: int, second: int) -> str:
    """Waits until both members report a state hash at the same index, and compares them."""
    seen: list[dict[int, str]] = [{}, {}]

    async def check() -> str | None:
        answers = await asyncio.gather(
            *(cluster.clients[member].call({"op": "hash"}) for member in (first, second))
        )
        for known, answer in zip(seen, answers, strict=True):
            known[answer["machine_index"]] = answer["sha256"]
        common = set(seen[0]) & set(seen[1])
        for index in common:
            assert seen[0][index] == seen[1][index], f"state differs at index {index}"
        return seen[0][max(common)] if common else None

    return await _eventually(check, "both members at one index")


async def _scenario(processes: list[MemberProcess]) -> None:
    cluster = Cluster(processes)
    try:
        old_leader = await cluster.leader()
        writers = [Writer(cluster, number) for number in range(WRITERS)]
        stop = asyncio.Event()
        tasks = [asyncio.create_task(writer.run(stop)) for writer in writers]

        await _all_writes_reach(writers, tasks, WRITES_BEFORE_KILL, "writes before the kill")
        await cluster.kill(old_leader)
        before = [len(writer.acknowledged) for writer in writers]
        new_leader = await cluster.leader()
        assert new_leader != old_leader
        await _all_writes_reach(
            writers, tasks, max(before) + WRITES_AFTER_KILL, "writes after the new leader"
        )
        stop.set()
        await asyncio.gather(*tasks)

        acknowledged = [write for writer in writers for write in writer.acknowledged]
        survivor = next(member for member in cluster.alive() if member != new_leader)
        revision, items = await _scan(cluster.clients[survivor], KEY_PREFIX)
        _check_writes(acknowledged, revision, items)
        # The retried writes once more, each through a linearizable get on a survivor.
        retried_keys = {
            f"{KEY_PREFIX}{writer.client_id}/{seq:08d}"
            for writer in writers
            for seq, _ in writer.retried
        }
        # Writers start spread over all members, so those on the killed leader had to retry.
        assert retried_keys, "no write was retried: the kill did not exercise retries"
        by_key = {write.key: write for write in acknowledged}
        for key in sorted(retried_keys):
            got = await _read(cluster.clients[survivor], {"op": "get", "key": key})
            assert got["found"] and got["version"] == 1, got
            assert got["mod_revision"] == by_key[key].revision, (got, by_key[key])

        # The killed member restarts from its files and converges on the same state.
        processes[old_leader].start()
        processes[old_leader].wait_ready(READY_TIMEOUT_S)
        restarted_revision, restarted_items = await _scan(cluster.clients[old_leader], KEY_PREFIX)
        _check_writes(acknowledged, restarted_revision, restarted_items)
        await _same_state_at_same_index(cluster, old_leader, new_leader)
        print(
            f"{len(acknowledged)} writes acknowledged, {len(retried_keys)} retried, "
            f"{sum(write.duplicate for write in acknowledged)} answered as duplicates"
        )
    finally:
        await cluster.close()


def test_leader_killed_during_writes__acknowledged_writes_survive_once_and_restart_catches_up(
    members: list[MemberProcess],
) -> None:
    asyncio.run(_scenario(members))
