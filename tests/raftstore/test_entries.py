"""What a log entry may hold (`raftstore.entries`): what xr and pysyncobj write passes, the rest is
a `BadEntry` that names what is wrong."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
from pysyncobj.node import TCPNode

from raftstore.entries import BadEntry, applicable_group, check_replicated, forwarded_group


def _call(call: Any, protocol: int = 5) -> bytes:
    return b"\x00" + pickle.dumps(call, protocol=protocol)


def _member_change(request: Any) -> bytes:
    return b"\x02" + pickle.dumps(request, protocol=2)


@pytest.mark.parametrize("protocol", [2, 5])
def test_a_call_of_apply_group__is_forwarded_and_applied(protocol: int) -> None:
    command = _call((0, (b"group",)), protocol)
    assert forwarded_group(command) == b"group"
    assert applicable_group(command) == b"group"


@pytest.mark.parametrize(
    ("command", "reason"),
    [
        (b"\x00garbage", "does not unpickle"),
        (_call((7, (b"group",))), "calls method 7"),
        (_call((True, (b"group",))), "calls method True"),
        (_call((0, (b"group", b"more"))), "argument is not one byte string"),
        (_call((0, ("text",))), "argument is not one byte string"),
        (_call((0, (b"group",), {"x": 1})), "not a call of apply_group"),
        (_call(0), "not a call of apply_group"),
        (b"", "non-empty byte string"),
        ("\x00text", "non-empty byte string"),
    ],
)
def test_what_no_member_writes__is_neither_forwarded_nor_applied(command: Any, reason: str) -> None:
    for check in (forwarded_group, applicable_group):
        with pytest.raises(BadEntry, match=reason if check is applicable_group else None):
            check(command)


@pytest.mark.parametrize(
    "command",
    [
        b"\x01",
        b"\x03" + pickle.dumps(1, protocol=2),
        _member_change(["add", "127.0.0.1:7002", TCPNode("127.0.0.1:7002")]),
        _member_change(["rem", "127.0.0.1:7002", TCPNode("127.0.0.1:7002")]),
        _member_change(("add", "127.0.0.1:7002")),
    ],
    ids=["no-op", "code version", "add", "remove", "add, address only"],
)
def test_pysyncobjs_own_entries__are_applied_by_pysyncobj_and_never_forwarded(
    command: bytes,
) -> None:
    assert applicable_group(command) is None
    with pytest.raises(BadEntry, match="must be a call of apply_group"):
        forwarded_group(command)


def _odd_node() -> TCPNode:
    node = TCPNode("127.0.0.1:7002")
    vars(node)["_TCPNode__port"] = "not a port"
    return node


@pytest.mark.parametrize(
    ("command", "reason"),
    [
        (b"\x03garbage", "does not unpickle"),
        (b"\x03" + pickle.dumps("1", protocol=2), "not an integer"),
        (b"\x03" + pickle.dumps(True, protocol=2), "not an integer"),
        (_member_change("add"), "not \\(action"),
        (_member_change(["move", "127.0.0.1:7002"]), "no known action"),
        (_member_change(["add", ""]), "not host:port"),
        (_member_change(["add", "127.0.0.1:port"]), "not host:port"),
        (_member_change(["add", 5]), "no member address"),
        (_member_change(["add", "127.0.0.1:7002", _odd_node()]), "not one pysyncobj makes"),
    ],
)
def test_pysyncobj_entries_it_cannot_apply__are_refused(command: bytes, reason: str) -> None:
    with pytest.raises(BadEntry, match=reason):
        applicable_group(command)


@pytest.mark.parametrize(
    "command",
    [b"\x00garbage", _call((7, (b"group",))), b"\x03garbage", b"\x03" + pickle.dumps("1")],
)
def test_what_a_follower_reads_only_when_applying__it_takes_from_its_leader(
    command: bytes,
) -> None:
    """Refusing it on receipt would keep a follower from ever catching up with a leader whose
    log holds it; it is skipped when applied instead, on every member alike."""
    check_replicated(command)
    with pytest.raises(BadEntry):
        applicable_group(command)


@pytest.mark.parametrize(
    "command", [b"", "text", _member_change(["add", ""]), _member_change(["move", "h:1"])]
)
def test_what_a_follower_reads_on_receipt__must_decode(command: Any) -> None:
    with pytest.raises(BadEntry):
        check_replicated(command)
