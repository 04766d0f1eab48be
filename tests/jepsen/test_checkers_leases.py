"""The lease checker: a lock lost sooner than its session's TTL (minus a slack) after the holder
asked for it is an anomaly; one lost later is not; changed clock rates make the verdict unknown."""

from __future__ import annotations

from typing import Any

from xr_jepsen.checkers import LeaseChecker
from xr_jepsen.history import Op

SECOND_NS = 1_000_000_000


def _history(lost_after_s: float, *, nemesis: dict[str, Any] | None = None) -> list[Op]:
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
            error="lock.not_held",
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
