"""One closed-loop HTTP load generator for every system the API benchmark measures.

A cell is `concurrency` workers on one asyncio loop, each doing one operation after another: first
for a warm-up, then for a timed window. What an operation is (one HTTP request or several) is up to
the system's adapter, an `Operation`; this module knows nothing about any system. The rules, the
same for every system:

- Each member has its own connection pool (an aiohttp `ClientSession`, at most `concurrency`
  connections). A worker sends each request to the next member in turn, worker w starting at
  member w mod n: requests spread evenly over leader and followers, as etcd's clientv3 spreads
  them (round robin per call).
- An operation counts when it completes inside the timed window; its latency runs from its start
  to its completion. Workers start no operation after the window and the cell waits for those in
  flight (the drain), so the next cell starts from a quiet system.
- With `cpu_pids`, a cell also measures the CPU time (user and system, all threads, from
  `/proc`) those processes (the system's members) and this process (the load generator) used
  during the timed window, per counted operation: on a machine whose cores the members and the
  load generator share, where the time goes.
- A failed operation is never counted as an operation: it is counted by error code, in every
  phase (warm-up, window and drain), and the worker pauses `ERROR_PAUSE_S` before its next one so
  a failing system is not hammered in a tight loop. Timeouts and connection errors are failures
  too (their outcome is unknown, so the operation is not counted).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import msgspec

if __name__ == "__main__":
    # Run as a script, a module does nothing or fails on an import: say whose it is.
    print(
        f"{__file__} is the load generator of bench/api.py, http_server.py, durability.py and "
        "raft_messages.py, not a script: run one of those",
        file=sys.stderr,
    )
    raise SystemExit(2)

from raftstore.member import latency_summary

__all__ = [
    "CellResult",
    "Endpoints",
    "ErrorCode",
    "Operation",
    "OperationFailed",
    "Worker",
    "process_cpu_s",
    "run_cell",
    "with_descendants",
]

# A worker whose operation failed waits this long before its next one.
ERROR_PAUSE_S = 0.01
# How long the in-flight operations may take to finish after the window, beyond one request's
# own timeout; past it they are cancelled and the cell fails.
DRAIN_MARGIN_S = 5.0
# Worker setup (sessions, leases) and cleanup are a handful of requests each.
SETUP_TIMEOUT_S = 60.0

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder()
_JSON_HEADERS = {"Content-Type": "application/json"}

# Turns a non-2xx answer (its status and decoded body, None when it had none) into an error code,
# the key failures are counted under. Each system knows the shape of its own errors.
ErrorCode = Callable[[int, Any], str]


class OperationFailed(Exception):
    """An operation did not succeed; `code` names why (an HTTP status and the system's error
    code, "timeout", "connection ...", or a check the adapter made on the answer)."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


class Endpoints:
    """One connection pool per member, opened and closed with `async with`."""

    def __init__(
        self,
        urls: Sequence[str],
        *,
        connections_per_member: int,
        request_timeout_s: float,
        error_code: ErrorCode,
    ) -> None:
        assert urls, "a system needs at least one member"
        self.urls = list(urls)
        self.error_code = error_code
        self._connections_per_member = connections_per_member
        self._timeout = aiohttp.ClientTimeout(total=request_timeout_s)
        self.sessions: list[aiohttp.ClientSession] = []

    async def __aenter__(self) -> Endpoints:
        self.sessions = [
            aiohttp.ClientSession(
                base_url=url,
                connector=aiohttp.TCPConnector(limit=self._connections_per_member),
                timeout=self._timeout,
            )
            for url in self.urls
        ]
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        for session in self.sessions:
            await session.close()
        self.sessions = []


@dataclass
class Worker:
    """One closed-loop client: its index, the members it sends to in turn, and whatever the
    operation keeps between its steps (a session, a lease, a sequence number)."""

    index: int
    endpoints: Endpoints
    state: dict[str, Any] = field(default_factory=dict)
    _next_member: int = -1

    def __post_init__(self) -> None:
        self._next_member = self.index % len(self.endpoints.urls)

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        headers: Mapping[str, str] | None = None,
    ) -> Any:
        """Sends one request to the next member in turn and returns the decoded JSON answer;
        raises `OperationFailed` for anything but a 2xx answer with a JSON body (or none)."""
        member = self._next_member
        self._next_member = (member + 1) % len(self.endpoints.urls)
        session = self.endpoints.sessions[member]
        data = None if body is None else _encoder.encode(body)
        sent_headers = {**_JSON_HEADERS, **headers} if headers else _JSON_HEADERS
        try:
            async with session.request(method, path, data=data, headers=sent_headers) as answer:
                status = answer.status
                payload = await answer.read()
        except TimeoutError:
            raise OperationFailed("timeout") from None
        except aiohttp.ClientError as error:
            raise OperationFailed(f"connection ({type(error).__name__})") from None
        try:
            document = _decoder.decode(payload) if payload else None
        except msgspec.DecodeError:
            raise OperationFailed(f"{status} answer is not JSON") from None
        if not 200 <= status < 300:
            raise OperationFailed(self.endpoints.error_code(status, document))
        return document


