"""Overload: what a cluster does when offered twice the writes it can take.

1. Capacity: closed-loop PUTs over the HTTP API (`CAPACITY_CONCURRENCY` workers, round robin
   over the members) for `--capacity` seconds.
2. Overload: open-loop PUTs at `--factor` times that rate (the target) for `--duration` seconds.
   Requests start on a fixed schedule whatever the answers, each from a client that has no
   request outstanding (a pool of client ids, each sending one request at a time with
   `Xr-Client-Id` / `Xr-Seq`), with no retries. A request ends within `REQUEST_TIMEOUT_S`, so
   the pool may grow to the target rate times that (`clients_max`), within the open files this
   process may have; when every client is busy a scheduled request is skipped, and the report
   then says by how much the rate actually offered (the requests sent) fell short of the
   target. Meanwhile `/healthz` of every member is probed every `HEALTH_PERIOD_S` from a
   process of its own (`--probe`), so a probe's time is the node's and the machine's, not the
   time it waited in the load generator's busy event loop.
3. Check: every acknowledged write is read back (each client writes its own key, so the key must
   hold the client's last acknowledged value); a lost one is a bug.

Reported: capacity, the target rate, the requests sent and skipped and the rate they offered,
admitted (2xx), refused (429, and how many lacked Retry-After),
other answers, unanswered (timeouts, connection errors), p50/p99/max latency of admitted requests
as the generator saw it, the same PUTs as the nodes timed them (their handling time, from the
`xr_http_request_duration_seconds` histogram scraped before and after; it leaves out the time a
request waited before a node read it), the health probes' p50/p99/max and how many were not 200,
and lost acknowledged writes. A table, then one JSON line.

On one machine the generator shares the cores with the nodes: the generator's figures then hold
its own queueing, and the nodes' figures leave out the kernel's and the parser's; the truth lies
between them.

    python -m bench.overload [--members 3] [--duration 60] [--factor 2]

Ctrl-C or SIGTERM stops the cluster and removes its directory.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script (`bench/run_all.py` runs it so), this file's folder comes first on the path, and
# `bench/raftstore.py` there would shadow the `raftstore` package; the repository root takes its
# place.
_BENCH_DIRECTORY = Path(__file__).resolve().parent
sys.path[:] = [str(_BENCH_DIRECTORY.parent)] + [
    entry for entry in sys.path if Path(entry or ".").resolve() != _BENCH_DIRECTORY
]

import argparse  # noqa: E402
import asyncio  # noqa: E402
import contextlib  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import urllib.error  # noqa: E402
import urllib.request  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from typing import Any  # noqa: E402

import aiohttp  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from bench._signals import kill_cluster, run_main, shielded  # noqa: E402
from node.localcluster import LocalCluster  # noqa: E402

__all__ = ["Settings", "clients_max", "main", "run"]

CAPACITY_CONCURRENCY = 64
HEALTH_PERIOD_S = 0.1
# A request unanswered after this long counts as unanswered (its outcome is unknown).
REQUEST_TIMEOUT_S = 10.0
# The pool of client ids (each with at most one request, so one connection, outstanding): at
# least CLIENTS_MIN, and as many as the target rate times REQUEST_TIMEOUT_S, but at most
# CLIENTS_MAX and within the open files this process may have less FILE_DESCRIPTORS_RESERVED (the
# cluster's pipes, the prober, Python). CLIENTS_MAX: with a pool of up to 19,744 (session 32) the
# generator, one Python process on the nodes' cores, became the bottleneck: it sent 1,882 puts/s
# of a 7,824/s target with a p50 of 7.5 s in its own queues, the nodes admitted 297/s of their
# 3,912/s capacity, and on a loaded machine 1,182 requests went unanswered. At 5,000 a run
# measures the nodes more than the generator, and says by how much the offered rate fell short.
CLIENTS_MIN = 1_000
CLIENTS_MAX = 5_000
FILE_DESCRIPTORS_RESERVED = 256
READY_TIMEOUT_S = 60.0


@dataclass(frozen=True, kw_only=True)
class Settings:
    base_dir: Path
    members: int = 3
    duration_s: float = 60.0
    capacity_s: float = 5.0
    offered_factor: float = 2.0
    # None: the node's default (`http.requests_in_flight_max`).
    requests_in_flight_max: int | None = None


@dataclass
class _Client:
    client_id: str
    seq: int = 0
    acknowledged: str | None = None


class _Counts:
    def __init__(self) -> None:
        self.sent = 0
        self.admitted = 0
        self.refused = 0
        self.refused_without_retry_after = 0
        self.other: dict[str, int] = {}
        self.unanswered = 0
        self.skipped = 0
        self.latencies_s: list[float] = []


def clients_max(rate_per_s: float) -> tuple[int, str | None]:
    """The pool's bound for `rate_per_s`, and why it is less than the rate needs (None: it is
    not). Raises this process's open-file limit to its hard limit where that helps."""
    wanted_by_rate = max(CLIENTS_MIN, math.ceil(rate_per_s * REQUEST_TIMEOUT_S))
    needed = min(wanted_by_rate, CLIENTS_MAX)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = needed + FILE_DESCRIPTORS_RESERVED
    if soft != resource.RLIM_INFINITY and soft < wanted:
        raised = wanted if hard == resource.RLIM_INFINITY else min(hard, wanted)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = raised
        except (OSError, ValueError):
            pass
    if soft != resource.RLIM_INFINITY and needed > soft - FILE_DESCRIPTORS_RESERVED:
        available = max(1, soft - FILE_DESCRIPTORS_RESERVED)
        return available, (
            f"the open-file limit ({soft}) leaves {available} clients; the target rate needs up "
            f"to {wanted_by_rate}"
        )
    if needed < wanted_by_rate:
        return needed, (
            f"the pool is capped at {CLIENTS_MAX:,} clients (more made this generator, not the "
            f"nodes, the bottleneck); the target rate needs up to {wanted_by_rate:,}"
        )
    return needed, None


