"""xr's HTTP API against etcd 3.4's v3 JSON gateway, 3 members each on loopback, in the same run.

Systems: xr is `node.localcluster.LocalCluster` (three real `xr node run` processes); etcd is the
3-member cluster that `anchors/etcd-cluster` starts, with fsync (etcd's default), and with
`--no-fsync-too` a second etcd cluster with `--unsafe-no-fsync` as another reference row. All
clusters run for the whole benchmark; an idle cluster only heartbeats.

Operations, one closed loop of c workers each (`bench/_load.py`, the same code for every system):
- put: one write of a 64-byte value to the worker's own key.
- put_get: that write, then a linearizable read of the same key, which must return the value just
  written (one operation is the pair).
- lock_distinct: acquire and release a lock of the worker's own. xr: one session per worker,
  granted before the timed part, acquire with `wait_s` then release; etcd: one lease per worker,
  granted before, /v3/lock/lock then /v3/lock/unlock.
- lock_contended: the same on one lock name shared by all workers (waiting acquires).
xr writes carry `Xr-Client-Id` (one per worker, kept for the whole run) and `Xr-Seq`, as a real
client's do. Each worker sends each request to the next member in turn (round robin per request),
for both systems alike.

Interleaving: for each (operation, concurrency) cell, `--rounds` rounds, each measuring every
system once: xr, then etcd (then etcd without fsync) in odd rounds, the reverse order in even
rounds, so that neither system always runs first (right after the previous cell's load); the
figures are medians over rounds. Failed operations are counted per cell by error code and
printed; they are never counted as operations.

Run: `python bench/api.py [--duration 5] [--warmup 1] [--rounds 3] [--concurrency 1,16,64]
[--ops put,put_get,lock_distinct,lock_contended] [--no-fsync-too] [--json PATH]`. The load
generator runs in this process (uvloop), so it shares the machine's cores with every cluster
member. Every process it starts is stopped on exit, on errors and on Ctrl-C or SIGTERM. The last
line is one JSON object.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this file's folder comes first on the path, and `bench/raftstore.py` there
# would shadow the `raftstore` package that the load generator imports; the repository root takes
# its place.
_BENCH_DIRECTORY = Path(__file__).resolve().parent
sys.path[:] = [str(_BENCH_DIRECTORY.parent)] + [
    entry for entry in sys.path if Path(entry or ".").resolve() != _BENCH_DIRECTORY
]

import argparse  # noqa: E402
import asyncio  # noqa: E402
import base64  # noqa: E402
import contextlib  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import urllib.error  # noqa: E402
import urllib.request  # noqa: E402
from collections import Counter  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from typing import Any, Protocol, TypeVar  # noqa: E402

import aiohttp  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from bench._arguments import check_output_path, write_output  # noqa: E402
from bench._load import (  # noqa: E402
    CellResult,
    Operation,
    OperationFailed,
    Worker,
    run_cell,
    with_descendants,
)
from bench._signals import run_main, shielded  # noqa: E402
from node.localcluster import LocalCluster  # noqa: E402

OPERATIONS = ("put", "put_get", "lock_distinct", "lock_contended")
CONCURRENCIES = (1, 16, 64)
VALUE_BYTES = 64
MEMBERS = 3
# A request that takes longer has failed ("timeout"). Lock waits are shorter, so a waiting
# acquire is answered by the server ("not granted") before the client gives up on it.
REQUEST_TIMEOUT_S = 30.0
LOCK_WAIT_S = 20.0
# Sessions and leases outlive a cell's warm-up, window and drain by this much.
LEASE_MARGIN_S = 60.0
# Sessions and leases are granted once per cell and never renewed, and xr's sessions live at most
# an hour (`SESSION_TTL_MAX_MS`), so a cell's warm-up and window must fit well inside that.
CELL_S_MAX = 3_000.0
XR_READY_TIMEOUT_S = 60.0
ETCD_START_TIMEOUT_S = 300.0
ETCD_STOP_TIMEOUT_S = 60.0
# Lines of each member's log shown when a cluster does not start.
LOG_TAIL_LINES = 20
# Disk syncs, read from each member's /metrics at a cell's window start and end: xr's journal
# syncs (`fsync` mode), etcd's WAL fsyncs (a histogram's count).
METRICS_TIMEOUT_S = 10.0
XR_SYNCS_SAMPLE = "xr_raft_journal_syncs_total"
ETCD_SYNCS_SAMPLE = "etcd_disk_wal_fsync_duration_seconds_count"
ETCD_SCRIPT = Path(
    os.environ.get("XR_ETCD_CLUSTER", "/work/shared/anchors/etcd-cluster")
)  # `anchors/etcd-cluster` beside the design notes
# etcd members use BASE..BASE+2 for clients and BASE+10..BASE+12 for peers.
ETCD_PORT_OFFSETS = (0, 1, 2, 10, 11, 12)
ETCD_BASE_PORT_FIRST = 24_000
ETCD_BASE_PORT_CANDIDATES = 400
SPREAD = (
    "each worker sends each request to the next of the 3 members in turn (round robin per "
    "request, worker w starting at member w mod 3), for every system alike; one aiohttp "
    "connection pool per member"
)


@dataclass(frozen=True, kw_only=True)
class Target:
    """A goal from the issue: xr's throughput at least `ratio_min` times etcd's (with fsync), or
    with `latency`, etcd's p50 at least `ratio_min` times xr's (xr's p50 no higher)."""

    operation: str
    concurrency: int
    ratio_min: float
    latency: bool = False

    @property
    def label(self) -> str:
        if self.latency:
            return f"{self.operation} c={self.concurrency}: p50 no higher than etcd's"
        return f"{self.operation} c={self.concurrency}: ops/s >= {self.ratio_min:g}x etcd"


TARGETS = (
    Target(operation="put", concurrency=64, ratio_min=1.5),
    Target(operation="lock_distinct", concurrency=64, ratio_min=2.0),
    Target(operation="lock_contended", concurrency=16, ratio_min=10.0),
    *(
        Target(operation=operation, concurrency=1, ratio_min=1.0, latency=True)
        for operation in OPERATIONS
    ),
)


# Systems.


class System(Protocol):
    """A running cluster and the adapters that do the benchmark's operations on it."""

    name: str
    urls: list[str]

    def operation(self, kind: str, *, tag: str, lease_ttl_s: int) -> Operation: ...

    def error_code(self, status: int, document: Any) -> str: ...

    def check_alive(self) -> None: ...

    def member_pids(self) -> list[int]: ...

    async def sync_count(self) -> float | None: ...


async def metric_sum(urls: Sequence[str], sample: str) -> float | None:
    """The sum over the members at `urls` of the Prometheus sample named `sample` (all its
    labels) on each one's `/metrics`; None when a member cannot be read or has no such
    sample."""
    total = 0.0
    try:
        async with aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=METRICS_TIMEOUT_S)
        ) as session:
            for url in urls:
                async with session.get(f"{url}/metrics") as response:
                    if response.status != 200:
                        return None
                    text = await response.text()
                values = [
                    found.value
                    for family in text_string_to_metric_families(text)
                    for found in family.samples
                    if found.name == sample
                ]
                if not values:
                    return None
                total += sum(values)
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None
    return total


