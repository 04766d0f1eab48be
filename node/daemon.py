"""The region daemon: one replicated store, its HTTP API and the node's own duties.

`run(config)` is what `xr node run` calls. It starts the Raft member from its data directory,
serves the API, registers the region with the cluster once a leader is known, sends region
heartbeats with its inventory, places pending tasks while it leads, runs its region's tasks
(`node.executor`), logs leader changes, and on SIGTERM or SIGINT shuts down gracefully: it stops
taking requests, lets in-flight ones finish (up to `http.shutdown_grace_s`), hands leadership to a
caught-up follower if it leads, then stops the store and closes its files. A signal during
start-up abandons the start and stops whatever had started the same way.

With `tls.cert_file` the API is served over https only (`node.tls`), and requests forwarded to
other nodes go over https too. Secrets (the cluster secret, tokens) are never logged; Raft running
off loopback without a cluster secret (`raft.insecure`) is logged as a warning at every start.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any

from aiohttp import web

from node.api.app import SERVICES, create_app
from node.api.cluster import FORWARD_SSL_CONTEXT
from node.api.connections import CappedAppRunner, connections_bound
from node.config import ConfigError, NodeConfig
from node.data_dir import DataDirLock
from node.executor.executor import Executor
from node.executor.inventory import detect as detect_inventory
from node.executor.inventory import to_gpus
from node.localcluster import STOP_WITH_PARENT_VARIABLE
from node.tls import certificate_warnings, client_context, server_context
from raftstore.faults import NO_FAULTS, Faults, FaultsRefused
from raftstore.replica import snapshot_members
from raftstore.store import RaftStore
from raftstore.testnet import Drops
from xrcore.commands import RegionHeartbeat, RegionRegister
from xrcore.errors import CodecError, StaleSchedule, XrError
from xrcore.placement import PlacementSettings, place
from xrcore.scheduler import SchedulerSettings

__all__ = ["Node", "configure_logging", "log_raft_security", "run"]

log = logging.getLogger("xr.node")
HEARTBEAT_INTERVAL_S = 2.0
LEADER_WATCH_INTERVAL_S = 0.2


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        document: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in ("request_id", "route", "region"):
            if hasattr(record, name):
                document[name] = getattr(record, name)
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        return json.dumps(document)


def configure_logging(config: NodeConfig) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if config.log.json:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(config.log.level.upper())
    # pysyncobj logs every connection attempt at info.
    logging.getLogger("pysyncobj").setLevel(logging.WARNING)


def http_server_options(config: NodeConfig) -> dict[str, Any]:
    """How aiohttp serves the API (keyword arguments of its application runner)."""
    return {
        "access_log": None,
        "handler_cancellation": True,
        "shutdown_timeout": config.http.shutdown_grace_s,
        # Counted from the connection's start and from each answer; a request being handled (a
        # long poll, a stream) is never cut by it.
        "keepalive_timeout": config.http.idle_timeout_s,
        # aiohttp's default of 8,190 bytes refused request lines the API document allows (long
        # names and query values, each character up to 12 bytes percent-encoded; found by
        # tests/node/test_schemathesis.py).
        "max_line_size": 16_384,
        # Request bodies are taken as sent, never inflated (`node.api.wire.read_body` refuses a
        # compressed one): aiohttp would otherwise inflate every compressed body on the event
        # loop, even one it answered 413 and only drains (four 5 GB gzip bombs took 11.5 s of
        # the node's CPU and held /healthz for up to 2.2 s; 0.4 s and 7 ms without).
        "auto_decompress": False,
    }


def check_members(config: NodeConfig) -> None:
    """Refuses a data directory the node cannot run on: a configuration whose members are not
    the ones the directory's Raft snapshot names, and an empty journal. pysyncobj takes the
    member set from the snapshot and silently ignores `raft.address` and `raft.peers`: a member
    seeded by `xr snapshot restore` without `--peers` ran as a cluster of one beside the others,
    and the cluster had two leaders, each granting the same lock."""
    journal = config.raft.journal_file
    if journal.exists() and journal.stat().st_size == 0:
        # pysyncobj fails to map it, with a traceback, at every start.
        raise ConfigError(
            f"data_dir {config.data_dir}: {journal} is empty (a restore or a first start that "
            "did not finish?); it holds nothing: remove it, and the snapshot beside it if a "
            "restore left one, then start again or restore again"
        )
    try:
        members = snapshot_members(config.raft)
    except CodecError as error:
        raise ConfigError(f"data_dir {config.data_dir}: {error.message}") from None
    configured = frozenset((config.raft.self_address, *config.raft.peers))
    if members is not None and members != configured:
        raise ConfigError(
            f"data_dir {config.data_dir} holds the Raft data of a cluster whose members are "
            f"{', '.join(sorted(members))}, but raft.address and raft.peers name "
            f"{', '.join(sorted(configured))}: each member must be configured with the members "
            "its data was written with, spelled the same (to start a new cluster from a backup, "
            "`xr snapshot restore` each member with its --raft-address and --peers)"
        )


class Node:
    """A started node: its store, its API on a socket, and its background duties."""

    def __init__(
        self, config: NodeConfig, *, faults: Faults = NO_FAULTS, drops: Drops | None = None
    ) -> None:
        self.config = config
        # Loaded before anything starts, so a bad file stops the node with a ConfigError.
        self.ssl_context = server_context(config.tls)
        forward_ssl_context = client_context(config.tls)
        # Before the journal is opened: a second node on this directory is refused.
        self.data_dir_lock = DataDirLock(config.data_dir)
        try:
            check_members(config)
            self.store = RaftStore(config.raft, faults=faults, drops=drops)
            self.app = create_app(config, store=self.store)
            if forward_ssl_context is not None:
                self.app[FORWARD_SSL_CONTEXT] = forward_ssl_context
            self.runner: web.AppRunner | None = None
            self._duties: list[asyncio.Task[None]] = []
            self.inventory = detect_inventory(config.region.cpu_slots)
            self.executor: Executor | None = None
            if config.executor.enabled:
                self.executor = Executor(
                    config,
                    self.store,
                    gpu_memory_mb=[gpu.memory_mb for gpu in self.inventory.gpus],
                    gpu_models=[gpu.model for gpu in self.inventory.gpus],
                )
        except BaseException:
            self.data_dir_lock.release()
            raise

    async def start(self) -> None:
        log_raft_security(self.config)
        for warning in certificate_warnings(self.config.tls, datetime.datetime.now(datetime.UTC)):
            log.warning("%s", warning)
        if self.executor is not None:
            await self.executor.prepare()
        await self.store.start()
        self.runner = CappedAppRunner(
            self.app,
            connections_max=connections_bound(self.config.http.connections_max),
            **http_server_options(self.config),
        )
        self.app[SERVICES].metrics.connections = self.runner
        await self.runner.setup()
        host, _, port = self.config.http.address.rpartition(":")
        site = web.TCPSite(
            self.runner, host, int(port), reuse_address=True, ssl_context=self.ssl_context
        )
        await site.start()
        self._duties = [
            asyncio.create_task(self._register_and_heartbeat()),
            asyncio.create_task(self._watch_leader()),
            asyncio.create_task(self._place_tasks()),
        ]
        if self.executor is not None:
            await self.executor.start()
        log.info(
            "region %s serving %s://%s%s (raft %s, peers %s, data %s)",
            self.config.region.name,
            self.config.http_scheme,
            self.config.http.address,
            _client_certificates_note(self.config),
            self.config.raft.self_address,
            ",".join(self.config.raft.peers) or "-",
            self.config.data_dir,
        )

    async def _register_and_heartbeat(self) -> None:
        region = self.config.region
        register = RegionRegister(
            name=region.name,
            http_address=self.config.http_advertise_address,
            raft_address=self.config.raft.self_address,
            provider=region.provider,
            price_per_gpu_hour=region.price_per_gpu_hour,
            carbon_g_per_kwh=region.carbon_g_per_kwh,
            labels=dict(region.labels),
            cpu_slots=region.cpu_slots,
        )
        registered = False
        while True:
            try:
                if not registered:
                    (await self.store.propose(register)).result.unwrap()
                    registered = True
                    log.info("region %s registered with the cluster", region.name)
                else:
                    await self.store.propose(
                        RegionHeartbeat(
                            name=region.name,
                            gpus=to_gpus(self.inventory),
                            rtt_ms=dict(region.rtt_ms),
                        )
                    )
            except XrError as error:
                log.debug("region %s: registration or heartbeat failed: %s", region.name, error)
            await asyncio.sleep(HEARTBEAT_INTERVAL_S if registered else 0.2)

    async def _place_tasks(self) -> None:
        """On the leader: runs the scheduling policy (`xrcore.placement`) every poll interval and
        proposes its decisions as one pass. The pass carries the scheduling revision it was
        computed from; if the state changed before it applied, it is refused as stale and
        computed again at once from the newer state."""
        executor, scheduler = self.config.executor, self.config.scheduler
        settings = PlacementSettings(
            retry_backoff_base_ms=int(executor.retry_backoff_base_s * 1000),
            retry_backoff_max_ms=int(executor.retry_backoff_max_s * 1000),
            pending_max=scheduler.pass_pending_max,
            policy=SchedulerSettings(
                preemption_min_run_ms=int(scheduler.preemption_min_run_s * 1000),
                preemption_grace_ms=int(scheduler.preemption_grace_s * 1000),
                preemptions_max=scheduler.preemptions_max,
                default_estimate_ms=int(scheduler.default_estimate_s * 1000),
                ms_per_dollar=scheduler.seconds_per_dollar * 1000,
                ms_per_kg_carbon=scheduler.seconds_per_kg_carbon * 1000,
                move_ups_max=scheduler.move_ups_max,
                move_up_min_run_ms=int(scheduler.move_up_min_run_s * 1000),
                move_up_saving_min_ms=int(scheduler.move_up_saving_min_s * 1000),
                move_up_saving_fraction=scheduler.move_up_saving_fraction,
                move_aside=scheduler.move_aside,
                move_aside_loss_max_ms=int(scheduler.move_aside_loss_max_s * 1000),
            ),
        )
        stale_retries_max = 3
        while True:
            await asyncio.sleep(executor.poll_interval_s)
            for _ in range(stale_retries_max):
                if not self.store.is_leader:
                    break
                decisions = self.store.replica.read(lambda machine: place(machine, settings))
                if decisions is None:
                    break
                try:
                    applied = await self.store.propose(decisions)
                except XrError as error:
                    log.debug("scheduling pass not proposed: %s", error)
                    break
                refused = applied.result.error
                if refused is None or refused.code != StaleSchedule.code:
                    if refused is not None:
                        log.warning("scheduling pass refused: %s", refused.message)
                    break

    async def _watch_leader(self) -> None:
        metrics = self.app[SERVICES].metrics
        leader: str | None = None
        while True:
            status = self.store.status()
            if status["leader"] != leader:
                log.info(
                    "leader is now %s (term %s)", status["leader"] or "unknown", status["term"]
                )
                if leader is not None and status["leader"] is not None:
                    metrics.leader_changes.labels(self.config.region.name).inc()
                leader = status["leader"]
            await asyncio.sleep(LEADER_WATCH_INTERVAL_S)

    async def stop(self) -> None:
        services = self.app[SERVICES]
        services.stopping.set()
        for duty in self._duties:
            duty.cancel()
        for duty in self._duties:
            with contextlib.suppress(asyncio.CancelledError):
                await duty
        if self.executor is not None:
            await self.executor.stop()
        if self.runner is not None:
            # Stops listening, then waits up to shutdown_grace_s for in-flight requests.
            await self.runner.cleanup()
        if self.store.is_leader:
            await self._hand_over_leadership()
        await self.store.stop()
        self.data_dir_lock.release()
        log.info("region %s stopped", self.config.region.name)

    async def _hand_over_leadership(self) -> None:
        status = self.store.status()
        for member in status["members"]:
            if not member["connected"]:
                continue
            try:
                await self.store.transfer_leadership(member["address"], timeout_s=2.0)
                log.info("handed leadership to %s", member["address"])
                return
            except XrError as error:
                log.info("could not hand leadership to %s: %s", member["address"], error)


def _client_certificates_note(config: NodeConfig) -> str:
    if config.tls.cert_file is None or config.tls.client_certs == "none":
        return ""
    return f" (client certificates {config.tls.client_certs})"


def log_raft_security(config: NodeConfig) -> None:
    """Warns, at every start, when `raft.insecure` lets Raft run off loopback without a cluster
    secret, and when it is set but has no effect (so it is not left on by mistake)."""
    raft = config.raft
    if not raft.insecure:
        return
    off_loopback = raft.off_loopback_addresses
    if off_loopback and not raft.cluster_secret:
        log.warning(
            "raft.insecure (--insecure) is set and Raft runs off loopback (%s) without a cluster "
            "secret: Raft traffic is unauthenticated and unencrypted, and anyone who reaches the "
            "Raft port can pose as a member and rewrite the cluster's state. Set "
            "raft.cluster_secret_file on every node.",
            ", ".join(off_loopback),
        )
    else:
        reason = "a cluster secret is set" if raft.cluster_secret else "Raft is on loopback only"
        log.warning(
            "raft.insecure (--insecure) is set but has no effect (%s); remove it so it cannot "
            "take effect unnoticed when addresses change",
            reason,
        )


async def serve(
    config: NodeConfig, *, faults: Faults = NO_FAULTS, drops: Drops | None = None
) -> None:
    # The handlers come first. In a container xr may be PID 1, and the kernel drops a signal
    # whose action is the default for a namespace's PID 1: a SIGTERM sent while the node was
    # starting (resolving an absent peer took 11 s) was lost, and `docker stop` waited its
    # whole grace period and killed the node.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signal_number in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signal_number, stop.set)
    try:
        await _serve_until_stopped(config, stop, faults=faults, drops=drops)
    finally:
        for signal_number in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signal_number)


async def _serve_until_stopped(
    config: NodeConfig, stop: asyncio.Event, *, faults: Faults, drops: Drops | None
) -> None:
    node = Node(config, faults=faults, drops=drops)
    if not await _start_unless_stopped(node, stop):
        # Stopped during start-up: whatever had started stops as on SIGTERM (the store, the
        # executor, the listener), and the node exits 0 without having served.
        log.info("stopping region %s during start-up", config.region.name)
        await node.stop()
        return
    parent_watch = None
    if os.environ.get(STOP_WITH_PARENT_VARIABLE) == "1":
        parent_watch = asyncio.create_task(_stop_with_parent(os.getppid(), stop))
    _say_ready(config)
    await stop.wait()
    if parent_watch is not None:
        parent_watch.cancel()
    log.info("stopping region %s", config.region.name)
    await node.stop()


async def _start_unless_stopped(node: Node, stop: asyncio.Event) -> bool:
    """Starts `node`; False when `stop` is set first, with the start cancelled wherever it had
    got to. A start that fails releases the data directory and raises."""
    starting = asyncio.create_task(node.start())
    stopped = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({starting, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    if stop.is_set():
        starting.cancel()
        try:
            await starting
        except asyncio.CancelledError:
            pass
        except Exception as error:  # the stop is what was asked for; say why the start failed
            log.warning(
                "region %s: start-up failed while stopping: %s", node.config.region.name, error
            )
        return False
    try:
        starting.result()
    except BaseException:
        node.data_dir_lock.release()
        raise
    return True


def _say_ready(config: NodeConfig) -> None:
    """The line that says the node is serving, on stdout: plain text, or with `log.json` a JSON
    log line, since Docker and Kubernetes collect stdout and stderr (the log) together and a
    plain line among JSON ones is one a log pipeline cannot parse."""
    address = f"{config.http_scheme}://{config.http.address}"
    if not config.log.json:
        print(f"xr node {config.region.name} ready at {address}", flush=True)
        return
    record = logging.LogRecord(
        log.name, logging.INFO, __file__, 0, "xr node %s ready at %s",
        (config.region.name, address), None,
    )  # fmt: skip
    record.region = config.region.name
    print(JsonFormatter().format(record), flush=True)


# `xr up` and the demo set STOP_WITH_PARENT_VARIABLE for the nodes they start: each stops (as on
# SIGTERM) once its starter is gone, even killed with SIGKILL, which left them serving for ever
# (their process groups are their own).
_PARENT_CHECK_S = 1.0


async def _stop_with_parent(parent_pid: int, stop: asyncio.Event) -> None:
    while os.getppid() == parent_pid:
        await asyncio.sleep(_PARENT_CHECK_S)
    log.warning("the process that started this node (pid %d) is gone: stopping", parent_pid)
    stop.set()


def run(config: NodeConfig) -> int:
    configure_logging(config)
    # Test-only deliberate bugs (`raftstore.faults`): read once, here, and refused outside tests.
    try:
        faults = Faults.from_environment(os.environ)
        drops = Drops.from_environment(os.environ)
    except FaultsRefused as error:
        log.error("cannot start region %s: %s", config.region.name, error)
        return 2
    faults.warn()
    try:
        import uvloop

        run_loop: Callable[[Coroutine[Any, Any, None]], None] = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a dependency outside Windows
        run_loop = asyncio.run
    try:
        run_loop(serve(config, faults=faults, drops=drops))
    except ConfigError as error:
        # A TLS or tokens file that does not load; `xr node run` exits 2 for every invalid setting.
        log.error("cannot start region %s: invalid configuration: %s", config.region.name, error)
        return 2
    except OSError as error:
        log.error("cannot start region %s: %s", config.region.name, error)
        return 1
    return 0
