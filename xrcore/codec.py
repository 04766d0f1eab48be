"""The wire format of commands and snapshots: an explicit, versioned msgpack envelope.

A log entry is the msgpack map
    {"v": 1, "now_ms": <proposer's clock>, "client_id": str|nil, "seq": int|nil,
     "command": {"type": "<tag>", ...fields}}
Decoding either returns a well-formed `Envelope` or raises a typed `XrError` (`CodecError`, or
`InvalidArgument` when the values break a command's rules); never anything else. Snapshots are the
msgpack encoding of `model.Snapshot` behind their own version number.
"""

from __future__ import annotations

from typing import Any, Union

import msgspec

from xrcore import limits
from xrcore._validate import WireStruct, check_name
from xrcore.commands import COMMAND_TYPES, Command
from xrcore.errors import CodecError, InvalidArgument, PayloadTooLarge, UnsupportedVersion, XrError
from xrcore.model import Snapshot

__all__ = [
    "ENVELOPE_VERSION",
    "SNAPSHOT_FORMAT",
    "Envelope",
    "decode",
    "decode_snapshot",
    "encode",
    "encode_snapshot",
]

ENVELOPE_VERSION = 1
SNAPSHOT_FORMAT = 1
SNAPSHOT_MAGIC = b"xrsnap1\n"
SEQ_MAX = (1 << 63) - 1


class Envelope(WireStruct, frozen=True):
    """One replicated entry: a command, the proposer's wall clock, and its request id."""

    command: Command
    now_ms: int
    client_id: str | None = None
    seq: int | None = None
    v: int = ENVELOPE_VERSION

    def validate(self) -> None:
        if type(self.command) not in COMMAND_TYPES:
            raise InvalidArgument(f"{type(self.command).__name__} is not a command type")
        if self.v != ENVELOPE_VERSION:
            raise UnsupportedVersion(f"envelope version {self.v} is not supported")
        if self.now_ms < 0:
            raise InvalidArgument(f"now_ms must be >= 0, got {self.now_ms}")
        if (self.client_id is None) != (self.seq is None):
            raise InvalidArgument("client_id and seq must be given together")
        if self.client_id is not None:
            check_name("client_id", self.client_id)
        if self.seq is not None and not 1 <= self.seq <= SEQ_MAX:
            raise InvalidArgument(f"seq must be between 1 and {SEQ_MAX}, got {self.seq}")


_CommandUnion: Any = Union[COMMAND_TYPES]  # noqa: UP007 - built from a tuple at run time


class _WireEnvelope(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    v: int
    now_ms: int
    command: _CommandUnion
    client_id: str | None = None
    seq: int | None = None


class _Version(msgspec.Struct):
    v: Any = None


_envelope_decoder = msgspec.msgpack.Decoder(_WireEnvelope)
_version_decoder = msgspec.msgpack.Decoder(_Version)
_encoder = msgspec.msgpack.Encoder()
_snapshot_decoder = msgspec.msgpack.Decoder(Snapshot)


def encode(envelope: Envelope) -> bytes:
    wire = _WireEnvelope(
        v=envelope.v,
        now_ms=envelope.now_ms,
        command=envelope.command,
        client_id=envelope.client_id,
        seq=envelope.seq,
    )
    data = _encoder.encode(wire)
    if len(data) > limits.ENVELOPE_BYTES_MAX:
        raise PayloadTooLarge(
            f"command is {len(data)} bytes encoded, more than {limits.ENVELOPE_BYTES_MAX}"
        )
    return data


def _version_of(data: bytes) -> Any:
    try:
        return _version_decoder.decode(data).v
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return None


def decode(data: bytes) -> Envelope:
    """Decodes one log entry; raises only `XrError` subclasses."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise CodecError(f"expected bytes, got {type(data).__name__}")
    if len(data) > limits.ENVELOPE_BYTES_MAX:
        raise PayloadTooLarge(f"entry is {len(data)} bytes, more than {limits.ENVELOPE_BYTES_MAX}")
    try:
        wire = _envelope_decoder.decode(data)
    except XrError:
        raise
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as error:
        version = _version_of(bytes(data))
        if version is not None and version != ENVELOPE_VERSION:
            raise UnsupportedVersion(f"envelope version {version!r} is not supported") from None
        raise CodecError(f"malformed command: {error}") from None
    return Envelope(
        v=wire.v,
        now_ms=wire.now_ms,
        command=wire.command,
        client_id=wire.client_id,
        seq=wire.seq,
    )


def encode_snapshot(snapshot: Snapshot) -> bytes:
    return SNAPSHOT_MAGIC + _encoder.encode(snapshot)


def decode_snapshot(data: bytes) -> Snapshot:
    if not data.startswith(SNAPSHOT_MAGIC):
        raise CodecError("not an xr snapshot (bad magic)")
    try:
        snapshot = _snapshot_decoder.decode(memoryview(data)[len(SNAPSHOT_MAGIC) :])
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as error:
        raise CodecError(f"malformed snapshot: {error}") from None
    if snapshot.format != SNAPSHOT_FORMAT:
        raise UnsupportedVersion(f"snapshot format {snapshot.format} is not supported")
    return snapshot
