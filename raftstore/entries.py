"""What a pysyncobj log entry may hold, so that no entry can stop a cluster's log.

A pysyncobj 0.3.17 log entry is a byte string: a type byte (0 a call of a replicated method, 1 a
no-op, 2 a membership change, 3 a code version) and then a pickle. pysyncobj decodes an entry only
when it applies it, on every member, and an entry it cannot decode (a body that does not unpickle,
a method that does not exist, arguments of the wrong shape, an empty entry) raises on every tick
without being marked applied: that member's log stops there for good, restarts included, since the
entry is in its journal. And a leader puts into its log, undecoded, whatever command a peer
forwards it (`apply_command`), so one frame from anyone who could pose as a member (on loopback
without a cluster secret: anyone on the host) stopped every member's log for good. Found by a
scratch script this check's tests grew from (`tests/raftstore/test_raft_entries.py`).

Three checks, on the way into the log and out of it:
- `forwarded_group`: a leader takes from a peer only what an xr member forwards, a call of
  `apply_group` with one byte string; `Replica` drops anything else before pysyncobj sees it.
- `check_replicated`: a follower takes from a leader no entry it would choke on when it reads
  it on receipt (an empty one, a membership change that does not decode); `raftstore.messages`
  drops the message that holds one.
- `applicable_group`: an entry already in the log that cannot be applied (from a forged leader,
  or written by a member of another version) is skipped: applied as a no-op, and logged. Every
  member reads the same bytes, so every member skips the same entries and the replicas stay
  equal.

A group is checked here only for being bytes: `apply_group` decodes it, and answers a malformed
group by applying nothing, the same way on every member.
"""

from __future__ import annotations

from typing import Any

from pysyncobj.node import TCPNode

from raftstore import pickling

__all__ = ["APPLY_GROUP_ID", "BadEntry", "applicable_group", "check_replicated", "forwarded_group"]

# pysyncobj's `_COMMAND_TYPE`.
_REGULAR = 0
_MEMBERSHIP = 2
_VERSION = 3
# pysyncobj numbers replicated methods by sorted name; `Replica` has exactly one, `apply_group`.
APPLY_GROUP_ID = 0
_MEMBERSHIP_ACTIONS = ("add", "rem")


class BadEntry(ValueError):
    """An entry pysyncobj cannot apply, or a peer may not forward; the message says why."""


def _unpickled(body: bytes) -> Any:
    try:
        return pickling.loads(body)
    except Exception as error:  # what garbage raises while unpickling is not of one type
        raise BadEntry(f"its body does not unpickle ({type(error).__name__})") from None


def _group(body: bytes) -> bytes:
    """The group a regular entry's body passes `apply_group`."""
    call = _unpickled(body)
    # pysyncobj's `replicated` pickles (id, args) for xr's one call, `apply_group(group)`.
    if not isinstance(call, tuple) or len(call) != 2:
        raise BadEntry("it is not a call of apply_group with one argument")
    method, args = call
    if type(method) is not int or method != APPLY_GROUP_ID:
        raise BadEntry(
            f"it calls method {method!r}; the only replicated method is {APPLY_GROUP_ID}"
        )
    if not isinstance(args, tuple) or len(args) != 1 or not isinstance(args[0], bytes):
        raise BadEntry("apply_group's argument is not one byte string")
    group: bytes = args[0]
    return group


def forwarded_group(command: Any) -> bytes:
    """The group in `command`, which a peer forwarded to the leader; `BadEntry` unless it is what
    an xr member forwards."""
    if not isinstance(command, bytes) or command[:1] != bytes((_REGULAR,)):
        raise BadEntry("a forwarded command must be a call of apply_group (type 0), in bytes")
    return _group(command[1:])


def _check_member(value: Any) -> None:
    """`value` is an address ("host:port") or a `TCPNode` as pysyncobj makes one for it."""
    address = getattr(value, "_TCPNode__address", None) if isinstance(value, TCPNode) else value
    if not isinstance(address, str):
        raise BadEntry("a membership change names no member address")
    try:
        node = TCPNode(address)
    except ValueError:
        raise BadEntry(f"a membership change names {address!r}, not host:port") from None
    if isinstance(value, TCPNode) and vars(value) != vars(node):
        raise BadEntry("a membership change's node is not one pysyncobj makes")


def _check_membership(request: Any) -> None:
    if not isinstance(request, tuple | list) or len(request) not in (2, 3):
        raise BadEntry("a membership change is not (action, member[, node])")
    if request[0] not in _MEMBERSHIP_ACTIONS:
        raise BadEntry("a membership change names no known action")
    for member in request[1:]:
        _check_member(member)


def check_replicated(command: Any) -> None:
    """`BadEntry` if a follower could not take `command`, an entry its leader sends: pysyncobj
    reads the type of every entry and decodes a membership change on receipt, and an empty
    entry, one that is not bytes, or a change that does not decode raises there, every time the
    leader sends it. Anything else is read only when applied (`applicable_group`), and must be
    taken, or an entry already in a leader's log would keep its followers from catching up."""
    if not isinstance(command, bytes) or not command:
        raise BadEntry("the entry is not a non-empty byte string")
    if command[0] == _MEMBERSHIP:
        _check_membership(_unpickled(command[1:]))


def applicable_group(command: Any) -> bytes | None:
    """The group of the committed entry `command` if it is a regular one; None if it is another
    kind that pysyncobj can apply (a no-op, a membership change, a code version); `BadEntry` if
    it cannot be applied."""
    check_replicated(command)
    kind = command[0]
    if kind == _REGULAR:
        return _group(command[1:])
    if kind == _VERSION and type(_unpickled(command[1:])) is not int:
        raise BadEntry("a code version is not an integer")
    return None
