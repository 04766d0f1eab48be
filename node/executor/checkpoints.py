"""Checkpoint storage: the `CheckpointStore` interface and its filesystem backend.

A checkpoint is a set of named arrays plus a small JSON `meta` object, saved by one attempt of one
task at one step. It is stored incrementally: each array's bytes are cut into chunks named by their
SHA-256, and a chunk that is already stored is not written again, so weights that did not change
since the last checkpoint cost nothing (`SavedCheckpoint.bytes_written` says what was new). A small
manifest names the chunks, each array's dtype and shape, the step, the attempt's fencing token (also
in the manifest's name, so attempts never overwrite each other) and a digest of its own contents.
An attempt never replaces a manifest it wrote either: `save` refuses a step it wrote before
(`CheckpointExists`), as the log may name that manifest with its checksum.

Layout of `FileCheckpointStore(root, area=tenant_area(tenant))`, a directory every region
reaches, one area per tenant:

    root/tenants/<tenant>/chunks/<sha256>           array bytes, shared by the tenant's jobs
    root/tenants/<tenant>/<job_id>/<task_index>/step-<step:012d>-token-<token>.json
                                                    one manifest per checkpoint

An area is its tenant's alone: chunks are shared between a tenant's jobs, never across tenants,
so a tenant's area can be given to an OS user of its own (`executor.tenant_users`, mode 0700)
and no other tenant's job reads or overwrites anything in it. Versions before areas wrote
`root/chunks/` and `root/<job_id>/...` (the area ""): a store still loads such a checkpoint (a
task resumed after an upgrade) but writes, lists and collects only in its own area.

A checkpoint's URI is its manifest's path relative to `root` (`tenants/<tenant>/<job_id>/...`),
so regions that mount the shared directory at different paths agree on it. Its checksum
(`sha256:<hex>` of the manifest bytes) is what the log records when the checkpoint is
committed; `load` verifies it and every chunk's hash.

Rules:
- Every file is written atomically: a temporary file in the same directory, written, fsynced,
  renamed over the final name, then the directory fsynced. A crash leaves either the whole file or
  none (plus a temporary file that garbage collection removes).
- Garbage collection deletes one task's manifests that are not kept, but never those of a newer
  attempt (a higher token), so a superseded attempt still running cannot delete its successor's
  checkpoints. It then deletes chunks that no manifest in the store references.
- Concurrent saves: a save that reuses a stored chunk refreshes its modification time first, and
  garbage collection spares chunks (and temporary files) modified within the grace period, so a
  chunk a save is about to reference is not deleted under it. This assumes a save finishes within
  the grace period (an hour by default).

Next backend: an object store such as S3. Manifests and chunks map to objects one for one; a
conditional put (`If-None-Match: *`) writes a chunk only if it is absent, which replaces both the
existence check and the temporary file; the grace period becomes the object's last-modified time,
refreshed by a copy-in-place, or replaced by a lifecycle rule on unreferenced chunks.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote, unquote

import msgspec
import numpy as np

from node.executor.arrays import to_numpy
from raftstore.files import fsync_directory, write_file_durably

__all__ = [
    "ARRAYS_PER_CHECKPOINT_MAX",
    "CHECKPOINT_BYTES_MAX",
    "CHUNK_BYTES",
    "CHUNK_GRACE_S",
    "META_BYTES_MAX",
    "Checkpoint",
    "CheckpointError",
    "CheckpointExists",
    "CheckpointInfo",
    "CheckpointStore",
    "CheckpointTooLarge",
    "CorruptCheckpoint",
    "FileCheckpointStore",
    "GarbageCollected",
    "SavedCheckpoint",
    "checksum_of",
    "tenant_area",
]

# Named arrays in one checkpoint.
ARRAYS_PER_CHECKPOINT_MAX = 1_024
# All arrays of one checkpoint together.
CHECKPOINT_BYTES_MAX = 16 << 30
# Arrays are cut into chunks of this size: memory for hashing stays bounded, and a large array
# whose tail alone changed rewrites only its last chunks.
CHUNK_BYTES = 16 << 20
# `meta`, encoded as JSON; it holds small things (step counters, losses), never arrays.
META_BYTES_MAX = 64 * 1024
ARRAY_NAME_BYTES_MAX = 256
# A manifest lists at most ARRAYS_PER_CHECKPOINT_MAX arrays of at most a few thousand chunks.
MANIFEST_BYTES_MAX = 16 << 20
# Garbage collection spares chunks and temporary files modified more recently than this.
CHUNK_GRACE_S = 3_600.0

_FORMAT = 1
_CHUNKS = "chunks"
_TENANTS = "tenants"
_MANIFEST_NAME = re.compile(r"step-(\d{12,19})-token-(\d{1,19})\.json")
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
_TEMPORARY_SUFFIX = ".tmp"


class CheckpointError(Exception):
    """Root of the checkpoint store's errors."""


