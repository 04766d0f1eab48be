"""The node's Prometheus metrics, with units last in their names.

Request metrics are counted by the HTTP middleware; Raft and state metrics are read from the store
when `/metrics` is scraped (a collector), so they are never stale and cost nothing between scrapes.
Each node has its own registry, so several nodes (tests, `xr up`) can live in one process.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Gauge, Histogram
from prometheus_client import Counter as PromCounter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from raftstore.frames import REFUSAL_REASONS
from raftstore.store import RaftStore

__all__ = ["NodeMetrics"]

_LATENCY_BUCKETS_S = (
    0.0005,
    0.001,
    0.002,
    0.005,
    0.01,
    0.02,
    0.05,
    0.1,
    0.2,
    0.5,
    1.0,
    2.0,
    5.0,
    10.0,
    30.0,
    60.0,
)


class _StoreCollector(Collector):
    def __init__(self, store: RaftStore, region: str) -> None:
        self.store = store
        self.region = region
        # When the counters below began (the store's own counters start with the node).
        self.created_s = time.time()

    def collect(self) -> Iterator[Any]:
        status = self.store.status()
        labels = ["region"]
        values = [self.region]

        def gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, documentation, labels=labels)
            family.add_metric(values, value)
            return family

        def counter(name: str, documentation: str, value: float) -> CounterMetricFamily:
            family = CounterMetricFamily(name, documentation, labels=labels)
            family.add_metric(values, value, created=self.created_s)
            return family

        yield gauge("xr_raft_term", "The current Raft term.", status["term"])
        yield gauge("xr_raft_commit_index", "The Raft commit index.", status["commit_index"])
        yield gauge(
            "xr_raft_applied_index", "The last applied Raft index.", status["applied_index"]
        )
        yield gauge(
            "xr_raft_is_leader", "1 when this node leads.", 1 if status["state"] == "leader" else 0
        )
        yield gauge(
            "xr_raft_has_quorum",
            "1 when this node's leader has a quorum.",
            1 if status["has_quorum"] else 0,
        )
        yield gauge(
            "xr_raft_proposals_in_flight",
            "Proposals waiting for their commit.",
            status["proposals_in_flight"],
        )
        # Journal syncs (raft.durability "fsync"; all 0 in "write" mode, which never syncs).
        # In line the node's event loop waits for each sync, heartbeats included; off the loop
        # (raft.background_sync) only what the sync acknowledges waits.
        yield counter(
            "xr_raft_journal_syncs",
            'Journal syncs since the node started (raft.durability "fsync"; 0 in "write").',
            status["journal_syncs"] or 0,
        )
        yield counter(
            "xr_raft_journal_syncs_off_loop",
            "Of the journal syncs, those that ran off the event loop (raft.background_sync: "
            "while the disk's recent syncs take at least raft.background_sync_min_ms).",
            status["journal_syncs_run_off_loop"] or 0,
        )
        yield gauge(
            "xr_raft_journal_recent_sync_seconds",
            "A moving average of the journal syncs' time, by which the next runs in line or off "
            "the event loop.",
            status["journal_recent_sync_s"] or 0.0,
        )
        yield counter(
            "xr_raft_journal_sync_seconds",
            "Seconds journal syncs took since the node started (in line, the event loop waited "
            "for them; off it, only what they acknowledge).",
            status["journal_sync_s_total"] or 0.0,
        )
        yield counter(
            "xr_raft_journal_slow_syncs",
            "Journal syncs that took over 0.1 s (a slow or overloaded disk; in line, near the "
            "election timeout, a leader change); logged at WARNING, at most once per 10 s.",
            status["journal_slow_syncs"] or 0,
        )
        yield gauge(
            "xr_raft_journal_sync_seconds_max",
            "The longest journal sync since the node started, in seconds.",
            status["journal_sync_s_max"] or 0.0,
        )
        yield counter(
            "xr_raft_commits_held_for_own_sync",
            "Ticks in which this node, leading, held a commit back until its own journal sync "
            "(off the event loop) had the entries, where its followers already had them.",
            status["commits_held_for_own_sync"],
        )
        yield counter(
            "xr_raft_entries_undecodable",
            "Committed entries this node could not decode and skipped: most likely written by "
            "a node of a newer version (this replica may then differ from the newer ones).",
            status["entries_undecodable"],
        )
        yield gauge(
            "xr_raft_apply_halted",
            "1 while this node has stopped applying the log at an entry written by a newer "
            "release (it refuses requests until it is upgraded), else 0.",
            0 if status["apply_halted"] is None else 1,
        )
        refused = CounterMetricFamily(
            "xr_raft_connections_refused",
            "Incoming Raft connections this node closed for what the peer sent, by reason: "
            "unauthenticated (another cluster secret, or none), bad_message, frame_too_long, "
            "not_a_member (a name not in raft.peers), silent (no handshake in time).",
            labels=["region", "reason"],
        )
        for reason in REFUSAL_REASONS:
            count = status["connections_refused"].get(reason, 0)
            refused.add_metric([self.region, reason], count, created=self.created_s)
        yield refused

        def census(machine: Any) -> tuple[int, int, int, int, Counter[str], Counter[str]]:
            states: Counter[str] = Counter()
            outcomes: Counter[str] = Counter()
            for job in machine.jobs.values():
                states[job.state] += 1
                for task in job.tasks:
                    for attempt in task.attempts:
                        outcomes[attempt.outcome or "running"] += 1
            return (
                len(machine.locks),
                len(machine.sessions),
                len(machine.keys),
                machine.revision,
                states,
                outcomes,
            )

        def inventory(machine: Any) -> list[tuple[str, int, int, int, int, int]]:
            running_in: Counter[str] = Counter(
                task.region
                for job in machine.jobs.values()
                for task in job.tasks
                if task.state.value == "running"
            )
            rows = []
            for region in machine.regions.values():
                running = running_in[region.name]
                total_mb = sum(gpu.memory_mb for gpu in region.gpus)
                free_mb = sum(gpu.free_mb for gpu in region.gpus)
                rows.append(
                    (
                        region.name,
                        len(region.gpus),
                        total_mb,
                        total_mb - free_mb,
                        region.cpu_slots,
                        running,
                    )
                )
            return rows

        locks, sessions, keys, revision, states, outcomes = self.store.replica.read(census)
        yield gauge("xr_locks_held", "Locks held, all tenants.", locks)
        yield gauge("xr_sessions", "Live sessions, all tenants.", sessions)
        yield gauge("xr_kv_keys", "Keys stored, all tenants.", keys)
        yield gauge("xr_kv_revision", "The KV store's revision.", revision)
        jobs = GaugeMetricFamily(
            "xr_jobs", "Jobs by state, all tenants.", labels=["region", "state"]
        )
        # A job's states (`Job.state`, derived from its tasks'): "assigned" is a task's state only.
        for state in ("pending", "running", "succeeded", "failed", "cancelled"):
            jobs.add_metric([self.region, state], states.get(state, 0))
        yield jobs
        attempts = GaugeMetricFamily(
            "xr_task_attempts",
            "Task attempts in the jobs table by outcome: running, succeeded, failed, cancelled, "
            "preempted, and lease_expired (a region lost: each one is a failover).",
            labels=["region", "outcome"],
        )
        for outcome in (
            "running",
            "succeeded",
            "failed",
            "cancelled",
            "preempted",
            "lease_expired",
        ):
            attempts.add_metric([self.region, outcome], outcomes.get(outcome, 0))
        yield attempts
        families = {
            "gpus": GaugeMetricFamily(
                "xr_region_gpus",
                "Devices in each region's last heartbeat.",
                labels=["region", "in_region"],
            ),
            "memory": GaugeMetricFamily(
                "xr_region_gpu_memory_bytes",
                "GPU memory of each region's devices, total and used (last heartbeat).",
                labels=["region", "in_region", "kind"],
            ),
            "slots": GaugeMetricFamily(
                "xr_region_cpu_slots",
                "CPU task slots of each region.",
                labels=["region", "in_region"],
            ),
            "running": GaugeMetricFamily(
                "xr_region_tasks_running",
                "Tasks running in each region.",
                labels=["region", "in_region"],
            ),
        }
        mebibyte = 1024 * 1024
        for name, gpus, total_mb, used_mb, slots, running in self.store.replica.read(inventory):
            families["gpus"].add_metric([self.region, name], gpus)
            families["memory"].add_metric([self.region, name, "total"], total_mb * mebibyte)
            families["memory"].add_metric([self.region, name, "used"], used_mb * mebibyte)
            families["slots"].add_metric([self.region, name], slots)
            families["running"].add_metric([self.region, name], running)
        yield from families.values()


class ConnectionsSource(Protocol):
    """What the API's connection bound reports (`node.api.connections.CappedAppRunner`)."""

    connections_max: int
    connections_refused: int

    def connections_open(self) -> int: ...