class Operation(Protocol):
    """What one system does for one kind of operation. `prepare` runs for every worker before
    the warm-up and `finish` after the drain (neither is timed); `run` is one timed operation."""

    async def prepare(self, worker: Worker) -> None: ...

    async def run(self, worker: Worker) -> None: ...

    async def finish(self, worker: Worker) -> None: ...


@dataclass(frozen=True, kw_only=True)
class CellResult:
    operations: int
    duration_s: float
    ops_per_s: float
    latency_p50_ms: float | None
    latency_p99_ms: float | None
    # Failed operations by error code, over warm-up, window and drain.
    failures: dict[str, int]
    # CPU time per counted operation during the window, in microseconds: the members' together
    # (`cpu_pids`) and the load generator's; None when not measured or nothing was counted.
    members_cpu_us_per_op: float | None = None
    driver_cpu_us_per_op: float | None = None
    # Disk syncs per counted operation during the window, all members together (`sync_count`);
    # None when not measured.
    syncs_per_op: float | None = None

    @property
    def failed(self) -> int:
        return sum(self.failures.values())

    def as_dict(self) -> dict[str, Any]:
        return {
            "operations": self.operations,
            "duration_s": self.duration_s,
            "ops_per_s": self.ops_per_s,
            "latency_p50_ms": self.latency_p50_ms,
            "latency_p99_ms": self.latency_p99_ms,
            "failed": self.failed,
            "failures": dict(self.failures),
            "members_cpu_us_per_op": self.members_cpu_us_per_op,
            "driver_cpu_us_per_op": self.driver_cpu_us_per_op,
            "syncs_per_op": self.syncs_per_op,
        }