class CorruptCheckpoint(CheckpointError):
    """A checkpoint's manifest or one of its chunks is missing, or does not match its hash."""


class CheckpointExists(CheckpointError, ValueError):
    """A checkpoint at this step of this attempt is written already (`save` never replaces)."""


class CheckpointTooLarge(CheckpointError, ValueError):
    """A checkpoint exceeds one of the store's limits; nothing was written."""


@dataclass(frozen=True, kw_only=True)
class SavedCheckpoint:
    uri: str
    # "sha256:<hex>" of the manifest's bytes: what the log records and `load` verifies.
    checksum: str
    # The manifest and every chunk it references.
    size_bytes: int
    # What this save actually wrote: the manifest and the chunks that were not stored yet.
    bytes_written: int


@dataclass(frozen=True, kw_only=True)
class CheckpointInfo:
    uri: str
    step: int
    token: int


@dataclass(frozen=True, kw_only=True)
class Checkpoint:
    uri: str
    step: int
    token: int
    arrays: dict[str, np.ndarray[Any, Any]]
    meta: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class GarbageCollected:
    manifests_deleted: list[str] = field(default_factory=list)
    chunks_deleted: int = 0
    bytes_freed: int = 0


class CheckpointStore(Protocol):
    """Where checkpoints live. Shaped for object stores too: keys are flat names, every write is
    a whole object, and nothing relies on renaming a directory."""

    def save(
        self,
        job_id: str,
        task_index: int,
        *,
        step: int,
        token: int,
        arrays: Mapping[str, Any],
        meta: Mapping[str, Any],
    ) -> SavedCheckpoint: ...

    def load(self, uri: str, checksum: str | None) -> Checkpoint:
        """The checkpoint at `uri`, verified against `checksum` (None: against the manifest's
        own digest only). Raises CorruptCheckpoint."""
        ...

    def list_checkpoints(self, job_id: str, task_index: int) -> list[CheckpointInfo]:
        """The task's manifests, oldest step first."""
        ...

    def delete(self, uri: str) -> None: ...

    def garbage_collect(
        self, job_id: str, task_index: int, keep_uris: Iterable[str], *, token: int
    ) -> GarbageCollected: ...