class _ConnectionsCollector(Collector):
    """The API's connections, read from the runner when scraped (0 until one is attached)."""

    def __init__(self, metrics: NodeMetrics) -> None:
        self.metrics = metrics
        self.created_s = time.time()

    def collect(self) -> Iterator[Any]:
        source = self.metrics.connections
        yield GaugeMetricFamily(
            "xr_http_connections",
            "HTTP API connections open now (bounded by xr_http_connections_max).",
            value=source.connections_open() if source else 0,
        )
        yield GaugeMetricFamily(
            "xr_http_connections_max",
            "The bound on open HTTP API connections (http.connections_max, or from the "
            "descriptor limit).",
            value=source.connections_max if source else 0,
        )
        yield CounterMetricFamily(
            "xr_http_connections_refused",
            "HTTP API connections refused at the bound (answered 429 limit.capacity and closed "
            "before any request was read, so not in xr_http_requests).",
            value=source.connections_refused if source else 0,
            created=self.created_s,
        )


class AuditSource(Protocol):
    """What the audit log reports (`node.api.audit.AuditLog`)."""

    @property
    def records_lost(self) -> int: ...


class _AuditCollector(Collector):
    """The audit log's lost records, read from it when scraped (0 while none is attached: the
    audit log is off, or not open yet)."""

    def __init__(self, metrics: NodeMetrics) -> None:
        self.metrics = metrics
        self.created_s = time.time()

    def collect(self) -> Iterator[Any]:
        source = self.metrics.audit
        yield CounterMetricFamily(
            "xr_audit_records_lost",
            "Audit log records this node could not write (a full disk, a read-only file system); "
            "their requests were answered all the same. Reported on stderr at most once a minute.",
            value=source.records_lost if source else 0,
            created=self.created_s,
        )


