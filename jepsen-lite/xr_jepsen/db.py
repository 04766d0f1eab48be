"""The database under test: N real `xr node run` processes, started through xr's own CLI
(`node.localcluster.LocalNode`), each in its own network namespace when the machine allows.

Two mechanisms, chosen once per run and recorded in its results:

- `namespaces`: each node in a namespace with its own address on a bridge (`net.Network`);
  partitions are nftables drops inside the namespaces. Needs root, `ip` and `nft`.
- `transport`: every node on 127.0.0.1, started with the test-only `XR_TEST_PARTITIONS=1`
  (`raftstore.testnet`), only when asked for (`fault_transport`): partitions are message drops
  inside the nodes, set through each node's `PUT /v1/test/drops`. For machines without
  namespaces; a node restarted during a partition comes back with no drops.
- `loopback`: every node on 127.0.0.1. No partition can be made (pysyncobj does not bind the
  source address of its connections, so per-node filtering is impossible); a nemesis that needs
  one is refused with a clear message, and only process faults (kill, pause) and clock faults run.

Clock faults: a node started with `clock=True` runs under libfaketime (the `faketime` Debian
package) reading a per-node FAKETIME file that `set_clock` rewrites. Only the wall clock is faked
(`FAKETIME_DONT_FAKE_MONOTONIC=1`): like a real machine whose clock is stepped or drifts, while
the monotonic clocks that pysyncobj and asyncio time out on keep running true.
"""

from __future__ import annotations

import contextlib
import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from node.localcluster import LocalNode, free_ports
from xr_jepsen.net import Network, NetworkUnavailable, namespaces_available

__all__ = [
    "LIBFAKETIME_PATHS",
    "Cluster",
    "Mechanism",
    "clock_rule",
    "find_libfaketime",
]

Mechanism = Literal["namespaces", "transport", "loopback"]
RAFT_PORT = 7000
HTTP_PORT = 8700
LIBFAKETIME_PATHS = (
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
)
STATUS_TIMEOUT_S = 1.0


def find_libfaketime() -> str | None:
    for path in LIBFAKETIME_PATHS:
        if Path(path).exists():
            return path
    return None


def clock_rule(*, offset_s: float, rate: float, age_s: float) -> str:
    """The FAKETIME file content that gives a clock `offset_s` ahead of true time from now on,
    running at `rate` times true speed, for a process `age_s` seconds old. libfaketime applies a
    rate from the process's start, so the offset is corrected to make the change continuous."""
    corrected_s = offset_s - age_s * (rate - 1.0)
    if rate == 1.0:
        return f"{offset_s:+.3f}\n"
    return f"{corrected_s:+.3f} x{rate:g}\n"


