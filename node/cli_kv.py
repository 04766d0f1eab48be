"""`xr kv`: read, write, list and watch keys in the caller's namespace."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

import click

from node.cli_common import (
    CommandFailed,
    client_options,
    connect,
    emit,
    json_output,
    non_empty,
    one_line,
    table,
    to_document,
    value_fields,
)
from node.files import TooLarge, read_stream_bounded
from xrcore.errors import PayloadTooLarge
from xrcore.limits import RANGE_LIMIT_MAX, VALUE_BYTES_MAX

if TYPE_CHECKING:
    from xrcore.client import KeyValue, WatchEvent

__all__ = ["kv"]

# Values longer than this are cut in `xr kv ls` tables (`xr kv get` prints them whole).
_VALUE_SHOWN_CHARS_MAX = 40


@click.group()
def kv() -> None:
    """Read, write, list and watch keys."""


def _key_document(item: KeyValue) -> dict[str, Any]:
    return {
        "key": item.key,
        **value_fields(item.value),
        "create_revision": item.create_revision,
        "mod_revision": item.mod_revision,
        "version": item.version,
        "session_id": item.session_id,
    }


@kv.command("get")
@click.argument("key", callback=non_empty)
@client_options
def kv_get(key: str) -> int:
    """Print the value of KEY (exit code 1 if there is no such key).

    A UTF-8 value is printed as text with a newline; any other value is written to stdout as
    raw bytes. --json prints the key's document: value (text or null), value_base64 and its
    revisions.
    """
    with connect() as client:
        item = client.kv.get(key)
    if item is None:
        raise CommandFailed("not_found", f"key {key!r} does not exist")
    if json_output():
        emit(_key_document(item), "")
        return 0
    # As stored, byte for byte (click.echo would drop escape sequences when stdout is a file).
    try:
        item.value.decode()
        value = item.value + b"\n"
    except UnicodeDecodeError:
        value = item.value
    sys.stdout.buffer.write(value)
    sys.stdout.buffer.flush()
    return 0


@kv.command("put")
@click.argument("key", callback=non_empty)
@click.argument("value")
@click.option(
    "--expect-revision",
    type=click.IntRange(min=0),
    metavar="REVISION",
    help="Write only if the key's mod revision is REVISION (0: only if the key does not exist).",
)
@click.option(
    "--session",
    "session_id",
    callback=non_empty,
    metavar="ID",
    help="Tie the key to a session: it is deleted when the session ends.",
)
@client_options
def kv_put(key: str, value: str, expect_revision: int | None, session_id: str | None) -> int:
    """Set KEY to VALUE (`-` reads the value from stdin, as bytes).

    Prints the revision of the write. With --expect-revision the write is a compare-and-set: it
    fails with kv.compare_failed (exit code 1) if the key changed in between.
    """
    if value == "-":
        if sys.stdin is None:
            raise click.UsageError("VALUE is -, but there is no standard input to read it from")
        try:
            data = read_stream_bounded(sys.stdin.buffer, VALUE_BYTES_MAX)
        except TooLarge as error:
            raise PayloadTooLarge(f"the value on stdin is {error.strerror}") from None
    else:
        data = value.encode()
    with connect() as client:
        result = client.kv.put(
            key, data, expected_mod_revision=expect_revision, session_id=session_id
        )
    emit({"key": key, **to_document(result)}, f"revision {result.revision}")
    return 0


@kv.command("del")
@click.argument("key", callback=non_empty)
@client_options
def kv_del(key: str) -> int:
    """Delete KEY (deleting a key that does not exist is not an error)."""
    with connect() as client:
        result = client.kv.delete(key)
    human = (
        f"deleted {key} (revision {result.revision})"
        if result.deleted
        else f"{key} did not exist (revision {result.revision})"
    )
    emit({"key": key, **to_document(result)}, human)
    return 0


@kv.command("ls")
@click.option("--prefix", default="", help="Only keys that start with PREFIX.")
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    metavar="N",
    help="At most N keys [default: every key, read page by page].",
)
@client_options
def kv_ls(prefix: str, limit: int | None) -> int:
    """List keys with their values and revisions, in key order."""
    items: list[KeyValue] = []
    revision = 0
    after: str | None = None
    with connect() as client:
        while limit is None or len(items) < limit:
            page_size = (
                RANGE_LIMIT_MAX if limit is None else min(RANGE_LIMIT_MAX, limit - len(items))
            )
            page = client.kv.range(prefix, limit=page_size, after=after)
            revision = revision or page.revision
            items.extend(page.items)
            after = page.next
            if after is None:
                break

    def human() -> None:
        if not items:
            click.echo(f"no keys (revision {revision})")
            return
        rows = [
            [item.key, _short(item.value), item.mod_revision, item.version, item.session_id]
            for item in items
        ]
        click.echo(table(["KEY", "VALUE", "MOD REVISION", "VERSION", "SESSION"], rows))

    emit({"revision": revision, "items": [_key_document(item) for item in items]}, human)
    return 0


def _short(value: bytes, *, characters_max: int | None = _VALUE_SHOWN_CHARS_MAX) -> str:
    """A value on one line: text with control characters escaped (`one_line`), cut to
    `characters_max`."""
    try:
        text = one_line(value.decode())
    except UnicodeDecodeError:
        return f"({len(value)} bytes, not UTF-8)"
    if characters_max is not None and len(text) > characters_max:
        return text[: characters_max - 3] + "..."
    return text


@kv.command("watch")
@click.option("--prefix", default="", help="Only keys that start with PREFIX.")
@click.option(
    "--from-revision",
    type=click.IntRange(min=1),
    metavar="REVISION",
    help="First revision to show [default: the current revision + 1, i.e. changes from now].",
)
@click.option(
    "--count", type=click.IntRange(min=1), metavar="N", help="Stop after N events [default: never]."
)
@client_options
def kv_watch(prefix: str, from_revision: int | None, count: int | None) -> int:
    """Print changes to keys as they happen, until Ctrl-C.

    Each line is `<revision> put <key> <value>` or `<revision> delete <key>`; with --json each
    line is one JSON document. A watch that asks for revisions older than the retained history
    fails with kv.compacted.
    """
    shown = 0
    with connect() as client:
        if from_revision is None:
            from_revision = client.kv.range(prefix, limit=1).revision + 1
        with client.kv.watch(prefix, from_revision=from_revision) as events:
            for event in events:
                click.echo(_event_line(event))
                shown += 1
                if count is not None and shown >= count:
                    break
    return 0


def _event_line(event: WatchEvent) -> str:
    if json_output():
        document = {
            "revision": event.revision,
            "kind": event.kind,
            "key": event.key,
            **value_fields(event.value),
            "create_revision": event.create_revision,
            "version": event.version,
        }
        return json.dumps(document)
    key = one_line(event.key)
    if event.value is None:
        return f"{event.revision} {event.kind} {key}"
    return f"{event.revision} {event.kind} {key} {_short(event.value, characters_max=None)}"
