"""Nemeses: the faults a run injects, each with the step that heals it, on a schedule drawn from
the run's seed.

| fault | what it does | heal |
| --- | --- | --- |
| partition halves | two halves of the nodes cannot reach each other | remove every drop rule |
| partition one | one node cannot reach any other | remove every drop rule |
| partition leader | the current leader cannot reach any other | remove every drop rule |
| partition ring | each node reaches a majority, no two the same (a bridge on 3) | (same) |
| partition bridge | two halves joined only through one node | (same) |
| kill | kill -9 a minority of nodes (or the leader) | start them again from their data |
| pause | SIGSTOP a minority of nodes (or the leader) | SIGCONT |
| clock | step a minority's wall clocks and change their rate | back to true time, rate 1 |
| clock-jump | step a minority's wall clocks, rate kept true | back to true time |

`schedule` is pure: the same nemesis, seed, duration and node count give the same windows, with
the nodes already chosen (a fault aimed at "the leader" is resolved when it starts, and the event
it records names the node). `Nemesis` carries them out on a `Cluster`.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from xr_jepsen.db import Cluster

__all__ = [
    "NEMESES",
    "PARTITION_SHAPES",
    "Fault",
    "Nemesis",
    "Window",
    "cut_off",
    "grudge",
    "needs_clock",
    "needs_partitions",
    "refusal",
    "schedule",
]

FaultKind = Literal["partition", "kill", "pause", "clock"]
PARTITION_SHAPES = ("halves", "one", "leader", "ring", "bridge")
NEMESES = (
    "none",
    *(f"partition-{shape}" for shape in PARTITION_SHAPES),
    "partition",
    "kill",
    "pause",
    "clock",
    "clock-jump",
    "mixed",
)
# A fault lasts long enough for an election and a few lease ticks, and the quiet time between
# two lets the cluster recover, so each window tests something.
FAULT_S_MIN, FAULT_S_MAX = 3.0, 6.0
QUIET_S_MIN, QUIET_S_MAX = 2.0, 4.0
# Faults end this long before the run's end, so the final heal does not race a fault's start.
TAIL_S = 1.0
WINDOWS_MAX = 1000
CLOCK_OFFSET_S_MAX = 60.0
# A partition needs a majority side and a minority side, and a kill or pause of "a minority" must
# leave a majority running: with fewer nodes the first cuts nothing (or everything) off and the
# others stop the only node or half the cluster.
NODES_MIN = 3
CLOCK_RATES = (0.5, 1.0, 2.0, 4.0)


@dataclass(frozen=True, kw_only=True, slots=True)
class Fault:
    """One fault. `nodes`: for a partition, an order of every node (the shape cuts it); for the
    others, the nodes it hits. `leader`: aim at whichever node leads when it starts."""

    kind: FaultKind
    nodes: tuple[int, ...]
    shape: str | None = None
    leader: bool = False
    offset_s: float = 0.0
    rate: float = 1.0

    def __post_init__(self) -> None:
        if self.kind == "partition" and self.shape not in PARTITION_SHAPES:
            raise ValueError(f"partition shape must be one of {PARTITION_SHAPES}: {self.shape}")
        if self.kind != "partition" and self.shape is not None:
            raise ValueError(f"only a partition has a shape, not a {self.kind}")
        if self.rate <= 0:
            raise ValueError(f"a clock rate must be positive, got {self.rate}")

    @property
    def name(self) -> str:
        return f"partition-{self.shape}" if self.kind == "partition" else self.kind

    @property
    def heal_step(self) -> str:
        return {
            "partition": "remove every drop rule",
            "kill": "start the killed nodes again",
            "pause": "SIGCONT the paused nodes",
            "clock": "set the clocks back to true time at rate 1",
        }[self.kind]


@dataclass(frozen=True, kw_only=True, slots=True)
class Window:
    """A fault from `start_s` to `end_s` after the workload starts (then healed)."""

    start_s: float
    end_s: float
    fault: Fault


def needs_partitions(nemesis: str) -> bool:
    return nemesis.startswith("partition")


def needs_clock(nemesis: str) -> bool:
    return nemesis in ("clock", "clock-jump", "mixed")


def refusal(nemesis: str, *, size: int, duration_s: float) -> str | None:
    """Why a run of `nemesis` on `size` nodes for `duration_s` could not test its fault, or None.

    Refused: a nemesis other than `none`, `clock` and `clock-jump` on fewer than NODES_MIN nodes
    (clock faults need no majority), and any nemesis but `none` whose schedule can place no
    window: the first fault starts after at least QUIET_S_MIN, lasts at least FAULT_S_MIN and
    must end TAIL_S before the run does, so a run of at most their sum never has one."""
    if nemesis == "none":
        return None
    if size < NODES_MIN and nemesis not in ("clock", "clock-jump"):
        return (
            f"nemesis {nemesis!r} needs at least {NODES_MIN} nodes (--nodes {size}): on fewer a "
            "partition has no minority side, and killing or pausing a minority stops the only "
            "node or half the cluster"
        )
    time_s_min = QUIET_S_MIN + FAULT_S_MIN + TAIL_S
    if duration_s <= time_s_min:
        return (
            f"nemesis {nemesis!r} can inject no fault in {duration_s:g} s: a fault starts at "
            f"least {QUIET_S_MIN:g} s in, lasts at least {FAULT_S_MIN:g} s and ends {TAIL_S:g} "
            f"s before the run does; give --time over {time_s_min:g}"
        )
    return None


def _minority(rng: random.Random, size: int) -> tuple[int, ...]:
    count = rng.randint(1, max(1, (size - 1) // 2))
    return tuple(sorted(rng.sample(range(size), count)))


def _fault(kind: str, rng: random.Random, size: int) -> Fault:
    if kind.startswith("partition"):
        shape = kind.removeprefix("partition-") if "-" in kind else rng.choice(PARTITION_SHAPES)
        order = list(range(size))
        rng.shuffle(order)
        return Fault(kind="partition", shape=shape, nodes=tuple(order))
    if kind == "kill" or kind == "pause":
        leader = rng.random() < 0.5
        process_fault: FaultKind = "kill" if kind == "kill" else "pause"
        nodes = () if leader else _minority(rng, size)
        return Fault(kind=process_fault, nodes=nodes, leader=leader)
    if kind == "clock":
        offset_s = round(rng.uniform(-CLOCK_OFFSET_S_MAX, CLOCK_OFFSET_S_MAX), 3)
        leader = rng.random() < 0.3
        return Fault(
            kind="clock",
            nodes=() if leader else _minority(rng, size),
            leader=leader,
            offset_s=offset_s,
            rate=rng.choice(CLOCK_RATES),
        )
    raise ValueError(f"unknown fault kind {kind!r}")


def schedule(
    nemesis: str, *, seed: int, duration_s: float, size: int, partitions: bool = True
) -> list[Window]:
    """The fault windows of a run. `partitions=False` (no namespaces): a mixed schedule draws
    no partition; a partition nemesis is refused (ValueError)."""
    if nemesis not in NEMESES:
        raise ValueError(f"unknown nemesis {nemesis!r}; choose one of {', '.join(NEMESES)}")
    if needs_partitions(nemesis) and not partitions:
        raise ValueError(
            f"nemesis {nemesis!r} needs partitions, which need network namespaces and nftables "
            "(root); this machine cannot make them, so only kill, pause, clock and mixed run"
        )
    if nemesis == "none":
        return []
    rng = random.Random(f"{seed}/nemesis/{nemesis}/{size}")
    mixed_kinds = ["kill", "pause", "clock"] + (["partition"] if partitions else [])
    windows: list[Window] = []
    now_s = 0.0
    while len(windows) < WINDOWS_MAX:
        start_s = now_s + rng.uniform(QUIET_S_MIN, QUIET_S_MAX)
        end_s = start_s + rng.uniform(FAULT_S_MIN, FAULT_S_MAX)
        if end_s > duration_s - TAIL_S:
            break
        kind = rng.choice(mixed_kinds) if nemesis == "mixed" else nemesis
        fault = _fault("clock" if kind == "clock-jump" else kind, rng, size)
        if kind == "clock-jump":
            # Offsets only: a lease system must survive clock steps; no system can tell a clock
            # running fast from time passing.
            fault = Fault(
                kind="clock",
                nodes=fault.nodes,
                leader=fault.leader,
                offset_s=fault.offset_s or CLOCK_OFFSET_S_MAX,
                rate=1.0,
            )
        windows.append(Window(start_s=round(start_s, 3), end_s=round(end_s, 3), fault=fault))
        now_s = end_s
    return windows


def grudge(shape: str, order: Sequence[int], *, leader: int | None = None) -> dict[int, list[int]]:
    """For each node, the nodes whose packets it drops, for a partition of `shape` cutting
    `order` (every node, in a drawn order). Always symmetric: TCP needs both directions."""
    size = len(order)
    if shape in ("one", "leader"):
        isolated = order[0] if shape == "one" else leader
        if isolated is None:
            raise ValueError("partitioning the leader needs the leader")
        return _cut([[isolated], [node for node in order if node != isolated]])
    if shape == "halves":
        return _cut([list(order[: size // 2]), list(order[size // 2 :])])
    if shape == "bridge":
        return _bridge(order)
    if shape == "ring":
        # Each node sees the nodes within `reach` of it around the ring: itself and 2 * reach
        # others, a majority; no two nodes see the same majority. On 3 nodes every node is
        # within reach of every other, so the ring is the bridge (the only such cut).
        majority = size // 2 + 1
        reach = majority // 2
        dropped = {
            order[position]: sorted(
                order[other]
                for other in range(size)
                if min((other - position) % size, (position - other) % size) > reach
            )
            for position in range(size)
        }
        if not any(dropped.values()):
            return _bridge(order)
        return {node: others for node, others in dropped.items() if others}
    raise ValueError(f"unknown partition shape {shape!r}")


def cut_off(
    shape: str, order: Sequence[int], dropped: dict[int, list[int]], *, leader: int | None = None
) -> list[int]:
    """The nodes a partition cuts off, which its event names (`grudge` gives every node's drops):
    the isolated node (one, leader), the smaller half (halves; the first half of `order`), and
    for ring and bridge every node that loses a peer, since no side is cut off whole."""
    if shape == "one":
        return [order[0]]
    if shape == "leader" and leader is not None:
        return [leader]
    if shape == "halves":
        return sorted(order[: len(order) // 2])
    return sorted(dropped)


def _cut(components: list[list[int]]) -> dict[int, list[int]]:
    dropped: dict[int, list[int]] = {}
    for component in components:
        others = sorted(node for other in components if other is not component for node in other)
        for node in component:
            if others:
                dropped[node] = others
    return dropped


def _bridge(order: Sequence[int]) -> dict[int, list[int]]:
    half = len(order) // 2
    left, right = list(order[:half]), list(order[half + 1 :])
    dropped = {node: sorted(right) for node in left}
    dropped.update({node: sorted(left) for node in right})
    return dropped


@dataclass
class Nemesis:
    """Carries out faults on a cluster and heals them. Blocking: the runner calls it from a
    thread."""

    cluster: Cluster
    # What each started fault resolved to (which nodes it hit), until healed.
    active: list[tuple[Fault, list[int]]] = field(default_factory=list)

    def _targets(self, fault: Fault) -> list[int]:
        if not fault.leader:
            return list(fault.nodes)
        leader = self.cluster.leader()
        # No leader now (an election is under way): hit a node drawn from the seed instead.
        return [leader] if leader is not None else [fault.nodes[0] if fault.nodes else 0]

    def start(self, fault: Fault) -> dict[str, Any]:
        """Injects `fault`; returns what it did, for the history."""
        described: dict[str, Any] = {"phase": "start", "fault": fault.name}
        if fault.kind == "partition":
            assert fault.shape is not None
            leader = self.cluster.leader() if fault.shape == "leader" else None
            if fault.shape == "leader" and leader is None:
                leader = fault.nodes[0]
            dropped = grudge(fault.shape, fault.nodes, leader=leader)
            self.cluster.partition(dropped)
            targets = cut_off(fault.shape, fault.nodes, dropped, leader=leader)
            described["drops"] = {self._name(node): self._names(dropped[node]) for node in dropped}
        else:
            targets = self._targets(fault)
            for index in targets:
                if fault.kind == "kill":
                    self.cluster.kill(index)
                elif fault.kind == "pause":
                    self.cluster.pause(index)
                else:
                    self.cluster.set_clock(index, offset_s=fault.offset_s, rate=fault.rate)
            if fault.kind == "clock":
                described.update(offset_s=fault.offset_s, rate=fault.rate)
        described["nodes"] = self._names(targets)
        self.active.append((fault, targets))
        return described

    def heal(self) -> dict[str, Any] | None:
        """Heals the oldest active fault; None when none is active."""
        if not self.active:
            return None
        fault, targets = self.active.pop(0)
        if fault.kind == "partition":
            self.cluster.heal_network()
        for index in targets:
            if fault.kind == "kill":
                self.cluster.start_node(index)
            elif fault.kind == "pause":
                self.cluster.resume(index)
            elif fault.kind == "clock":
                self.cluster.set_clock(index, offset_s=0.0, rate=1.0)
        return {
            "phase": "heal",
            "fault": fault.name,
            "nodes": self._names(targets),
            "step": fault.heal_step,
        }

    def heal_all(self) -> list[dict[str, Any]]:
        """Heals every active fault, then makes sure of it: no drop rule, every node running,
        none paused, every clock true."""
        healed = []
        while self.active:
            event = self.heal()
            if event is not None:
                healed.append(event)
        self.cluster.heal_network()
        for index, node in enumerate(self.cluster.nodes):
            if node.paused:
                self.cluster.resume(index)
            if not node.running:
                self.cluster.start_node(index)
            if index in self.cluster.clocks and self.cluster.clocks[index] != (0.0, 1.0):
                self.cluster.set_clock(index, offset_s=0.0, rate=1.0)
        return healed

    def _name(self, index: int) -> str:
        return self.cluster.nodes[index].region

    def _names(self, indexes: Sequence[int]) -> list[str]:
        return [self._name(index) for index in indexes]
