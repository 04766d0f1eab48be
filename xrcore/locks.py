"""Fenced distributed locks with FIFO wait queues.

A lock is held by a session. Its fencing token comes from the state machine's one sequence of
tokens, so the tokens of one lock strictly increase across grants, hand-offs and re-creation of
the lock, even when one entry grants a lock twice. Releasing a
lock, or the end of its holder's session, hands it to the first waiter in the same entry. A
resource protected by a lock remembers the highest token it has accepted and rejects lower ones;
`validate` answers through the log whether a token is still the current grant.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from xrcore.commands import LockAcquire, LockLeave, LockRelease, LockValidate
from xrcore.errors import CapacityExceeded, LockNotHeld, NotFound
from xrcore.model import Effect, Lock, Session

if TYPE_CHECKING:
    from xrcore.state import StateMachine

__all__ = ["Lock", "acquire", "get", "hand_on", "leave", "release", "validate"]


def _live_session(machine: StateMachine, session_id: str) -> Session:
    session = machine.sessions.get(session_id)
    if session is None:
        raise NotFound(f"session {session_id!r} does not exist (it may have expired)")
    return session


def _check_session_room(machine: StateMachine, session: Session) -> None:
    if len(session.locks) >= machine.limits.locks_per_session_max:
        raise CapacityExceeded(
            f"session {session.session_id!r} already holds or awaits "
            f"{machine.limits.locks_per_session_max} locks"
        )


def _grant_view(lock: Lock) -> dict[str, Any]:
    return {"name": lock.name, "granted": True, "token": lock.token, "holder": lock.holder}


def acquire(machine: StateMachine, command: LockAcquire, index: int) -> dict[str, Any]:
    session = _live_session(machine, command.session_id)
    lock = machine.locks.get(command.name)
    if lock is None:
        _check_session_room(machine, session)
        if len(machine.locks) >= machine.limits.locks_max:
            raise CapacityExceeded(f"the maximum of {machine.limits.locks_max} locks is reached")
        lock = Lock(
            name=command.name,
            holder=session.session_id,
            token=machine.issue_token(),
            granted_at_ms=machine.now_ms,
        )
        machine.locks[command.name] = lock
        session.locks.append(command.name)
        return _grant_view(lock)
    if lock.holder == session.session_id:
        return _grant_view(lock)
    if session.session_id in lock.waiters:
        position = lock.waiters.index(session.session_id) + 1
        return {"name": lock.name, "granted": False, "queued": True, "position": position}
    if not command.wait:
        return {"name": lock.name, "granted": False, "queued": False, "holder": lock.holder}
    _check_session_room(machine, session)
    if len(lock.waiters) >= machine.limits.lock_waiters_max:
        raise CapacityExceeded(
            f"lock {lock.name!r} already has {machine.limits.lock_waiters_max} waiters"
        )
    lock.waiters.append(session.session_id)
    session.locks.append(lock.name)
    return {"name": lock.name, "granted": False, "queued": True, "position": len(lock.waiters)}


def release(machine: StateMachine, command: LockRelease, index: int) -> dict[str, Any]:
    lock = machine.locks.get(command.name)
    session = machine.sessions.get(command.session_id)
    if lock is None or session is None:
        raise LockNotHeld(
            f"session {command.session_id!r} neither holds nor awaits lock {command.name!r}"
        )
    if lock.holder == session.session_id:
        session.locks.remove(lock.name)
        hand_on(machine, lock, index)
        return {"name": lock.name, "released": True}
    if session.session_id in lock.waiters:
        lock.waiters.remove(session.session_id)
        session.locks.remove(lock.name)
        return {"name": lock.name, "released": False, "left_queue": True}
    raise LockNotHeld(
        f"session {command.session_id!r} neither holds nor awaits lock {command.name!r}"
    )


def leave(machine: StateMachine, command: LockLeave, index: int) -> dict[str, Any]:
    """Takes a waiting session out of the lock's queue. Never releases: a session that holds
    the lock (granted since its wait began) keeps it, and one that neither holds nor awaits it
    is answered as such, not refused (the node proposing this cannot know which it is)."""
    lock = machine.locks.get(command.name)
    session = machine.sessions.get(command.session_id)
    if lock is not None and session is not None and session.session_id in lock.waiters:
        lock.waiters.remove(session.session_id)
        session.locks.remove(lock.name)
        return {"name": lock.name, "left_queue": True}
    if lock is not None and lock.holder == command.session_id:
        return {"name": lock.name, "left_queue": False, "granted": True, "token": lock.token}
    return {"name": command.name, "left_queue": False, "granted": False}


def hand_on(machine: StateMachine, lock: Lock, index: int) -> None:
    """Gives a lock whose holder let go to its first waiter, or deletes it if none waits.
    The caller has already removed the lock from the old holder's session."""
    if not lock.waiters:
        del machine.locks[lock.name]
        return
    lock.holder = lock.waiters.pop(0)
    lock.token = machine.issue_token()
    lock.granted_at_ms = machine.now_ms
    machine.effects.append(
        Effect(kind="lock.granted", name=lock.name, session_id=lock.holder, token=lock.token)
    )


def validate(machine: StateMachine, command: LockValidate, index: int) -> dict[str, Any]:
    lock = machine.locks.get(command.name)
    current = None if lock is None else lock.token
    return {"name": command.name, "valid": current == command.token, "current_token": current}


def get(machine: StateMachine, name: str) -> dict[str, Any]:
    lock = machine.locks.get(name)
    if lock is None:
        raise NotFound(f"lock {name!r} is not held")
    return {
        "name": lock.name,
        "holder": lock.holder,
        "token": lock.token,
        "granted_at_ms": lock.granted_at_ms,
        "waiters": list(lock.waiters),
    }