class NodeMetrics:
    def __init__(self, store: RaftStore, region: str) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.requests = PromCounter(
            "xr_http_requests",
            "HTTP requests answered, by route, method and status.",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "xr_http_request_duration_seconds",
            "HTTP request latency, by route and method.",
            ["route", "method"],
            buckets=_LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        # Requests being handled now, besides those with bounds of their own: the admission
        # middleware's count (`node.api.admission`), which refuses beyond
        # `http.requests_in_flight_max`.
        self.requests_in_flight = 0
        Gauge(
            "xr_http_requests_in_flight",
            "HTTP requests being handled, besides health checks, streams and waits "
            "(bounded by http.requests_in_flight_max).",
            registry=self.registry,
        ).set_function(lambda: self.requests_in_flight)
        # Request bodies being received before their requests are admitted (`node.api.admission`),
        # refused beyond `http.bodies_arriving_max`.
        self.bodies_arriving = 0
        Gauge(
            "xr_http_bodies_arriving",
            "HTTP request bodies being received, before their requests are admitted "
            "(bounded by http.bodies_arriving_max).",
            registry=self.registry,
        ).set_function(lambda: self.bodies_arriving)
        self.leader_changes = PromCounter(
            "xr_raft_leader_changes",
            "Leader changes this node has seen since it started.",
            ["region"],
            registry=self.registry,
        )
        # A labelled counter has no sample until its label is first used: without this the
        # series was missing until the node's first leader change, dashboards showed nothing,
        # and `increase()` missed that first change (it needs a sample before it).
        self.leader_changes.labels(region)
        self.registry.register(_StoreCollector(store, region))
        # Set by the daemon once its HTTP runner exists.
        self.connections: ConnectionsSource | None = None
        self.registry.register(_ConnectionsCollector(self))
        # Set while the application's audit log is open.
        self.audit: AuditSource | None = None
        self.registry.register(_AuditCollector(self))

    def observe(self, route: str, method: str, status: int, duration_s: float) -> None:
        self.requests.labels(route, method, str(status)).inc()
        self.latency.labels(route, method).observe(duration_s)