def with_descendants(pids: Sequence[int]) -> list[int]:
    """`pids` and every process below them (children, their children...), from `/proc`: a
    member's helper processes (xr's journal sync helper) use CPU for it."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found: list[int] = []
    waiting = list(pids)
    while waiting:
        pid = waiting.pop()
        if pid not in found:
            found.append(pid)
            waiting.extend(parents.get(pid, []))
    return sorted(found)


def process_cpu_s(pids: Sequence[int]) -> float | None:
    """User plus system CPU time, in seconds, of the processes `pids` (all their threads)
    together, from `/proc/PID/stat`; None if one of them cannot be read (gone, or no `/proc`)."""
    ticks = 0
    for pid in pids:
        try:
            # The fields after the command name, which is in parentheses and may hold spaces:
            # utime and stime are the 14th and 15th fields of the line, so the 12th and 13th
            # after it.
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])
        except (OSError, ValueError, IndexError):
            return None
    return ticks / os.sysconf("SC_CLK_TCK")


@dataclass
class _Window:
    start_s: float
    end_s: float
    latencies_s: list[float] = field(default_factory=list)
    failures: Counter[str] = field(default_factory=Counter)


@dataclass
class _CpuUse:
    """The CPU time the members and this process used during the window, once it has ended
    (None where it was not measured)."""

    members_s: float | None = None
    driver_s: float | None = None


async def _measure_cpu(window: _Window, pids: Sequence[int], use: _CpuUse) -> None:
    await asyncio.sleep(max(window.start_s - time.perf_counter(), 0.0))
    members_start, driver_start = process_cpu_s(pids), time.process_time()
    await asyncio.sleep(max(window.end_s - time.perf_counter(), 0.0))
    members_end, driver_end = process_cpu_s(pids), time.process_time()
    if members_start is not None and members_end is not None:
        use.members_s = members_end - members_start
    use.driver_s = driver_end - driver_start


async def _measure_count(
    window: _Window, count: Callable[[], Awaitable[float | None]], counted: list[float]
) -> None:
    """Appends to `counted` how much `count()` grew over the window, if both reads worked."""
    await asyncio.sleep(max(window.start_s - time.perf_counter(), 0.0))
    start = await count()
    await asyncio.sleep(max(window.end_s - time.perf_counter(), 0.0))
    end = await count()
    if start is not None and end is not None:
        counted.append(end - start)


def _per_op_us(seconds: float | None, operations: int) -> float | None:
    return None if seconds is None or operations == 0 else seconds * 1e6 / operations


async def _work(worker: Worker, operation: Operation, window: _Window) -> None:
    while True:
        started_s = time.perf_counter()
        if started_s >= window.end_s:
            return
        try:
            await operation.run(worker)
        except OperationFailed as failure:
            window.failures[failure.code] += 1
            await asyncio.sleep(ERROR_PAUSE_S)
            continue
        ended_s = time.perf_counter()
        if window.start_s <= ended_s <= window.end_s:
            window.latencies_s.append(ended_s - started_s)


async def _prepare(workers: Sequence[Worker], operation: Operation) -> None:
    """Sets every worker up at once; a worker that cannot be set up fails the cell."""
    try:
        async with asyncio.timeout(SETUP_TIMEOUT_S):
            await asyncio.gather(*(operation.prepare(worker) for worker in workers))
    except OperationFailed as failure:
        raise RuntimeError(f"worker setup failed: {failure.code}") from None
    except TimeoutError:
        raise RuntimeError(f"worker setup did not finish in {SETUP_TIMEOUT_S} s") from None


async def _finish(workers: Sequence[Worker], operation: Operation, failures: Counter[str]) -> None:
    """Cleans every worker up at once; a cleanup that fails is counted as "cleanup <code>"
    rather than failing the cell, whose measurement is already complete."""

    async def finish(worker: Worker) -> None:
        try:
            await operation.finish(worker)
        except OperationFailed as failure:
            failures[f"cleanup {failure.code}"] += 1

    try:
        async with asyncio.timeout(SETUP_TIMEOUT_S):
            await asyncio.gather(*(finish(worker) for worker in workers))
    except TimeoutError:
        failures["cleanup timeout"] += 1


async def run_cell(
    operation: Operation,
    urls: Sequence[str],
    *,
    concurrency: int,
    warmup_s: float,
    duration_s: float,
    request_timeout_s: float,
    error_code: ErrorCode,
    cpu_pids: Sequence[int] = (),
    sync_count: Callable[[], Awaitable[float | None]] | None = None,
) -> CellResult:
    """`concurrency` workers doing `operation` back to back: `warmup_s` unmeasured, then
    `duration_s` measured; with `cpu_pids`, the CPU time those processes and this one used
    in the window too, and with `sync_count` (the system's disk syncs so far, or None when
    they cannot be read) how many it made in the window."""
    assert concurrency >= 1 and duration_s > 0 and warmup_s >= 0
    async with Endpoints(
        urls,
        connections_per_member=concurrency,
        request_timeout_s=request_timeout_s,
        error_code=error_code,
    ) as endpoints:
        workers = [Worker(index, endpoints) for index in range(concurrency)]
        await _prepare(workers, operation)
        started_s = time.perf_counter()
        window = _Window(start_s=started_s + warmup_s, end_s=started_s + warmup_s + duration_s)
        cpu = _CpuUse()
        syncs: list[float] = []
        try:
            tasks = [asyncio.create_task(_work(worker, operation, window)) for worker in workers]
            if cpu_pids:
                tasks.append(asyncio.create_task(_measure_cpu(window, cpu_pids, cpu)))
            if sync_count is not None:
                tasks.append(asyncio.create_task(_measure_count(window, sync_count, syncs)))
            try:
                async with asyncio.timeout(
                    warmup_s + duration_s + request_timeout_s + DRAIN_MARGIN_S
                ):
                    await asyncio.gather(*tasks)
            except TimeoutError:
                raise RuntimeError(
                    f"operations still in flight {request_timeout_s + DRAIN_MARGIN_S} s "
                    "after the window"
                ) from None
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            await _finish(workers, operation, window.failures)
    summary = latency_summary(window.latencies_s)
    operations = len(window.latencies_s)
    return CellResult(
        operations=operations,
        duration_s=duration_s,
        ops_per_s=operations / duration_s,
        latency_p50_ms=summary["latency_p50_ms"],
        latency_p99_ms=summary["latency_p99_ms"],
        failures=dict(window.failures),
        members_cpu_us_per_op=_per_op_us(cpu.members_s, operations),
        driver_cpu_us_per_op=_per_op_us(cpu.driver_s, operations),
        syncs_per_op=syncs[0] / operations if syncs and operations else None,
    )