def _value(worker: Worker) -> str:
    """A 64-byte value that no other write in the run has, so a read can tell it apart."""
    number = worker.state["writes"] = worker.state.get("writes", 0) + 1
    return f"{worker.index}-{number}-".ljust(VALUE_BYTES, "x")


class XrSystem:
    name = "xr"

    def __init__(self, root: Path) -> None:
        self.cluster = LocalCluster(root / "xr", size=MEMBERS)
        self.urls = self.cluster.urls
        # One client id per worker for the whole run, and its last sequence number.
        self._client_prefix = f"bench-{os.getpid()}"
        self._seqs: Counter[int] = Counter()

    def start(self) -> None:
        self.cluster.start(timeout_s=XR_READY_TIMEOUT_S)

    def stop(self) -> None:
        self.cluster.kill()

    def check_alive(self) -> None:
        for node in self.cluster.nodes:
            if not node.running:
                raise RuntimeError(
                    f"xr region {node.region} exited with {node.exit_code}:\n{node.log_tail()}"
                )

    def node_pids(self) -> list[int]:
        """The node processes themselves."""
        return [node.process.pid for node in self.cluster.nodes if node.process is not None]

    def member_pids(self) -> list[int]:
        # With each node's own processes (its journal sync helper in "fsync" mode).
        return with_descendants(self.node_pids())

    async def sync_count(self) -> float | None:
        # Counted in `fsync` mode only (docs/durability.md); 0 in `write` mode.
        return await metric_sum(self.urls, XR_SYNCS_SAMPLE)

    def leader(self) -> str:
        node = self.cluster.leader()
        return "none" if node is None else f"{node.region} ({node.url})"

    def write_headers(self, worker: Worker) -> dict[str, str]:
        self._seqs[worker.index] += 1
        return {
            "Xr-Client-Id": f"{self._client_prefix}-{worker.index}",
            "Xr-Seq": str(self._seqs[worker.index]),
        }

    def error_code(self, status: int, document: Any) -> str:
        if isinstance(document, dict) and isinstance(document.get("error"), dict):
            return f"{status} {document['error'].get('code')}"
        return str(status)

    def operation(self, kind: str, *, tag: str, lease_ttl_s: int) -> Operation:
        if kind == "put":
            return XrPut(self, tag=tag)
        if kind == "put_get":
            return XrPutGet(self, tag=tag)
        shared = kind == "lock_contended"
        return XrLock(self, tag=tag, shared=shared, ttl_ms=lease_ttl_s * 1000)