async def _capacity(
    session: aiohttp.ClientSession, urls: list[str], seconds: float
) -> tuple[float, int]:
    """Closed-loop PUTs per second, and the failures seen (not counted as operations)."""
    done = 0
    failures = 0
    deadline_s = time.monotonic() + seconds

    async def worker(index: int) -> None:
        nonlocal done, failures
        turn = index
        while time.monotonic() < deadline_s:
            url = urls[turn % len(urls)]
            turn += 1
            try:
                async with session.put(
                    f"{url}/v1/kv/overload/capacity/{index}", json={"value": str(turn)}
                ) as answer:
                    await answer.read()
                    if answer.status == 200:
                        done += 1
                    else:
                        failures += 1
                        await asyncio.sleep(0.01)
            except (aiohttp.ClientError, TimeoutError):
                failures += 1
                await asyncio.sleep(0.01)

    started_s = time.monotonic()
    await asyncio.gather(*(worker(index) for index in range(CAPACITY_CONCURRENCY)))
    return done / (time.monotonic() - started_s), failures


def _probe(urls: list[str]) -> dict[str, Any]:
    """The prober's loop (`--probe`): GET /healthz of each member every `HEALTH_PERIOD_S` until
    standard input closes; returns what it saw."""
    closed = threading.Event()

    def wait_for_close() -> None:
        sys.stdin.read()
        closed.set()

    threading.Thread(target=wait_for_close, daemon=True).start()
    latencies_s: list[float] = []
    not_ok = 0
    while not closed.is_set():
        for url in urls:
            started_s = time.monotonic()
            try:
                with urllib.request.urlopen(f"{url}/healthz", timeout=REQUEST_TIMEOUT_S) as answer:
                    answer.read()
                    ok = answer.status == 200
            except (OSError, urllib.error.URLError):
                ok = False
            latencies_s.append(time.monotonic() - started_s)
            not_ok += 0 if ok else 1
        closed.wait(HEALTH_PERIOD_S)
    ordered = sorted(latencies_s)
    return {
        "probes": len(ordered),
        "not_ok": not_ok,
        "latency_p50_ms": _percentile_ms(ordered, 0.50),
        "latency_p99_ms": _percentile_ms(ordered, 0.99),
        "latency_max_ms": _percentile_ms(ordered, 1.0),
    }


