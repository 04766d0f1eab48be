"""A deterministic in-process simulation of a raftstore cluster, and the checks that run over it.

N `Replica`s (real pysyncobj, real journal and snapshot files) run in one thread. Everything that
could make two runs differ is replaced or ordered by the simulator:
- Time. `simulated_pysyncobj` patches pysyncobj's module-level `monotonicTime` with the simulated
  clock, its `random` with a seeded `random.Random` (the election timeouts), and its `time` with an
  object that refuses to sleep. Each node's wall clock is the simulated time plus that node's
  skew; a proposal is stamped from it as `RaftStore` stamps (the leader moves replicated time,
  a follower stamps the time it has applied), or plainly with it (`stamping="wall"`).
- The network. `SimTransport` hands every message to a seeded in-memory `Network`, which delivers
  it after a simulated delay, in order per directed link, in the order of (delivery time, sender,
  receiver, sequence number on the link). A global sequence number would inherit the order in which
  pysyncobj iterates its set of peers, which depends on the process's hash seed; so each directed
  link also draws its delays from its own random stream.
- Ticks. The simulator calls `doTick(0)` on every live node at a fixed period (50 ms by default),
  and on a node at once when a message reaches it or a command is proposed on it (as pysyncobj's
  poller would wake it), always in node order. pysyncobj's poller and wake-up pipe are replaced
  by a do-nothing poller, so no file descriptor is opened besides the journal and snapshot files.

Faults: cut links (`partition`, `isolate`, `cut`), `heal`, extra `delay`, `pause` (the node stops
ticking; messages to it queue), `crash` (the node is destroyed; messages in flight to and from it
are lost) and `restart` (a new Replica on the same files), `snapshot` (forced log compaction) and
`skew` of a node's wall clock. A cut link behaves like a broken TCP connection: messages in flight
on it are lost and both ends are told the peer disconnected; when the link heals both ends are
told it connected again.

While it runs, the simulator checks what must hold at every moment and records a violation (with
the seed and the command that replays the run) instead of letting a run go on silently:
- Election safety: at most one leader per term.
- State machine safety: every node's state at an equal xrcore index hashes the same, and each
  node's replicated time and lease clock never go back (nor step by more than the bound).
- Leases: a session or attempt is expired only after a full TTL on the lease clock since its last
  renewal, and never before a TTL of simulated wall time has passed since that renewal was stamped
  (less the largest clock skew in play), so a holder that renews within its TTL is never expired.
`check_invariants` adds what is checked between steps: every acknowledged write is present in the
committed state of every node that has applied it (its result in the exactly-once table; a KV put
in the watch history) and locks, sessions and waiters agree with one another on every node.

The simulator proposes exactly one command per log entry (or none, for a read barrier), so the
state after an entry is the state after that command; the lease checks rely on it.
"""

from __future__ import annotations

import contextlib
import hashlib
import heapq
import importlib
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pysyncobj import FAIL_REASON
from pysyncobj.node import TCPNode
from pysyncobj.transport import Transport

from raftstore.config import RaftConfig
from raftstore.replica import Replica, encode_group
from xrcore import Applied, Envelope, StateMachine, encode
from xrcore.commands import Command, KvPut, Tick
from xrcore.limits import DEFAULT_LIMITS, Limits

__all__ = [
    "InvariantViolation",
    "Network",
    "NodeClock",
    "Proposal",
    "SimCluster",
    "SimTransport",
    "replay_command",
    "simulated_pysyncobj",
]

# pysyncobj sees this monotonic time when a simulation starts; real clocks do not start at zero.
MONOTONIC_START_S = 1_000.0
WALL_START_MS = 1_700_000_000_000
# Named limits on the simulator's own loops, so a livelock fails loudly instead of hanging.
SETTLE_ROUNDS_MAX = 10_000
DELIVERIES_PER_INSTANT_MAX = 1_000_000
# The leader's lease tick is abandoned (and another proposed) after this many intervals,
# as `RaftStore._lease_ticks` gives each tick a deadline of four intervals.
LEASE_TICK_DEADLINE_INTERVALS = 4


class InvariantViolation(AssertionError):
    """A property the cluster must keep was broken; the message says how to replay the run."""


def replay_command(seed: int, test: str) -> str:
    """The shell command that reruns one seed of a seeded simulation test."""
    return f"XR_SIM_SEED={seed} .venv/bin/pytest {test} -q"


# pysyncobj patched onto simulated time.


class _NullPoller:
    """Stands in for pysyncobj's poller: the simulator delivers messages itself."""

    def subscribe(self, descriptor: Any, callback: Any, event_mask: int) -> None:
        raise AssertionError("a simulated node has no file descriptors to poll")

    def unsubscribe(self, descriptor: Any) -> None:
        return None

    def poll(self, timeout: float) -> None:
        return None


class _NoSleep:
    """Stands in for the `time` module inside pysyncobj, which uses it only to sleep: a simulated
    node must never sleep (it would stop every node, and real time means nothing here)."""

    def sleep(self, seconds: float) -> None:
        raise AssertionError(f"pysyncobj tried to sleep {seconds} s inside a simulation")


_PATCHED_NAMES = ("monotonicTime", "random", "time", "PIPE_NOTIFIER_ENABLED", "createPoller")
_patch_active = False