class XrPut:
    def __init__(self, system: XrSystem, *, tag: str) -> None:
        self.system = system
        self.tag = tag

    async def prepare(self, worker: Worker) -> None:
        worker.state["path"] = f"/v1/kv/bench/{self.tag}/{worker.index}"

    async def put(self, worker: Worker) -> str:
        value = _value(worker)
        await worker.request(
            "PUT",
            worker.state["path"],
            {"value": value},
            headers=self.system.write_headers(worker),
        )
        return value

    async def run(self, worker: Worker) -> None:
        await self.put(worker)

    async def finish(self, worker: Worker) -> None:
        pass


class XrPutGet(XrPut):
    async def run(self, worker: Worker) -> None:
        value = await self.put(worker)
        document = await worker.request("GET", worker.state["path"])
        if document.get("value") != value:
            raise OperationFailed("read did not return the value just written")


class XrLock:
    def __init__(self, system: XrSystem, *, tag: str, shared: bool, ttl_ms: int) -> None:
        self.system = system
        self.tag = tag
        self.shared = shared
        self.ttl_ms = ttl_ms

    async def prepare(self, worker: Worker) -> None:
        name = f"bench-{self.tag}" if self.shared else f"bench-{self.tag}-{worker.index}"
        session = await worker.request(
            "POST",
            "/v1/sessions",
            {"ttl_ms": self.ttl_ms},
            headers=self.system.write_headers(worker),
        )
        worker.state["session_id"] = session["session_id"]
        worker.state["acquire"] = f"/v1/locks/{name}/acquire"
        worker.state["release"] = f"/v1/locks/{name}/release"

    async def run(self, worker: Worker) -> None:
        session_id = worker.state["session_id"]
        granted = await worker.request(
            "POST",
            worker.state["acquire"],
            {"session_id": session_id, "wait_s": LOCK_WAIT_S},
            headers=self.system.write_headers(worker),
        )
        if not granted.get("granted"):
            raise OperationFailed("lock not granted within wait_s")
        released = await worker.request(
            "POST",
            worker.state["release"],
            {"session_id": session_id},
            headers=self.system.write_headers(worker),
        )
        if not released.get("released"):
            raise OperationFailed("release answered released=false")

    async def finish(self, worker: Worker) -> None:
        await worker.request(
            "DELETE",
            f"/v1/sessions/{worker.state['session_id']}",
            headers=self.system.write_headers(worker),
        )


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


class StartFailed(RuntimeError):
    """A system did not start; the message holds what its logs said."""


def etcd_script_problem() -> str | None:
    """Why `ETCD_SCRIPT` cannot be run (checked before anything starts), or None."""
    if not ETCD_SCRIPT.is_file():
        return f"the etcd cluster script {ETCD_SCRIPT} does not exist"
    if not os.access(ETCD_SCRIPT, os.X_OK):
        return f"the etcd cluster script {ETCD_SCRIPT} is not executable"
    return None


