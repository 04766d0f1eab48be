"""The nemesis without processes: schedules come from the seed, every fault has its heal, each
partition shape cuts the nodes as it says, and the nftables text for it is right."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from xr_jepsen.db import Cluster, clock_rule
from xr_jepsen.nemesis import (
    FAULT_S_MIN,
    NEMESES,
    PARTITION_SHAPES,
    QUIET_S_MIN,
    TAIL_S,
    Fault,
    Nemesis,
    grudge,
    refusal,
    schedule,
)
from xr_jepsen.net import NFT_TABLE, grudge_rules, heal_rules

RUN_S = 120.0


@pytest.mark.parametrize("nemesis", NEMESES)
def test_schedule__same_seed__same_windows(nemesis: str) -> None:
    first = schedule(nemesis, seed=7, duration_s=RUN_S, size=5)
    again = schedule(nemesis, seed=7, duration_s=RUN_S, size=5)
    assert first == again
    if nemesis != "none":
        assert first, "a two-minute run has faults"
        assert first != schedule(nemesis, seed=8, duration_s=RUN_S, size=5)


@pytest.mark.parametrize("nemesis", NEMESES)
def test_schedule__windows_are_ordered_and_end_before_the_run(nemesis: str) -> None:
    windows = schedule(nemesis, seed=3, duration_s=RUN_S, size=3)
    previous_end_s = 0.0
    for window in windows:
        assert previous_end_s < window.start_s < window.end_s < RUN_S
        assert window.fault.heal_step, "every fault names the step that heals it"
        previous_end_s = window.end_s


@given(
    nemesis=st.sampled_from([name for name in NEMESES if name != "none"]),
    seed=st.integers(0, 2**32),
    duration_s=st.floats(1, 30),
)
def test_refusal__refuses_exactly_the_times_whose_schedule_has_no_fault(
    nemesis: str, seed: int, duration_s: float
) -> None:
    # The bound holds for every seed: at most QUIET_S_MIN + FAULT_S_MIN + TAIL_S, no window.
    refused = refusal(nemesis, size=3, duration_s=duration_s)
    if refused is not None:
        assert "can inject no fault" in refused
        assert schedule(nemesis, seed=seed, duration_s=duration_s, size=3) == []
    else:
        assert duration_s > QUIET_S_MIN + FAULT_S_MIN + TAIL_S == 6.0


@pytest.mark.parametrize("nemesis", NEMESES)
@pytest.mark.parametrize("size", [1, 2, 3, 5])
def test_refusal__needs_three_nodes_but_for_clock_faults(nemesis: str, size: int) -> None:
    refused = refusal(nemesis, size=size, duration_s=RUN_S)
    assert (refused is not None) is (size < 3 and nemesis not in ("none", "clock", "clock-jump"))
    if refused is not None:
        assert f"needs at least 3 nodes (--nodes {size})" in refused


def test_schedule__mixed_draws_every_kind_of_fault() -> None:
    kinds = {window.fault.kind for window in schedule("mixed", seed=1, duration_s=600, size=5)}
    assert kinds == {"partition", "kill", "pause", "clock"}


def test_schedule__without_partitions__mixed_draws_none_and_partitions_are_refused() -> None:
    windows = schedule("mixed", seed=1, duration_s=600, size=5, partitions=False)
    assert windows
    assert all(window.fault.kind != "partition" for window in windows)
    with pytest.raises(ValueError, match="needs partitions"):
        schedule("partition-halves", seed=1, duration_s=60, size=3, partitions=False)


@pytest.mark.parametrize("size", [3, 5])
@pytest.mark.parametrize("nemesis", ["kill", "pause", "clock"])
def test_process_faults__hit_a_minority(nemesis: str, size: int) -> None:
    for window in schedule(nemesis, seed=11, duration_s=600, size=size):
        assert window.fault.leader or 1 <= len(window.fault.nodes) <= (size - 1) // 2


def _symmetric(dropped: dict[int, list[int]]) -> bool:
    return all(
        node in dropped.get(other, []) for node, others in dropped.items() for other in others
    )


def _reachable(dropped: dict[int, list[int]], node: int, size: int) -> set[int]:
    return {other for other in range(size) if other not in dropped.get(node, [])}


@pytest.mark.parametrize("size", [3, 5])
@pytest.mark.parametrize("shape", PARTITION_SHAPES)
def test_grudge__every_shape_is_symmetric(shape: str, size: int) -> None:
    order = list(reversed(range(size)))
    dropped = grudge(shape, order, leader=2)
    assert dropped, f"{shape} on {size} nodes cuts something"
    assert _symmetric(dropped)
    assert all(node not in others for node, others in dropped.items())


def test_grudge__halves() -> None:
    assert grudge("halves", [4, 0, 3, 1, 2]) == {
        4: [1, 2, 3],
        0: [1, 2, 3],
        3: [0, 4],
        1: [0, 4],
        2: [0, 4],
    }


def test_grudge__one_isolates_the_first_of_the_order_and_leader_the_leader() -> None:
    assert grudge("one", [1, 0, 2]) == {1: [0, 2], 0: [1], 2: [1]}
    assert grudge("leader", [1, 0, 2], leader=2) == {2: [0, 1], 1: [2], 0: [2]}


def test_grudge__bridge_joins_two_halves_through_the_middle_node() -> None:
    dropped = grudge("bridge", [0, 1, 2, 3, 4])
    assert 2 not in dropped
    assert dropped == {0: [3, 4], 1: [3, 4], 3: [0, 1], 4: [0, 1]}


def test_grudge__ring_of_five__each_node_sees_its_own_majority() -> None:
    dropped = grudge("ring", [0, 1, 2, 3, 4])
    majorities = {frozenset(_reachable(dropped, node, 5)) for node in range(5)}
    assert len(majorities) == 5
    assert all(len(seen) == 3 for seen in majorities)
    assert _reachable(dropped, 0, 5) == {4, 0, 1}


def test_grudge__ring_of_three_is_the_bridge() -> None:
    assert grudge("ring", [2, 0, 1]) == grudge("bridge", [2, 0, 1])


def test_rules__drop_the_sources_in_one_atomic_replacement() -> None:
    text = grudge_rules(["10.77.1.3", "10.77.1.12", "10.77.1.2"])
    assert text == (
        f"table inet {NFT_TABLE} {{}}\n"
        f"delete table inet {NFT_TABLE}\n"
        f"table inet {NFT_TABLE} {{\n"
        "  chain input {\n"
        "    type filter hook input priority filter; policy accept;\n"
        "    ip saddr { 10.77.1.2, 10.77.1.3, 10.77.1.12 } drop\n"
        "  }\n"
        "}\n"
    )


def test_rules__heal_removes_the_table_whether_or_not_it_exists() -> None:
    assert heal_rules() == f"table inet {NFT_TABLE} {{}}\ndelete table inet {NFT_TABLE}\n"
    assert grudge_rules([]) == heal_rules()


def test_clock_rule__a_rate_change_is_continuous() -> None:
    # libfaketime applies a rate from the process's start: 100 s in, doubling the rate alone
    # would jump the clock 100 s ahead.
    assert clock_rule(offset_s=10.0, rate=2.0, age_s=100.0) == "-90.000 x2\n"
    assert clock_rule(offset_s=-5.5, rate=1.0, age_s=100.0) == "-5.500\n"


@dataclass
class _Node:
    region: str
    running: bool = True
    paused: bool = False


@dataclass
class _FakeCluster:
    """Records what the nemesis asks of the cluster."""

    size: int = 3
    calls: list[tuple[object, ...]] = field(default_factory=list)
    clocks: dict[int, tuple[float, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.nodes = [_Node(f"n{index}") for index in range(self.size)]
        self.clocks = {index: (0.0, 1.0) for index in range(self.size)}

    def leader(self) -> int:
        return 1

    def partition(self, dropped: dict[int, list[int]]) -> None:
        self.calls.append(("partition", dropped))

    def heal_network(self) -> None:
        self.calls.append(("heal_network",))

    def kill(self, index: int) -> None:
        self.nodes[index].running = False
        self.calls.append(("kill", index))

    def start_node(self, index: int) -> None:
        self.nodes[index].running = True
        self.calls.append(("start_node", index))

    def pause(self, index: int) -> None:
        self.nodes[index].paused = True
        self.calls.append(("pause", index))

    def resume(self, index: int) -> None:
        self.nodes[index].paused = False
        self.calls.append(("resume", index))

    def set_clock(self, index: int, *, offset_s: float, rate: float) -> None:
        self.clocks[index] = (offset_s, rate)
        self.calls.append(("set_clock", index, offset_s, rate))


@pytest.mark.parametrize(
    ("fault", "injected", "healed"),
    [
        (
            Fault(kind="kill", nodes=(0, 2)),
            [("kill", 0), ("kill", 2)],
            [("start_node", 0), ("start_node", 2)],
        ),
        (Fault(kind="pause", nodes=(), leader=True), [("pause", 1)], [("resume", 1)]),
        (
            Fault(kind="clock", nodes=(2,), offset_s=-30.0, rate=2.0),
            [("set_clock", 2, -30.0, 2.0)],
            [("set_clock", 2, 0.0, 1.0)],
        ),
        (
            Fault(kind="partition", shape="leader", nodes=(0, 1, 2)),
            [("partition", {1: [0, 2], 0: [1], 2: [1]})],
            [("heal_network",)],
        ),
    ],
)
def test_nemesis__each_fault_is_undone_by_its_heal(
    fault: Fault, injected: list[tuple[object, ...]], healed: list[tuple[object, ...]]
) -> None:
    fake = _FakeCluster()
    nemesis = Nemesis(cast(Cluster, fake))
    started = nemesis.start(fault)
    assert started["phase"] == "start" and started["fault"] == fault.name
    assert fake.calls == injected
    fake.calls.clear()
    assert nemesis.heal() is not None
    assert fake.calls == healed
    assert nemesis.heal() is None


@pytest.mark.parametrize(
    ("shape", "named"),
    [
        # partition-one said "on n0,n1,n2": every node with a drop rule.
        ("one", ["n2"]),
        ("leader", ["n1"]),
        ("halves", ["n2", "n4"]),
        ("bridge", ["n0", "n2", "n3", "n4"]),
    ],
)
def test_nemesis__a_partition_names_the_nodes_it_cuts_off(shape: str, named: list[str]) -> None:
    nemesis = Nemesis(cast(Cluster, _FakeCluster(size=5)))
    started = nemesis.start(Fault(kind="partition", shape=shape, nodes=(2, 4, 1, 0, 3)))
    assert started["nodes"] == named
    healed = nemesis.heal()
    assert healed is not None and healed["nodes"] == named


def test_nemesis__heal_all_leaves_every_node_running_and_true() -> None:
    fake = _FakeCluster()
    nemesis = Nemesis(cast(Cluster, fake))
    nemesis.start(Fault(kind="kill", nodes=(0,)))
    nemesis.start(Fault(kind="pause", nodes=(2,)))
    nemesis.start(Fault(kind="clock", nodes=(1,), offset_s=3.0, rate=0.5))
    healed = nemesis.heal_all()
    assert [event["fault"] for event in healed] == ["kill", "pause", "clock"]
    assert all(node.running and not node.paused for node in fake.nodes)
    assert set(fake.clocks.values()) == {(0.0, 1.0)}
    assert ("heal_network",) in fake.calls