class _ArrayEntry(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    dtype: str
    shape: list[int]
    size_bytes: int
    chunks: list[str]


class _Manifest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    format: int
    job_id: str
    task_index: int
    step: int
    token: int
    meta: dict[str, Any]
    arrays: dict[str, _ArrayEntry]
    # "sha256:<hex>" of this manifest encoded with sorted keys and an empty digest: lets a
    # manifest be verified when the log's checksum for it is not known (the fallback on restore).
    digest: str = ""


_manifest_decoder = msgspec.json.Decoder(_Manifest)


def checksum_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def tenant_area(tenant: str) -> str:
    """The tenant's area of the store, relative to its root: one directory level per part, the
    tenant's name quoted (names may hold "/")."""
    return f"{_TENANTS}/{quote(tenant, safe='')}"


def _digest(manifest: _Manifest) -> str:
    canonical = msgspec.json.encode(msgspec.structs.replace(manifest, digest=""), order="sorted")
    return checksum_of(canonical)


class FileCheckpointStore:
    """The filesystem backend; see the module docstring for its layout and rules."""

    def __init__(
        self,
        root: Path,
        *,
        area: str = "",
        chunk_grace_s: float = CHUNK_GRACE_S,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        # URIs are relative to `root`; this store writes, lists and collects in `home` only.
        self.root = root
        self.area = area
        self.home = root / area if area else root
        self._area_parts = area.split("/") if area else []
        if any(part in ("", ".", "..") for part in self._area_parts) or area.startswith("/"):
            raise ValueError(f"not an area of a checkpoint store: {area!r}")
        self.chunk_grace_s = chunk_grace_s
        # File modification times are wall-clock times, so the grace period is measured on it.
        self.wall_clock = wall_clock

    # Names.

    def _task_directory(self, job_id: str, task_index: int) -> Path:
        # Job ids may contain "/", which must not become a directory level.
        return self.home / quote(job_id, safe="") / str(task_index)

    def _uri(self, job_id: str, task_index: int, step: int, token: int) -> str:
        area = f"{self.area}/" if self.area else ""
        return f"{area}{quote(job_id, safe='')}/{task_index}/step-{step:012d}-token-{token}.json"

    def _parse_uri(self, uri: str) -> tuple[Path, str, int, int, int]:
        """(the directory of its area, job_id, task_index, step, token) from a URI of this
        store's area or of the store before areas (see the module's text); ValueError
        otherwise, another tenant's URI among them."""
        parts = uri.split("/")
        home, tail = self.root, parts
        if self._area_parts and parts[: len(self._area_parts)] == self._area_parts:
            home, tail = self.home, parts[len(self._area_parts) :]
        name = _MANIFEST_NAME.fullmatch(tail[-1]) if len(tail) == 3 else None
        if (
            name is None
            or not tail[1].isdigit()
            or not tail[0]
            or tail[0].startswith(".")
            or (home is self.root and tail[0] == _TENANTS)
        ):
            raise ValueError(f"not a checkpoint URI of this store: {uri!r}")
        return home, unquote(tail[0]), int(tail[1]), int(name.group(1)), int(name.group(2))

    def _chunk_path(self, digest: str, home: Path | None = None) -> Path:
        return (self.home if home is None else home) / _CHUNKS / digest

    # Saving.

    def save(
        self,
        job_id: str,
        task_index: int,
        *,
        step: int,
        token: int,
        arrays: Mapping[str, Any],
        meta: Mapping[str, Any],
    ) -> SavedCheckpoint:
        if step < 0 or token <= 0 or task_index < 0:
            raise ValueError(f"bad checkpoint position: step {step}, token {token}")
        host_arrays = _check_arrays(arrays)
        meta_object = _check_meta(meta)
        uri = self._uri(job_id, task_index, step, token)
        if (self.root / uri).exists():
            # The log may name that manifest with its checksum: replacing it would make the
            # committed checkpoint fail its check (and a restore fall back to an older one).
            raise CheckpointExists(
                f"the checkpoint at step {step} of the attempt with token {token} is written "
                "already; a checkpoint is never replaced"
            )
        entries: dict[str, _ArrayEntry] = {}
        stored: dict[str, int] = {}  # chunk digest -> size, each chunk counted once
        chunk_bytes_written = 0
        for name, array in host_arrays.items():
            digests = []
            for piece in _pieces(array):
                digest = hashlib.sha256(piece).hexdigest()
                if digest not in stored:
                    chunk_bytes_written += self._store_chunk(digest, piece)
                    stored[digest] = len(piece)
                digests.append(digest)
            entries[name] = _ArrayEntry(
                dtype=array.dtype.str,
                shape=list(array.shape),
                size_bytes=array.nbytes,
                chunks=digests,
            )
        manifest = _Manifest(
            format=_FORMAT,
            job_id=job_id,
            task_index=task_index,
            step=step,
            token=token,
            meta=meta_object,
            arrays=entries,
        )
        data = msgspec.json.encode(msgspec.structs.replace(manifest, digest=_digest(manifest)))
        _write_atomically(self.root / uri, data)
        return SavedCheckpoint(
            uri=uri,
            checksum=checksum_of(data),
            size_bytes=len(data) + sum(stored.values()),
            bytes_written=len(data) + chunk_bytes_written,
        )

    def _store_chunk(self, digest: str, piece: memoryview) -> int:
        """Writes a chunk unless it is stored already; returns the bytes written."""
        path = self._chunk_path(digest)
        try:
            if path.stat().st_size == len(piece):
                # Refreshing the modification time tells garbage collection the chunk is in use.
                os.utime(path)
                return 0
        except FileNotFoundError:
            pass
        # Missing, or truncated by something outside the store: (re)write it.
        _write_atomically(path, piece)
        return len(piece)

    # Loading.

    def load(self, uri: str, checksum: str | None) -> Checkpoint:
        home, manifest = self._read_manifest(uri, checksum)
        arrays = {
            name: self._read_array(home, uri, name, entry)
            for name, entry in manifest.arrays.items()
        }
        return Checkpoint(
            uri=uri, step=manifest.step, token=manifest.token, arrays=arrays, meta=manifest.meta
        )

    def _read_manifest(self, uri: str, checksum: str | None) -> tuple[Path, _Manifest]:
        """The directory of the URI's area (where its chunks are) and its manifest."""
        try:
            home, job_id, task_index, step, token = self._parse_uri(uri)
        except ValueError as error:
            raise CorruptCheckpoint(str(error)) from None
        path = self.root / uri
        try:
            if path.stat().st_size > MANIFEST_BYTES_MAX:
                raise CorruptCheckpoint(
                    f"checkpoint {uri}: manifest is larger than {MANIFEST_BYTES_MAX} bytes"
                )
            data = path.read_bytes()
        except FileNotFoundError:
            raise CorruptCheckpoint(f"checkpoint {uri}: manifest is missing") from None
        except OSError as error:
            # Another tenant's files among them (docs/security.md).
            raise CorruptCheckpoint(
                f"checkpoint {uri}: manifest cannot be read: {error.strerror}"
            ) from None
        if checksum is not None and checksum_of(data) != checksum:
            raise CorruptCheckpoint(
                f"checkpoint {uri}: manifest checksum is {checksum_of(data)}, expected {checksum}"
            )
        try:
            manifest = _manifest_decoder.decode(data)
        except msgspec.DecodeError as error:
            raise CorruptCheckpoint(f"checkpoint {uri}: manifest is unreadable: {error}") from None
        if manifest.digest != _digest(manifest):
            raise CorruptCheckpoint(f"checkpoint {uri}: manifest does not match its digest")
        if (manifest.job_id, manifest.task_index, manifest.step, manifest.token) != (
            job_id,
            task_index,
            step,
            token,
        ):
            raise CorruptCheckpoint(f"checkpoint {uri}: manifest is for another checkpoint")
        return home, manifest

    def _read_array(
        self, home: Path, uri: str, name: str, entry: _ArrayEntry
    ) -> np.ndarray[Any, Any]:
        try:
            dtype = np.dtype(entry.dtype)
        except TypeError:
            dtype = np.dtype(object)
        expected_bytes = math.prod(entry.shape) * dtype.itemsize
        if dtype.hasobject or expected_bytes != entry.size_bytes:
            raise CorruptCheckpoint(f"checkpoint {uri}: array {name!r} has a bad dtype or shape")
        buffer = bytearray()
        for digest in entry.chunks:
            buffer += self._read_chunk(home, uri, name, digest)
        if len(buffer) != entry.size_bytes:
            raise CorruptCheckpoint(
                f"checkpoint {uri}: array {name!r} has {len(buffer)} bytes, "
                f"expected {entry.size_bytes}"
            )
        # A bytearray gives a writable array, which restored state must be.
        return np.frombuffer(buffer, dtype=dtype).reshape(entry.shape)

    def _read_chunk(self, home: Path, uri: str, name: str, digest: str) -> bytes:
        if _SHA256_HEX.fullmatch(digest) is None:
            raise CorruptCheckpoint(f"checkpoint {uri}: array {name!r} names a bad chunk")
        try:
            data = self._chunk_path(digest, home).read_bytes()
        except FileNotFoundError:
            raise CorruptCheckpoint(
                f"checkpoint {uri}: chunk {digest} of array {name!r} is missing"
            ) from None
        except OSError as error:
            raise CorruptCheckpoint(
                f"checkpoint {uri}: chunk {digest} of array {name!r} cannot be read: "
                f"{error.strerror}"
            ) from None
        if hashlib.sha256(data).hexdigest() != digest:
            raise CorruptCheckpoint(
                f"checkpoint {uri}: chunk {digest} of array {name!r} does not match its hash"
            )
        return data

    # Listing, deleting, garbage collection.

    def list_checkpoints(self, job_id: str, task_index: int) -> list[CheckpointInfo]:
        directory = self._task_directory(job_id, task_index)
        found = []
        for path in _listing(directory):
            match = _MANIFEST_NAME.fullmatch(path.name)
            if match is not None:
                step, token = int(match.group(1)), int(match.group(2))
                uri = self._uri(job_id, task_index, step, token)
                found.append(CheckpointInfo(uri=uri, step=step, token=token))
        return sorted(found, key=lambda info: (info.step, info.token))

    def delete(self, uri: str) -> None:
        """Deletes a checkpoint of this store's own area (ValueError for any other)."""
        home = self._parse_uri(uri)[0]
        if home is not self.home:
            raise ValueError(f"not a checkpoint of this store's area: {uri!r}")
        path = self.root / uri
        with suppress(FileNotFoundError):
            path.unlink()
            fsync_directory(path.parent)

    def garbage_collect(
        self, job_id: str, task_index: int, keep_uris: Iterable[str], *, token: int
    ) -> GarbageCollected:
        """Deletes this task's manifests that are not in `keep_uris` and were written by an
        attempt no newer than `token`, then every chunk no manifest references. Reads every
        manifest in the store to find the chunks in use, so call it after a commit, not per
        step."""
        kept = set(keep_uris)
        deleted = []
        for info in self.list_checkpoints(job_id, task_index):
            if info.uri not in kept and info.token <= token:
                self.delete(info.uri)
                deleted.append(info.uri)
        cutoff_s = self.wall_clock() - self.chunk_grace_s
        self._remove_stale_temporaries(self._task_directory(job_id, task_index), cutoff_s)
        chunks_deleted, bytes_freed = self._sweep_chunks(cutoff_s)
        return GarbageCollected(
            manifests_deleted=deleted, chunks_deleted=chunks_deleted, bytes_freed=bytes_freed
        )

    def _referenced_chunks(self) -> set[str]:
        referenced: set[str] = set()
        for path in self._all_manifests():
            try:
                manifest = _manifest_decoder.decode(path.read_bytes())
            except (OSError, msgspec.DecodeError):
                # Deleted meanwhile, or corrupt: a corrupt manifest cannot be restored anyway.
                continue
            for entry in manifest.arrays.values():
                referenced.update(entry.chunks)
        return referenced

    def _all_manifests(self) -> Iterator[Path]:
        for job_directory in _listing(self.home):
            if job_directory.name in (_CHUNKS, _TENANTS) or not job_directory.is_dir():
                continue
            for task_directory in _listing(job_directory):
                for path in _listing(task_directory):
                    if _MANIFEST_NAME.fullmatch(path.name):
                        yield path

    def _sweep_chunks(self, cutoff_s: float) -> tuple[int, int]:
        directory = self.home / _CHUNKS
        # Listed before the manifests are read: a chunk written after this listing is not seen,
        # and one listed here but referenced by a manifest written meanwhile is younger than the
        # grace period.
        candidates = _listing(directory)
        referenced = self._referenced_chunks()
        self._remove_stale_temporaries(directory, cutoff_s)
        deleted = freed_bytes = 0
        for path in candidates:
            if path.name in referenced or _SHA256_HEX.fullmatch(path.name) is None:
                continue
            try:
                status = path.stat()
                if status.st_mtime >= cutoff_s:
                    continue
                path.unlink()
            except FileNotFoundError:
                continue
            deleted += 1
            freed_bytes += status.st_size
        if deleted:
            fsync_directory(directory)
        return deleted, freed_bytes

    @staticmethod
    def _remove_stale_temporaries(directory: Path, cutoff_s: float) -> None:
        """Temporary files left by a crash in the middle of a write."""
        for path in _listing(directory):
            if path.name.startswith(".") and path.name.endswith(_TEMPORARY_SUFFIX):
                with suppress(FileNotFoundError):
                    if path.stat().st_mtime < cutoff_s:
                        path.unlink()


def _check_arrays(arrays: Mapping[str, Any]) -> dict[str, np.ndarray[Any, Any]]:
    """The arrays as C-contiguous NumPy arrays, after checking the store's limits."""
    if len(arrays) > ARRAYS_PER_CHECKPOINT_MAX:
        raise CheckpointTooLarge(
            f"a checkpoint holds at most {ARRAYS_PER_CHECKPOINT_MAX} arrays, got {len(arrays)}"
        )
    host: dict[str, np.ndarray[Any, Any]] = {}
    total_bytes = 0
    for name, array in arrays.items():
        if not isinstance(name, str) or not 0 < _utf8_size(name) <= ARRAY_NAME_BYTES_MAX:
            raise ValueError(
                f"array names must be non-empty strings of at most {ARRAY_NAME_BYTES_MAX} bytes, "
                f"got {name!r:.80}"
            )
        if isinstance(array, np.ma.MaskedArray):
            # np.asarray keeps the data and drops the mask: refused rather than changed.
            raise ValueError(
                f"array {name!r} is a masked array, whose mask a checkpoint would lose; store "
                "its data and its mask (numpy.ma.getmaskarray) as two arrays"
            )
        converted = np.asarray(to_numpy(array), order="C")
        if converted.dtype.hasobject or converted.dtype.fields is not None:
            raise ValueError(
                f"array {name!r} has dtype {converted.dtype}; checkpoints hold arrays of numbers"
            )
        if converted.dtype.itemsize == 0:
            # NumPy cannot make such an array from bytes again: every restore would fail.
            raise ValueError(
                f"array {name!r} has dtype {converted.dtype}, whose elements have no bytes"
            )
        total_bytes += converted.nbytes
        if total_bytes > CHECKPOINT_BYTES_MAX:
            raise CheckpointTooLarge(
                f"a checkpoint holds at most {CHECKPOINT_BYTES_MAX} bytes of arrays; "
                f"the arrays up to {name!r} already hold {total_bytes}"
            )
        host[name] = converted
    return host


def _utf8_size(name: str) -> int:
    """Bytes of `name` in UTF-8; -1 for a string that has none (a lone surrogate)."""
    try:
        return len(name.encode())
    except UnicodeEncodeError:
        return -1


def _check_meta(meta: Mapping[str, Any]) -> dict[str, Any]:
    try:
        # The standard encoder first, for what msgspec would change silently rather than refuse:
        # NaN and infinities (written as null) and bytes (written as base64 text).
        _check_keys(meta)
        json.dumps(dict(meta), allow_nan=False)
        encoded = msgspec.json.encode(dict(meta))
    except (TypeError, ValueError, OverflowError, RecursionError) as error:
        # ValueError covers a lone surrogate (UnicodeEncodeError) and NaN.
        raise ValueError(f"checkpoint meta must be JSON: {error}") from None
    if len(encoded) > META_BYTES_MAX:
        raise CheckpointTooLarge(
            f"checkpoint meta is {len(encoded)} bytes as JSON, more than {META_BYTES_MAX}; "
            "store large values as arrays"
        )
    # Decoded again so that what is stored is exactly what a restore will see.
    decoded: dict[str, Any] = msgspec.json.decode(encoded)
    return decoded


def _check_keys(value: Any) -> None:
    """TypeError for a mapping key that is not a string, at any depth: JSON would turn it into
    one (1 into "1"), and the restored meta would differ from what was given."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"keys must be strings, not {type(key).__name__} {key!r:.40}")
            _check_keys(item)
    elif isinstance(value, list | tuple):
        for item in value:
            _check_keys(item)


def _pieces(array: np.ndarray[Any, Any]) -> Iterator[memoryview]:
    data = memoryview(array.reshape(-1).view(np.uint8).data)
    if not len(data):
        return
    for start in range(0, len(data), CHUNK_BYTES):
        yield data[start : start + CHUNK_BYTES]


def _listing(directory: Path) -> list[Path]:
    try:
        return sorted(directory.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []


def _make_directory(directory: Path) -> None:
    if directory.is_dir():
        return
    directory.mkdir(parents=True, exist_ok=True)
    # The new directory's entry must be durable too, or a crash could lose the whole directory.
    for level in (directory.parent, directory.parent.parent):
        with suppress(OSError):
            fsync_directory(level)


def _write_atomically(path: Path, data: bytes | memoryview) -> None:
    """Writes `path` whole or not at all (`raftstore.files.write_file_durably`), in a directory
    made durably first. Other regions' nodes may run as other users of the shared directory, so
    the file is readable by all."""
    _make_directory(path.parent)
    write_file_durably(path, data, suffix=_TEMPORARY_SUFFIX, mode=0o644)
