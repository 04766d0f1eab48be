"""Fenced locks: workers take xr locks, present the fencing token to a protected resource while
they believe they hold the lock, and release it.

Each acquire grants a fresh session (`LOCK_TTL_S`, not kept alive: a holder delayed by a fault
loses its lock when the session expires, which is what fencing is for) and waits in the lock's
queue. The protected resource (`resource.FencedResource`, in the harness) accepts a token unless
it has accepted a higher one for the lock; `access` is `ok` when it accepts, `fail` when it
rejects the token as stale. The checkers verify that the resource is fenced (a token it accepts
is never older than one it accepted before, and no token is granted to two acquires) and that no
lease ended before its TTL.
"""

from __future__ import annotations

from dataclasses import dataclass

from xr_jepsen.checkers import CheckResult, LeaseChecker, LockChecker, compose
from xr_jepsen.history import Op
from xr_jepsen.workloads.base import Completion, Context, Planned, WorkerState, outcome_of
from xrcore.client import AsyncClient
from xrcore.errors import LockNotHeld, NotFound, XrError

__all__ = ["LOCK_TTL_S", "LockWorkload"]

PREFIX = "locks/"
# Long enough for a holder's few accesses, short enough that faults make sessions expire.
LOCK_TTL_S = 4.0
# How long an acquire waits in the lock's queue.
LOCK_WAIT_S = 2.0
ACCESSES_MAX = 3


@dataclass
class LockWorkload:
    name: str = "locks"
    workers: int = 5
    # The mean pause between one worker's operations.
    pause_s_mean: float = 0.05
    locks: int = 2

    def _lock(self, index: int) -> str:
        return f"{PREFIX}l{index}"

    def plan(self, state: WorkerState) -> Planned:
        held = state.seen.get("held")
        if held is None:
            return Planned(f="acquire", value={"lock": self._lock(state.rng.randrange(self.locks))})
        value = {"lock": held["lock"], "token": held["token"]}
        if held["accesses"] < ACCESSES_MAX and state.rng.random() < 0.75:
            return Planned(f="access", value=value, key=held["lock"])
        return Planned(f="release", value=value, key=held["lock"])

    async def invoke(
        self, client: AsyncClient, planned: Planned, state: WorkerState, context: Context
    ) -> Completion:
        if planned.f == "acquire":
            return await self._acquire(client, planned.value["lock"], state)
        held = state.seen["held"]
        if planned.f == "access":
            held["accesses"] += 1
            accepted = context.access(held["lock"], held["token"])
            if accepted:
                return Completion(type="ok", value=planned.value)
            return Completion(type="fail", value=planned.value, error="stale token rejected")
        state.seen.pop("held")
        try:
            await client.locks.release(held["lock"], held["session_id"])
        except LockNotHeld as error:
            return Completion(type="fail", value=planned.value, error=error.code)
        except XrError as error:
            return outcome_of(error)
        finally:
            await _end_session(client, held["session_id"])
        return Completion(type="ok", value=planned.value)

    async def _acquire(self, client: AsyncClient, lock: str, state: WorkerState) -> Completion:
        try:
            session = await client.sessions.grant(LOCK_TTL_S)
        except XrError as error:
            return outcome_of(error)
        try:
            result = await client.locks.acquire(lock, session.session_id, wait_s=LOCK_WAIT_S)
        except XrError as error:
            # Granted or not, ending the session gives the lock back; what happened in between
            # is unknown unless the error was definite.
            await _end_session(client, session.session_id)
            return outcome_of(error)
        if not result.granted or result.token is None:
            # Not granted: the session may still be queued. Only once it has ended is it
            # certain that it never holds the lock.
            if await _end_session(client, session.session_id):
                return Completion(type="fail", value={"lock": lock}, error="lock.not_granted")
            return Completion(type="info", value={"lock": lock}, error="not granted; not ended")
        state.seen["held"] = {
            "lock": lock,
            "token": result.token,
            "session_id": session.session_id,
            "accesses": 0,
        }
        return Completion(type="ok", value={"lock": lock, "token": result.token})

    def observe(self, planned: Planned, completion: Completion, state: WorkerState) -> None:
        # An acquire whose outcome is unknown leaves nothing held (its session was ended).
        if completion.type == "info":
            state.seen.pop("held", None)

    def final_plan(self, state: WorkerState, last: Completion | None) -> Planned | None:
        # Each lock once more: acquire it (again until granted), then release it; `counter`
        # counts the locks done.
        held = state.seen.get("held")
        if held is not None:
            state.counter += 1
            return Planned(
                f="release", value={"lock": held["lock"], "token": held["token"]}, key=held["lock"]
            )
        if state.counter >= self.locks:
            return None
        return Planned(f="acquire", value={"lock": self._lock(state.counter)})

    def check(self, ops: list[Op]) -> CheckResult:
        # Fencing (the resource never goes back to an older token) and leases (no holder loses
        # its lock before its session's TTL).
        checker = compose({"locks": LockChecker(), "leases": LeaseChecker(ttl_s=LOCK_TTL_S)})
        return checker.check(ops)


async def _end_session(client: AsyncClient, session_id: str) -> bool:
    """Revokes the session; True once it has certainly ended (or was already gone)."""
    try:
        await client.sessions.revoke(session_id)
    except NotFound:
        return True
    except XrError:
        return False
    return True
