"""Bad input for the codec beyond `test_codec.py`'s fuzzing: every truncation of every golden
entry, msgpack headers that claim huge lengths, deep nesting, oversize entries, extension types,
integers outside 64 bits, values that are not bytes at all, and streams of random msgpack tokens.

Whatever arrives, `decode` and `decode_snapshot` answer with a well-formed value or a typed
`XrError` (`CodecError`, `UnsupportedVersion`, `InvalidArgument`, `PayloadTooLarge`), never with
another exception, and a huge claimed length never makes them allocate it. An envelope that does
decode re-encodes to the same envelope. `SLOW_EXAMPLES` examples per property run under the slow
marker (`make test-slow`).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from functools import partial
from typing import Any

import msgpack  # type: ignore[import-untyped]
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.xrcore.test_codec import BASE_SNAPSHOT, EXAMPLE_BYTES, EXAMPLES
from xrcore import StateMachine, kv, limits
from xrcore.codec import Envelope, decode, decode_snapshot, encode
from xrcore.commands import KvPut
from xrcore.errors import CodecError, InvalidArgument, PayloadTooLarge, XrError
from xrcore.model import Snapshot

SLOW_EXAMPLES = 5_000


def typed(action: Callable[[], Any]) -> Any:
    """The value `action` returns, or None when it raised an `XrError`; any other exception fails
    the test with the input that caused it."""
    try:
        return action()
    except XrError:
        return None


def check_entry(data: Any) -> Envelope | None:
    envelope: Envelope | None = typed(lambda: decode(data))
    if envelope is not None:
        assert type(envelope) is Envelope
        assert decode(encode(envelope)) == envelope
    return envelope


# Truncation: every prefix of every golden entry, and a sample of the snapshot's.


@pytest.mark.parametrize("position", range(len(EXAMPLE_BYTES)))
def test_every_truncation_of_a_golden_entry__is_a_codec_error(position: int) -> None:
    data = EXAMPLE_BYTES[position]
    for end in range(len(data)):
        with pytest.raises(CodecError):
            decode(data[:end])


def test_truncations_of_a_snapshot__are_codec_errors() -> None:
    # A prefix of a msgpack document is never a complete document, so each one is refused.
    for end in range(0, len(BASE_SNAPSHOT), 3):
        with pytest.raises(CodecError):
            decode_snapshot(BASE_SNAPSHOT[:end])


# Huge claimed lengths: a header that says 4 GiB follows, with a few bytes behind it.

_HUGE_HEADERS = {
    "bin32": b"\xc6\xff\xff\xff\xff",
    "str32": b"\xdb\xff\xff\xff\xff",
    "array32": b"\xdd\xff\xff\xff\xff",
    "map32": b"\xdf\xff\xff\xff\xff",
    "ext32": b"\xc9\xff\xff\xff\xff\x01",
    "array16": b"\xdc\xff\xff",
    "map16": b"\xde\xff\xff",
}


@pytest.mark.parametrize("header", sorted(_HUGE_HEADERS))
def test_huge_claimed_length__anywhere_in_an_entry__is_a_codec_error(header: str) -> None:
    data = EXAMPLE_BYTES[0]
    for position in range(len(data) + 1):
        crafted = data[:position] + _HUGE_HEADERS[header] + data[position:]
        typed(partial(decode, crafted))
    with pytest.raises(CodecError):
        decode(_HUGE_HEADERS[header] + b"\x00" * 16)


@pytest.mark.parametrize("header", sorted(_HUGE_HEADERS))
def test_huge_claimed_length__after_the_snapshot_magic__is_a_codec_error(header: str) -> None:
    body = BASE_SNAPSHOT[len(b"xrsnap1\n") :]
    with pytest.raises(CodecError):
        decode_snapshot(b"xrsnap1\n" + _HUGE_HEADERS[header] + body)


# Nesting and size.


@pytest.mark.parametrize("depth", [64, 1_000, 50_000])
@pytest.mark.parametrize("opener", [b"\x91", b"\x81\xa1k"])
def test_deep_nesting__is_a_codec_error(depth: int, opener: bytes) -> None:
    nested = opener * depth + b"\xc0"
    with pytest.raises(CodecError):
        decode(nested)
    # The same nesting in the place of the command, behind a valid header.
    envelope = b"\x83\xa1v\x01\xa6now_ms\x01\xa7command" + nested
    with pytest.raises(CodecError):
        decode(envelope)


def test_entry_over_the_size_limit__is_payload_too_large_before_it_is_read() -> None:
    for data in (
        b"\x00" * (limits.ENVELOPE_BYTES_MAX + 1),
        b"\xc1" * (4 * limits.ENVELOPE_BYTES_MAX),
    ):
        with pytest.raises(PayloadTooLarge):
            decode(data)


def test_entry_exactly_at_the_size_limit__is_read() -> None:
    # The limit is inclusive: an entry of exactly ENVELOPE_BYTES_MAX bytes is decoded (and
    # refused for what it holds, here padding after a valid entry).
    data = EXAMPLE_BYTES[0]
    padded = data + b"\xc0" * (limits.ENVELOPE_BYTES_MAX - len(data))
    with pytest.raises(CodecError):
        decode(padded)


# Values that are not bytes at all.


@pytest.mark.parametrize(
    "value",
    [None, 0, 1.5, "text", [b"x"], {"v": 1}, (EXAMPLE_BYTES[0],), object(), EXAMPLES["tick"]],
    ids=lambda value: type(value).__name__,
)
def test_not_bytes__is_a_codec_error(value: Any) -> None:
    with pytest.raises(CodecError):
        decode(value)
    with pytest.raises(CodecError):
        decode_snapshot(value)


def test_state_machine__given_an_entry_that_is_not_bytes__answers_an_error_result() -> None:
    machine = StateMachine.restore(BASE_SNAPSHOT)
    before = machine.snapshot()
    applied = machine.apply("not bytes", machine.index + 1)  # type: ignore[arg-type]
    assert applied.result.error is not None
    assert applied.result.error.code == CodecError.code
    assert decode_snapshot(machine.snapshot()).keys == decode_snapshot(before).keys


# Random msgpack token streams: headers of every kind with lengths that may lie.

_FIXED_TOKENS = [
    b"\xc0",  # nil
    b"\xc2",  # false
    b"\xc3",  # true
    b"\xc1",  # never used
    b"\xca\x7f\xc0\x00\x00",  # float32 NaN
    b"\xcb\x7f\xf0\x00\x00\x00\x00\x00\x00",  # float64 +inf
    b"\xcf\xff\xff\xff\xff\xff\xff\xff\xff",  # uint64 max
    b"\xd3\x80\x00\x00\x00\x00\x00\x00\x00",  # int64 min
    b"\xd6\xff\x00\x00\x00\x00",  # timestamp32
    b"\xd7\xff" + b"\x00" * 8,  # timestamp64
    b"\xd4\x01\x00",  # fixext1
]
_KEYS = sorted({"v", "now_ms", "command", "client_id", "seq", "type", "key", "value", "spec"})


@st.composite
def msgpack_tokens(draw: st.DrawFn) -> bytes:
    """A sequence of msgpack tokens whose headers may claim more (or fewer) items than follow."""
    parts: list[bytes] = []
    for _ in range(draw(st.integers(min_value=1, max_value=24))):
        kind = draw(st.sampled_from(["fixed", "int", "key", "str", "bin", "array", "map", "raw"]))
        if kind == "fixed":
            parts.append(draw(st.sampled_from(_FIXED_TOKENS)))
        elif kind == "int":
            parts.append(msgpack.packb(draw(st.integers(-(1 << 63), (1 << 64) - 1))))
        elif kind == "key":
            parts.append(msgpack.packb(draw(st.sampled_from(_KEYS))))
        elif kind in ("str", "bin"):
            claimed = draw(st.integers(min_value=0, max_value=(1 << 32) - 1))
            marker = b"\xdb" if kind == "str" else b"\xc6"
            parts.append(marker + struct.pack(">I", claimed) + draw(st.binary(max_size=8)))
        elif kind in ("array", "map"):
            claimed = draw(st.integers(min_value=0, max_value=(1 << 32) - 1))
            marker = b"\xdd" if kind == "array" else b"\xdf"
            parts.append(marker + struct.pack(">I", claimed))
        else:
            parts.append(draw(st.binary(min_size=1, max_size=4)))
    return b"".join(parts)


@given(msgpack_tokens())
def test_fuzz__msgpack_token_streams__decode_raises_only_typed_errors(data: bytes) -> None:
    check_entry(data)


@given(msgpack_tokens())
def test_fuzz__msgpack_token_streams_after_a_valid_header__decode_raises_only_typed_errors(
    data: bytes,
) -> None:
    check_entry(b"\x83\xa1v\x01\xa6now_ms\x01\xa7command" + data)


@given(msgpack_tokens())
def test_fuzz__msgpack_token_streams__decode_snapshot_raises_only_typed_errors(
    data: bytes,
) -> None:
    snapshot = typed(lambda: decode_snapshot(b"xrsnap1\n" + data))
    assert snapshot is None or type(snapshot) is Snapshot


@pytest.mark.slow
@settings(max_examples=SLOW_EXAMPLES)
@given(data=msgpack_tokens(), behind_header=st.booleans())
def test_fuzz__msgpack_token_streams__long_run(data: bytes, behind_header: bool) -> None:
    prefix = b"\x83\xa1v\x01\xa6now_ms\x01\xa7command" if behind_header else b""
    check_entry(prefix + data)
    typed(lambda: decode_snapshot(b"xrsnap1\n" + data))


# Integers msgpack cannot write (found through the HTTP API by tests/node/test_schemathesis.py).


@pytest.mark.parametrize("value", [1 << 64, -(1 << 63) - 1, 10**30])
def test_command_with_an_integer_beyond_64_bits__is_invalid_when_built(value: int) -> None:
    with pytest.raises(InvalidArgument):
        KvPut(key="k", value=b"x", expected_mod_revision=value)


def test_watch_from_a_revision_beyond_64_bits__is_invalid_not_a_crash() -> None:
    machine = StateMachine.restore(BASE_SNAPSHOT)
    with pytest.raises(InvalidArgument):
        kv.watch(machine, 10**25)
    # A revision past the history but within range selects nothing.
    assert kv.watch(machine, kv.REVISION_MAX)["events"] == []
