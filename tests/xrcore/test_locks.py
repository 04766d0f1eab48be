"""Fenced locks: grants, FIFO hand-off, tokens from the log, release on session end, limits."""

from __future__ import annotations

import pytest

from xrcore import errors, locks
from xrcore.commands import (
    LockAcquire,
    LockLeave,
    LockRelease,
    LockValidate,
    SessionGrant,
    SessionKeepAlive,
    SessionRevoke,
    Tick,
)
from xrcore.limits import Limits

from .helpers import Driver


def _sessions(driver: Driver, count: int, ttl_ms: int = 10_000) -> list[str]:
    return [driver.ok(SessionGrant(ttl_ms=ttl_ms))["session_id"] for _ in range(count)]


def test_acquire__free_lock__granted_with_a_new_fencing_token() -> None:
    driver = Driver()
    (session,) = _sessions(driver, 1)
    grant = driver.ok(LockAcquire(name="L", session_id=session))
    assert grant == {"name": "L", "granted": True, "token": 1, "holder": session}
    assert driver.machine.fencing_token == 1


def test_acquire__held_lock_without_wait__is_not_granted_and_not_queued() -> None:
    driver = Driver()
    first, second = _sessions(driver, 2)
    driver.ok(LockAcquire(name="L", session_id=first))
    answer = driver.ok(LockAcquire(name="L", session_id=second))
    assert answer == {"name": "L", "granted": False, "queued": False, "holder": first}
    assert locks.get(driver.machine, "L")["waiters"] == []


def test_acquire__by_the_holder_again__returns_the_same_grant() -> None:
    driver = Driver()
    (session,) = _sessions(driver, 1)
    token = driver.ok(LockAcquire(name="L", session_id=session))["token"]
    assert driver.ok(LockAcquire(name="L", session_id=session))["token"] == token


def test_release__hands_the_lock_to_waiters_in_fifo_order_with_increasing_tokens() -> None:
    driver = Driver()
    holder, *waiters = _sessions(driver, 4)
    tokens = [driver.ok(LockAcquire(name="L", session_id=holder))["token"]]
    for position, waiter in enumerate(waiters, start=1):
        answer = driver.ok(LockAcquire(name="L", session_id=waiter, wait=True))
        assert answer["position"] == position
    order = [holder]
    for _ in waiters:
        applied = driver.apply(LockRelease(name="L", session_id=order[-1]))
        (granted,) = [effect for effect in applied.effects if effect.kind == "lock.granted"]
        assert granted.token == driver.machine.fencing_token
        order.append(granted.session_id)
        tokens.append(granted.token)
    assert order == [holder, *waiters]
    assert tokens == sorted(set(tokens))


def test_release__last_holder__frees_the_lock() -> None:
    driver = Driver()
    (session,) = _sessions(driver, 1)
    driver.ok(LockAcquire(name="L", session_id=session))
    driver.ok(LockRelease(name="L", session_id=session))
    with pytest.raises(errors.NotFound):
        locks.get(driver.machine, "L")


def test_release__by_a_waiter__leaves_the_queue() -> None:
    driver = Driver()
    holder, waiter, other = _sessions(driver, 3)
    driver.ok(LockAcquire(name="L", session_id=holder))
    driver.ok(LockAcquire(name="L", session_id=waiter, wait=True))
    driver.ok(LockAcquire(name="L", session_id=other, wait=True))
    assert driver.ok(LockRelease(name="L", session_id=waiter))["left_queue"] is True
    assert locks.get(driver.machine, "L")["waiters"] == [other]


def test_release__by_a_stranger__is_lock_not_held() -> None:
    driver = Driver()
    holder, stranger = _sessions(driver, 2)
    driver.ok(LockAcquire(name="L", session_id=holder))
    assert driver.error(LockRelease(name="L", session_id=stranger)) == "lock.not_held"


def test_leave__takes_a_waiter_out_of_the_queue_and_never_releases_a_grant() -> None:
    """What a node proposes when a wait ends unanswered (`node.api.locks`): by the time it
    applies, the session may hold the lock, granted through another node."""
    driver = Driver()
    holder, waiter, other, stranger = _sessions(driver, 4)
    driver.ok(LockAcquire(name="L", session_id=holder))
    driver.ok(LockAcquire(name="L", session_id=waiter, wait=True))
    driver.ok(LockAcquire(name="L", session_id=other, wait=True))
    assert driver.ok(LockLeave(name="L", session_id=waiter)) == {"name": "L", "left_queue": True}
    assert locks.get(driver.machine, "L")["waiters"] == [other]
    assert driver.machine.sessions[waiter].locks == []
    # The holder's leave changes nothing; nor does a stranger's, or one for a missing lock.
    token = locks.get(driver.machine, "L")["token"]
    assert driver.ok(LockLeave(name="L", session_id=holder)) == {
        "name": "L",
        "left_queue": False,
        "granted": True,
        "token": token,
    }
    for session, name in [(stranger, "L"), (holder, "nowhere"), ("no-such-session", "L")]:
        answer = driver.ok(LockLeave(name=name, session_id=session))
        assert (answer["left_queue"], answer["granted"]) == (False, False)
    shown = locks.get(driver.machine, "L")
    assert (shown["holder"], shown["token"], shown["waiters"]) == (holder, token, [other])