class EtcdSystem:
    """A 3-member etcd cluster started and stopped by `anchors/etcd-cluster`."""

    def __init__(self, root: Path, *, name: str, fsync: bool, base_port: int) -> None:
        self.name = name
        self.fsync = fsync
        self.base_port = base_port
        self.directory = root / name
        self.urls: list[str] = []

    def _script(self, *arguments: str, timeout_s: float) -> str:
        # Its own session: a Ctrl-C in the terminal reaches this process, which stops the
        # members through the script, not the members themselves halfway through a cell.
        completed = subprocess.run(
            [str(ETCD_SCRIPT), *arguments, "--dir", str(self.directory)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            start_new_session=True,
            check=False,
        )
        if completed.returncode != 0:
            raise RuntimeError(
                f"{ETCD_SCRIPT.name} {arguments[0]} failed ({completed.returncode}): "
                f"{completed.stderr.strip()}"
            )
        return completed.stdout

    def start(self) -> None:
        options = ["--base-port", str(self.base_port)] + ([] if self.fsync else ["--no-fsync"])
        try:
            output = self._script("start", *options, timeout_s=ETCD_START_TIMEOUT_S)
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as error:
            # The members' logs are in the benchmark's temporary directory, which goes when the
            # benchmark ends: their last lines go with the error.
            raise StartFailed(f"{self.name} did not start: {error}\n{self.log_tails()}") from None
        self.urls = [line.strip() for line in output.splitlines() if line.startswith("http")]
        if len(self.urls) != MEMBERS:
            raise RuntimeError(f"{self.name}: expected {MEMBERS} client URLs, got {output!r}")

    def log_tails(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last `lines` lines of each member's log, each under its name."""
        parts = []
        for log in sorted(self.directory.glob("m*.log")):
            with contextlib.suppress(OSError):
                tail = log.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"--- last lines of {log.name} ---\n" + "\n".join(tail))
        return "\n".join(parts) or "(no member logs)"

    def _member_pids(self) -> list[int]:
        """The members' process ids, from the files the script keeps, for processes still
        running this cluster's data directory."""
        pids = []
        for pid_file in self.directory.glob("m*.pid"):
            with contextlib.suppress(OSError, ValueError):
                pid = int(pid_file.read_text())
                if str(self.directory) in Path(f"/proc/{pid}/cmdline").read_text():
                    pids.append(pid)
        return pids

    def member_pids(self) -> list[int]:
        return sorted(self._member_pids())

    async def sync_count(self) -> float | None:
        return await metric_sum(self.urls, ETCD_SYNCS_SAMPLE)

    def stop(self) -> None:
        """Stops the members through the script, then kills by process id any it left."""
        pids = self._member_pids()
        try:
            self._script("stop", timeout_s=ETCD_STOP_TIMEOUT_S)
        finally:
            for pid in pids:
                with contextlib.suppress(OSError):
                    if str(self.directory) in Path(f"/proc/{pid}/cmdline").read_text():
                        os.kill(pid, signal.SIGKILL)

    def check_alive(self) -> None:
        for member in range(MEMBERS):
            pid_file = self.directory / f"m{member}.pid"
            pid = int(pid_file.read_text()) if pid_file.exists() else None
            alive = pid is not None and Path(f"/proc/{pid}").exists()
            if not alive:
                log = (self.directory / f"m{member}.log").read_text(errors="replace")[-4000:]
                raise RuntimeError(f"{self.name} member m{member} is not running:\n{log}")

    def leader(self) -> str:
        for url in self.urls:
            try:
                status = _post_json(f"{url}/v3/maintenance/status", {})
            except (OSError, ValueError):
                continue
            if status.get("leader") == status.get("header", {}).get("member_id"):
                return f"m{self.urls.index(url)} ({url})"
        return "none"

    def version(self) -> str:
        with contextlib.suppress(OSError, ValueError, subprocess.SubprocessError):
            completed = subprocess.run(
                ["etcd", "--version"], capture_output=True, text=True, timeout=10, check=False
            )
            return completed.stdout.splitlines()[0]
        return "unknown"

    def error_code(self, status: int, document: Any) -> str:
        if isinstance(document, dict) and "code" in document:
            message = str(document.get("message", ""))[:60]
            return f"{status} grpc {document['code']} {message}".rstrip()
        return str(status)

    def operation(self, kind: str, *, tag: str, lease_ttl_s: int) -> Operation:
        if kind == "put":
            return EtcdPut(tag=tag)
        if kind == "put_get":
            return EtcdPutGet(tag=tag)
        shared = kind == "lock_contended"
        return EtcdLock(tag=tag, shared=shared, ttl_s=lease_ttl_s)


def _post_json(url: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=2.0) as answer:
        document: dict[str, Any] = json.load(answer)
        return document


class EtcdPut:
    def __init__(self, *, tag: str) -> None:
        self.tag = tag

    async def prepare(self, worker: Worker) -> None:
        worker.state["key"] = _b64(f"bench/{self.tag}/{worker.index}")

    async def put(self, worker: Worker) -> str:
        value = _b64(_value(worker))
        await worker.request("POST", "/v3/kv/put", {"key": worker.state["key"], "value": value})
        return value

    async def run(self, worker: Worker) -> None:
        await self.put(worker)

    async def finish(self, worker: Worker) -> None:
        pass


class EtcdPutGet(EtcdPut):
    async def run(self, worker: Worker) -> None:
        value = await self.put(worker)
        # serializable=false (the default) is etcd's linearizable read.
        document = await worker.request("POST", "/v3/kv/range", {"key": worker.state["key"]})
        found = document.get("kvs") or [{}]
        if found[0].get("value") != value:
            raise OperationFailed("read did not return the value just written")


class EtcdLock:
    def __init__(self, *, tag: str, shared: bool, ttl_s: int) -> None:
        self.tag = tag
        self.shared = shared
        self.ttl_s = ttl_s

    async def prepare(self, worker: Worker) -> None:
        name = f"bench-{self.tag}" if self.shared else f"bench-{self.tag}-{worker.index}"
        lease = await worker.request("POST", "/v3/lease/grant", {"TTL": self.ttl_s})
        worker.state["lease"] = lease["ID"]
        worker.state["name"] = _b64(name)

    async def run(self, worker: Worker) -> None:
        locked = await worker.request(
            "POST", "/v3/lock/lock", {"name": worker.state["name"], "lease": worker.state["lease"]}
        )
        key = locked.get("key")
        if not key:
            raise OperationFailed("lock answered without a key")
        await worker.request("POST", "/v3/lock/unlock", {"key": key})

    async def finish(self, worker: Worker) -> None:
        await worker.request("POST", "/v3/lease/revoke", {"ID": worker.state["lease"]})


# Ports, processes and signals.


def _ports_free(ports: Sequence[int]) -> bool:
    for port in ports:
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                return False
    return True


def _etcd_base_ports(count: int) -> list[int]:
    """`count` base ports whose etcd port sets are free now and do not overlap, starting from a
    place that depends on this process id, so that two benchmarks started together differ."""
    step = max(ETCD_PORT_OFFSETS) + 1
    first = ETCD_BASE_PORT_FIRST + (os.getpid() % ETCD_BASE_PORT_CANDIDATES) * step
    found: list[int] = []
    for candidate in range(ETCD_BASE_PORT_CANDIDATES):
        base = first + candidate * step
        if base + step >= 65_536:
            break
        if _ports_free([base + offset for offset in ETCD_PORT_OFFSETS]):
            found.append(base)
            if len(found) == count:
                return found
    raise RuntimeError("no free ports for etcd")


def _stop_all(stoppers: Sequence[Callable[[], None]]) -> None:
    """Stops every cluster, the last started first. SIGINT and SIGTERM are ignored meanwhile, so
    a second Ctrl-C cannot leave members behind, and a failure to stop one does not skip the
    others."""
    with shielded():
        for stop in reversed(stoppers):
            try:
                stop()
            except Exception as error:
                print(f"could not stop a cluster cleanly: {error}", file=sys.stderr)


def _event_loop_runner() -> asyncio.Runner:
    try:
        import uvloop
    except ImportError:
        return asyncio.Runner()
    return asyncio.Runner(loop_factory=uvloop.new_event_loop)


# Measuring.

_Item = TypeVar("_Item")


def _milliseconds(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.2f} ms"


def _failures_text(failures: dict[str, int]) -> str:
    if not failures:
        return "0"
    detail = ", ".join(f"{code}: {count}" for code, count in sorted(failures.items()))
    return f"{sum(failures.values())} ({detail})"


def round_order(systems: Sequence[_Item], round_number: int) -> list[_Item]:
    """The order in which round `round_number` (from 0) measures `systems`: as given, then
    reversed, alternately."""
    return list(systems) if round_number % 2 == 0 else list(reversed(systems))


async def _measure(
    systems: Sequence[System], arguments: argparse.Namespace, *, count_syncs: bool = False
) -> dict[tuple[str, int], dict[str, list[CellResult]]]:
    """Every cell, each system in turn within a round, in an order reversed every other round;
    with `count_syncs`, each system's disk syncs in the window too."""
    cells = [
        (operation, concurrency)
        for operation in arguments.ops
        for concurrency in arguments.concurrency
    ]
    lease_ttl_s = math.ceil(arguments.warmup + arguments.duration + REQUEST_TIMEOUT_S) + round(
        LEASE_MARGIN_S
    )
    total = len(cells) * arguments.rounds * len(systems)
    done = 0
    results: dict[tuple[str, int], dict[str, list[CellResult]]] = {}
    for operation, concurrency in cells:
        per_system: dict[str, list[CellResult]] = {system.name: [] for system in systems}
        results[operation, concurrency] = per_system
        for round_number in range(arguments.rounds):
            for system in round_order(systems, round_number):
                tag = f"{operation}-c{concurrency}-r{round_number}"
                result = await run_cell(
                    system.operation(operation, tag=tag, lease_ttl_s=lease_ttl_s),
                    system.urls,
                    concurrency=concurrency,
                    warmup_s=arguments.warmup,
                    duration_s=arguments.duration,
                    request_timeout_s=REQUEST_TIMEOUT_S,
                    error_code=system.error_code,
                    cpu_pids=system.member_pids(),
                    sync_count=system.sync_count if count_syncs else None,
                )
                system.check_alive()
                per_system[system.name].append(result)
                done += 1
                print(
                    f"[{done:>3}/{total}] {operation:<14} c={concurrency:<3} "
                    f"round {round_number + 1}/{arguments.rounds} {system.name:<12} "
                    f"{result.ops_per_s:>9,.0f} ops/s  p50 {_milliseconds(result.latency_p50_ms)}"
                    f"  p99 {_milliseconds(result.latency_p99_ms)}  "
                    f"failed {_failures_text(result.failures)}",
                    flush=True,
                )
    return results


@dataclass(frozen=True, kw_only=True)
class Summary:
    """One system's figures in one cell: medians over rounds, failures summed."""

    ops_per_s: float
    latency_p50_ms: float
    latency_p99_ms: float
    failures: dict[str, int]
    # CPU time per operation in the window, microseconds: the members' together, the load
    # generator's (NaN where not measured).
    members_cpu_us_per_op: float = math.nan
    driver_cpu_us_per_op: float = math.nan
    # Disk syncs per operation in the window, the members' together (NaN where not counted).
    syncs_per_op: float = math.nan

    @classmethod
    def of(cls, rounds: Sequence[CellResult]) -> Summary:
        def median(values: Sequence[float | None]) -> float:
            present = [value for value in values if value is not None]
            return float(statistics.median(present)) if present else math.nan

        failures: Counter[str] = Counter()
        for result in rounds:
            failures.update(result.failures)
        return cls(
            ops_per_s=median([result.ops_per_s for result in rounds]),
            latency_p50_ms=median([result.latency_p50_ms for result in rounds]),
            latency_p99_ms=median([result.latency_p99_ms for result in rounds]),
            failures=dict(failures),
            members_cpu_us_per_op=median([result.members_cpu_us_per_op for result in rounds]),
            driver_cpu_us_per_op=median([result.driver_cpu_us_per_op for result in rounds]),
            syncs_per_op=median([result.syncs_per_op for result in rounds]),
        )

    @property
    def failed(self) -> int:
        return sum(self.failures.values())


def _ratio(numerator: float, denominator: float) -> float:
    if math.isnan(numerator) or math.isnan(denominator) or denominator == 0:
        return math.nan
    return numerator / denominator


def _ratio_text(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2f}x"


def _verdict(target: Target, cell: dict[str, Summary] | None) -> tuple[str, float]:
    """ "met", "not met" or "unknown ..." (three-valued: a figure from a cell with failed
    operations, or no figure at all, proves nothing), and the measured ratio."""
    if cell is None:
        return "unknown (not measured)", math.nan
    xr, etcd = cell["xr"], cell["etcd"]
    if target.latency:
        ratio = _ratio(etcd.latency_p50_ms, xr.latency_p50_ms)
    else:
        ratio = _ratio(xr.ops_per_s, etcd.ops_per_s)
    if math.isnan(ratio):
        return "unknown (no figure)", ratio
    if ratio < target.ratio_min:
        return "not met", ratio
    failed = xr.failed + etcd.failed
    if failed:
        return f"unknown ({failed} failed operations)", ratio
    return "met", ratio


def _report(
    results: dict[tuple[str, int], dict[str, list[CellResult]]], names: Sequence[str]
) -> tuple[list[str], dict[tuple[str, int], dict[str, Summary]], list[dict[str, Any]]]:
    summaries = {
        cell: {name: Summary.of(rounds) for name, rounds in per_system.items()}
        for cell, per_system in results.items()
    }
    targets_by_cell: dict[tuple[str, int], list[Target]] = {}
    for target in TARGETS:
        targets_by_cell.setdefault((target.operation, target.concurrency), []).append(target)
    references = [name for name in names if name != "xr"]
    header = ["operation", "c", "xr ops/s", "xr p50", "xr p99"]
    for name in references:
        header += [f"{name} ops/s", f"{name} p50", f"{name} p99", f"ops/s xr/{name}"]
    header += ["p50 etcd/xr", "target", "failed ops"]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for (operation, concurrency), cell in summaries.items():
        row = [operation, str(concurrency)]
        for name in ["xr", *references]:
            summary = cell[name]
            row += [
                f"{summary.ops_per_s:,.0f}",
                _milliseconds(summary.latency_p50_ms),
                _milliseconds(summary.latency_p99_ms),
            ]
            if name != "xr":
                row.append(_ratio_text(_ratio(cell["xr"].ops_per_s, summary.ops_per_s)))
        row.append(_ratio_text(_ratio(cell["etcd"].latency_p50_ms, cell["xr"].latency_p50_ms)))
        verdicts = []
        for target in targets_by_cell.get((operation, concurrency), []):
            verdict, _ = _verdict(target, cell)
            what = "p50" if target.latency else f"ops/s >={target.ratio_min:g}x"
            verdicts.append(f"{what}: {verdict}")
        row.append("; ".join(verdicts) or "-")
        row.append(
            ", ".join(f"{name} {cell[name].failed}" for name in ["xr", *references])
            if any(summary.failed for summary in cell.values())
            else "0"
        )
        lines.append("| " + " | ".join(row) + " |")
    verdicts_out = []
    for target in TARGETS:
        verdict, ratio = _verdict(target, summaries.get((target.operation, target.concurrency)))
        verdicts_out.append(
            {
                "target": target.label,
                "operation": target.operation,
                "concurrency": target.concurrency,
                "kind": "p50 etcd/xr" if target.latency else "ops/s xr/etcd",
                "ratio_min": target.ratio_min,
                "ratio": None if math.isnan(ratio) else round(ratio, 3),
                "verdict": verdict,
            }
        )
    return lines, summaries, verdicts_out


def _failure_lines(summaries: dict[tuple[str, int], dict[str, Summary]]) -> list[str]:
    lines = []
    for (operation, concurrency), cell in summaries.items():
        for name, summary in cell.items():
            if summary.failures:
                lines.append(
                    f"  {operation} c={concurrency} {name}: {_failures_text(summary.failures)}"
                )
    return lines


def _number(value: float) -> float | None:
    return None if math.isnan(value) else round(value, 3)


def _document(
    arguments: argparse.Namespace,
    results: dict[tuple[str, int], dict[str, list[CellResult]]],
    summaries: dict[tuple[str, int], dict[str, Summary]],
    verdicts: list[dict[str, Any]],
    context: dict[str, Any],
) -> dict[str, Any]:
    cells = []
    for (operation, concurrency), per_system in results.items():
        cell = summaries[operation, concurrency]
        cells.append(
            {
                "operation": operation,
                "concurrency": concurrency,
                "systems": {
                    name: {
                        "ops_per_s": _number(cell[name].ops_per_s),
                        "latency_p50_ms": _number(cell[name].latency_p50_ms),
                        "latency_p99_ms": _number(cell[name].latency_p99_ms),
                        "failures": cell[name].failures,
                        "rounds": [result.as_dict() for result in rounds],
                    }
                    for name, rounds in per_system.items()
                },
                "ops_ratio_xr_etcd": _number(_ratio(cell["xr"].ops_per_s, cell["etcd"].ops_per_s)),
                "p50_ratio_etcd_xr": _number(
                    _ratio(cell["etcd"].latency_p50_ms, cell["xr"].latency_p50_ms)
                ),
            }
        )
    return {
        "bench": "api",
        "settings": {
            "duration_s": arguments.duration,
            "warmup_s": arguments.warmup,
            "rounds": arguments.rounds,
            "concurrency": list(arguments.concurrency),
            "ops": list(arguments.ops),
            "value_bytes": VALUE_BYTES,
            "spread": SPREAD,
            "cpu_count": os.cpu_count(),
            **context,
        },
        "cells": cells,
        "targets": verdicts,
    }


def run(arguments: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="xr-bench-api-") as directory:
        root = Path(directory)
        base_ports = _etcd_base_ports(2 if arguments.no_fsync_too else 1)
        xr = XrSystem(root)
        etcd_systems = [EtcdSystem(root, name="etcd", fsync=True, base_port=base_ports[0])]
        if arguments.no_fsync_too:
            etcd_systems.append(
                EtcdSystem(root, name="etcd-nofsync", fsync=False, base_port=base_ports[1])
            )
        stoppers: list[Callable[[], None]] = []
        try:
            print(f"starting xr (3 regions) and etcd under {root}", flush=True)
            stoppers.append(xr.stop)
            xr.start()
            for etcd in etcd_systems:
                stoppers.append(etcd.stop)
                etcd.start()
            systems: list[System] = [xr, *etcd_systems]
            leaders_before = {"xr": xr.leader(), **{e.name: e.leader() for e in etcd_systems}}
            version = etcd_systems[0].version()
            print(
                f"{version}; leaders: "
                + ", ".join(f"{name} {leader}" for name, leader in leaders_before.items())
                + f"\nrequests: {SPREAD}\nload generator: this process (uvloop), sharing "
                f"{os.cpu_count()} cores with every cluster member\n{arguments.rounds} round(s) "
                f"of {arguments.warmup} s warm-up + {arguments.duration} s per cell and system",
                flush=True,
            )
            with _event_loop_runner() as runner:
                results = runner.run(_measure(systems, arguments))
            leaders_after = {"xr": xr.leader(), **{e.name: e.leader() for e in etcd_systems}}
        finally:
            _stop_all(stoppers)
    lines, summaries, verdicts = _report(results, [system.name for system in systems])
    print()
    print(
        f"median of {arguments.rounds} interleaved round(s); ops/s and latency per operation; "
        "p50 etcd/xr > 1 means xr is faster"
    )
    for line in lines:
        print(line)
    failure_lines = _failure_lines(summaries)
    if failure_lines:
        print("failed operations (all rounds, warm-up and drain included):")
        for line in failure_lines:
            print(line)
    print("targets (against etcd with fsync):")
    for verdict in verdicts:
        ratio = math.nan if verdict["ratio"] is None else verdict["ratio"]
        print(f"  {verdict['target']}: {_ratio_text(ratio)} -> {verdict['verdict']}")
    if leaders_after != leaders_before:
        print(f"leaders changed during the run: before {leaders_before}, after {leaders_after}")
    return _document(
        arguments,
        results,
        summaries,
        verdicts,
        {"etcd_version": version, "leaders_before": leaders_before, "leaders_after": leaders_after},
    )


def _listed(kind: Callable[[str], Any], allowed: Sequence[Any] | None = None) -> Any:
    def parse(text: str) -> tuple[Any, ...]:
        values = tuple(kind(part.strip()) for part in text.split(",") if part.strip())
        unknown = [value for value in values if allowed is not None and value not in allowed]
        if not values or unknown:
            raise argparse.ArgumentTypeError(
                f"expected a comma-separated list of {', '.join(map(str, allowed or ['numbers']))}"
            )
        return values

    return parse


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per cell (5)")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds before each cell (1)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (3)")
    parser.add_argument(
        "--concurrency",
        type=_listed(int),
        default=CONCURRENCIES,
        help="comma-separated workers per cell (1,16,64)",
    )
    parser.add_argument(
        "--ops",
        type=_listed(str, OPERATIONS),
        default=OPERATIONS,
        help=f"comma-separated operations ({','.join(OPERATIONS)})",
    )
    parser.add_argument(
        "--no-fsync-too",
        action="store_true",
        help="also measure etcd with --unsafe-no-fsync, as a second reference",
    )
    parser.add_argument("--json", type=Path, help="write every figure to this file as JSON")
    arguments = parser.parse_args(argv)
    # Written so that NaN, which compares false with anything, is refused too.
    if not (arguments.duration > 0 and arguments.warmup >= 0) or arguments.rounds < 1:
        parser.error("--duration must be positive, --warmup not negative, --rounds at least 1")
    if arguments.duration + arguments.warmup > CELL_S_MAX:
        parser.error(f"--warmup plus --duration must be at most {CELL_S_MAX:g} s")
    if any(concurrency < 1 for concurrency in arguments.concurrency):
        parser.error("every --concurrency must be at least 1")
    check_output_path(parser, "--json", arguments.json)
    return run_main(lambda: _main(arguments))


def _main(arguments: argparse.Namespace) -> int:
    problem = etcd_script_problem()
    if problem is not None:
        print(f"api: {problem} (XR_ETCD_CLUSTER names another)", file=sys.stderr)
        return 2
    started_s = time.monotonic()
    try:
        document = run(arguments)
    except StartFailed as error:
        print(f"api: {error}", file=sys.stderr)
        return 1
    document["settings"]["wall_s"] = round(time.monotonic() - started_s, 1)
    written = True
    if arguments.json is not None:
        written = write_output(arguments.json, json.dumps(document, indent=2) + "\n", program="api")
        if written:
            print(f"wrote {arguments.json}")
    print(
        json.dumps(
            {
                "bench": "api",
                "targets": {
                    verdict["target"]: {"ratio": verdict["ratio"], "verdict": verdict["verdict"]}
                    for verdict in document["targets"]
                },
            }
        )
    )
    return 0 if written else 1


if __name__ == "__main__":
    sys.exit(main())
