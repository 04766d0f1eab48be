"""Test-only fault modes: deliberate bugs that prove the chaos harness (jepsen-lite) catches bugs.

A harness that never fails proves nothing: it may be checking too little. Each fault here is one
well-known way a system like xr goes wrong, switched on in a real node so that a harness run can
show its checkers notice. None of them is ever on in production:

- They are enabled by one environment variable, `XR_TEST_FAULTS`, a comma-separated list of the
  names below, and only together with the marker `XR_TEST_RUN=1`, which test runs set. A node
  that finds `XR_TEST_FAULTS` without the marker, or a name it does not know, refuses to start.
- A node with faults logs a warning naming each one at start, and `/v1/cluster/status` lists them
  (`test_faults`), so a report shows what was broken on purpose.
- Code that misbehaves checks `faults.active(Fault.X)` at one place each; the variable is read once,
  at start (`Faults.from_environment`), and the result injected (`RaftStore(faults=...)`).

The faults, and where each acts:
- `stale-follower-reads`: a follower answers a default (linearizable) read from its local state,
  without a read barrier, and says it is not stale (`RaftStore.read`).
- `leader-local-reads`: a node that believes it leads answers default reads locally, without a
  barrier; a deposed leader cut off from the majority keeps believing it leads for
  `leader_fallback_timeout_s` and serves old data meanwhile (`RaftStore.read`).
- `ack-before-commit`: an API write is answered as soon as it is proposed, with the result of
  applying it to a copy of this replica's state, before the log commits it; a write the log later
  loses, or that a concurrent write supersedes, was reported done (`node.api.app.write`). The
  proposal leaves `ACK_BEFORE_COMMIT_DELAY_S` after the answer, as under a slow disk or network:
  on loopback a commit takes about a millisecond, too short a window for the harness to catch
  the bug reliably in a few seconds of load.
- `unfenced-locks`: a lock grant is answered with the token of the first grant of that lock this
  node served, so tokens stop increasing between holders, and `validate` accepts any token up to
  the current one (`node.api.locks`).
- `retries-without-dedup`: proposals lose their `(client_id, seq)`, so the state machine cannot
  recognise a retry and applies it again (`RaftStore.propose`).
- `local-clock-leases`: the lease clock follows the leader's wall clock without the bound on each
  step, so a leaderless gap, a paused leader or a new leader's clock running ahead expires
  sessions, locks and attempt leases early (`RaftStore.__init__`, through the limits).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import msgspec

from xrcore import Applied, Envelope, StateMachine
from xrcore.commands import Command
from xrcore.errors import XrError
from xrcore.limits import Limits

if TYPE_CHECKING:
    from raftstore.store import RaftStore

__all__ = [
    "FAULTS_VARIABLE",
    "NO_FAULTS",
    "TEST_RUN_VARIABLE",
    "Fault",
    "Faults",
    "FaultsRefused",
    "acknowledge_before_commit",
]

log = logging.getLogger(__name__)

FAULTS_VARIABLE = "XR_TEST_FAULTS"
TEST_RUN_VARIABLE = "XR_TEST_RUN"
# Under `local-clock-leases`, the step the lease clock may take in one entry: about three years,
# so in practice the lease clock moves exactly as the leader's wall clock does.
UNBOUNDED_LEASE_STEP_MS = 100_000_000_000
# `ack-before-commit`: how long after its answer the write is proposed.
ACK_BEFORE_COMMIT_DELAY_S = 0.02
# Lock names whose first token `unfenced-locks` remembers; beyond it grants keep their own token.
REMEMBERED_LOCKS_MAX = 100_000


class Fault(StrEnum):
    STALE_FOLLOWER_READS = "stale-follower-reads"
    LEADER_LOCAL_READS = "leader-local-reads"
    ACK_BEFORE_COMMIT = "ack-before-commit"
    UNFENCED_LOCKS = "unfenced-locks"
    RETRIES_WITHOUT_DEDUP = "retries-without-dedup"
    LOCAL_CLOCK_LEASES = "local-clock-leases"


class FaultsRefused(Exception):
    """Faults were asked for outside a test run, or by a name that does not exist."""


class Faults:
    """The faults active in this process, and the little state some of them keep."""

    def __init__(self, enabled: frozenset[Fault] = frozenset()) -> None:
        self.enabled = enabled
        # `unfenced-locks`: lock name -> the token of the first grant this node answered.
        self._first_tokens: dict[str, int] = {}
        # `ack-before-commit`: proposals still in flight after their answer was sent.
        self._unconfirmed: set[asyncio.Task[Any]] = set()

    @classmethod
    def of(cls, *faults: Fault | str) -> Faults:
        return cls(frozenset(Fault(fault) for fault in faults))

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> Faults:
        """The faults `XR_TEST_FAULTS` asks for. `FaultsRefused` if it is set outside a test run
        (`XR_TEST_RUN=1`) or names a fault that does not exist."""
        text = environ.get(FAULTS_VARIABLE, "").strip()
        if not text:
            return cls()
        if environ.get(TEST_RUN_VARIABLE) != "1":
            raise FaultsRefused(
                f"{FAULTS_VARIABLE}={text!r} breaks this node on purpose and is allowed only in a "
                f"test run ({TEST_RUN_VARIABLE}=1); unset {FAULTS_VARIABLE} to run normally"
            )
        names = [name.strip() for name in text.split(",") if name.strip()]
        known = {fault.value for fault in Fault}
        unknown = sorted(set(names) - known)
        if unknown:
            raise FaultsRefused(
                f"{FAULTS_VARIABLE} names unknown fault(s) {', '.join(unknown)}; "
                f"known: {', '.join(fault.value for fault in Fault)}"
            )
        return cls.of(*names)

    def active(self, fault: Fault) -> bool:
        return fault in self.enabled

    def names(self) -> list[str]:
        return sorted(fault.value for fault in self.enabled)

    def warn(self) -> None:
        """Says loudly, once per fault, that this node is broken on purpose."""
        for name in self.names():
            log.warning(
                "TEST FAULT ACTIVE: %s. This node is deliberately unsafe (%s); never run it "
                "outside a test",
                name,
                FAULTS_VARIABLE,
            )

    # What the faults change.

    def reads_locally(self, *, is_leader: bool) -> bool:
        """Whether a default read skips its barrier: `leader-local-reads` on a node that
        believes it leads, `stale-follower-reads` on any other."""
        fault = Fault.LEADER_LOCAL_READS if is_leader else Fault.STALE_FOLLOWER_READS
        return self.active(fault)

    def limits(self, limits: Limits) -> Limits:
        """The limits the state machine runs with: under `local-clock-leases` the lease clock
        takes any step the leader's wall clock takes."""
        if not self.active(Fault.LOCAL_CLOCK_LEASES):
            return limits
        return msgspec.structs.replace(limits, lease_step_max_ms=UNBOUNDED_LEASE_STEP_MS)

    def first_token(self, name: str, token: int) -> int:
        """`unfenced-locks`: the token this node answered for the first grant of lock `name`."""
        first = self._first_tokens.get(name)
        if first is not None:
            return first
        if len(self._first_tokens) < REMEMBERED_LOCKS_MAX:
            self._first_tokens[name] = token
        return token

    def keep_unconfirmed(self, task: asyncio.Task[Any]) -> None:
        self._unconfirmed.add(task)
        task.add_done_callback(self._unconfirmed.discard)


NO_FAULTS = Faults()


async def acknowledge_before_commit(
    store: RaftStore, command: Command, *, client_id: str | None, seq: int | None
) -> Applied:
    """`ack-before-commit`: proposes the command in the background and answers at once with what
    applying it to a copy of this replica's state gives. The log may lose the command (a deposed
    leader) or apply it to a different state (a concurrent write ahead of it); either way the
    caller was told it is done."""

    async def propose() -> None:
        await asyncio.sleep(ACK_BEFORE_COMMIT_DELAY_S)
        try:
            await store.propose(command, client_id=client_id, seq=seq)
        except XrError as error:
            log.info("a write already acknowledged (test fault) did not commit: %s", error)

    envelope = Envelope(command=command, now_ms=store._stamp_ms(), client_id=client_id, seq=seq)
    store.faults.keep_unconfirmed(asyncio.ensure_future(propose()))
    copy = StateMachine.restore(store.replica.read(lambda machine: machine.snapshot()))
    return copy.apply(envelope, copy.index + 1)