@contextlib.contextmanager
def simulated_pysyncobj(
    monotonic: Callable[[], float], randomness: random.Random
) -> Iterator[None]:
    """Runs pysyncobj on a simulated clock and a seeded random source, restoring both after.

    The patch is process-wide (pysyncobj reads module globals), so only one simulation may run at
    a time. The wake-up pipe is turned off and the poller replaced: the simulator decides when each
    node ticks, so nothing has to wake it."""
    global _patch_active
    if _patch_active:
        raise RuntimeError("another simulation is running: close it first (one at a time)")
    module = importlib.import_module("pysyncobj.syncobj")
    saved = {name: getattr(module, name) for name in _PATCHED_NAMES}
    module.monotonicTime = monotonic  # type: ignore[attr-defined]
    module.random = randomness  # type: ignore[attr-defined]
    module.time = _NoSleep()  # type: ignore[attr-defined]
    module.PIPE_NOTIFIER_ENABLED = False  # type: ignore[attr-defined]
    module.createPoller = lambda poller_type: _NullPoller()  # type: ignore[attr-defined]
    _patch_active = True
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(module, name, value)
        _patch_active = False


# Clocks.


class _SimTime:
    """The one simulated time of a cluster, in seconds since the simulation started."""

    def __init__(self) -> None:
        self.elapsed_s = 0.0

    def monotonic(self) -> float:
        return MONOTONIC_START_S + self.elapsed_s


class NodeClock:
    """One node's view of simulated time (a `raftstore.clock.Clock`): the shared time, and a wall
    clock shifted by the node's own skew."""

    def __init__(self, time: _SimTime) -> None:
        self._time = time
        self.skew_ms = 0

    def now_ms(self) -> int:
        return WALL_START_MS + round(self._time.elapsed_s * 1000) + self.skew_ms

    def monotonic_s(self) -> float:
        return self._time.elapsed_s


# The network.


@dataclass(frozen=True, slots=True)
class _Envelope:
    """A message on its way; its epoch is the link's when it was sent."""

    source: str
    target: str
    epoch: int
    message: Any


_QueueItem = tuple[float, int, int, int, _Envelope]


def _pair(a: str, b: str) -> tuple[str, str]:
    return (a, b) if a < b else (b, a)


class SimTransport(Transport):
    """pysyncobj's side of the simulated network for one node."""

    def __init__(self, network: Network, address: str) -> None:
        super().__init__(None, None, None)
        self.network = network
        self.address = address
        # The peers pysyncobj was told are connected, with the link epoch it was told about.
        self.connected: dict[str, int] = {}

    def send(self, node: Any, message: Any) -> bool:
        return self.network.send(self.address, str(node.id), message)

    def destroy(self) -> None:
        self.network.detach(self.address)


