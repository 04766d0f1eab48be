"""Crash the whole cluster again and again under load: no acknowledged write is ever lost.

A real 3-node cluster (`xr node run` processes, `node.localcluster`) takes puts from several
writers at once (`xrcore.client`, each writer its own client id, distinct keys). In each cycle,
at a moment drawn from the seed (after a random number of acknowledged writes), every node is
killed with SIGKILL at once, then all are restarted from their data directories. At the end
every acknowledged write is read back linearizably with its value, and every node's applied
state has the same SHA-256 at the same index (`GET /v1/snapshot/hash`).

kill -9 keeps the page cache, so this holds in both durability modes; it checks that restarts
from the journal and snapshot files (and, in "fsync" mode, the durable journal and outbox) lose
nothing. A power loss cannot be simulated here (docs/durability.md says what covers it).
Everything waits on progress; the seed is printed on failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from node.localcluster import LocalCluster
from xrcore.client import AsyncClient
from xrcore.errors import XrError

pytestmark = pytest.mark.integration

WRITERS = 4
READY_TIMEOUT_S = 60.0
# A kill comes after this many acknowledged writes in the cycle, drawn from the seed.
ACKS_BEFORE_KILL_MIN = 10
ACKS_BEFORE_KILL_MAX = 80
HASH_ATTEMPTS_MAX = 500
KEY_PREFIX = "crash/"


@dataclass
class Load:
    acknowledged: dict[str, str] = field(default_factory=dict)
    attempts: int = 0
    indefinite: int = 0


async def _writer(
    urls: list[str], number: int, load: Load, stop: asyncio.Event, cycle: int
) -> None:
    async with AsyncClient(urls, timeout_s=2.0, retry_s=0.0) as client:
        sequence = 0
        while not stop.is_set():
            sequence += 1
            key = f"{KEY_PREFIX}{cycle}/{number}/{sequence}"
            value = f"{cycle}-{number}-{sequence}"
            load.attempts += 1
            try:
                await client.kv.put(key, value)
            except XrError as error:
                # Unknown or refused: not acknowledged, so the check does not count on it.
                load.indefinite += 0 if error.definite else 1
                await asyncio.sleep(0.05)
                continue
            load.acknowledged[key] = value


async def _cycle(cluster: LocalCluster, load: Load, cycle: int, kill_after: int) -> None:
    stop = asyncio.Event()
    before = len(load.acknowledged)
    writers = [
        asyncio.create_task(_writer(cluster.urls, number, load, stop, cycle))
        for number in range(WRITERS)
    ]
    try:
        while len(load.acknowledged) - before < kill_after:
            assert not any(task.done() for task in writers), [t.exception() for t in writers]
            await asyncio.sleep(0.005)
        # Every node at once, writes in flight.
        for node in cluster.nodes:
            assert node.process is not None
            node.process.kill()
    finally:
        stop.set()
        await asyncio.gather(*writers, return_exceptions=True)
    await asyncio.to_thread(cluster.kill)
    for node in cluster.nodes:
        node.start()
    await asyncio.to_thread(cluster.wait_ready, timeout_s=READY_TIMEOUT_S)


def _state_hash(cluster: LocalCluster) -> list[tuple[int, str]]:
    hashes = []
    for node in cluster.nodes:
        with node.get("/v1/snapshot/hash", timeout_s=5.0) as answer:
            document = json.load(answer)
        hashes.append((int(document["machine_index"]), str(document["sha256"])))
    return hashes


def _same_state_everywhere(cluster: LocalCluster) -> tuple[int, str]:
    """Every node's (index, hash), asked until all answer the same index (the leader's lease
    ticks keep the index moving, so an attempt may catch one node a tick ahead)."""
    seen: list[tuple[int, str]] = []
    for _ in range(HASH_ATTEMPTS_MAX):
        seen = _state_hash(cluster)
        if len({index for index, _ in seen}) == 1:
            assert len({digest for _, digest in seen}) == 1, seen
            return seen[0]
    raise AssertionError(f"nodes never answered at one index: {seen}")


async def _check(cluster: LocalCluster, load: Load) -> int:
    async with AsyncClient(cluster.urls, timeout_s=10.0) as client:
        found = {item.key: item.value async for item in client.kv.list(KEY_PREFIX)}
    missing = {key for key in load.acknowledged if key not in found}
    assert not missing, f"acknowledged writes lost: {sorted(missing)[:10]} ({len(missing)})"
    wrong = {key for key, value in load.acknowledged.items() if found[key] != value.encode()}
    assert not wrong, f"acknowledged writes with another value: {sorted(wrong)[:10]}"
    return len(found)


def run_crash_cycles(tmp_path: Path, *, cycles: int, durability: str, seed: int) -> dict[str, int]:
    """Runs the scenario; returns its counts. Raises AssertionError (with the seed) on a loss."""
    chooser = random.Random(seed)
    load = Load()
    cluster = LocalCluster(tmp_path / "cluster", settings={"raft.durability": durability})
    try:
        cluster.start(timeout_s=READY_TIMEOUT_S)

        async def scenario() -> int:
            for cycle in range(cycles):
                kill_after = chooser.randint(ACKS_BEFORE_KILL_MIN, ACKS_BEFORE_KILL_MAX)
                await _cycle(cluster, load, cycle, kill_after)
            return await _check(cluster, load)

        try:
            present = asyncio.run(scenario())
            index, _ = _same_state_everywhere(cluster)
        except AssertionError as error:
            raise AssertionError(f"seed {seed}, durability {durability}: {error}") from None
    finally:
        with contextlib.suppress(Exception):
            cluster.kill()
    return {
        "cycles": cycles,
        "acknowledged": len(load.acknowledged),
        "present": present,
        "attempts": load.attempts,
        "indefinite": load.indefinite,
        "machine_index": index,
    }


@pytest.mark.parametrize("durability", ["write", "fsync"])
def test_every_node_killed_at_once__twice__no_acknowledged_write_lost_and_replicas_agree(
    tmp_path: Path, durability: str
) -> None:
    result = run_crash_cycles(tmp_path, cycles=2, durability=durability, seed=1)
    assert result["acknowledged"] >= 2 * ACKS_BEFORE_KILL_MIN
    print(result)


@pytest.mark.slow
@pytest.mark.parametrize("durability", ["write", "fsync"])
def test_every_node_killed_at_once__twenty_times__no_acknowledged_write_lost(
    tmp_path: Path, durability: str
) -> None:
    result = run_crash_cycles(tmp_path, cycles=20, durability=durability, seed=20)
    assert result["acknowledged"] >= 20 * ACKS_BEFORE_KILL_MIN
    print(result)
