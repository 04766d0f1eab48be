"""What a peer's Raft message may hold: the types and ranges pysyncobj itself sends.

pysyncobj 0.3.17 takes a message's fields as they come. A term that is a float, or an integer of
2**64 or more, is taken as the member's term, and the member then cannot write it into a log
entry (`struct.pack("<QQ", index, term)`): every election and every append raised from then on,
on every member that heard it, and the cluster never committed again; the term is in the
journal, so restarts did not help. Without a cluster secret one `request_vote` or
`append_entries` from anyone on the host did it (tests/raftstore/test_raft_messages.py). Other
fields of the wrong type raise in pysyncobj's handler, some after it has changed part of its
state.

`check` holds a message from a peer to what pysyncobj sends: every term and index an integer the
journal can write ([0, 2**64)), flags booleans, entries `(bytes, index, term)` that follow the
message's previous index one by one and carry no term above the message's, a snapshot chunk
`(bytes, bool, bool)`, and only the message types pysyncobj and xr send. An entry sent in chunks
(pysyncobj's `transmission`, for an entry over `raft.append_entries_batch_bytes`) is refused:
xr's settings keep every entry under that size, so no member sends one, and pysyncobj took the
reassembled entry as it came (a string command or an index out of place stalled the cluster, as
above) and held the chunks without a bound. `Replica` drops a message that fails before
pysyncobj sees it.

This does not make a stranger who poses as a member harmless; only the cluster secret does that:
well-formed messages of a higher term still let it rewrite the cluster's state, or hold off
elections while it sends them. Nor can any check stop it from using up the terms: a term of
2**64 - 1 is one the journal can write, and the next election's term is not (the member becomes
a candidate for good, at terms the others drop). A bound below that
only moves the edge: a stranger sets one member's term at the bound and the others refuse that
member's next term, so no leader is ever elected again. A bound relative to the receiver's own
term (at most 2**32 ahead, tried) splits the members the same way, in one message, as the
simulated stranger of tests/sim/test_stranger.py found on its first seed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from raftstore import entries

__all__ = ["INT_MAX", "PRE_VOTE", "PRE_VOTE_RESPONSE", "BadMessage", "check"]

# xr's pre-vote messages (`Replica._may_campaign`); pysyncobj never sees them.
PRE_VOTE = "xr_pre_vote"
PRE_VOTE_RESPONSE = "xr_pre_vote_response"

# The journal writes terms and indexes as unsigned 64-bit integers.
INT_MAX = (1 << 64) - 1


class BadMessage(ValueError):
    """A peer's message that pysyncobj never sends; the message says what is wrong."""


def _is_int(value: Any) -> bool:
    return type(value) is int and 0 <= value <= INT_MAX


def _ints(message: dict[str, Any], *names: str) -> None:
    for name in names:
        if not _is_int(message.get(name)):
            raise BadMessage(f"{name} is not an integer in [0, 2**64)")


def _flags(message: dict[str, Any], *names: str) -> None:
    for name in names:
        if type(message.get(name)) is not bool:
            raise BadMessage(f"{name} is not a boolean")


def _check_entries(message: dict[str, Any]) -> None:
    """Entries follow `prevLogIdx` one by one, each `(command, index, term)`."""
    found = message.get("entries", [])
    if not isinstance(found, list):
        raise BadMessage("entries is not a list")
    term = message["term"]
    next_index = message["prevLogIdx"] + 1
    for entry in found:
        if not isinstance(entry, tuple | list) or len(entry) != 3:
            raise BadMessage("an entry is not (command, index, term)")
        command, index, entry_term = entry
        try:
            entries.check_replicated(command)
        except entries.BadEntry as error:
            raise BadMessage(f"an entry: {error}") from None
        if type(index) is not int or index != next_index:
            raise BadMessage(f"an entry's index is {index!r}, not the next one, {next_index}")
        if type(entry_term) is not int or not 0 <= entry_term <= term:
            raise BadMessage("an entry's term is not an integer up to the message's")
        next_index += 1


def _append_entries(message: dict[str, Any]) -> None:
    _ints(message, "term", "commit_index")
    if "prevLogIdx" in message:
        _ints(message, "prevLogIdx", "prevLogTerm")
        _check_entries(message)
        if "transmission" in message:
            raise BadMessage(
                "no member sends an entry in chunks (raft.group_bytes_max keeps every entry "
                "under raft.append_entries_batch_bytes)"
            )
        return
    serialized = message.get("serialized")
    if serialized is not None and not (
        isinstance(serialized, tuple | list)
        and len(serialized) == 3
        and isinstance(serialized[0], bytes)
        and type(serialized[1]) is bool
        and type(serialized[2]) is bool
    ):
        raise BadMessage("a snapshot chunk is not (bytes, first, last)")


def _next_node_idx(message: dict[str, Any]) -> None:
    _ints(message, "next_node_idx")
    _flags(message, "reset", "success")


def _apply_command(message: dict[str, Any]) -> None:
    if "request_id" in message:
        _ints(message, "request_id")
    try:
        entries.forwarded_group(message.get("command"))
    except entries.BadEntry as error:
        raise BadMessage(str(error)) from None


def _apply_command_response(message: dict[str, Any]) -> None:
    _ints(message, "request_id")
    if "error" in message:
        _ints(message, "error")
    else:
        _ints(message, "log_idx", "log_term")


def _pre_vote_response(message: dict[str, Any]) -> None:
    _ints(message, "term")
    _flags(message, "granted")
    # Sent since session 25: the voter's term, which a member behind it takes.
    if "current_term" in message:
        _ints(message, "current_term")


_CHECKS: dict[str, Callable[[dict[str, Any]], None]] = {
    "request_vote": lambda message: _ints(message, "term", "last_log_index", "last_log_term"),
    "response_vote": lambda message: _ints(message, "term"),
    "timeout_now": lambda message: _ints(message, "term"),
    "append_entries": _append_entries,
    "next_node_idx": _next_node_idx,
    "apply_command": _apply_command,
    "apply_command_response": _apply_command_response,
    PRE_VOTE: lambda message: _ints(message, "term", "last_log_index", "last_log_term"),
    PRE_VOTE_RESPONSE: _pre_vote_response,
}


def check(message: Any) -> None:
    """`BadMessage` unless `message`, from a peer, is one pysyncobj or xr sends."""
    if not isinstance(message, dict):
        raise BadMessage("a message is not a dict")
    kind = message.get("type")
    checker = _CHECKS.get(kind) if isinstance(kind, str) else None
    if checker is None:
        raise BadMessage(f"no member sends a message of type {kind!r}")
    checker(message)
