"""Every stored history in histories/ gets the verdict its file name states.

A file is `<checker>_<case>.<valid|invalid|unknown>.jsonl`; the prefix picks the checker. These
are hand-made, each the smallest history showing one behaviour (the classic anomalies, and the
legal corner cases an over-eager checker gets wrong).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from xr_jepsen.checkers import (
    Checker,
    LinearizableChecker,
    LockChecker,
    QueueChecker,
    SetChecker,
    Valid,
    kv,
    register,
)
from xr_jepsen.history import read_history

HISTORIES = Path(__file__).parent / "histories"
CHECKERS: dict[str, Checker] = {
    "register": LinearizableChecker(register),
    "kv": LinearizableChecker(kv, per_key=False),
    "lock": LockChecker(),
    "queue": QueueChecker(),
    "set": SetChecker(),
}
VERDICTS: dict[str, Valid] = {"valid": True, "invalid": False, "unknown": "unknown"}
FILES = sorted(HISTORIES.glob("*.jsonl"))


def test_stored_histories__exist_for_every_checker_and_verdict() -> None:
    seen = {(path.name.split("_")[0], path.name.split(".")[-2]) for path in FILES}
    for checker in CHECKERS:
        assert (checker, "valid") in seen
        assert (checker, "invalid") in seen


@pytest.mark.parametrize("path", FILES, ids=[path.name for path in FILES])
def test_stored_history__gets_the_verdict_in_its_name(path: Path) -> None:
    checker = CHECKERS[path.name.split("_")[0]]
    expected = VERDICTS[path.name.split(".")[-2]]
    result = checker.check(read_history(path))
    assert result.valid == expected, result.to_json()
    if expected is False:
        assert result.anomalies
        assert result.window is not None
        first, last = result.window
        assert any(
            all(first <= index <= last for index in item["ops"]) for item in result.anomalies
        )
    else:
        assert result.window is None