class Network:
    """A seeded in-memory network between named nodes.

    A link between two attached nodes is up unless it is cut. Every time a link goes down (a cut,
    or either end crashing) its epoch increases: messages sent in an earlier epoch are dropped on
    arrival, as the bytes in a broken TCP connection are. Each end learns of a link going down or
    up through pysyncobj's connected and disconnected callbacks; a paused node learns when it
    resumes."""

    def __init__(
        self,
        addresses: Sequence[str],
        *,
        seed: int,
        time: _SimTime,
        delay_min_s: float,
        delay_max_s: float,
        on_delivered: Callable[[str, str, Any], None],
    ) -> None:
        if not 0 <= delay_min_s <= delay_max_s:
            raise ValueError("network delays must satisfy 0 <= delay_min_s <= delay_max_s")
        self.addresses = list(addresses)
        self.rank = {address: position for position, address in enumerate(self.addresses)}
        self._time = time
        self.delay_min_s = delay_min_s
        self.delay_max_s = delay_max_s
        self._on_delivered = on_delivered
        self._nodes = {address: TCPNode(address) for address in self.addresses}
        self.endpoints: dict[str, SimTransport] = {}
        self.paused: set[str] = set()
        self.cut_pairs: set[tuple[str, str]] = set()
        self.epochs = {_pair(a, b): 0 for a in self.addresses for b in self.addresses if a < b}
        self.extra_delay_s: dict[tuple[str, str], float] = {}
        # Each directed link draws its delays from its own stream, so the order in which pysyncobj
        # sends to its peers (set iteration order) cannot change which delay a message gets.
        self._link_random = {
            (a, b): random.Random(f"{seed}/{a}/{b}")
            for a in self.addresses
            for b in self.addresses
            if a != b
        }
        self._link_sequence = dict.fromkeys(self._link_random, 0)
        self._link_last_s = dict.fromkeys(self._link_random, 0.0)
        self._queue: list[_QueueItem] = []
        self._held: dict[str, list[_QueueItem]] = {address: [] for address in self.addresses}
        self.sent = 0
        self.delivered = 0
        self.dropped = 0

    # Topology.

    def link_up(self, a: str, b: str) -> bool:
        return a in self.endpoints and b in self.endpoints and _pair(a, b) not in self.cut_pairs

    def attach(self, transport: SimTransport) -> None:
        assert transport.address not in self.endpoints, f"{transport.address} is attached twice"
        transport.connected.clear()
        self.endpoints[transport.address] = transport
        self.reconcile()

    def detach(self, address: str) -> None:
        if self.endpoints.pop(address, None) is None:
            return
        for other in self.addresses:
            if other != address:
                self.epochs[_pair(address, other)] += 1
        self._held[address].clear()
        self.reconcile()

    def cut(self, pairs: Sequence[tuple[str, str]], *, heal_others: bool = False) -> None:
        """Cuts these links; with `heal_others`, they become the only cut links."""
        wanted = {_pair(a, b) for a, b in pairs if a != b}
        if heal_others:
            self.cut_pairs &= wanted
        for pair in sorted(wanted - self.cut_pairs):
            self.cut_pairs.add(pair)
            self.epochs[pair] += 1
        self.reconcile()

    def heal(self, pairs: Sequence[tuple[str, str]] | None = None) -> None:
        if pairs is None:
            self.cut_pairs.clear()
        else:
            for a, b in pairs:
                self.cut_pairs.discard(_pair(a, b))
        self.reconcile()

    def pause(self, address: str) -> None:
        self.paused.add(address)

    def resume(self, address: str) -> None:
        """Lets a paused node learn what happened to its links, then hands it what queued up."""
        self.paused.discard(address)
        self.reconcile()
        now_s = self._time.elapsed_s
        for _, source_rank, target_rank, sequence, envelope in self._held[address]:
            heapq.heappush(self._queue, (now_s, source_rank, target_rank, sequence, envelope))
        self._held[address].clear()

    def reconcile(self) -> None:
        """Tells every running node about links that went down or came up since it last heard."""
        for address in self.addresses:
            transport = self.endpoints.get(address)
            if transport is None or address in self.paused:
                continue
            for peer in self.addresses:
                if peer == address:
                    continue
                epoch = self.epochs[_pair(address, peer)]
                known = transport.connected.get(peer)
                up = self.link_up(address, peer)
                if known is not None and (not up or known != epoch):
                    del transport.connected[peer]
                    transport._onNodeDisconnected(self._nodes[peer])
                if up and peer not in transport.connected:
                    transport.connected[peer] = epoch
                    transport._onNodeConnected(self._nodes[peer])

    # Messages.

    def send(self, source: str, target: str, message: Any) -> bool:
        transport = self.endpoints.get(source)
        if transport is None or target not in transport.connected:
            return False
        epoch = self.epochs[_pair(source, target)]
        if transport.connected[target] != epoch or not self.link_up(source, target):
            return False
        link = (source, target)
        delay_s = self._link_random[link].uniform(self.delay_min_s, self.delay_max_s)
        delay_s += self.extra_delay_s.get(link, 0.0)
        # In order per link: a message never overtakes the one sent before it on the same link.
        deliver_s = max(self._time.elapsed_s + delay_s, self._link_last_s[link])
        self._link_last_s[link] = deliver_s
        self._link_sequence[link] += 1
        item = (
            deliver_s,
            self.rank[source],
            self.rank[target],
            self._link_sequence[link],
            _Envelope(source, target, epoch, message),
        )
        heapq.heappush(self._queue, item)
        self.sent += 1
        return True

    def next_delivery_s(self) -> float | None:
        return self._queue[0][0] if self._queue else None

    def deliver_due(self) -> None:
        """Delivers, in order, every message due by now. Messages to a paused node wait for it."""
        now_s = self._time.elapsed_s
        queue = self._queue
        deliveries = 0
        while queue and queue[0][0] <= now_s:
            item = heapq.heappop(queue)
            envelope = item[4]
            source, target = envelope.source, envelope.target
            transport = self.endpoints.get(target)
            if transport is None or envelope.epoch != self.epochs[_pair(source, target)]:
                self.dropped += 1
                continue
            if target in self.paused:
                self._held[target].append(item)
                continue
            if transport.connected.get(source) != envelope.epoch:
                self.dropped += 1
                continue
            deliveries += 1
            if deliveries > DELIVERIES_PER_INSTANT_MAX:
                raise RuntimeError(
                    f"more than {DELIVERIES_PER_INSTANT_MAX} messages at one instant"
                )
            self.delivered += 1
            transport._onMessageReceived(self._nodes[source], envelope.message)
            self._on_delivered(source, target, envelope.message)


# Proposals.

ProposalStatus = Literal["pending", "ok", "failed", "lost"]


@dataclass(eq=False)
class Proposal:
    """One command (or a read barrier, with no command) proposed on one node, and its outcome.

    `failed` carries pysyncobj's reason; LEADER_CHANGED, DISCARDED and UNKNOWN_OUTCOME are
    indefinite (the command may have been applied). `lost` means the node crashed, or was down,
    before it answered: also indefinite."""

    node: int
    command: Command | None
    client_id: str | None
    seq: int | None
    proposed_s: float
    stamp_ms: int
    status: ProposalStatus = "pending"
    reason: int | None = None
    results: list[Applied] = field(default_factory=list)
    completed_s: float | None = None

    @property
    def applied(self) -> Applied | None:
        """What applying the command did, once it succeeded (None for a barrier)."""
        return self.results[0] if self.status == "ok" and self.results else None

    @property
    def done(self) -> bool:
        return self.status != "pending"

    @property
    def definitely_not_applied(self) -> bool:
        indefinite = (
            FAIL_REASON.LEADER_CHANGED,
            FAIL_REASON.DISCARDED,
            FAIL_REASON.UNKNOWN_OUTCOME,
        )
        return self.status == "failed" and self.reason not in indefinite


# Nodes.

NodeState = Literal["up", "paused", "crashed"]


