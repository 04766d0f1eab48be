"""The history format: Op validation, JSON lines on disk, pairing, and the recorder."""

from __future__ import annotations

import itertools
import json
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from xr_jepsen.history import (
    NEMESIS_PROCESS,
    History,
    HistoryError,
    HistoryRecorder,
    Op,
    pair,
    read_history,
    write_history,
)

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=3), children, max_size=3)
    ),
    max_leaves=8,
)
OPTIONAL_TEXT = st.none() | st.text(min_size=1, max_size=5)


def op(index: int, type: str, process: int = 0, value: Any = None, f: str = "read") -> Op:
    return Op(index=index, type=type, f=f, process=process, value=value, time_ns=index)  # type: ignore[arg-type]


@st.composite
def ops_lists(draw: st.DrawFn) -> list[Op]:
    count = draw(st.integers(0, 8))
    return [
        Op(
            index=index,
            type=draw(st.sampled_from(["invoke", "ok", "fail", "info"])),
            f=draw(st.sampled_from(["read", "write", "cas", "nemesis"])),
            process=draw(st.integers(-1, 5)),
            value=draw(JSON_VALUES),
            time_ns=draw(st.integers(0, 2**62)),
            key=draw(OPTIONAL_TEXT),
            node=draw(OPTIONAL_TEXT),
            error=draw(OPTIONAL_TEXT),
        )
        for index in range(count)
    ]


@given(ops=ops_lists())
def test_history__round_trips_through_json_lines(tmp_path_factory: Any, ops: list[Op]) -> None:
    path = tmp_path_factory.mktemp("history") / "h.jsonl"
    write_history(path, ops)
    assert read_history(path) == ops
    assert [Op.from_json(item.to_json()) for item in ops] == ops


def test_to_json__leaves_out_optional_fields_that_are_none() -> None:
    assert op(0, "invoke").to_json() == {
        "index": 0,
        "type": "invoke",
        "f": "read",
        "process": 0,
        "value": None,
        "time_ns": 0,
    }


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"index": None}, "index"),
        ({"index": -1}, "index"),
        ({"index": True}, "index"),
        ({"type": "done"}, "type"),
        ({"f": ""}, "f"),
        ({"process": "p1"}, "process"),
        ({"time_ns": 1.5}, "time_ns"),
        ({"key": 3}, "key"),
        ({"node": ["n1"]}, "node"),
        ({"error": 500}, "error"),
        ({"colour": "red"}, "colour"),
    ],
)
def test_from_json__names_the_bad_field(change: dict[str, Any], field: str) -> None:
    data = {**op(0, "invoke").to_json(), **change}
    with pytest.raises(ValueError, match=field):
        Op.from_json(data)


@pytest.mark.parametrize("field", ["index", "type", "f", "process", "value", "time_ns"])
def test_from_json__names_a_missing_field(field: str) -> None:
    data = op(0, "invoke").to_json()
    del data[field]
    with pytest.raises(ValueError, match=f"missing field '{field}'"):
        Op.from_json(data)


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "JSON object"),
        ('{"index": 0}', "missing field 'type'"),
        (
            '{"index": 5, "type": "invoke", "f": "r", "process": 0, "value": 1, "time_ns": 0}',
            "index",
        ),
    ],
)
def test_read_history__a_bad_line_raises_history_error_with_its_number(
    tmp_path: Path, line: str, reason: str
) -> None:
    path = tmp_path / "h.jsonl"
    good = json.dumps(op(0, "invoke").to_json())
    path.write_text(f"{good}\n\n{line}\n")
    with pytest.raises(HistoryError, match=reason) as caught:
        read_history(path)
    assert caught.value.line == 3
    assert str(caught.value).startswith("line 3: ")


def test_pair__matches_completions_to_invokes_of_the_same_process() -> None:
    ops = [
        op(0, "invoke", 1),
        op(1, "invoke", 2),
        Op(index=2, type="info", f="nemesis", process=NEMESIS_PROCESS, value="kill", time_ns=2),
        op(2 + 1, "ok", 2, 5),
        op(4, "invoke", 3),
        op(5, "info", 1),
    ]
    operations = pair(ops)
    assert [(o.invoke.index, o.completion and o.completion.index) for o in operations] == [
        (0, 5),
        (1, 3),
        (4, None),
    ]
    assert [o.type for o in operations] == ["info", "ok", "info"]
    assert operations[1].value == 5
    assert operations[2].indices == [4]
    assert History(ops).operations() == operations
    assert len(History(ops).client_ops()) == 5


@pytest.mark.parametrize(
    ("ops", "message"),
    [
        ([op(0, "ok", 1)], "no outstanding invoke"),
        ([op(0, "invoke", 1), op(1, "invoke", 1)], "invokes again"),
        ([op(0, "invoke", 1), op(1, "ok", 1, f="write")], "differs"),
        # A client read on the nemesis's process was skipped, never judged.
        ([op(0, "invoke", 1), op(1, "invoke", NEMESIS_PROCESS)], "go together"),
        ([op(0, "invoke", 1, f="nemesis")], "not process 1 with f 'nemesis'"),
    ],
)
def test_pair__rejects_a_history_that_does_not_pair_up(ops: list[Op], message: str) -> None:
    with pytest.raises(HistoryError, match=message) as caught:
        pair(ops)
    assert caught.value.index == ops[-1].index


def test_recorder__uses_the_injected_clock_and_copies_key_and_node() -> None:
    moments = iter([10, 20, 30])
    recorder = HistoryRecorder(clock=lambda: next(moments))
    invoke = recorder.invoke(4, "write", 7, key="k", node="n2")
    done = recorder.complete(invoke, "fail", error="lock.not_held")
    fault = recorder.nemesis({"fault": "pause", "node": "n1"})
    assert [item.time_ns for item in recorder.ops] == [10, 20, 30]
    assert (done.key, done.node, done.error, done.f) == ("k", "n2", "lock.not_held", "write")
    assert (fault.process, fault.f, fault.type) == (NEMESIS_PROCESS, "nemesis", "info")


def test_recorder__refuses_a_second_outstanding_op_and_a_double_completion() -> None:
    recorder = HistoryRecorder(clock=lambda: 0)
    invoke = recorder.invoke(1, "read", None)
    with pytest.raises(ValueError, match="outstanding"):
        recorder.invoke(1, "read", None)
    recorder.complete(invoke, "ok", 3)
    with pytest.raises(ValueError, match="not outstanding"):
        recorder.complete(invoke, "ok", 3)
    with pytest.raises(ValueError, match="ok, fail or info"):
        recorder.complete(recorder.invoke(1, "read", None), "invoke")


def test_recorder__threads_record_a_history_that_pairs_in_time_order(tmp_path: Path) -> None:
    path = tmp_path / "stream.jsonl"
    with HistoryRecorder(stream_path=path) as recorder:

        def client(process: int) -> None:
            for number in range(200):
                invoke = recorder.invoke(process, "write", number, key="k")
                recorder.complete(invoke, "ok")

        threads = [threading.Thread(target=client, args=(process,)) for process in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        ops = recorder.ops
    assert len(ops) == 8 * 200 * 2
    assert [item.index for item in ops] == list(range(len(ops)))
    assert all(a.time_ns <= b.time_ns for a, b in itertools.pairwise(ops))
    assert len(pair(ops)) == 8 * 200
    assert read_history(path) == ops
