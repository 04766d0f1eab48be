"""Sessions: leases that hold locks and keys, kept alive by their owner.

A session lives while its owner renews it within its TTL on the lease clock. When it ends (revoked,
or expired by the state machine when the lease clock passes its deadline) every key written under
it is deleted, it leaves every wait queue, and every lock it holds passes to the next waiter.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from xrcore import kv, locks, tenants
from xrcore.commands import SessionGrant, SessionKeepAlive, SessionRevoke
from xrcore.errors import CapacityExceeded, NotFound
from xrcore.model import Effect, Session

if TYPE_CHECKING:
    from xrcore.state import StateMachine

__all__ = ["Session", "end_sessions", "get", "grant", "keepalive", "revoke"]


def _session(machine: StateMachine, session_id: str) -> Session:
    session = machine.sessions.get(session_id)
    if session is None:
        raise NotFound(f"session {session_id!r} does not exist (it may have expired)")
    return session


def _view(machine: StateMachine, session: Session) -> dict[str, Any]:
    return {
        "session_id": session.session_id,
        "ttl_ms": session.ttl_ms,
        "remaining_ms": max(0, session.deadline_ms - machine.lease_clock_ms),
        "granted_at_ms": session.granted_at_ms,
        "owner": session.owner,
        "locks": list(session.locks),
        "keys": list(session.keys),
    }


def grant(machine: StateMachine, command: SessionGrant, index: int) -> dict[str, Any]:
    if len(machine.sessions) >= machine.limits.sessions_max:
        raise CapacityExceeded(f"the maximum of {machine.limits.sessions_max} sessions is reached")
    tenants.check_sessions(machine, command.owner)
    session_id = f"s{index}"
    session = Session(
        session_id=session_id,
        ttl_ms=command.ttl_ms,
        deadline_ms=machine.lease_clock_ms + command.ttl_ms,
        granted_at_ms=machine.now_ms,
        owner=command.owner,
    )
    machine.sessions[session_id] = session
    machine.watch_session(session.deadline_ms, session_id)
    return _view(machine, session)


def keepalive(machine: StateMachine, command: SessionKeepAlive, index: int) -> dict[str, Any]:
    session = _session(machine, command.session_id)
    session.deadline_ms = machine.lease_clock_ms + session.ttl_ms
    machine.watch_session(session.deadline_ms, session.session_id)
    return _view(machine, session)


def revoke(machine: StateMachine, command: SessionRevoke, index: int) -> dict[str, Any]:
    _session(machine, command.session_id)
    end_sessions(machine, [command.session_id], index, reason="revoked")
    return {"session_id": command.session_id, "revoked": True}


def end_sessions(machine: StateMachine, session_ids: list[str], index: int, *, reason: str) -> None:
    """Ends sessions together. All of them leave every wait queue before any lock is handed on,
    so no lock passes to a session that ends in the same entry (which would grant one lock twice
    at one index and break strictly increasing tokens)."""
    ending = [machine.sessions.pop(session_id) for session_id in session_ids]
    for session in ending:
        for name in session.locks:
            awaited = machine.locks[name]
            if awaited.holder != session.session_id:
                awaited.waiters.remove(session.session_id)
    for session in ending:
        for name in session.locks:
            lock = machine.locks.get(name)
            if lock is not None and lock.holder == session.session_id:
                locks.hand_on(machine, lock, index)
        for key in list(session.keys):
            if key in machine.keys:
                kv.delete_key(machine, key)
        machine.effects.append(
            Effect(kind="session.ended", session_id=session.session_id, reason=reason)
        )


def get(machine: StateMachine, session_id: str) -> dict[str, Any]:
    return _view(machine, _session(machine, session_id))