class SimNode:
    """One member: its files, its clock, and its current incarnation (Replica), if running."""

    def __init__(self, index: int, address: str, config: RaftConfig, clock: NodeClock) -> None:
        self.index = index
        self.address = address
        self.config = config
        self.clock = clock
        self.replica: Replica | None = None
        self.transport: SimTransport | None = None
        self.state: NodeState = "crashed"
        self.incarnation = 0
        self.pending: list[Proposal] = []
        self.lease_next_s = 0.0
        self.lease_tick: Proposal | None = None
        # The last (xrcore index, now_ms, lease clock) this incarnation applied.
        self.last_applied: tuple[int, int, int] | None = None
        # Where this incarnation's stamps continue from as leader: (now_ms, monotonic s, term).
        self.time_base: tuple[int, float, int] | None = None

    def stamp_ms(self) -> int:
        """The time this node stamps on a proposal, by `RaftStore._stamp_ms`'s rule: a follower
        stamps the replicated time it has applied (so its clock moves nothing); the leader stamps
        its wall clock, but never less than the replicated time it found on taking office plus
        the time elapsed since on its monotonic clock."""
        replica = self.replica
        assert replica is not None
        replicated_ms = replica.machine.now_ms
        if not replica._isLeader():
            return replicated_ms
        term = replica.raftCurrentTerm
        monotonic_s = self.clock.monotonic_s()
        if self.time_base is None or self.time_base[2] != term:
            self.time_base = (replicated_ms, monotonic_s, term)
        base_ms, base_s, _ = self.time_base
        return max(self.clock.now_ms(), base_ms + int((monotonic_s - base_s) * 1000))

    @property
    def running(self) -> bool:
        return self.state == "up"

    def machine(self) -> StateMachine | None:
        return None if self.replica is None else self.replica.machine


# The checks that run while the simulation runs.


@dataclass
class _Renewal:
    """A lease's last renewal: the lease clock and replicated time of the entry that made it."""

    lease_ms: int
    now_ms: int
    ttl_ms: int


class _Checker:
    """Records what every node applies and elects, and the violations of safety properties."""

    def __init__(self, cluster: SimCluster) -> None:
        self.cluster = cluster
        self.leaders_by_term: dict[int, str] = {}
        self.state_hashes: dict[int, tuple[bytes, str]] = {}
        self.first_applied_s: dict[int, float] = {}
        self.session_renewals: dict[str, _Renewal] = {}
        self.attempt_renewals: dict[int, _Renewal] = {}
        self.expiries = 0
        self.violations: list[str] = []

    def violation(self, text: str) -> None:
        self.violations.append(f"t={self.cluster.now_s:.3f}s: {text}")

    def observe_leader(self, node: SimNode) -> None:
        replica = node.replica
        if replica is None or not replica._isLeader():
            return
        term = replica.raftCurrentTerm
        leader = self.leaders_by_term.setdefault(term, node.address)
        if leader != node.address:
            self.violation(f"two leaders in term {term}: {leader} and {node.address}")

    def on_applied(self, node: SimNode, results: list[Applied]) -> None:
        machine = node.machine()
        assert machine is not None
        index = machine.index
        limits = machine.limits
        self._check_time(node, machine, limits)
        digest = hashlib.sha256(machine.snapshot()).digest()
        self.cluster.trace(f"apply {node.address} {index} {digest.hex()[:16]}")
        recorded = self.state_hashes.get(index)
        if recorded is None:
            self.state_hashes[index] = (digest, node.address)
            self.first_applied_s[index] = self.cluster.now_s
            self._check_leases(machine, results)
        elif recorded[0] != digest:
            self.violation(
                f"{node.address} and {recorded[1]} hold different states at xrcore index {index}"
            )

    def _check_time(self, node: SimNode, machine: StateMachine, limits: Limits) -> None:
        current = (machine.index, machine.now_ms, machine.lease_clock_ms)
        previous = node.last_applied
        node.last_applied = current
        if previous is None:
            return
        index, now_ms, lease_ms = previous
        if current[0] < index or current[1] < now_ms or current[2] < lease_ms:
            self.violation(f"{node.address} went back from {previous} to {current}")
        step_ms = current[2] - lease_ms
        if step_ms > limits.lease_step_max_ms * max(1, current[0] - index):
            self.violation(
                f"{node.address}'s lease clock stepped {step_ms} ms over entries {index}..."
                f"{current[0]}, more than {limits.lease_step_max_ms} ms per entry"
            )

    def _check_leases(self, machine: StateMachine, results: list[Applied]) -> None:
        """Runs once per xrcore index, on its first application anywhere."""
        wall_ms = WALL_START_MS + round(self.cluster.now_s * 1000)
        for applied in results:
            for effect in applied.effects:
                if effect.kind == "session.ended" and effect.reason == "expired":
                    renewal = self.session_renewals.get(effect.session_id)
                    self._check_expiry(f"session {effect.session_id}", renewal, machine, wall_ms)
                elif effect.kind == "attempt.ended" and effect.reason == "lease_expired":
                    renewal = self.attempt_renewals.get(effect.token)
                    self._check_expiry(f"attempt {effect.token}", renewal, machine, wall_ms)
        # Renewals: a lease's deadline is the lease clock of its last renewal plus its TTL.
        for session in machine.sessions.values():
            lease_ms = session.deadline_ms - session.ttl_ms
            known = self.session_renewals.get(session.session_id)
            if known is None or known.lease_ms != lease_ms:
                self.session_renewals[session.session_id] = _Renewal(
                    lease_ms, machine.now_ms, session.ttl_ms
                )
        for job in machine.jobs.values():
            for task in job.tasks:
                attempt = task.live_attempt()
                if attempt is None:
                    continue
                lease_ms = attempt.deadline_ms - attempt.lease_ttl_ms
                known = self.attempt_renewals.get(attempt.token)
                if known is None or known.lease_ms != lease_ms:
                    self.attempt_renewals[attempt.token] = _Renewal(
                        lease_ms, machine.now_ms, attempt.lease_ttl_ms
                    )

    def _check_expiry(
        self, what: str, renewal: _Renewal | None, machine: StateMachine, wall_ms: int
    ) -> None:
        self.expiries += 1
        if renewal is None:
            self.violation(f"{what} expired at index {machine.index} but was never seen renewed")
            return
        lease_elapsed_ms = machine.lease_clock_ms - renewal.lease_ms
        if lease_elapsed_ms < renewal.ttl_ms:
            self.violation(
                f"{what} expired at index {machine.index} after {lease_elapsed_ms} ms of lease "
                f"clock since its last renewal, less than its TTL of {renewal.ttl_ms} ms"
            )
        # Its renewal was stamped no later than `renewal.now_ms`; every stamp is at most the
        # stamping node's skew ahead of true time. So a holder gets its full TTL of real time.
        wall_elapsed_ms = wall_ms + self.cluster.skew_max_ms - renewal.now_ms
        if wall_elapsed_ms < renewal.ttl_ms:
            self.violation(
                f"{what} expired at index {machine.index} only {wall_elapsed_ms} ms of simulated "
                f"time (allowing {self.cluster.skew_max_ms} ms of skew) after its renewal was "
                f"stamped, less than its TTL of {renewal.ttl_ms} ms"
            )


