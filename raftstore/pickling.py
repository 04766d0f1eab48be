"""What a member unpickles: the plain data pysyncobj's messages are made of, and nothing that runs
code.

pysyncobj 0.3.17 pickles everything it sends a peer (Raft messages, the handshake), its own log
commands (a membership change, a code version) and the header of a snapshot, and reads all of it
back with `pickle.loads`, which calls whatever function a pickle names. Without a cluster secret
anyone who reaches a Raft port could so run code in the member, and with one anyone who holds the
secret; a log entry or a snapshot a peer sends is unpickled the same way when it is applied or
loaded. xr's commands reach pickle only as one byte string per log entry (a msgpack group of
xrcore envelopes, the argument of `Replica.apply_group`), so pysyncobj needs very little of it:

- strings, numbers, bytes, lists, tuples, dicts, None and booleans, which pickle builds itself;
- sets (the member set in a snapshot's header);
- `pysyncobj.node.TCPNode` (a member, in a membership change and in a snapshot's header), a plain
  object whose state is its address;
- and, in pickles made with protocol 2 (what pysyncobj 0.3.17 writes, so what older members send
  and older journals and snapshots hold), bytes spelled as `_codecs.encode(text, "latin1")`, and
  empty bytes spelled as `bytes()`.

`install` makes pysyncobj's `loads` and `load` (and the journal's, which it imported by name)
refuse every other global with `pickle.UnpicklingError`, as they refused garbage: a message that
does not load closes its connection (tests/raftstore/test_raft_identity.py), a command a peer
forwards that does not is dropped, and a log entry that does not is skipped on every member
(`raftstore.entries`). It also makes pysyncobj pickle
with protocol 5 instead of 2: bytes are then written as themselves, so a message names no global
at all, and the messages of a put are pickled and unpickled in 0.65x the time pysyncobj's own
functions take (`bench/pickling.py`). Every Python that runs xr reads protocol 5, so members of
older versions read these frames and entries, and these members read theirs.
"""

from __future__ import annotations

import io
import pickle
from typing import IO, Any

import pysyncobj.journal as journal_module
import pysyncobj.pickle as pysyncobj_pickle
from pysyncobj.node import TCPNode

__all__ = ["PICKLE_PROTOCOL", "Refused", "dump", "dumps", "install", "load", "loads"]

PICKLE_PROTOCOL = 5


class Refused(pickle.UnpicklingError):
    """A pickle named a global that pysyncobj's data never holds."""


def _latin1_bytes(text: Any, encoding: Any) -> bytes:
    """How protocol 2 spells bytes, `_codecs.encode(text, "latin1")`, and nothing else: any
    other codec, or anything but a string, is refused."""
    if type(text) is not str or encoding not in ("latin1", "latin-1"):
        raise Refused("_codecs.encode is allowed only for bytes spelled as latin-1 text")
    return text.encode("latin-1")


def _empty_bytes(*args: Any) -> bytes:
    """How protocol 2 spells empty bytes, `bytes()`; with arguments `bytes` could be made to
    allocate any size, so arguments are refused."""
    if args:
        raise Refused("bytes is allowed only without arguments, for empty bytes")
    return b""


_ALLOWED: dict[tuple[str, str], Any] = {
    ("_codecs", "encode"): _latin1_bytes,
    ("builtins", "bytes"): _empty_bytes,
    ("__builtin__", "bytes"): _empty_bytes,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    # Protocol 2 names Python 2's module; pickle maps it only in its own `find_class`.
    ("__builtin__", "set"): set,
    ("__builtin__", "frozenset"): frozenset,
    ("pysyncobj.node", "TCPNode"): TCPNode,
}


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        found = _ALLOWED.get((module, name))
        if found is None:
            raise Refused(f"a peer's pickle may not name {module}.{name}")
        return found


def loads(data: bytes | bytearray | memoryview | str) -> Any:
    if isinstance(data, str):
        data = data.encode()
    return _Unpickler(io.BytesIO(data)).load()


def load(file: IO[bytes]) -> Any:
    return _Unpickler(file).load()


def dumps(obj: Any, protocol: int | None = None) -> bytes:
    """Protocol 5 whatever `protocol` pysyncobj asks for (it asks for none)."""
    return pickle.dumps(obj, PICKLE_PROTOCOL)


def dump(obj: Any, file: IO[bytes], protocol: int | None = None) -> None:
    pickle.dump(obj, file, PICKLE_PROTOCOL)


def install() -> None:
    """Replaces pysyncobj's pickling functions (idempotent). Its modules call them through
    `pysyncobj.pickle` at call time, except the journal, which imported them by name."""
    for name, function in (("loads", loads), ("load", load), ("dumps", dumps), ("dump", dump)):
        setattr(pysyncobj_pickle, name, function)
    journal_module.loads = loads
    journal_module.dumps = dumps
