"""`xr up`: a local cluster of N regions in the foreground, for development and demos.

It starts one `xr node run` process per region on loopback (through `LocalCluster`), says what
it is doing while they start, prints where each region is (API URL, Raft address, log, data
directory) and the `export XR_ENDPOINTS=...` line for the client commands, then waits for
Ctrl-C (SIGINT), SIGTERM or SIGHUP and stops every node with SIGTERM, so each one finishes its
requests and hands leadership over as in production.

It never leaves a node behind: a node that fails to start stops the others (its log tail is
shown), and a node that does not stop within `STOP_TIMEOUT_S` is killed. A second Ctrl-C while
stopping kills the nodes at once. Only a SIGKILL of `xr up` itself can orphan the nodes, which run
in their own sessions so that Ctrl-C reaches `xr up` alone and the shutdown stays orderly.

Without `--dir` the data lives in a temporary directory removed at the end (unless
`--keep-data`). With `--dir` the data stays, and the ports are recorded in `xr-up.json` there, so
running `xr up --dir D` again restarts the same cluster from its data at the same addresses.

Raft traffic between the regions is authenticated with a cluster secret that `xr up` makes (32
random bytes, in `cluster-secret` in the directory, mode 0600, kept for restarts) unless a secret
or `raft.insecure` is given. Without one anyone on the host could pose as a member on the
loopback Raft ports and rewrite the cluster's state, or stop it for good with one message to
each member (a term the journal cannot go past; docs/robustness.md, "The Raft port").
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from node.files import CONFIG_BYTES_MAX, read_bounded
from node.localcluster import (
    HOST,
    SECRET_FILE,
    LocalCluster,
    LocalNode,
    check_port_free,
    free_ports,
    prepare_directory,
    secret_file,
)

__all__ = ["STATE_FILE", "UpError", "UpOptions", "plan_ports", "run_up"]

STATE_FILE = "xr-up.json"
# The Raft port of each region is its API port plus this (with --base-port).
RAFT_PORT_OFFSET = 100
REGIONS_MAX = RAFT_PORT_OFFSET
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0
_POLL_S = 0.1
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

Echo = Callable[[str], None]


class UpError(Exception):
    """`xr up` cannot run as asked (bad directory, ports, regions); nothing was started."""


@dataclass(frozen=True, kw_only=True)
class UpOptions:
    region_names: list[str]
    base_dir: Path | None = None
    base_port: int | None = None
    keep_data: bool = False
    settings: dict[str, str] = field(default_factory=dict)
    start_timeout_s: float = START_TIMEOUT_S


def plan_ports(
    region_names: list[str], *, base_port: int | None, recorded: dict[str, Any] | None
) -> tuple[list[int], list[int]]:
    """(API ports, Raft ports), one each per region: from `--base-port`, else those a previous
    run recorded in the directory, else free ones chosen by the operating system."""
    count = len(region_names)
    if base_port is not None:
        highest = base_port + RAFT_PORT_OFFSET + count - 1
        if base_port < 1 or highest > 65535:
            raise UpError(
                f"--base-port {base_port}: the ports {base_port}..{highest} must lie in 1..65535"
            )
        http_ports = [base_port + position for position in range(count)]
        return http_ports, [port + RAFT_PORT_OFFSET for port in http_ports]
    if recorded is not None:
        return list(recorded["http_ports"]), list(recorded["raft_ports"])
    ports = free_ports(2 * count)
    return ports[:count], ports[count:]


# Settings `xr up` sets for each region itself, and what sets them instead of `--set`.
_PER_REGION = {
    "data_dir": "under --dir",
    "region.name": "--regions or --region",
    "raft.address": "from --base-port",
    "raft.peers": "the other regions",
    "http.address": "from --base-port",
    "http.advertise_address": "its http.address",
}


def _check_settings(
    options: UpOptions, names: list[str], http_ports: list[int], raft_ports: list[int]
) -> bool:
    """Loads the first region's configuration as its node will (the environment, then the
    flags, then `--set`), so that a bad `--set` is refused before any node starts. Returns
    whether it leaves Raft without a secret, and not by `raft.insecure`."""
    from node.api.auth import Authenticator
    from node.config import ConfigError, load_config

    for name in sorted(set(options.settings) & set(_PER_REGION)):
        raise UpError(
            f"invalid setting: {name}: xr up gives each region its own ({_PER_REGION[name]}), "
            "not one for all by --set"
        )
    for name in sorted(options.settings):
        if name.startswith("tls."):
            raise UpError(_no_tls(name, "--set"))
    data_dir = (options.base_dir or Path(tempfile.gettempdir()) / "xr-up") / names[0]
    overrides = {
        "region.name": names[0],
        "raft.address": f"{HOST}:{raft_ports[0]}",
        "raft.peers": ",".join(f"{HOST}:{port}" for port in raft_ports[1:]),
        "http.address": f"{HOST}:{http_ports[0]}",
        "data_dir": str(data_dir),
        **options.settings,
    }
    try:
        config = load_config(overrides=overrides)
        # The tokens file, read as each node reads it at start (which a bad one stops).
        Authenticator(config.auth)
    except ConfigError as error:
        raise UpError(f"invalid setting: {error}") from None
    # From the environment (the --set ones were refused above).
    for name, source in sorted(config.sources.items()):
        if name.startswith("tls."):
            raise UpError(_no_tls(name, source))
    return config.raft.cluster_secret is None and not config.raft.insecure


def _no_tls(name: str, source: str) -> str:
    # Its readiness checks and the endpoints it prints are plain http: it would wait for nodes
    # that serve https only, then give up on them.
    return (
        f"invalid setting: {name} (from {source}): xr up does not start TLS nodes; start each "
        "with `xr node run` (docs/security.md)"
    )


def _check_ports_free(http_ports: list[int], raft_ports: list[int], *, remedy: str) -> None:
    """UpError when a port the nodes will listen on is taken: another cluster's nodes on it would
    answer the readiness checks of this one's, which then could not listen on it."""
    for kind, ports in (("API", http_ports), ("Raft", raft_ports)):
        for port in ports:
            try:
                check_port_free(port)
            except OSError as error:
                raise UpError(
                    f"{kind} port {HOST}:{port} cannot be used: {error.strerror or error} "
                    f"(another cluster's nodes?); {remedy}"
                ) from None


