"""The device ledger: whole devices for GPU tasks, memory shares packed best fit for the rest."""

from __future__ import annotations

from xrcore.devices import DeviceLedger, Grant


def test_whole_devices_go_only_to_untouched_devices_of_the_model() -> None:
    ledger = DeviceLedger(memory_mb=[16_000, 80_000, 80_000], models=["T4", "A100", "A100"])
    assert ledger.reserve(gpus=2, memory_mb=0, model="A100") == Grant(devices=(1, 2))
    assert ledger.reserve(gpus=1, memory_mb=0, model="A100") is None
    assert ledger.reserve(gpus=1, memory_mb=20_000) is None  # the T4 is too small
    assert ledger.reserve(gpus=1, memory_mb=0) == Grant(devices=(0,))


def test_memory_shares_are_packed_best_fit_and_keep_big_devices_whole() -> None:
    ledger = DeviceLedger(memory_mb=[40_000, 16_000])
    first = ledger.reserve(gpus=0, memory_mb=6_000)
    second = ledger.reserve(gpus=0, memory_mb=6_000)
    assert first == second == Grant(devices=(1,), shared_memory_mb=6_000)
    # The 16 GB device is nearly full; the 40 GB one is still whole.
    assert ledger.reserve(gpus=1, memory_mb=0) == Grant(devices=(0,))
    assert ledger.reserve(gpus=0, memory_mb=6_000) is None
    assert first is not None
    ledger.release(first)
    assert ledger.reserve(gpus=0, memory_mb=6_000) == Grant(devices=(1,), shared_memory_mb=6_000)


def test_a_shared_device_is_not_handed_out_whole_until_its_shares_end() -> None:
    ledger = DeviceLedger(memory_mb=[24_000])
    share = ledger.reserve(gpus=0, memory_mb=1_000)
    assert share is not None
    assert ledger.reserve(gpus=1, memory_mb=0) is None
    ledger.release(share)
    assert ledger.reserve(gpus=1, memory_mb=0) == Grant(devices=(0,))
    assert ledger.used == 1