# The cluster.


class SimCluster:
    """N replicas in one process on a simulated network and clock. Use it as a context manager,
    or call `close`: it patches pysyncobj process-wide while it exists."""

    def __init__(
        self,
        node_count: int,
        *,
        seed: int,
        data_dir: Path,
        limits: Limits = DEFAULT_LIMITS,
        tick_interval_s: float = 0.05,
        delay_min_s: float = 0.002,
        delay_max_s: float = 0.02,
        lease_tick_interval_s: float = 0.25,
        lease_ticks: bool = True,
        stamping: Literal["store", "wall"] = "store",
        raft_options: Mapping[str, Any] | None = None,
        replay: str | None = None,
    ) -> None:
        if not 1 <= node_count <= 9:
            raise ValueError(f"node_count must be between 1 and 9, got {node_count}")
        if tick_interval_s <= 0:
            raise ValueError("tick_interval_s must be positive")
        self.seed = seed
        self.replay = replay
        self.limits = limits
        self.tick_interval_s = tick_interval_s
        self.lease_tick_interval_s = lease_tick_interval_s
        self.lease_ticks = lease_ticks
        # "store": proposals are stamped as `RaftStore` stamps them; "wall": with the proposing
        # node's wall clock, as a naive proposer would.
        self.stamping = stamping
        self.skew_max_ms = 0
        self._time = _SimTime()
        self._ticks_done = 0
        self.ticks = 0
        self.lease_ticks_proposed = 0
        self._dirty: set[int] = set()
        self._trace = hashlib.sha256()
        self.proposals: list[Proposal] = []
        self.acknowledged: list[Proposal] = []
        self.checker = _Checker(self)
        self._exit = contextlib.ExitStack()
        self._exit.enter_context(
            simulated_pysyncobj(self._time.monotonic, random.Random(f"{seed}/pysyncobj"))
        )
        addresses = [f"127.0.0.1:{9001 + position}" for position in range(node_count)]
        self._by_address = {address: position for position, address in enumerate(addresses)}
        self.network = Network(
            addresses,
            seed=seed,
            time=self._time,
            delay_min_s=delay_min_s,
            delay_max_s=delay_max_s,
            on_delivered=self._on_delivered,
        )
        self.nodes: list[SimNode] = []
        try:
            for position, address in enumerate(addresses):
                config = RaftConfig(
                    self_address=address,
                    peers=tuple(other for other in addresses if other != address),
                    data_dir=data_dir / f"n{position}",
                    **dict(raft_options or {}),
                )
                self.nodes.append(SimNode(position, address, config, NodeClock(self._time)))
            for node in self.nodes:
                self._start(node)
        except BaseException:
            self.close()
            raise

    # Life cycle.

    def __enter__(self) -> SimCluster:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Destroys every replica (closing its files) and restores pysyncobj."""
        try:
            for node in self.nodes:
                if node.replica is not None:
                    node.replica.destroy()
                    node.replica = None
        finally:
            self._exit.close()

    def _start(self, node: SimNode) -> None:
        transport = SimTransport(self.network, node.address)
        node.incarnation += 1
        node.last_applied = None
        node.replica = Replica(
            node.config,
            limits=self.limits,
            transport=transport,
            on_applied=lambda results: self.checker.on_applied(node, results),
        )
        node.transport = transport
        node.state = "up"
        node.lease_next_s = self.now_s
        node.lease_tick = None
        node.time_base = None
        self.network.attach(transport)
        self._dirty.add(node.index)

    # Time.

    @property
    def now_s(self) -> float:
        """Simulated seconds since the cluster started."""
        return self._time.elapsed_s

    def run_for(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("simulated time only moves forward")
        self.run_until_time(self.now_s + seconds)

    def step(self, seconds: float) -> None:
        """The same as `run_for`: one step of simulated time."""
        self.run_for(seconds)

    def run_until_time(self, end_s: float) -> None:
        """Advances simulated time to `end_s`, delivering messages and ticking nodes on the way."""
        self._settle()
        while True:
            next_tick_s = (self._ticks_done + 1) * self.tick_interval_s
            next_s = next_tick_s
            delivery_s = self.network.next_delivery_s()
            if delivery_s is not None and delivery_s < next_s:
                next_s = delivery_s
            if next_s > end_s:
                break
            self._time.elapsed_s = next_s
            if next_s >= next_tick_s:
                self._ticks_done += 1
                self._dirty.update(node.index for node in self.nodes if node.running)
            self._settle()
        self._time.elapsed_s = max(self._time.elapsed_s, end_s)
        self._settle()

    def run_until(self, condition: Callable[[], bool], *, timeout_s: float) -> bool:
        """Runs until `condition()` holds (checked every tick period); False at the timeout."""
        deadline_s = self.now_s + timeout_s
        while not condition():
            if self.now_s >= deadline_s:
                return False
            self.run_until_time(min(deadline_s, self.now_s + self.tick_interval_s))
        return True

    def _settle(self) -> None:
        """At the current instant: delivers what is due and ticks every node that has work,
        in node order, until nothing is left to do."""
        for _ in range(SETTLE_ROUNDS_MAX):
            self.network.deliver_due()
            self._raise_violations()
            if not self._dirty:
                return
            dirty, self._dirty = self._dirty, set()
            for node in self.nodes:
                if node.index in dirty and node.running:
                    self._tick(node)
            self._raise_violations()
        raise RuntimeError(f"no quiet moment after {SETTLE_ROUNDS_MAX} rounds at one instant")

    def _tick(self, node: SimNode) -> None:
        replica = node.replica
        assert replica is not None
        replica.doTick(0.0)
        self.ticks += 1
        self.checker.observe_leader(node)
        if self.lease_ticks:
            self._maybe_lease_tick(node, replica)

    def _maybe_lease_tick(self, node: SimNode, replica: Replica) -> None:
        """The leader's lease tick, as `RaftStore._lease_ticks` proposes it."""
        now_s = self.now_s
        if now_s < node.lease_next_s or not replica._isLeader() or not replica.hasQuorum:
            return
        in_flight = node.lease_tick
        deadline_s = self.lease_tick_interval_s * LEASE_TICK_DEADLINE_INTERVALS
        if (
            in_flight is not None
            and not in_flight.done
            and now_s - in_flight.proposed_s < deadline_s
        ):
            return
        node.lease_next_s = now_s + self.lease_tick_interval_s
        node.lease_tick = self._propose(node, Tick(), None, None, record=False)
        self.lease_ticks_proposed += 1

    def _on_delivered(self, source: str, target: str, message: Any) -> None:
        kind = message.get("type") if isinstance(message, dict) else type(message).__name__
        self.trace(f"deliver {source} {target} {kind}")
        node = self.nodes[self._by_address[target]]
        self._dirty.add(node.index)
        self.checker.observe_leader(node)

    def _raise_violations(self) -> None:
        if self.checker.violations:
            raise InvariantViolation(self._describe("\n".join(self.checker.violations)))

    def _describe(self, text: str) -> str:
        lines = [f"simulation seed {self.seed} broke an invariant:", text]
        if self.replay is not None:
            lines.append(f"replay with: {self.replay}")
        return "\n".join(lines)

    def trace(self, text: str) -> None:
        """Adds an event to the run's digest: two runs are the same run if their digests are."""
        self._trace.update(f"{self.now_s:.6f} {text}\n".encode())

    def trace_digest(self) -> str:
        return self._trace.hexdigest()

    # Proposals.

    def propose(
        self,
        node: int,
        command: Command,
        *,
        client_id: str | None = None,
        seq: int | None = None,
    ) -> Proposal:
        """Proposes one command on one node, stamped as the cluster's `stamping` says."""
        return self._propose(self.nodes[node], command, client_id, seq, record=True)

    def barrier(self, node: int) -> Proposal:
        """Proposes an empty group: it succeeds only once committed through the log (a read
        barrier, as `RaftStore.read` uses)."""
        return self._propose(self.nodes[node], None, None, None, record=True)

    def _propose(
        self,
        node: SimNode,
        command: Command | None,
        client_id: str | None,
        seq: int | None,
        *,
        record: bool,
    ) -> Proposal:
        wall = node.replica is None or self.stamping == "wall"
        stamp_ms = node.clock.now_ms() if wall else node.stamp_ms()
        proposal = Proposal(
            node=node.index,
            command=command,
            client_id=client_id,
            seq=seq,
            proposed_s=self.now_s,
            stamp_ms=stamp_ms,
        )
        if record:
            self.proposals.append(proposal)
        replica = node.replica
        if replica is None:
            proposal.status = "lost"
            proposal.completed_s = self.now_s
            return proposal
        entries = []
        if command is not None:
            envelope = Envelope(command=command, now_ms=stamp_ms, client_id=client_id, seq=seq)
            entries.append(encode(envelope))
        node.pending.append(proposal)
        incarnation = node.incarnation

        def on_done(results: Any, reason: int) -> None:
            if node.incarnation != incarnation or proposal.done:
                return
            node.pending.remove(proposal)
            proposal.completed_s = self.now_s
            proposal.reason = reason
            if reason == FAIL_REASON.SUCCESS and not isinstance(results, list):
                # Another entry at its index and term: only a stranger posing as a leader puts
                # one there (tests/sim/test_stranger.py). Its outcome is unknown.
                proposal.status = "failed"
            elif reason == FAIL_REASON.SUCCESS:
                proposal.status = "ok"
                proposal.results = list(results)
                if record and proposal.client_id is not None and proposal.results:
                    self.acknowledged.append(proposal)
            else:
                proposal.status = "failed"

        replica.propose_group(encode_group(entries), on_done)
        self._dirty.add(node.index)
        return proposal

    def run_until_done(self, proposal: Proposal, *, timeout_s: float) -> bool:
        return self.run_until(lambda: proposal.done, timeout_s=timeout_s)

    def commit(
        self,
        command: Command,
        *,
        client_id: str,
        seq: int,
        timeout_s: float = 10.0,
        attempt_timeout_s: float = 2.0,
    ) -> Proposal | None:
        """Proposes as a client that retries with the same (client_id, seq) does: on the leader
        if one is known, else on each running node in turn, again after every failure or attempt
        timeout. Returns the attempt that succeeded, or None at the timeout."""
        deadline_s = self.now_s + timeout_s
        attempt = 0
        while self.now_s < deadline_s:
            running = self.running()
            if not running:
                self.run_for(min(self.tick_interval_s, deadline_s - self.now_s))
                continue
            leader = self.leader()
            target = running[attempt % len(running)] if leader is None else leader
            attempt += 1
            proposal = self.propose(target, command, client_id=client_id, seq=seq)
            started_s = self.now_s
            self.run_until_done(proposal, timeout_s=min(attempt_timeout_s, deadline_s - started_s))
            if proposal.status == "ok":
                return proposal
            if self.now_s == started_s:
                # It failed at once (no leader known there): let time pass before the next try.
                self.run_for(min(self.tick_interval_s, deadline_s - self.now_s))
        return None

    # Observations.

    def leader(self) -> int | None:
        """The running node that leads in the highest term, if any."""
        best: tuple[int, int] | None = None
        for node in self.nodes:
            replica = node.replica
            if node.running and replica is not None and replica._isLeader():
                candidate = (replica.raftCurrentTerm, node.index)
                if best is None or candidate > best:
                    best = candidate
        return None if best is None else best[1]

    def wall_ms(self, node: int) -> int:
        return self.nodes[node].clock.now_ms()

    def running(self) -> list[int]:
        return [node.index for node in self.nodes if node.running]

    def machine(self, node: int) -> StateMachine | None:
        return self.nodes[node].machine()

    def addresses(self, nodes: Sequence[int]) -> list[str]:
        return [self.nodes[node].address for node in nodes]

    # Faults.

    def partition(self, *groups: Sequence[int]) -> None:
        """Makes the network exactly these groups: every link between different groups is cut,
        every link inside a group works; a node in no group is cut from all."""
        group_of = {node: number for number, group in enumerate(groups) for node in group}

        def side(node: SimNode) -> int:
            # A node in no group is alone: its own side, numbered apart from every group.
            return group_of.get(node.index, -1 - node.index)

        pairs = [
            (a.address, b.address)
            for a in self.nodes
            for b in self.nodes
            if a.index < b.index and side(a) != side(b)
        ]
        self.network.cut(pairs, heal_others=True)
        self.trace(f"partition {groups}")

    def ring(self, order: Sequence[int]) -> None:
        """Makes the network a ring: each node reaches only its two neighbours in `order`."""
        count = len(order)
        neighbours = {
            _pair(self.nodes[order[i]].address, self.nodes[order[(i + 1) % count]].address)
            for i in range(count)
        }
        pairs = [
            (a.address, b.address)
            for a in self.nodes
            for b in self.nodes
            if a.index < b.index and _pair(a.address, b.address) not in neighbours
        ]
        self.network.cut(pairs, heal_others=True)
        self.trace(f"ring {list(order)}")

    def isolate(self, node: int) -> None:
        self.partition([other.index for other in self.nodes if other.index != node], [node])

    def cut(self, a: int, b: int) -> None:
        self.network.cut([(self.nodes[a].address, self.nodes[b].address)])
        self.trace(f"cut {a} {b}")

    def heal(self) -> None:
        """Brings every link up and removes every extra delay."""
        self.network.heal()
        self.network.extra_delay_s.clear()
        self.trace("heal")

    def delay(self, source: int, target: int, extra_s: float) -> None:
        """Adds `extra_s` to every message from `source` to `target` (0 removes it)."""
        link = (self.nodes[source].address, self.nodes[target].address)
        self.network.extra_delay_s[link] = extra_s

    def pause(self, node: int) -> None:
        """Stops a node as a long garbage collection or SIGSTOP would: it keeps its connections,
        ticks no more, and messages to it queue until it resumes."""
        target = self.nodes[node]
        if target.state == "up":
            target.state = "paused"
            self.network.pause(target.address)
            self.trace(f"pause {node}")

    def resume(self, node: int) -> None:
        target = self.nodes[node]
        if target.state == "paused":
            target.state = "up"
            self.network.resume(target.address)
            self._dirty.add(node)
            self.trace(f"resume {node}")

    def crash(self, node: int) -> None:
        """Kills a node as kill -9 would: what pysyncobj wrote to its files stays (it never
        fsyncs, so this is the page cache surviving a process crash), everything else is lost."""
        target = self.nodes[node]
        if target.replica is None:
            return
        # A crashed node is not paused any more; what queued for it is lost with its links.
        self.network.paused.discard(target.address)
        target.replica.destroy()
        target.replica = None
        target.transport = None
        target.state = "crashed"
        for proposal in target.pending:
            proposal.status = "lost"
            proposal.completed_s = self.now_s
        target.pending.clear()
        self.trace(f"crash {node}")

    def restart(self, node: int) -> None:
        """Starts a crashed node again from its journal and snapshot files."""
        target = self.nodes[node]
        if target.state == "crashed":
            self._start(target)
            self.trace(f"restart {node}")

    def snapshot(self, node: int) -> None:
        """Forces log compaction: the node writes a snapshot on its next tick."""
        replica = self.nodes[node].replica
        if replica is not None:
            replica.forceLogCompaction()
            self._dirty.add(node)

    def skew(self, node: int, skew_ms: int) -> None:
        """Shifts a node's wall clock (what it stamps on commands) by `skew_ms`."""
        self.nodes[node].clock.skew_ms = skew_ms
        self.skew_max_ms = max(self.skew_max_ms, skew_ms)

    def heal_all(self) -> None:
        """Heals the network, resumes paused nodes, restarts crashed ones and clears skews."""
        self.heal()
        for node in self.nodes:
            self.resume(node.index)
            self.restart(node.index)
            node.clock.skew_ms = 0

    # Checks between steps.

    def check_invariants(self) -> None:
        """Checks acknowledged writes and lock tables on every node; raises on a violation."""
        self._raise_violations()
        problems: list[str] = []
        for node in self.nodes:
            machine = node.machine()
            if machine is None:
                continue
            problems += _acknowledged_writes_missing(node.address, machine, self.acknowledged)
            problems += _lock_table_problems(node.address, machine)
        if problems:
            raise InvariantViolation(self._describe("\n".join(problems)))

    def check_converged(self) -> None:
        """Checks that every node is running and holds the same state at the same index."""
        self.check_invariants()
        states = {}
        for node in self.nodes:
            machine = node.machine()
            if machine is None or not node.running:
                raise InvariantViolation(self._describe(f"{node.address} is not running"))
            states[node.address] = (machine.index, hashlib.sha256(machine.snapshot()).hexdigest())
        if len(set(states.values())) != 1:
            raise InvariantViolation(self._describe(f"nodes did not converge: {states}"))

    def converged(self) -> bool:
        """True when every node runs and has applied the same xrcore index and raft entries."""
        if any(not node.running or node.replica is None for node in self.nodes):
            return False
        replicas = [node.replica for node in self.nodes if node.replica is not None]
        applied = {replica.raftLastApplied for replica in replicas}
        commits = {replica.raftCommitIndex for replica in replicas}
        return len(applied) == 1 and applied == commits

    def stats(self) -> dict[str, float]:
        return {
            "simulated_s": self.now_s,
            "ticks": self.ticks,
            "messages_sent": self.network.sent,
            "messages_delivered": self.network.delivered,
            "messages_dropped": self.network.dropped,
            "lease_ticks_proposed": self.lease_ticks_proposed,
            "expiries_checked": self.checker.expiries,
        }