def test_session_revoked__its_lock_passes_to_the_next_waiter() -> None:
    driver = Driver()
    holder, waiter = _sessions(driver, 2)
    driver.ok(LockAcquire(name="L", session_id=holder))
    driver.ok(LockAcquire(name="L", session_id=waiter, wait=True))
    driver.apply(SessionRevoke(session_id=holder))
    assert locks.get(driver.machine, "L")["holder"] == waiter
    assert locks.get(driver.machine, "L")["token"] == driver.machine.fencing_token


def test_session_expired__its_lock_passes_on_and_old_token_is_invalid() -> None:
    driver = Driver()
    (holder,) = _sessions(driver, 1, ttl_ms=2_000)
    (waiter,) = _sessions(driver, 1, ttl_ms=60_000)
    old = driver.ok(LockAcquire(name="L", session_id=holder))["token"]
    driver.ok(LockAcquire(name="L", session_id=waiter, wait=True))
    for _ in range(3):
        driver.ok(SessionKeepAlive(session_id=waiter), advance_ms=1_000)
    assert locks.get(driver.machine, "L")["holder"] == waiter
    assert driver.ok(LockValidate(name="L", token=old))["valid"] is False


def test_holder_and_waiter_expire_in_one_entry__lock_goes_to_a_live_session_once() -> None:
    # Both sessions end at the same index; if the lock passed through the waiter on its way to
    # the third session, it would be granted twice with the same token.
    driver = Driver()
    holder, doomed = _sessions(driver, 2, ttl_ms=2_000)
    (survivor,) = _sessions(driver, 1, ttl_ms=60_000)
    driver.ok(LockAcquire(name="L", session_id=holder))
    driver.ok(LockAcquire(name="L", session_id=doomed, wait=True))
    driver.ok(LockAcquire(name="L", session_id=survivor, wait=True))
    applied = driver.apply(SessionKeepAlive(session_id=survivor), advance_ms=1_000)
    applied = driver.apply(SessionKeepAlive(session_id=survivor), advance_ms=1_000)
    grants = [effect for effect in applied.effects if effect.kind == "lock.granted"]
    assert [(grant.session_id, grant.token) for grant in grants] == [(survivor, 2)]


def test_validate__current_token_is_valid_and_others_are_not() -> None:
    driver = Driver()
    (session,) = _sessions(driver, 1)
    token = driver.ok(LockAcquire(name="L", session_id=session))["token"]
    assert driver.ok(LockValidate(name="L", token=token))["valid"] is True
    assert driver.ok(LockValidate(name="L", token=token + 1))["valid"] is False
    assert driver.ok(LockValidate(name="free", token=token))["current_token"] is None


def test_acquire__with_unknown_session__is_not_found() -> None:
    assert Driver().error(LockAcquire(name="L", session_id="s404")) == "not_found"


def test_waiters_max__one_more_waiter__is_rejected() -> None:
    driver = Driver(Limits(lock_waiters_max=2))
    holder, *waiters = _sessions(driver, 4)
    driver.ok(LockAcquire(name="L", session_id=holder))
    driver.ok(LockAcquire(name="L", session_id=waiters[0], wait=True))
    driver.ok(LockAcquire(name="L", session_id=waiters[1], wait=True))
    assert driver.error(LockAcquire(name="L", session_id=waiters[2], wait=True)) == (
        "limit.capacity"
    )


def test_locks_per_session_max__is_enforced() -> None:
    driver = Driver(Limits(locks_per_session_max=2))
    (session,) = _sessions(driver, 1)
    driver.ok(LockAcquire(name="a", session_id=session))
    driver.ok(LockAcquire(name="b", session_id=session))
    assert driver.error(LockAcquire(name="c", session_id=session)) == "limit.capacity"


def test_expiry_hands_on_and_the_new_holder_releases_in_one_entry__tokens_still_increase() -> None:
    # Found by the state-machine test: the entry that expires the holder (handing the lock to
    # the first waiter) carries that waiter's release (handing it to the second): two grants of
    # one lock in one entry, which must still get distinct, increasing tokens.
    driver = Driver()
    (holder,) = _sessions(driver, 1, ttl_ms=1_000)
    first, second = _sessions(driver, 2, ttl_ms=60_000)
    driver.ok(LockAcquire(name="L", session_id=holder))
    driver.ok(LockAcquire(name="L", session_id=first, wait=True))
    driver.ok(LockAcquire(name="L", session_id=second, wait=True))
    applied = driver.apply(LockRelease(name="L", session_id=first), advance_ms=1_000)
    grants = [
        (effect.session_id, effect.token)
        for effect in applied.effects
        if effect.kind == "lock.granted"
    ]
    assert grants == [(first, 2), (second, 3)]
    assert locks.get(driver.machine, "L")["token"] == 3


def test_lock_recreated_after_free__gets_a_higher_token() -> None:
    driver = Driver()
    (session,) = _sessions(driver, 1)
    first = driver.ok(LockAcquire(name="L", session_id=session))["token"]
    driver.ok(LockRelease(name="L", session_id=session))
    driver.ok(Tick())
    assert driver.ok(LockAcquire(name="L", session_id=session))["token"] > first
