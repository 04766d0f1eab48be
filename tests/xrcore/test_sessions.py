"""Sessions: grant, keepalive, revoke, and expiry measured on the lease clock only."""

from __future__ import annotations

import pytest

from xrcore import errors, sessions
from xrcore.commands import SessionGrant, SessionKeepAlive, SessionRevoke, Tick
from xrcore.limits import Limits

from .helpers import Driver


def test_grant__ids_come_from_the_log_index() -> None:
    driver = Driver()
    answer = driver.ok(SessionGrant(ttl_ms=5_000, owner="trainer-1"))
    assert answer["session_id"] == f"s{driver.index}"
    assert answer["remaining_ms"] == 5_000


def test_keepalive__renews_the_full_ttl() -> None:
    driver = Driver()
    session_id = driver.ok(SessionGrant(ttl_ms=3_000))["session_id"]
    for _ in range(10):
        driver.ok(SessionKeepAlive(session_id=session_id), advance_ms=1_000)
    assert sessions.get(driver.machine, session_id)["remaining_ms"] == 3_000


def test_no_keepalive__session_expires_after_its_ttl_of_commits() -> None:
    driver = Driver()
    session_id = driver.ok(SessionGrant(ttl_ms=3_000))["session_id"]
    driver.ok(Tick(), advance_ms=1_000)
    driver.ok(Tick(), advance_ms=1_000)
    assert session_id in driver.machine.sessions
    applied = driver.apply(Tick(), advance_ms=1_000)
    assert session_id not in driver.machine.sessions
    assert [effect.kind for effect in applied.effects] == ["session.ended"]
    assert driver.error(SessionKeepAlive(session_id=session_id)) == "not_found"


def test_gap_in_commits__counts_at_most_one_step_against_the_lease() -> None:
    # A leaderless minute: the next entry carries a clock a minute later, but the lease clock
    # moves by at most lease_step_max_ms, so the holder still has time to renew.
    driver = Driver()
    session_id = driver.ok(SessionGrant(ttl_ms=3_000))["session_id"]
    driver.ok(Tick(), advance_ms=60_000)
    assert sessions.get(driver.machine, session_id)["remaining_ms"] == 2_000
    driver.ok(SessionKeepAlive(session_id=session_id))


def test_proposer_clock_behind__time_does_not_go_back_and_leases_do_not_age() -> None:
    driver = Driver()
    session_id = driver.ok(SessionGrant(ttl_ms=3_000))["session_id"]
    now_ms, lease_clock_ms = driver.machine.now_ms, driver.machine.lease_clock_ms
    for _ in range(20):
        driver.ok(Tick(), advance_ms=-1_000)
    assert (driver.machine.now_ms, driver.machine.lease_clock_ms) == (now_ms, lease_clock_ms)
    assert sessions.get(driver.machine, session_id)["remaining_ms"] == 3_000


def test_revoke__ends_the_session_now() -> None:
    driver = Driver()
    session_id = driver.ok(SessionGrant(ttl_ms=3_000))["session_id"]
    driver.ok(SessionRevoke(session_id=session_id))
    with pytest.raises(errors.NotFound):
        sessions.get(driver.machine, session_id)
    assert driver.error(SessionRevoke(session_id=session_id)) == "not_found"


def test_sessions_max__one_more__is_rejected() -> None:
    driver = Driver(Limits(sessions_max=2))
    driver.ok(SessionGrant(ttl_ms=3_000))
    driver.ok(SessionGrant(ttl_ms=3_000))
    assert driver.error(SessionGrant(ttl_ms=3_000)) == "limit.capacity"


def test_many_keepalives__deadline_index_stays_bounded() -> None:
    driver = Driver()
    session_id = driver.ok(SessionGrant(ttl_ms=3_000))["session_id"]
    for _ in range(1_000):
        driver.ok(SessionKeepAlive(session_id=session_id), advance_ms=10)
    assert len(driver.machine.session_deadlines) <= 2 * len(driver.machine.sessions) + 64


def test_keepalive_to_the_same_deadline__session_expires_once() -> None:
    # Found by the state-machine test: two equal entries in the deadline index ended the session
    # twice in one entry.
    driver = Driver()
    session_id = driver.ok(SessionGrant(ttl_ms=1_000))["session_id"]
    driver.ok(SessionKeepAlive(session_id=session_id))
    applied = driver.apply(Tick(), advance_ms=1_000)
    assert [effect.kind for effect in applied.effects] == ["session.ended"]
