"""A stranger on the Raft port cannot make a member buffer more than a handshake's worth, nor
hold its connections.

pysyncobj trusts a frame's announced length before authenticating it (`raftstore.frames`): these
tests announce a huge and a negative length on a member's Raft port and stream data after it; the
member must hang up long before the stream ends, and keep committing writes. Connections that
never identify themselves (silent, or trickling bytes) must be closed after the connection
timeout, and no more than `UNIDENTIFIED_CONNECTIONS_MAX` held at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import re
import struct
import zlib
from pathlib import Path

import pytest

from raftstore.frames import (
    HANDSHAKE_FRAME_BYTES_MAX,
    STORED_FRAME_BYTES_MAX,
    UNIDENTIFIED_CONNECTIONS_MAX,
    SmallFramesStored,
)
from raftstore.store import RaftStore
from tests.raftstore.one_member import raft_port, start_member
from xrcore.commands import KvPut

pytestmark = pytest.mark.integration

SECRET = "frames-cluster-secret"
# What the stranger tries to send after its length prefix: far more than a handshake.
STREAM_BYTES = 16 << 20
CHUNK_BYTES = 64 << 10
# How long to wait for the member to hang up once the stream is sent (not asserted as a bound).
HANG_UP_WAIT_S = 10.0


async def _stream_after(port: int, prefix: bytes) -> tuple[int, bool]:
    """Sends `prefix` and then zeros in chunks; answers (bytes sent, whether the member hung
    up)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    sent = 0
    hung_up = False
    try:
        writer.write(prefix)
        chunk = bytes(CHUNK_BYTES)
        while sent < STREAM_BYTES:
            writer.write(chunk)
            await writer.drain()
            sent += len(chunk)
    except ConnectionError:
        hung_up = True
    if not hung_up:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(HANG_UP_WAIT_S):
                try:
                    hung_up = await reader.read(1) == b""
                except ConnectionError:
                    hung_up = True
    writer.close()
    with contextlib.suppress(ConnectionError):
        await writer.wait_closed()
    return sent, hung_up


@pytest.mark.parametrize("secret", [SECRET, None], ids=["with-secret", "loopback-no-secret"])
def test_raft_port__a_huge_or_negative_frame_length__is_hung_up_on_and_the_member_commits(
    tmp_path: Path, secret: str | None
) -> None:
    asyncio.run(_scenario(tmp_path, secret))


async def _scenario(tmp_path: Path, secret: str | None) -> None:
    store = await start_member(tmp_path, secret)
    try:
        for length in (1 << 30, HANDSHAKE_FRAME_BYTES_MAX + 1, -5):
            sent, hung_up = await _stream_after(raft_port(store), struct.pack("i", length))
            assert hung_up, f"length {length}: the member read {sent} bytes and kept listening"
            assert sent < STREAM_BYTES, f"length {length}: the member took the whole stream"
        applied = await store.propose(KvPut(key="after", value=b"still here"), timeout_s=30.0)
        assert applied.result.unwrap() is not None
    finally:
        await store.stop()


# Connections that never identify themselves.

Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def _connect(store: RaftStore, count: int) -> list[Connection]:
    return [await asyncio.open_connection("127.0.0.1", raft_port(store)) for _ in range(count)]


async def _closed_by_member(connection: Connection, wait_s: float) -> bool:
    """Whether the member hangs up on `connection` within `wait_s`."""
    try:
        async with asyncio.timeout(wait_s):
            return await connection[0].read(1) == b""
    except TimeoutError:
        return False
    except ConnectionError:
        return True


async def _close_all(connections: list[Connection]) -> None:
    for _, writer in connections:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


