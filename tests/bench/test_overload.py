"""`bench/overload.py` reports the rate it offered, not the rate it meant to: a run whose client
pool ran dry once said "offered 2117.3 puts/s" with 46,429 of its puts never sent."""

from __future__ import annotations

import os
import resource
from typing import Any

import pytest

from bench import overload


def _report(**changes: Any) -> dict[str, Any]:
    report: dict[str, Any] = {
        "members": 3,
        "duration_s": 40.0,
        "capacity_per_s": 1058.6,
        "capacity_failures": 0,
        "target_per_s": 2117.3,
        "scheduled": 84_692,
        "offered_per_s": 956.6,
        "sent": 38_264,
        "admitted": 30_000,
        "admitted_per_s": 750.0,
        "refused": 8_264,
        "refused_without_retry_after": 0,
        "other": 0,
        "other_by_status": {},
        "unanswered": 0,
        "skipped": 46_428,
        "clients_max": 5_000,
        "clients_max_limited_by": None,
        "latency_p50_ms": 1.0,
        "latency_p99_ms": 2.0,
        "latency_max_ms": 3.0,
        "node_put_timing": {
            "requests": 38_264,
            "p50_ms_at_most": 1.0,
            "p99_ms_at_most": 5.0,
            "p999_ms_at_most": 10.0,
        },
        "health": {"probes": 10, "not_ok": 0, "latency_p50_ms": 1.0, "latency_p99_ms": 2.0,
                   "latency_max_ms": 3.0},
        "lost_acknowledged_writes": 0,
    }  # fmt: skip
    return report | changes


def test_table__a_short_rate_shows_what_was_sent_skipped_and_by_how_much_it_fell_short() -> None:
    table = overload._table(_report())
    assert "offered (sent)                       956.6 puts/s: 38264 sent" in table
    assert "46428" in table
    assert "target (open loop)                   2117.3 puts/s for 40.0 s" in table
    note = table.splitlines()[-1]
    assert note.startswith("NOTE: the rate offered fell short of the target by 55%")
    assert "0.90x capacity, not 2.00x" in note
    assert "46,428 of 84,692 scheduled puts were skipped" in note


def test_table__no_note_when_every_put_was_sent() -> None:
    table = overload._table(
        _report(offered_per_s=2117.3, sent=84_692, skipped=0, clients_max=21_173)
    )
    assert "NOTE" not in table
    assert "2117.3 puts/s: 84692 sent" in table


def test_clients_max__the_pool_grows_with_the_rate_within_the_open_file_limit_and_its_cap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    limits = {"soft": 1_024, "hard": 4_096}

    def getrlimit(which: int) -> tuple[int, int]:
        return limits["soft"], limits["hard"]

    def setrlimit(which: int, values: tuple[int, int]) -> None:
        limits["soft"] = values[0]

    monkeypatch.setattr(resource, "getrlimit", getrlimit)
    monkeypatch.setattr(resource, "setrlimit", setrlimit)
    # 200 puts/s for up to 10 s each: 2,000 clients, the soft limit raised to allow them.
    assert overload.clients_max(200.0) == (2_000, None)
    assert limits["soft"] == 2_000 + overload.FILE_DESCRIPTORS_RESERVED
    # Beyond the hard limit: as many as it allows, and why.
    bound, reason = overload.clients_max(420.0)
    assert bound == 4_096 - overload.FILE_DESCRIPTORS_RESERVED
    assert reason is not None and "open-file limit (4096)" in reason and "4200" in reason
    # Beyond the cap, whatever the limit: the cap, and why.
    limits["hard"] = 1 << 20
    bound, reason = overload.clients_max(2_117.3)
    assert bound == overload.CLIENTS_MAX
    assert reason is not None and "capped at 5,000" in reason and "21,173" in reason


def test_the_health_prober_runs_in_a_session_of_its_own_so_ctrl_c_does_not_kill_it() -> None:
    # A Ctrl-C in the terminal used to reach the prober too, and its exit (-2) then failed the
    # run with a traceback; now it ends when its standard input closes.
    prober = overload._start_prober(["http://127.0.0.1:9"])
    try:
        assert os.getsid(prober.pid) == prober.pid != os.getsid(0)
        report = overload._stop_prober(prober)
    finally:
        overload._abandon_prober(prober)
    # Ended by its standard input closing, it reports (how many probes depends on how soon).
    assert report["probes"] >= 0 and report["not_ok"] <= report["probes"]
