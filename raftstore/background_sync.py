"""Journal syncs off the event loop (`raft.background_sync`, with `raft.durability = "fsync"`).

A sync in line stops the node's event loop for as long as the disk takes (about 0.5 ms here), and
measured, that standing still is what the sync costs: a blocking sleep as long costs as much, a
hold that lets the loop go on gains 26-47% of the puts (docs/durability.md). A thread cannot take
the sync off the loop, since it must take the interpreter lock back to report, and waits for it
while the loop is busy. So a helper process runs it: the loop sends the journal's file descriptor
over a Unix socket (`socket.send_fds`), the helper runs `fdatasync` on it and answers, and the
loop reads the answer when it comes (`add_reader`) and releases what waited for the sync.

A `SyncRunner` runs one sync at a time; `raftstore.replica.Outbox` decides what waits for which,
and whether the next sync runs here or in line: the helper's round trip (two wake-ups and two
socket messages) costs more than a fast disk's sync, so while the disk's recent syncs took less
than `raft.background_sync_min_ms` (1 ms by default) they run in line. The helper times each sync
and reports it with its result.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from typing import Protocol

__all__ = ["HelperFailed", "HelperProcessSync", "OnSynced", "SyncRunner", "SyncRunnerFactory"]

log = logging.getLogger(__name__)

# Told when a sync ends: None if the file is on disk, else why not (`HelperFailed` where the
# runner could not sync at all, any other OSError where the disk refused the sync); and how long
# the sync itself took, in seconds (the disk's time, not the loop's wait for the answer).
OnSynced = Callable[[OSError | None, float], None]


class HelperFailed(OSError):
    """The runner could not sync at all (its helper is gone): nothing is known of the disk."""


class SyncRunner(Protocol):
    """Runs one file sync at a time without blocking the caller's event loop."""

    def start(self, descriptor: int) -> None:
        """Starts syncing `descriptor` (the caller keeps it open until the sync ends); the end is
        reported to the `OnSynced` the runner was made with, on the loop."""

    def close(self) -> None:
        """Stops the runner; a sync in progress is not reported."""


SyncRunnerFactory = Callable[[asyncio.AbstractEventLoop, OnSynced], SyncRunner]

# The helper: standard library only, started with -I -S (no site, no environment), so it starts in
# a few tens of milliseconds and imports nothing of this project. Each request is one datagram
# carrying one descriptor (a copy the kernel makes: it stays valid when the journal closes its own
# on a compaction); each answer is the errno of the sync (0: synced) in two bytes and the sync's
# time in microseconds in four. It exits when
# its socket closes, which the kernel does when the node exits, killed or not.
_HELPER = """
import errno, os, signal, socket, sys, time
# Ctrl-C reaches the node's whole process group: the node stops, and closes the socket.
signal.signal(signal.SIGINT, signal.SIG_IGN)
channel = socket.socket(fileno=int(sys.argv[1]))
while True:
    try:
        data, descriptors, _, _ = socket.recv_fds(channel, 16, 4)
    except OSError:
        break
    if not data:
        break
    error = 0 if descriptors else errno.EBADF
    started = time.monotonic()
    for descriptor in descriptors:
        try:
            os.fdatasync(descriptor)
        except OSError as exc:
            error = exc.errno or 5
        finally:
            os.close(descriptor)
    took_us = min(int((time.monotonic() - started) * 1e6), 0xFFFFFFFF)
    channel.send(error.to_bytes(2, "little") + took_us.to_bytes(4, "little"))
"""


# An answer: the errno (2 bytes) and the sync's time in microseconds (4 bytes).
_ANSWER_BYTES = 6


class HelperProcessSync:
    """A `SyncRunner` backed by a helper process (see the module's docstring)."""

    # How long `close` waits for the helper to exit once its socket is closed.
    EXIT_WAIT_S = 2.0

    def __init__(self, loop: asyncio.AbstractEventLoop, on_synced: OnSynced) -> None:
        self._loop = loop
        self._on_synced = on_synced
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _HELPER, str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                close_fds=True,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._channel = ours
        ours.setblocking(False)
        self._in_progress = False
        self._closed = False
        loop.add_reader(ours.fileno(), self._on_readable)

    @property
    def pid(self) -> int:
        return self._process.pid

    def start(self, descriptor: int) -> None:
        if self._in_progress:
            raise RuntimeError("a sync is already in progress")
        if self._closed:
            raise RuntimeError("the sync helper is closed")
        self._in_progress = True
        try:
            socket.send_fds(self._channel, [b"s"], [descriptor])
        except OSError as exc:
            # The helper is gone (or the socket is full, which one request at a time rules out).
            self._in_progress = False
            self._fail(exc)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._in_progress = False
        self._loop.remove_reader(self._channel.fileno())
        self._channel.close()
        try:
            self._process.wait(self.EXIT_WAIT_S)
        except subprocess.TimeoutExpired:  # pragma: no cover - the helper exits on EOF
            self._process.kill()
            self._process.wait()

    def _on_readable(self) -> None:
        if self._closed:
            return
        try:
            answer = self._channel.recv(16)
        except BlockingIOError:
            return
        except OSError as exc:
            self._fail(exc)
            return
        if len(answer) != _ANSWER_BYTES:
            self._fail(OSError(errno.EPIPE, "the journal sync helper exited"))
            return
        self._in_progress = False
        code = int.from_bytes(answer[:2], "little")
        took_s = int.from_bytes(answer[2:], "little") / 1e6
        self._on_synced(None if code == 0 else OSError(code, os.strerror(code)), took_s)

    def _fail(self, error: OSError) -> None:
        """The helper cannot sync anymore: it is stopped and the failure reported."""
        self.close()
        log.error("journal sync helper failed: %s", error)
        self._on_synced(HelperFailed(error.errno, str(error)), 0.0)
