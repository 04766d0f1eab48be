"""The lease checker: a lock lost sooner than its session's TTL (minus a slack) after the holder
asked for it is an anomaly; one lost later is not; changed clock rates make the verdict unknown."""

from __future__ import annotations

from typing import Any

from xr_jepsen.checkers import LeaseChecker
from xr_jepsen.history import Op

SECOND_NS = 1_000_000_000


def _history(
    lost_after_s: float,
    *,
    nemesis: dict[str, Any] | None = None,
    error: str = "lock.not_held: the session does not hold lock 'l'",
) -> list[Op]:
    value = {"lock": "l", "token": 7}
    ops = [
        Op(index=0, type="invoke", f="acquire", process=0, value={"lock": "l"}, time_ns=0),
        Op(index=1, type="ok", f="acquire", process=0, value=value, time_ns=SECOND_NS // 10),
        Op(
            index=2,
            type="invoke",
            f="release",
            process=0,
            value=value,
            time_ns=int(lost_after_s * SECOND_NS) - 1,
        ),
        Op(
            index=3,
            type="fail",
            f="release",
            process=0,
            value=value,
            time_ns=int(lost_after_s * SECOND_NS),
            error=error,
        ),
    ]
    if nemesis is not None:
        ops.append(
            Op(index=4, type="info", f="nemesis", process=-1, value=nemesis, time_ns=5 * SECOND_NS)
        )
    return ops


def test_a_lock_lost_well_before_its_ttl_is_an_early_expiry() -> None:
    result = LeaseChecker(ttl_s=4.0, slack_s=1.5).check(_history(1.0))
    assert result.valid is False
    assert [item["kind"] for item in result.anomalies] == ["early-expiry"]
    assert result.window == (0, 3)


def test_a_lock_lost_after_its_ttl_less_the_slack_is_fine() -> None:
    assert LeaseChecker(ttl_s=4.0, slack_s=1.5).check(_history(3.0)).valid is True


def test_a_changed_clock_rate_makes_the_verdict_unknown() -> None:
    rate = {"fault": "clock", "rate": 4.0, "offset_s": 0.0}
    result = LeaseChecker(ttl_s=4.0, slack_s=1.5).check(_history(1.0, nemesis=rate))
    assert result.valid == "unknown"
    assert result.anomalies


def test_a_release_whose_whole_session_expired_is_a_lost_lease_too() -> None:
    """The session can be gone altogether when the release comes (`not_found`), which the
    checker missed: the local-clock-leases fault was caught only when a release answered
    lock.not_held."""
    gone = "not_found: session 's209' does not exist (it may have expired)"
    result = LeaseChecker(ttl_s=4.0, slack_s=1.5).check(_history(1.0, error=gone))
    assert result.valid is False
    assert [item["kind"] for item in result.anomalies] == ["early-expiry"]
    assert LeaseChecker(ttl_s=4.0, slack_s=1.5).check(_history(3.0, error=gone)).valid is True


def test_a_release_refused_for_another_reason_is_not_a_lost_lease() -> None:
    for error in ("unavailable: no leader", "invalid_argument: bad token", "", "not_held"):
        result = LeaseChecker(ttl_s=4.0, slack_s=1.5).check(_history(1.0, error=error))
        assert result.valid is True, error