def _start_prober(urls: list[str]) -> subprocess.Popen[bytes]:
    # Its own session: a Ctrl-C in the terminal, or run_all's SIGTERM to this benchmark's group,
    # reaches this process, which then ends the prober; the prober also ends by itself when its
    # standard input closes, which it does when this process dies however it dies.
    return subprocess.Popen(
        [sys.executable, "-m", "bench.overload", "--probe", ",".join(urls)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=Path(__file__).resolve().parent.parent,
        start_new_session=True,
    )


def _stop_prober(prober: subprocess.Popen[bytes]) -> dict[str, Any]:
    output, _ = prober.communicate(timeout=REQUEST_TIMEOUT_S * 2)
    if prober.returncode != 0:
        raise RuntimeError(f"the health prober exited with {prober.returncode}")
    report: dict[str, Any] = json.loads(output.decode().strip().splitlines()[-1])
    return report


def _abandon_prober(prober: subprocess.Popen[bytes]) -> None:
    """Ends the prober without its report (the run is failing or being stopped)."""
    prober.kill()
    with contextlib.suppress(subprocess.TimeoutExpired, OSError, ValueError):
        prober.communicate(timeout=REQUEST_TIMEOUT_S)


# The nodes' own timing of the PUTs: xr_http_request_duration_seconds for this route.
_PUT_ROUTE = {"route": "/v1/kv/{key}", "method": "PUT"}


async def _put_buckets(session: aiohttp.ClientSession, urls: list[str]) -> dict[float, float]:
    """Upper bound (s) -> cumulative count of PUTs timed by all members together."""
    buckets: dict[float, float] = {}
    for url in urls:
        async with session.get(f"{url}/metrics") as answer:
            text = await answer.text()
        for family in text_string_to_metric_families(text):
            if family.name != "xr_http_request_duration_seconds":
                continue
            for sample in family.samples:
                labels = sample.labels
                if sample.name.endswith("_bucket") and all(
                    labels.get(name) == value for name, value in _PUT_ROUTE.items()
                ):
                    bound = float(labels["le"])
                    buckets[bound] = buckets.get(bound, 0.0) + sample.value
    return buckets


def _bucket_quantiles(before: dict[float, float], after: dict[float, float]) -> dict[str, Any]:
    """Quantiles of the PUTs timed between two scrapes, as bucket upper bounds (ms): the
    smallest bound under which that share of requests finished."""
    bounds = sorted(after)
    counts = [after[bound] - before.get(bound, 0.0) for bound in bounds]
    total = counts[-1] if counts else 0.0

    def quantile(fraction: float) -> float | None:
        for bound, count in zip(bounds, counts, strict=True):
            if total and count >= fraction * total:
                return bound * 1000 if bound != float("inf") else None
        return None

    return {
        "requests": int(total),
        "p50_ms_at_most": quantile(0.50),
        "p99_ms_at_most": quantile(0.99),
        "p999_ms_at_most": quantile(0.999),
    }


async def _send(session: aiohttp.ClientSession, url: str, client: _Client, counts: _Counts) -> None:
    client.seq += 1
    value = f"{client.client_id}-{client.seq}"
    headers = {"Xr-Client-Id": client.client_id, "Xr-Seq": str(client.seq)}
    counts.sent += 1
    started_s = time.monotonic()
    try:
        async with session.put(
            f"{url}/v1/kv/overload/open/{client.client_id}",
            json={"value": value},
            headers=headers,
        ) as answer:
            await answer.read()
            status = answer.status
            retry_after = answer.headers.get("Retry-After")
    except (aiohttp.ClientError, TimeoutError):
        counts.unanswered += 1
        # The outcome is unknown: the key may hold this value or the last acknowledged one.
        client.acknowledged = None
        return
    if 200 <= status < 300:
        counts.admitted += 1
        counts.latencies_s.append(time.monotonic() - started_s)
        client.acknowledged = value
    elif status == 429:
        counts.refused += 1
        counts.refused_without_retry_after += 0 if retry_after else 1
    else:
        counts.other[str(status)] = counts.other.get(str(status), 0) + 1
        client.acknowledged = None


async def _open_loop(
    session: aiohttp.ClientSession,
    urls: list[str],
    rate: float,
    seconds: float,
    run_id: str,
    *,
    pool_max: int,
) -> tuple[_Counts, list[_Client]]:
    counts = _Counts()
    clients: list[_Client] = []
    idle: list[_Client] = []
    running: set[asyncio.Task[None]] = set()

    def finished(client: _Client, task: asyncio.Task[None]) -> None:
        running.discard(task)
        idle.append(client)

    loop = asyncio.get_running_loop()
    started_s = loop.time()
    total = int(rate * seconds)
    for number in range(total):
        delay_s = started_s + number / rate - loop.time()
        if delay_s > 0:
            await asyncio.sleep(delay_s)
        if idle:
            client = idle.pop()
        elif len(clients) < pool_max:
            client = _Client(client_id=f"overload-{run_id}-{len(clients)}")
            clients.append(client)
        else:
            counts.skipped += 1
            continue
        task = asyncio.ensure_future(_send(session, urls[number % len(urls)], client, counts))
        running.add(task)
        task.add_done_callback(functools.partial(finished, client))
    await asyncio.gather(*running)
    return counts, clients


async def _lost(session: aiohttp.ClientSession, url: str, clients: list[_Client]) -> int:
    lost = 0
    for client in clients:
        if client.acknowledged is None:
            continue
        async with session.get(f"{url}/v1/kv/overload/open/{client.client_id}") as answer:
            document = await answer.json() if answer.status == 200 else {}
        if document.get("value") != client.acknowledged:
            lost += 1
    return lost


def _percentile_ms(ordered: list[float], fraction: float) -> float | None:
    if not ordered:
        return None
    return round(ordered[round(fraction * (len(ordered) - 1))] * 1000, 2)


async def _measure(urls: list[str], settings: Settings) -> dict[str, Any]:
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        capacity, capacity_failures = await _capacity(session, urls, settings.capacity_s)
        rate = max(capacity * settings.offered_factor, 1.0)
        before = await _put_buckets(session, urls)
        pool_max, pool_bound = clients_max(rate)
        prober = _start_prober(urls)
        try:
            counts, clients = await _open_loop(
                session,
                urls,
                rate,
                settings.duration_s,
                run_id=str(os.getpid()),
                pool_max=pool_max,
            )
        except BaseException:
            _abandon_prober(prober)
            raise
        health_report = _stop_prober(prober)
        after = await _put_buckets(session, urls)
        lost = await _lost(session, urls[0], clients)
    ordered = sorted(counts.latencies_s)
    return {
        "bench": "overload",
        "members": len(urls),
        "duration_s": settings.duration_s,
        "requests_in_flight_max": settings.requests_in_flight_max,
        "capacity_per_s": round(capacity, 1),
        "capacity_failures": capacity_failures,
        "target_per_s": round(rate, 1),
        "scheduled": int(rate * settings.duration_s),
        # What was actually offered: the requests sent, over the window.
        "offered_per_s": round(counts.sent / settings.duration_s, 1),
        "sent": counts.sent,
        "admitted": counts.admitted,
        "admitted_per_s": round(counts.admitted / settings.duration_s, 1),
        "refused": counts.refused,
        "refused_without_retry_after": counts.refused_without_retry_after,
        "other": sum(counts.other.values()),
        "other_by_status": counts.other,
        "unanswered": counts.unanswered,
        "skipped": counts.skipped,
        "clients_max": pool_max,
        "clients_max_limited_by": pool_bound,
        "latency_p50_ms": _percentile_ms(ordered, 0.50),
        "latency_p99_ms": _percentile_ms(ordered, 0.99),
        "latency_max_ms": _percentile_ms(ordered, 1.0),
        # Admitted and refused PUTs together: refusals are the quick end of this distribution.
        "node_put_timing": _bucket_quantiles(before, after),
        "health": health_report,
        "lost_acknowledged_writes": lost,
    }


def run(settings: Settings) -> dict[str, Any]:
    """Starts a local cluster under `settings.base_dir`, measures, stops it."""
    cluster_settings = {}
    if settings.requests_in_flight_max is not None:
        cluster_settings["http.requests_in_flight_max"] = str(settings.requests_in_flight_max)
    cluster = LocalCluster(
        settings.base_dir / "cluster", size=settings.members, settings=cluster_settings
    )
    try:
        cluster.start(timeout_s=READY_TIMEOUT_S)
        return asyncio.run(_measure(cluster.urls, settings))
    finally:
        with shielded():
            kill_cluster(cluster)


def _node_timing(timing: dict[str, Any]) -> str:
    return (
        f"<= {timing['p50_ms_at_most']} / {timing['p99_ms_at_most']} / "
        f"{timing['p999_ms_at_most']} ms ({timing['requests']} PUTs, refusals included)"
    )


def shortfall(report: dict[str, Any]) -> str | None:
    """A sentence saying by how much the rate offered fell short of the target, or None when
    every scheduled request was sent."""
    if not report["skipped"]:
        return None
    target, offered, capacity = (
        report["target_per_s"],
        report["offered_per_s"],
        report["capacity_per_s"],
    )
    short = 1 - offered / target if target else 0.0
    against_capacity = (
        f" ({offered / capacity:.2f}x capacity, not {target / capacity:.2f}x)" if capacity else ""
    )
    bound = report["clients_max_limited_by"] or (
        f"that bound is the target rate times the {REQUEST_TIMEOUT_S:g} s request timeout, so "
        "this process could not keep the schedule"
    )
    return (
        f"NOTE: the rate offered fell short of the target by {short:.0%}: {offered} puts/s sent "
        f"against {target} puts/s scheduled{against_capacity}; {report['skipped']:,} of "
        f"{report['scheduled']:,} scheduled puts were skipped because all "
        f"{report['clients_max']:,} clients had a request outstanding; {bound}"
    )


def _table(report: dict[str, Any]) -> str:
    rows = [
        ("members", report["members"]),
        ("capacity (closed loop)", f"{report['capacity_per_s']} puts/s"),
        ("target (open loop)", f"{report['target_per_s']} puts/s for {report['duration_s']} s"),
        ("offered (sent)", f"{report['offered_per_s']} puts/s: {report['sent']} sent"),
        ("skipped (every client busy)", f"{report['skipped']} (clients at most "
            f"{report['clients_max']})"),
        ("admitted", f"{report['admitted']} ({report['admitted_per_s']}/s)"),
        ("refused 429", report["refused"]),
        ("  without Retry-After", report["refused_without_retry_after"]),
        ("other answers", report["other_by_status"] or 0),
        ("unanswered", report["unanswered"]),
        ("admitted p50 / p99 / max", "{} / {} / {} ms".format(
            report["latency_p50_ms"], report["latency_p99_ms"], report["latency_max_ms"])),
        ("nodes' PUT timing p50 / p99 / p99.9", _node_timing(report["node_put_timing"])),
        ("health probes (not 200)", f"{report['health']['probes']} ({report['health']['not_ok']})"),
        ("health probe p50 / p99 / max", "{} / {} / {} ms".format(
            report["health"]["latency_p50_ms"], report["health"]["latency_p99_ms"],
            report["health"]["latency_max_ms"])),
        ("lost acknowledged writes", report["lost_acknowledged_writes"]),
    ]  # fmt: skip
    width = max(len(name) for name, _ in rows)
    lines = [f"{name:<{width}}  {value}" for name, value in rows]
    note = shortfall(report)
    return "\n".join(lines if note is None else [*lines, note])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--members", type=int, default=3, help="cluster size (3)")
    parser.add_argument("--duration", type=float, default=60.0, help="overload seconds (60)")
    parser.add_argument("--capacity", type=float, default=5.0, help="capacity seconds (5)")
    parser.add_argument("--factor", type=float, default=2.0, help="offered / capacity (2)")
    parser.add_argument(
        "--requests-in-flight-max", type=int, default=None, help="the nodes' bound (default)"
    )
    parser.add_argument("--probe", help=argparse.SUPPRESS)  # the health prober's process
    arguments = parser.parse_args(argv)
    if not all(
        0 < value < math.inf for value in (arguments.duration, arguments.capacity, arguments.factor)
    ):
        parser.error("--duration, --capacity and --factor must be positive and finite")
    bound = arguments.requests_in_flight_max
    if arguments.members < 1 or (bound is not None and bound < 1):
        parser.error("--members and --requests-in-flight-max must be at least 1")
    if arguments.probe:
        print(json.dumps(_probe(arguments.probe.split(","))))
        return 0
    return run_main(lambda: _main(arguments))


def _main(arguments: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="xr-overload-") as directory:
        report = run(
            Settings(
                base_dir=Path(directory),
                members=arguments.members,
                duration_s=arguments.duration,
                capacity_s=arguments.capacity,
                offered_factor=arguments.factor,
                requests_in_flight_max=arguments.requests_in_flight_max,
            )
        )
    print(_table(report))
    print(json.dumps(report))
    return 0 if report["lost_acknowledged_writes"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
