"""The versioned key-value store: puts, deletes, compare-and-set, ranges and a watch history.

Every change increments the store's revision by one and is recorded in a bounded history, so a
watcher can resume from any revision that is still retained; older ones answer `Compacted`.
Each key carries its create revision, mod revision and version (number of puts since creation),
as in etcd. A key written under a session is deleted when that session ends.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from itertools import islice
from typing import TYPE_CHECKING, Any

from xrcore import tenants
from xrcore._validate import check_page_limit
from xrcore.commands import KvDelete, KvPut
from xrcore.errors import CapacityExceeded, Compacted, CompareFailed, InvalidArgument, NotFound
from xrcore.limits import PAGE_BYTES_MAX
from xrcore.model import KeyRecord, KvEvent

if TYPE_CHECKING:
    from xrcore.state import StateMachine

__all__ = ["REVISION_MAX", "KeyRecord", "delete", "delete_key", "get", "put", "range_", "watch"]

# Revisions are signed 64-bit on the wire; a watch cannot start beyond the last one.
REVISION_MAX = (1 << 63) - 1


def _compare(record: KeyRecord | None, expected_mod_revision: int | None, key: str) -> None:
    if expected_mod_revision is None:
        return
    actual = 0 if record is None else record.mod_revision
    if actual != expected_mod_revision:
        raise CompareFailed(
            f"key {key!r} has mod revision {actual}, expected {expected_mod_revision}"
        )


def put(machine: StateMachine, command: KvPut, index: int) -> dict[str, Any]:
    key = command.key
    record = machine.keys.get(key)
    _compare(record, command.expected_mod_revision, key)
    session = None
    if command.session_id is not None:
        session = machine.sessions.get(command.session_id)
        if session is None:
            raise NotFound(f"session {command.session_id!r} does not exist")
        attached = record is not None and record.session_id == command.session_id
        if not attached and len(session.keys) >= machine.limits.keys_per_session_max:
            raise CapacityExceeded(
                f"session {command.session_id!r} already holds "
                f"{machine.limits.keys_per_session_max} keys"
            )
    if record is None and len(machine.keys) >= machine.limits.keys_max:
        raise CapacityExceeded(f"the store holds its maximum of {machine.limits.keys_max} keys")
    if record is None:
        tenants.check_keys(machine, key)

    machine.revision += 1
    revision = machine.revision
    previous_revision = 0 if record is None else record.mod_revision
    if record is None:
        record = KeyRecord(
            value=command.value, create_revision=revision, mod_revision=revision, version=1
        )
        machine.keys[key] = record
        machine.add_sorted_key(key)
    else:
        record.value = command.value
        record.mod_revision = revision
        record.version += 1
    if record.session_id != command.session_id:
        if record.session_id is not None:
            machine.sessions[record.session_id].keys.remove(key)
        if session is not None:
            session.keys.append(key)
        record.session_id = command.session_id
    _record_event(machine, "put", key, record)
    return {
        "revision": revision,
        "previous_mod_revision": previous_revision,
        "version": record.version,
    }


def delete(machine: StateMachine, command: KvDelete, index: int) -> dict[str, Any]:
    record = machine.keys.get(command.key)
    _compare(record, command.expected_mod_revision, command.key)
    if record is None:
        return {"deleted": 0, "revision": machine.revision}
    delete_key(machine, command.key)
    return {"deleted": 1, "revision": machine.revision}


def delete_key(machine: StateMachine, key: str) -> None:
    """Deletes an existing key, detaching it from its session; one revision."""
    record = machine.keys.pop(key)
    machine.remove_sorted_key(key)
    if record.session_id is not None:
        session = machine.sessions.get(record.session_id)
        if session is not None and key in session.keys:
            session.keys.remove(key)
    machine.revision += 1
    record.mod_revision = machine.revision
    _record_event(machine, "delete", key, record)


def _record_event(machine: StateMachine, kind: str, key: str, record: KeyRecord) -> None:
    machine.history.append(
        KvEvent(
            revision=machine.revision,
            kind=kind,
            key=key,
            value=record.value if kind == "put" else None,
            create_revision=record.create_revision,
            version=record.version if kind == "put" else 0,
        )
    )


# Queries.


def _key_view(key: str, record: KeyRecord) -> dict[str, Any]:
    return {
        "key": key,
        "value": record.value,
        "create_revision": record.create_revision,
        "mod_revision": record.mod_revision,
        "version": record.version,
        "session_id": record.session_id,
    }


def get(machine: StateMachine, key: str) -> dict[str, Any]:
    record = machine.keys.get(key)
    if record is None:
        raise NotFound(f"key {key!r} does not exist")
    return {"revision": machine.revision, **_key_view(key, record)}


def range_(
    machine: StateMachine, prefix: str, *, limit: int = 100, after: str | None = None
) -> dict[str, Any]:
    """Keys starting with `prefix` in byte order, at most `limit`, starting after key `after`.
    `next` is the key to pass as `after` for the following page, or None at the end."""
    check_page_limit(limit)
    keys = machine.sorted_keys
    start = bisect_left(keys, prefix) if after is None else bisect_right(keys, max(after, prefix))
    items: list[dict[str, Any]] = []
    position = start
    page_bytes = 0
    while position < len(keys) and keys[position].startswith(prefix) and len(items) < limit:
        key = keys[position]
        record = machine.keys[key]
        page_bytes += len(key) + len(record.value)
        if items and page_bytes > PAGE_BYTES_MAX:
            break
        items.append(_key_view(key, record))
        position += 1
    more = position < len(keys) and keys[position].startswith(prefix)
    return {
        "revision": machine.revision,
        "items": items,
        "next": items[-1]["key"] if more and items else None,
    }


def watch(machine: StateMachine, from_revision: int, *, limit: int = 100) -> dict[str, Any]:
    """Changes with revision >= `from_revision`, oldest first, at most `limit`.
    Raises `Compacted` when some of them are no longer retained."""
    check_page_limit(limit)
    if not 1 <= from_revision <= REVISION_MAX:
        raise InvalidArgument(
            f"from_revision must be between 1 and {REVISION_MAX}, got {from_revision}"
        )
    history = machine.history
    oldest = history[0].revision if history else machine.revision + 1
    if from_revision < oldest:
        raise Compacted(
            f"revision {from_revision} is compacted; the oldest retained is {oldest}, "
            f"current is {machine.revision}"
        )
    skip = from_revision - oldest
    # A revision beyond the history selects nothing (islice refuses a bound past sys.maxsize).
    selected: list[KvEvent] = []
    page_bytes = 0
    for event in islice(history, skip, skip + limit) if skip < len(history) else ():
        page_bytes += len(event.key) + len(event.value or b"")
        if selected and page_bytes > PAGE_BYTES_MAX:
            break
        selected.append(event)
    events = [
        {
            "revision": event.revision,
            "kind": event.kind,
            "key": event.key,
            "value": event.value,
            "create_revision": event.create_revision,
            "version": event.version,
        }
        for event in selected
    ]
    next_revision = selected[-1].revision + 1 if selected else max(from_revision, oldest)
    return {"revision": machine.revision, "events": events, "next_revision": next_revision}