def _acknowledged_writes_missing(
    address: str, machine: StateMachine, acknowledged: list[Proposal]
) -> list[str]:
    """Every acknowledged write this node has applied must be in its committed state: its result
    in the exactly-once table (unless the table legitimately dropped it as too old), and a KV
    put's event in the watch history."""
    problems: list[str] = []
    history = machine.history
    oldest_revision = history[0].revision if history else machine.revision + 1
    for proposal in acknowledged:
        applied = proposal.applied
        assert applied is not None and proposal.client_id is not None and proposal.seq is not None
        if applied.index > machine.index:
            continue
        record = machine.clients.get(proposal.client_id)
        stored = None if record is None else record.results.get(proposal.seq)
        if stored is None:
            kept = 0 if record is None else len(record.results)
            evicted = (
                record is not None
                and kept >= machine.limits.results_per_client_max
                and proposal.seq < min(record.results)
            )
            if not evicted:
                problems.append(
                    f"{address} at index {machine.index} lost acknowledged write "
                    f"{proposal.client_id}/{proposal.seq} applied at index {applied.index}"
                )
        elif stored != applied.result:
            problems.append(
                f"{address} holds {stored} for {proposal.client_id}/{proposal.seq}, "
                f"but {applied.result} was acknowledged"
            )
        value = applied.result.value
        command = proposal.command
        if value is None or not isinstance(command, KvPut):
            continue
        revision = value["revision"]
        if revision < oldest_revision or revision > machine.revision:
            continue
        event = history[revision - oldest_revision]
        expected = ("put", command.key, command.value)
        if (event.kind, event.key, event.value) != expected or event.revision != revision:
            problems.append(
                f"{address} has {event} at revision {revision}, where the acknowledged put "
                f"{proposal.client_id}/{proposal.seq} wrote {expected}"
            )
    return problems