def _read_state(base_dir: Path, region_names: list[str]) -> dict[str, Any] | None:
    path = base_dir / STATE_FILE
    try:
        state = json.loads(read_bounded(path, CONFIG_BYTES_MAX))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError) as error:
        raise UpError(f"{path} cannot be read ({error}); remove it or use another --dir") from None
    if not isinstance(state, dict) or not {"regions", "http_ports", "raft_ports"} <= set(state):
        raise UpError(f"{path} is not a state file of xr up; remove it or use another --dir")
    if state["regions"] != region_names:
        raise UpError(
            f"{base_dir} holds a cluster of regions {', '.join(map(str, state['regions']))}; "
            "start it with the same regions, or use another --dir"
        )
    return state


def _write_state(cluster: LocalCluster, region_names: list[str]) -> None:
    state = {
        "regions": region_names,
        "http_ports": [node.http_port for node in cluster.nodes],
        "raft_ports": [node.raft_port for node in cluster.nodes],
    }
    (cluster.base_dir / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")


class _StopRequests:
    """Counts stop signals; while installed, SIGINT, SIGTERM and SIGHUP only set the count (the
    main loop polls it), so no signal interrupts a node's start or stop half-way."""

    def __init__(self) -> None:
        self.count = 0
        self._previous: dict[int, Any] = {}

    def _handle(self, signal_number: int, frame: FrameType | None) -> None:
        self.count += 1

    def install(self) -> None:
        for signal_number in _STOP_SIGNALS:
            self._previous[signal_number] = signal.signal(signal_number, self._handle)

    def restore(self) -> None:
        for signal_number, handler in self._previous.items():
            signal.signal(signal_number, handler)


def _table(cluster: LocalCluster) -> str:
    from node.cli_common import table

    return table(
        ["REGION", "PID", "API URL", "RAFT ADDRESS", "LOG", "DATA DIR"],
        [
            [
                node.region,
                None if node.process is None else node.process.pid,
                node.url,
                node.raft_address,
                node.log_path,
                node.data_dir,
            ]
            for node in cluster.nodes
        ],
    )


def _start(
    cluster: LocalCluster, stops: _StopRequests, echo: Echo, warn: Echo, timeout_s: float
) -> bool:
    """Starts every node and waits until each is ready. False if a node failed or did not
    become ready (its log tail shown) or a stop was asked for; the caller stops the rest."""
    for node in cluster.nodes:
        node.start()
        pid = None if node.process is None else node.process.pid
        echo(f"  {node.region}: started (pid {pid}), API {node.url}, raft {node.raft_address}")
    waiting = list(cluster.nodes)
    deadline_s = time.monotonic() + timeout_s
    while waiting:
        if stops.count:
            warn("xr up: interrupted while starting")
            return False
        for node in list(waiting):
            if not node.running:
                warn(f"xr up: region {node.region} exited with code {node.exit_code} at start")
                warn(f"--- last lines of {node.log_path}:")
                warn(node.log_tail(3000).rstrip())
                return False
            # Still running once ready: another process on its port could have answered.
            if node.ready() and node.running:
                echo(f"  {node.region}: ready")
                waiting.remove(node)
        if waiting and time.monotonic() > deadline_s:
            for node in waiting:
                warn(f"xr up: region {node.region} not ready after {timeout_s:g} s")
                warn(f"--- last lines of {node.log_path}:")
                warn(node.log_tail(1500).rstrip())
            return False
        if waiting:
            time.sleep(_POLL_S)
    return True


def _check_not_running(base_dir: Path, names: list[str]) -> None:
    """UpError when a node holds a region's data directory: the cluster in `base_dir` runs (a
    second `xr up --dir` on it would find its ports taken, and its nodes would be answered by
    the running ones')."""
    from node.config import ConfigError
    from node.data_dir import DataDirLock

    for name in names:
        try:
            DataDirLock(base_dir / name).release()
        except ConfigError as error:
            raise UpError(f"the cluster in {base_dir} is running: {error}") from None
        except OSError as error:
            raise UpError(f"{base_dir / name} cannot be used: {error.strerror or error}") from None


def _watch(cluster: LocalCluster, stops: _StopRequests, warn: Echo) -> bool:
    """Waits for a stop signal (True), reporting any node that exits on its own meanwhile;
    False when every node has exited."""
    reported: set[str] = set()
    while not stops.count:
        for node in cluster.nodes:
            if node.region not in reported and not node.running:
                reported.add(node.region)
                warn(
                    f"xr up: region {node.region} exited with code {node.exit_code}; "
                    f"its log is {node.log_path}"
                )
        if len(reported) == len(cluster.nodes):
            warn("xr up: every region has exited")
            return False
        time.sleep(_POLL_S * 2)
    return True


def _stop(cluster: LocalCluster, stops: _StopRequests, echo: Echo) -> None:
    """SIGTERM to every node at once (each hands over leadership and finishes its requests),
    then SIGKILL for any still running after STOP_TIMEOUT_S or a further stop signal."""
    running = [node for node in cluster.nodes if node.running]
    if running:
        echo(f"stopping {', '.join(node.region for node in running)} ...")
    signals_before = stops.count
    for node in running:
        assert node.process is not None
        node.process.terminate()
    deadline_s = time.monotonic() + STOP_TIMEOUT_S
    while any(node.running for node in running):
        if stops.count > signals_before:
            echo("stop asked again: killing the nodes")
            break
        if time.monotonic() > deadline_s:
            slow = ", ".join(node.region for node in running if node.running)
            echo(f"not stopped after {STOP_TIMEOUT_S:g} s, killing: {slow}")
            break
        time.sleep(_POLL_S)
    _kill_all(cluster.nodes)
    if running:
        echo("stopped " + ", ".join(f"{node.region} ({node.exit_code})" for node in running))


def _kill_all(nodes: list[LocalNode]) -> None:
    # kill() sends SIGKILL only to a node still running, then reaps it.
    for node in nodes:
        node.kill()


def _unfailing(echo: Echo) -> Echo:
    def say(line: str) -> None:
        with contextlib.suppress(OSError):
            echo(line)

    return say


def run_up(options: UpOptions, *, echo: Echo, warn: Echo) -> int:
    """Runs the cluster until a stop signal: 0 after a clean stop, 1 if a node failed to start or
    every node exited, 130 if interrupted while starting. Progress goes to `echo`, failures to
    `warn`. Raises UpError before starting anything if it cannot do what `options` ask."""
    # A closed stdout (`xr up | head`) must not stop the nodes from being stopped.
    echo, warn = _unfailing(echo), _unfailing(warn)
    names = options.region_names
    recorded = None
    if options.base_dir is not None:
        base_dir = options.base_dir.resolve()
        if base_dir.exists() and not base_dir.is_dir():
            raise UpError(f"--dir {base_dir} exists and is not a directory")
        try:
            prepare_directory(base_dir)
        except OSError as error:
            raise UpError(f"--dir {base_dir} cannot be used: {error.strerror or error}") from None
        recorded = _read_state(base_dir, names)
        if recorded is not None:
            _check_not_running(base_dir, names)
    http_ports, raft_ports = plan_ports(names, base_port=options.base_port, recorded=recorded)
    needs_secret = _check_settings(options, names, http_ports, raft_ports)
    if options.base_port is not None:
        remedy = "choose another --base-port"
    elif recorded is not None:
        remedy = f"the cluster in {base_dir} uses the ports in {STATE_FILE} there; free them"
    else:
        remedy = "try again"
    _check_ports_free(http_ports, raft_ports, remedy=remedy)
    if options.base_dir is None:
        base_dir = Path(tempfile.mkdtemp(prefix="xr-up-"))
    settings = dict(options.settings)
    if needs_secret:
        try:
            settings["raft.cluster_secret_file"] = str(secret_file(base_dir / SECRET_FILE))
        except OSError as error:
            raise UpError(f"{base_dir / SECRET_FILE} cannot be made: {error}") from None
    remove_dir = options.base_dir is None and not options.keep_data
    stops = _StopRequests()
    stops.install()
    cluster: LocalCluster | None = None
    try:
        cluster = LocalCluster(
            base_dir,
            region_names=names,
            settings=settings,
            http_ports=http_ports,
            raft_ports=raft_ports,
            stop_with_parent=True,
        )
        base_dir.mkdir(parents=True, exist_ok=True)
        _write_state(cluster, names)
        restarting = " (restarting from its data)" if recorded is not None else ""
        echo(f"starting {len(names)} regions in {base_dir}{restarting}")
        if needs_secret:
            echo(f"Raft traffic is authenticated with the secret in {base_dir / SECRET_FILE}")
        if not _start(cluster, stops, echo, warn, options.start_timeout_s):
            return 130 if stops.count else 1
        echo("")
        echo(_table(cluster))
        echo("")
        echo(f"export XR_ENDPOINTS={','.join(cluster.urls)}")
        echo("")
        echo("the cluster is up; Ctrl-C stops it")
        return 0 if _watch(cluster, stops, warn) else 1
    finally:
        if cluster is not None:
            try:
                _stop(cluster, stops, echo)
            finally:
                _kill_all(cluster.nodes)
        stops.restore()
        if remove_dir:
            shutil.rmtree(base_dir, ignore_errors=True)
            echo(f"removed {base_dir}")
        else:
            echo(f"data kept in {base_dir}")
