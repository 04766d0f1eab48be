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
    "newer_version",
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
    """The envelope as written."""

    v: int
    now_ms: int
    command: _CommandUnion
    client_id: str | None = None
    seq: int | None = None


class _WireHeader(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The envelope as read: the version is checked before the command is decoded, so an entry
    of another version is reported as such and not as a broken version-1 command."""

    v: int
    now_ms: int
    command: msgspec.Raw
    client_id: str | None = None
    seq: int | None = None


class _Version(msgspec.Struct):
    v: Any = None
    format: Any = None


_header_decoder = msgspec.msgpack.Decoder(_WireHeader)
_command_decoder: msgspec.msgpack.Decoder[Any] = msgspec.msgpack.Decoder(_CommandUnion)
_version_decoder = msgspec.msgpack.Decoder(_Version)
_encoder = msgspec.msgpack.Encoder()
_snapshot_decoder = msgspec.msgpack.Decoder(Snapshot)
_DECODE_ERRORS = (msgspec.DecodeError, msgspec.ValidationError, RecursionError)


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


def _version_of(data: bytes | memoryview) -> _Version:
    try:
        return _version_decoder.decode(data)
    except _DECODE_ERRORS:
        return _Version()


def newer_version(data: bytes | memoryview) -> int | None:
    """The envelope version of an entry a newer release wrote (an integer above
    `ENVELOPE_VERSION`), or None for an entry of this version or one that is merely malformed.
    A replica must not skip such an entry, as it skips a malformed one: the newer replicas apply
    it, and one that skipped it would differ from them from there on (`raftstore.replica`)."""
    version = _version_of(data).v
    if type(version) is int and version > ENVELOPE_VERSION:
        return version
    return None


def decode(data: bytes) -> Envelope:
    """Decodes one log entry; raises only `XrError` subclasses."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise CodecError(f"expected bytes, got {type(data).__name__}")
    if len(data) > limits.ENVELOPE_BYTES_MAX:
        raise PayloadTooLarge(f"entry is {len(data)} bytes, more than {limits.ENVELOPE_BYTES_MAX}")
    try:
        header = _header_decoder.decode(data)
    except _DECODE_ERRORS as error:
        version = _version_of(data).v
        if version is not None and version != ENVELOPE_VERSION:
            raise UnsupportedVersion(f"envelope version {version!r} is not supported") from None
        raise CodecError(f"malformed envelope: {error}") from None
    if header.v != ENVELOPE_VERSION:
        raise UnsupportedVersion(f"envelope version {header.v} is not supported")
    try:
        command = _command_decoder.decode(header.command)
    except _DECODE_ERRORS as error:
        raise CodecError(f"malformed command: {error}") from None
    return Envelope(
        v=header.v,
        now_ms=header.now_ms,
        command=command,
        client_id=header.client_id,
        seq=header.seq,
    )


def encode_snapshot(snapshot: Snapshot) -> bytes:
    return SNAPSHOT_MAGIC + _encoder.encode(snapshot)


def decode_snapshot(data: bytes) -> Snapshot:
    """Decodes a snapshot; raises only `CodecError` (or `UnsupportedVersion`)."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise CodecError(f"expected bytes, got {type(data).__name__}")
    if not bytes(data[: len(SNAPSHOT_MAGIC)]) == SNAPSHOT_MAGIC:
        raise CodecError("not an xr snapshot (bad magic)")
    body = memoryview(data)[len(SNAPSHOT_MAGIC) :]
    version = _version_of(body).format
    if version is not None and version != SNAPSHOT_FORMAT:
        raise UnsupportedVersion(f"snapshot format {version!r} is not supported")
    try:
        snapshot = _snapshot_decoder.decode(body)
    except _DECODE_ERRORS as error:
        raise CodecError(f"malformed snapshot: {error}") from None
    except XrError as error:
        # A record inside the snapshot (a job spec) broke its own rules: the file is corrupt.
        raise CodecError(f"malformed snapshot: {error.message}") from None
    if snapshot.format != SNAPSHOT_FORMAT:
        raise UnsupportedVersion(f"snapshot format {snapshot.format} is not supported")
    return snapshot