def _lock_table_problems(address: str, machine: StateMachine) -> list[str]:
    """Each lock has one live holder and live, distinct waiters, and every session's list of
    locks says exactly which it holds or awaits."""
    problems: list[str] = []
    sessions = machine.sessions
    for name, lock in machine.locks.items():
        if lock.holder not in sessions:
            problems.append(f"{address}: lock {name} is held by ended session {lock.holder}")
        if lock.holder in lock.waiters or len(set(lock.waiters)) != len(lock.waiters):
            problems.append(f"{address}: lock {name} has holder {lock.holder} in {lock.waiters}")
        if not 0 < lock.token <= machine.fencing_token:
            problems.append(
                f"{address}: lock {name} has token {lock.token}, but the last token issued is "
                f"{machine.fencing_token}"
            )
        for session_id in [lock.holder, *lock.waiters]:
            session = sessions.get(session_id)
            if session is not None and name not in session.locks:
                problems.append(f"{address}: session {session_id} forgot lock {name}")
    for session in sessions.values():
        for name in session.locks:
            listed = machine.locks.get(name)
            holds = listed is not None and listed.holder == session.session_id
            awaits = listed is not None and session.session_id in listed.waiters
            if not holds and not awaits:
                problems.append(f"{address}: session {session.session_id} lists lock {name}")
    return problems
