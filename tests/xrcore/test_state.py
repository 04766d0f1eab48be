"""The state machine's own rules: replicated time, exactly-once writes, malformed entries,
log order and snapshots."""

from __future__ import annotations

import pytest

from xrcore import Envelope, StateMachine, encode
from xrcore.commands import KvPut, SessionGrant, Tick
from xrcore.limits import Limits

from .helpers import START_MS, Driver


def test_time__replicated_now_is_the_maximum_proposed_and_never_goes_back() -> None:
    driver = Driver()
    driver.ok(Tick(), advance_ms=500)
    driver.ok(Tick(), advance_ms=-300)
    assert driver.machine.now_ms == START_MS + 500


def test_time__lease_clock_moves_at_most_one_step_per_entry() -> None:
    driver = Driver(Limits(lease_step_max_ms=250))
    driver.ok(Tick())
    start = driver.machine.lease_clock_ms
    driver.ok(Tick(), advance_ms=100)
    driver.ok(Tick(), advance_ms=10_000)
    assert driver.machine.lease_clock_ms - start == 100 + 250


def test_retry__same_client_and_seq__returns_the_stored_result_without_applying() -> None:
    driver = Driver()
    first = driver.apply(KvPut(key="a", value=b"1"), client_id="c", seq=1)
    retry = driver.apply(KvPut(key="a", value=b"1"), client_id="c", seq=1)
    assert retry.duplicate and retry.result == first.result
    assert driver.machine.revision == 1


def test_retry__of_a_failed_write__returns_the_same_failure() -> None:
    driver = Driver()
    driver.ok(KvPut(key="a", value=b"1"))
    failed = driver.apply(KvPut(key="a", value=b"2", expected_mod_revision=9), client_id="c", seq=1)
    driver.ok(KvPut(key="a", value=b"3"))
    retry = driver.apply(KvPut(key="a", value=b"2", expected_mod_revision=9), client_id="c", seq=1)
    assert retry.duplicate and retry.result == failed.result and retry.result.error is not None


def test_retry__concurrent_requests_of_one_client__each_applied_once() -> None:
    driver = Driver()
    for seq in (3, 1, 2):
        driver.apply(KvPut(key=f"k{seq}", value=b""), client_id="c", seq=seq)
    for seq in (1, 2, 3):
        assert driver.apply(KvPut(key=f"k{seq}", value=b""), client_id="c", seq=seq).duplicate
    assert driver.machine.revision == 3


def test_retry__older_than_the_kept_results__is_an_indefinite_error() -> None:
    driver = Driver(Limits(results_per_client_max=2))
    for seq in (1, 2, 3):
        driver.ok(KvPut(key="k", value=b""), client_id="c", seq=seq)
    result = driver.apply(KvPut(key="k", value=b""), client_id="c", seq=1).result
    assert result.error is not None and result.error.code == "request.too_old"
    assert result.error.to_error().definite is False
    assert driver.machine.revision == 3


def test_clients_max__new_client_rejected_until_an_idle_one_is_forgotten() -> None:
    driver = Driver(Limits(clients_max=1, client_idle_ms=5_000))
    driver.ok(KvPut(key="k", value=b""), client_id="old", seq=1)
    assert driver.error(KvPut(key="k", value=b""), client_id="new", seq=1) == "limit.capacity"
    for _ in range(6):
        driver.ok(Tick(), advance_ms=1_000)
    driver.ok(KvPut(key="k", value=b""), client_id="new", seq=1)
    assert list(driver.machine.clients) == ["new"]


def test_reads_and_ticks__are_not_kept_in_the_exactly_once_table() -> None:
    driver = Driver()
    driver.ok(Tick(), client_id="c", seq=1)
    assert "c" not in driver.machine.clients


def test_malformed_entry__rejected_with_a_typed_error_and_the_index_advances() -> None:
    machine = StateMachine()
    applied = machine.apply(b"\xc1garbage", 1)
    assert applied.result.error is not None and applied.result.error.code == "codec.malformed"
    assert machine.index == 1


def test_entries_out_of_order__are_a_programming_error() -> None:
    machine = StateMachine()
    machine.apply(encode(Envelope(command=Tick(), now_ms=1)), 5)
    with pytest.raises(AssertionError):
        machine.apply(encode(Envelope(command=Tick(), now_ms=2)), 5)


def test_snapshot__restore_then_continue__matches_the_replica_that_never_stopped() -> None:
    driver = Driver()
    session_id = driver.ok(SessionGrant(ttl_ms=2_000))["session_id"]
    driver.ok(KvPut(key="a", value=b"1", session_id=session_id), client_id="c", seq=1)
    restored = StateMachine.restore(driver.machine.snapshot())
    for _ in range(3):
        entry = encode(Envelope(command=Tick(), now_ms=driver.now_ms + 1_000))
        driver.now_ms += 1_000
        driver.index += 1
        expected = driver.machine.apply(entry, driver.index)
        assert restored.apply(entry, driver.index) == expected
    assert restored.snapshot() == driver.machine.snapshot()
    assert session_id not in restored.sessions