@pytest.mark.parametrize("secret", [SECRET, None], ids=["with-secret", "loopback-no-secret"])
def test_raft_port__connections_that_never_identify_themselves__are_closed_after_the_timeout(
    tmp_path: Path, secret: str | None
) -> None:
    """pysyncobj checked a connection's timeout only when something happened on it: a silent
    connection was held for ever (a descriptor each), and one trickling a byte now and then kept
    itself alive."""

    async def scenario() -> None:
        store = await start_member(tmp_path, secret, connection_timeout_s=1.0)
        connections: list[Connection] = []
        try:
            connections = await _connect(store, 20)
            trickling = connections[-1]
            # A frame's length, then a byte every 0.3 s: never silent for the 1 s timeout.
            trickling[1].write(struct.pack("i", 1000))

            async def trickle() -> None:
                while True:
                    await asyncio.sleep(0.3)
                    trickling[1].write(b"x")
                    with contextlib.suppress(ConnectionError):
                        await trickling[1].drain()

            trickler = asyncio.create_task(trickle())
            try:
                closed = await asyncio.gather(
                    *(_closed_by_member(item, HANG_UP_WAIT_S) for item in connections)
                )
            finally:
                trickler.cancel()
                with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                    await trickler
            assert all(closed), f"{closed.count(False)} of 20 connections are still held"
            applied = await store.propose(KvPut(key="after", value=b"here"), timeout_s=30.0)
            assert applied.result.unwrap() is not None
        finally:
            await _close_all(connections)
            await store.stop()

    asyncio.run(scenario())


def test_raft_port__beyond_the_bound_of_unidentified_connections__the_oldest_are_closed(
    tmp_path: Path,
) -> None:
    extra = 8

    async def scenario() -> None:
        # A timeout far longer than the test: only the bound closes connections here.
        store = await start_member(tmp_path, SECRET, connection_timeout_s=60.0)
        connections: list[Connection] = []
        try:
            connections = await _connect(store, UNIDENTIFIED_CONNECTIONS_MAX + extra)
            oldest = await asyncio.gather(
                *(_closed_by_member(item, HANG_UP_WAIT_S) for item in connections[:extra])
            )
            assert all(oldest), oldest
            newest = [await _closed_by_member(item, 0.05) for item in connections[extra:]]
            assert not any(newest), f"{newest.count(True)} of the newest were closed"
            applied = await store.propose(KvPut(key="after", value=b"here"), timeout_s=30.0)
            assert applied.result.unwrap() is not None
        finally:
            await _close_all(connections)
            await store.stop()

    asyncio.run(scenario())


# Small frames sent uncompressed, readable by any member.


@pytest.mark.parametrize("size", [0, 1, 300, STORED_FRAME_BYTES_MAX - 1])
def test_small_frames__are_stored_uncompressed_and_any_zlib_decoder_reads_them(size: int) -> None:
    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    framed = SmallFramesStored.compress(data, 3)
    # What an unpatched member (pysyncobj's own `zlib.decompress`) does with it.
    assert zlib.decompress(framed) == data
    # Stored, not compressed (the data repeats, so level 3 would shrink it): the zlib header and
    # checksum and a 5-byte header per stored block around the data.
    assert len(data) + 2 + 5 + 4 <= len(framed) <= len(data) + 2 + 4 + 5 * 8
    if size >= 512:
        assert len(zlib.compress(data, 3)) < len(data) / 2


def test_large_frames__are_compressed_as_pysyncobj_compresses_them() -> None:
    data = b"an entry that repeats " * 100
    assert len(data) >= STORED_FRAME_BYTES_MAX
    assert SmallFramesStored.compress(data, 3) == zlib.compress(data, 3)


def test_frames_of_members_that_compress_everything_are_read() -> None:
    data = b"x" * 300
    assert SmallFramesStored.decompress(zlib.compress(data, 3)) == data


def test_pysyncobjs_connections_frame_through_it_and_use_nothing_else_of_zlib() -> None:
    import pysyncobj.tcp_connection as tcp_connection

    from raftstore import frames

    frames.install()
    assert getattr(tcp_connection, "zlib") is SmallFramesStored  # noqa: B009 - no stub
    used = set(re.findall(r"\bzlib\.(\w+)", inspect.getsource(tcp_connection)))
    assert used == {"compress", "decompress"}
