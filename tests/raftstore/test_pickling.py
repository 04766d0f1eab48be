"""A member unpickles pysyncobj's data and nothing that runs code (`raftstore.pickling`).

Each refusal here is a pickle pysyncobj 0.3.17 would have run with `pickle.loads` on a message
from the Raft port, a log entry it applies or a snapshot header it loads."""

from __future__ import annotations

import _codecs
import io
import os
import pickle
import pickletools
from typing import Any

import pysyncobj.journal
import pysyncobj.pickle
import pysyncobj.serializer
import pysyncobj.syncobj
import pysyncobj.tcp_connection
import pytest
from pysyncobj import SyncObj
from pysyncobj.node import TCPNode

from raftstore import pickling
from raftstore.replica import SNAPSHOT_MAGIC, decode_raft_snapshot, encode_raft_snapshot

RAN: list[str] = []


def _ran(label: str) -> str:
    RAN.append(label)
    return label


class _Calls:
    """Pickles as a call of `function(*arguments)`."""

    def __init__(self, function: Any, *arguments: Any) -> None:
        self.function, self.arguments = function, arguments

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (self.function, self.arguments)


def _message() -> dict[str, Any]:
    """An append_entries message as pysyncobj sends one: an entry whose command is a pickled
    call of xr's apply_group with a byte string."""
    command = b"\x00" + pickle.dumps((0, (b"\x91\xc4\x03abc",)), protocol=2)
    return {
        "type": "append_entries",
        "term": 3,
        "commit_index": 7,
        "entries": [(command, 8, 3)],
        "prevLogIdx": 7,
        "prevLogTerm": 3,
    }


PYSYNCOBJ_DATA = [
    _message(),
    "127.0.0.1:7001",
    os.urandom(32),
    ["add", "127.0.0.1:7002", TCPNode("127.0.0.1:7002")],
    # A snapshot header: pysyncobj's fields, the last two entries and the member set.
    (
        {"_SyncObj__raftCurrentTerm": 3},
        (b"\x00x", 8, 3),
        (b"\x00y", 7, 3),
        {TCPNode("127.0.0.1:7001"), TCPNode("127.0.0.1:7002")},
    ),
    frozenset({"a", "b"}),
    {"type": "apply_command", "command": b"\x00" + bytes(range(256)), "request_id": 12},
    # Protocol 2 spells empty bytes `bytes()`.
    {"type": "append_entries", "serialized": (b"", 0, True)},
]


@pytest.mark.parametrize("protocol", [2, 5])
@pytest.mark.parametrize("value", PYSYNCOBJ_DATA, ids=range(len(PYSYNCOBJ_DATA)))
def test_loads__reads_what_pysyncobj_pickles__in_the_old_protocol_and_the_new(
    value: Any, protocol: int
) -> None:
    loaded = pickling.loads(pickle.dumps(value, protocol=protocol))
    assert loaded == value
    assert pickling.load(io.BytesIO(pickle.dumps(value, protocol=protocol))) == value


def test_a_member_read_back__keeps_its_address() -> None:
    node = pickling.loads(pickle.dumps(TCPNode("127.0.0.1:7002"), protocol=2))
    assert (type(node), node.address, node.host, node.port) == (
        TCPNode,
        "127.0.0.1:7002",
        "127.0.0.1",
        7002,
    )


REFUSED = {
    "a function of the test": _Calls(_ran, "function"),
    "os.system": _Calls(os.system, "true"),
    "builtins.eval": _Calls(eval, "1 + 1"),
    "builtins.getattr": _Calls(getattr, 1, "real"),
    "another codec": _Calls(_codecs.encode, b"x" * 100, "zlib"),
    "latin-1 of bytes": _Calls(_codecs.encode, b"x", "latin1"),
    "bytes of a size": _Calls(bytes, 1 << 40),
    "a pysyncobj class other than a member": _Calls(SyncObj, "127.0.0.1:1", []),
}


@pytest.mark.parametrize("protocol", [2, 5])
@pytest.mark.parametrize("label", REFUSED)
def test_loads__refuses_every_other_global(label: str, protocol: int) -> None:
    RAN.clear()
    data = pickle.dumps(REFUSED[label], protocol=protocol)
    with pytest.raises(pickling.Refused):
        pickling.loads(data)
    # Inside a structure too, and through pysyncobj's module once installed.
    pickling.install()
    with pytest.raises(pickle.UnpicklingError):
        pysyncobj.pickle.loads(pickle.dumps({"type": "append_entries", "x": [REFUSED[label]]}, 2))
    assert RAN == []


def test_plain_pickle__would_have_run_them() -> None:
    """The refusals above refuse something: plain `pickle.loads` runs the call."""
    RAN.clear()
    assert pickle.loads(pickle.dumps(REFUSED["a function of the test"], protocol=2)) == "function"
    assert RAN == ["function"]


def test_dumps__writes_protocol_5_which_names_no_global_for_a_message() -> None:
    data = pickling.dumps(_message())
    opcodes = [opcode.name for opcode, _, _ in pickletools.genops(data)]
    assert opcodes[0] == "PROTO" and pickletools.genops(data).__next__()[1] == 5
    assert not {"GLOBAL", "STACK_GLOBAL", "REDUCE", "INST", "OBJ"} & set(opcodes)
    # Protocol 2 spelled each byte string as a call of _codecs.encode.
    old = [opcode.name for opcode, _, _ in pickletools.genops(pickle.dumps(_message(), 2))]
    assert "GLOBAL" in old


def test_install__replaces_pysyncobjs_pickling_everywhere_it_is_called() -> None:
    pickling.install()
    assert pysyncobj.pickle.loads is pickling.loads
    assert pysyncobj.pickle.load is pickling.load
    assert pysyncobj.pickle.dumps is pickling.dumps
    assert pysyncobj.pickle.dump is pickling.dump
    # The journal imported its functions by name; the other modules call them through
    # `pysyncobj.pickle` (checked so that a new pysyncobj that binds them early is noticed).
    assert pysyncobj.journal.loads is pickling.loads
    assert pysyncobj.journal.dumps is pickling.dumps
    for module in (pysyncobj.syncobj, pysyncobj.tcp_connection, pysyncobj.serializer):
        assert module.pickle is pysyncobj.pickle
        assert "loads" not in vars(module) and "load" not in vars(module)


def test_a_snapshot_header_that_runs_code__is_refused() -> None:
    RAN.clear()
    header = pickle.dumps(_Calls(_ran, "snapshot"), protocol=2)
    data = SNAPSHOT_MAGIC + len(header).to_bytes(8, "big") + header + b"state"
    with pytest.raises(pickling.Refused):
        decode_raft_snapshot(data, "raft.snapshot")
    assert RAN == []
    # A header as xr writes one reads back.
    meta = ({"x": 1}, (b"\x00a", 2, 1), (b"\x00b", 1, 1), {TCPNode("127.0.0.1:1")})
    assert decode_raft_snapshot(encode_raft_snapshot(meta, b"state"), "s") == (meta, b"state")