@dataclass
class Cluster:
    """The nodes of one run under `base_dir` (`<base_dir>/<region>/` data, `<region>.log` log):
    the runner puts `base_dir` inside the run directory, so every node's log and data stay with
    the run's results."""

    base_dir: Path
    size: int
    settings: dict[str, str]
    mechanism: Mechanism
    network: Network | None
    nodes: list[LocalNode]
    # Per node (by index): the FAKETIME file, and when its process started (for rate changes).
    clock_files: dict[int, Path]
    started_at_s: dict[int, float]
    # The clock each node is set to now, as (offset_s, rate).
    clocks: dict[int, tuple[float, float]]

    @classmethod
    def create(
        cls,
        base_dir: Path,
        *,
        size: int,
        settings: dict[str, str],
        want_namespaces: bool = True,
        clock: bool = False,
        fault_transport: bool = False,
    ) -> tuple[Cluster, str]:
        """The cluster (not started) and a sentence saying which mechanism it uses and why."""
        base_dir.mkdir(parents=True, exist_ok=True)
        # Before the network is made: a missing libfaketime must not leave a network behind.
        prefix_of = cls._clock_prefixes(base_dir, size) if clock else {}
        reason = namespaces_available() if want_namespaces else "namespaces not asked for"
        network = None
        if reason is None:
            network = Network(size)
            try:
                network.create()
            except NetworkUnavailable as error:
                reason, network = str(error), None
        if network is not None:
            mechanism: Mechanism = "namespaces"
            hosts = [network.address(index) for index in range(size)]
            raft_ports, http_ports = [RAFT_PORT] * size, [HTTP_PORT] * size
            secret_path = base_dir / "cluster-secret"
            secret_path.write_text("xr-jepsen-test-cluster\n")
            settings = {**settings, "raft.cluster_secret_file": str(secret_path)}
            note = f"namespaces: one network namespace per node on bridge {network.bridge}"
        else:
            mechanism = "transport" if fault_transport else "loopback"
            hosts = ["127.0.0.1"] * size
            ports = free_ports(2 * size)
            raft_ports, http_ports = ports[:size], ports[size:]
            note = (
                f"transport: no namespaces ({reason}); partitions are message drops inside the "
                "nodes (XR_TEST_PARTITIONS)"
                if fault_transport
                else f"loopback: partitions unavailable ({reason}); process faults only"
            )
        addresses = [f"{host}:{port}" for host, port in zip(hosts, raft_ports, strict=True)]
        nodes = []
        drop_prefix = (
            ["env", "XR_TEST_RUN=1", "XR_TEST_PARTITIONS=1"] if mechanism == "transport" else []
        )
        for index in range(size):
            prefix = network.exec_prefix(index) if network is not None else drop_prefix
            nodes.append(
                LocalNode(
                    region=f"n{index}",
                    raft_port=raft_ports[index],
                    http_port=http_ports[index],
                    data_dir=base_dir / f"n{index}",
                    log_path=base_dir / f"n{index}.log",
                    peers=[address for address in addresses if address != addresses[index]],
                    settings=dict(settings),
                    host=hosts[index],
                    command_prefix=[*prefix, *prefix_of.get(index, [])],
                )
            )
        cluster = cls(
            base_dir=base_dir,
            size=size,
            settings=settings,
            mechanism=mechanism,
            network=network,
            nodes=nodes,
            clock_files={index: base_dir / f"n{index}.faketime" for index in prefix_of},
            started_at_s={},
            clocks={index: (0.0, 1.0) for index in prefix_of},
        )
        return cluster, note

    @staticmethod
    def _clock_prefixes(base_dir: Path, size: int) -> dict[int, list[str]]:
        library = find_libfaketime()
        if library is None:
            raise NetworkUnavailable(
                "clock faults need libfaketime (apt-get install faketime; make jepsen-deps)"
            )
        prefixes = {}
        for index in range(size):
            clock_file = base_dir / f"n{index}.faketime"
            clock_file.write_text("+0\n")
            prefixes[index] = [
                "env",
                f"LD_PRELOAD={library}",
                f"FAKETIME_TIMESTAMP_FILE={clock_file}",
                # The file is read again at most once a second: a clock fault lands within a
                # second, without a file read on every clock call.
                "FAKETIME_CACHE_DURATION=1",
                "FAKETIME_DONT_FAKE_MONOTONIC=1",
                # With the monotonic clock left alone, libfaketime's "monotonic fix" for timed
                # condition waits mistranslates their deadlines: pysyncobj's and asyncio's waits
                # went wrong, with elections every second and a tenth of the throughput.
                "FAKETIME_FORCE_MONOTONIC_FIX=0",
            ]
        return prefixes

    @property
    def host_address(self) -> str:
        """Where the nodes reach the harness (its protected resources)."""
        return "127.0.0.1" if self.network is None else self.network.host_address

    @property
    def urls(self) -> list[str]:
        return [node.url for node in self.nodes]

    @property
    def partitions_available(self) -> bool:
        return self.network is not None or self.mechanism == "transport"

    @property
    def clocks_available(self) -> bool:
        return bool(self.clock_files)

    # Processes.

    def start(self, *, timeout_s: float = 60.0) -> None:
        for index in range(self.size):
            self.start_node(index)
        self.wait_ready(timeout_s=timeout_s)

    def start_node(self, index: int) -> None:
        if index in self.clock_files:
            # A restarted process starts with a true clock: libfaketime counts rates from the
            # start of the process.
            self.clock_files[index].write_text("+0\n")
            self.clocks[index] = (0.0, 1.0)
        self.started_at_s[index] = time.time()
        self.nodes[index].start()

    def wait_ready(self, *, timeout_s: float) -> None:
        deadline_s = time.monotonic() + timeout_s
        waiting = [node for node in self.nodes if node.running]
        while waiting:
            for node in waiting:
                if node.exit_code is not None and node.exit_code >= 0:
                    raise RuntimeError(
                        f"node {node.region} exited with {node.exit_code}:\n{node.log_tail()}"
                    )
            waiting = [node for node in waiting if node.running and not node.ready()]
            if waiting and time.monotonic() > deadline_s:
                logs = "\n".join(f"--- {node.region}\n{node.log_tail(1500)}" for node in waiting)
                raise RuntimeError(f"nodes not ready in {timeout_s} s:\n{logs}")
            time.sleep(0.2)

    def kill(self, index: int) -> None:
        self.nodes[index].kill()

    def pause(self, index: int) -> None:
        self.nodes[index].pause()

    def resume(self, index: int) -> None:
        self.nodes[index].resume()

    def set_clock(self, index: int, *, offset_s: float, rate: float) -> None:
        """Steps node `index`'s wall clock to `offset_s` ahead of true time, running at `rate`."""
        age_s = time.time() - self.started_at_s.get(index, time.time())
        self.clock_files[index].write_text(clock_rule(offset_s=offset_s, rate=rate, age_s=age_s))
        self.clocks[index] = (offset_s, rate)

    def partition(self, grudge: dict[int, list[int]]) -> None:
        if self.mechanism == "transport":
            for index in range(self.size):
                self._set_drops(index, grudge.get(index, []))
            return
        if self.network is None:
            raise NetworkUnavailable("partitions need network namespaces, unavailable in this run")
        self.network.apply(grudge)

    def heal_network(self) -> None:
        if self.mechanism == "transport":
            for index in range(self.size):
                self._set_drops(index, [])
        elif self.network is not None:
            self.network.heal()

    def _set_drops(self, index: int, dropped: list[int]) -> None:
        """Tells node `index` to drop messages to and from `dropped` (a down node is skipped:
        it comes back with no drops)."""
        node = self.nodes[index]
        if not node.running or node.paused:
            return
        peers = [self.nodes[other].raft_address for other in dropped]
        request = urllib.request.Request(
            f"{node.url}/v1/test/drops",
            data=json.dumps({"peers": peers}).encode(),
            headers={"Content-Type": "application/json"},
            method="PUT",
        )
        with contextlib.suppress(OSError, urllib.error.URLError):
            urllib.request.urlopen(request, timeout=STATUS_TIMEOUT_S).close()

    def status(self, index: int) -> dict[str, Any] | None:
        """Node `index`'s `GET /v1/cluster/status`, or None when it does not answer."""
        node = self.nodes[index]
        if not node.running or node.paused:
            return None
        try:
            url = f"{node.url}/v1/cluster/status"
            with urllib.request.urlopen(url, timeout=STATUS_TIMEOUT_S) as answer:
                document: dict[str, Any] = json.load(answer)
                return document
        except (OSError, urllib.error.URLError, ValueError):
            return None

    def leader(self) -> int | None:
        """The index of a node that says it leads with a quorum, or None."""
        for index in range(self.size):
            status = self.status(index)
            if status is not None and status.get("state") == "leader" and status["has_quorum"]:
                return index
        return None

    def stop(self) -> None:
        """Kills every node (the run is over: nothing graceful is being tested) and removes the
        network. Safe to call twice."""
        for node in self.nodes:
            with contextlib.suppress(OSError):
                node.kill()
        if self.network is not None:
            self.network.destroy()
