"""A member whose disk fails it stops at once, saying why (`raftstore.disk`).

Found by the disk QA pass of session 32: with its data directory's disk full, a member died of
SIGBUS with nothing in its log (pysyncobj grows its journal as a sparse memory map); a leader
that could not store a new term had already taken it in memory, so two leaders held one term and
acknowledged writes were lost; a member that could not store its metadata logged a traceback a
second and went on. The first test fills a real (small) disk under a member, in a mount namespace
of its own; the others make each write fail by hand.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, NoReturn

import pytest

from raftstore import disk
from raftstore.background_sync import HelperFailed
from raftstore.replica import DurableJournal, Outbox
from tests.raftstore.test_entry_fuzz import make_replica

ROOT = Path(__file__).resolve().parents[2]

# A one-member cluster on the disk given, writing 8 KiB values until the process ends.
_FILL = """
import asyncio, logging, sys
from pathlib import Path
from raftstore.config import RaftConfig
from raftstore.store import RaftStore
from xrcore.commands import KvPut

logging.basicConfig(level=logging.WARNING)

async def main():
    store = RaftStore(RaftConfig(
        self_address="127.0.0.1:" + sys.argv[3], peers=(), data_dir=Path(sys.argv[1]),
        durability=sys.argv[2]))
    await store.start()
    for number in range(100_000):
        applied = await store.propose(KvPut(key=f"k{number % 500}", value=b"v" * 8192))
        applied.result.unwrap()
    print("the disk never filled")

asyncio.run(main())
"""


class Stopped(BaseException):
    """`disk.exit_process`, in this process."""


@pytest.fixture
def stops(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    codes: list[int] = []

    def stop(code: int) -> NoReturn:
        codes.append(code)
        raise Stopped

    monkeypatch.setattr(disk, "exit_process", stop)
    return codes


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.integration
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root")
@pytest.mark.parametrize("durability", ["write", "fsync"])
def test_a_member_whose_disk_fills__stops_with_a_message__not_sigbus(
    tmp_path: Path, durability: str
) -> None:
    mount = tmp_path / "disk"
    mount.mkdir()
    script = (
        f"mount -t tmpfs -o size=1m tmpfs {mount} && exec {sys.executable} -c "
        f'"$XR_FILL" {mount}/raft {durability} {_free_port()}'
    )
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "/bin/sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "XR_FILL": _FILL, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == disk.STORAGE_FAILED_EXIT, (done.returncode, done.stderr[-3000:])
    assert "CRITICAL" in done.stderr and "cannot write" in done.stderr, done.stderr[-3000:]
    assert "No space left on device" in done.stderr
    assert "Traceback" not in done.stderr, done.stderr[-3000:]


def test_a_term_that_cannot_be_stored__stops_the_member_before_it_acts_on_it(
    tmp_path: Path, stops: list[int], caplog: pytest.LogCaptureFixture
) -> None:
    journal = disk.CheckedJournal(str(tmp_path / "raft.journal"))
    storer: Any = getattr(journal, "_FileJournal__metaStorer")  # noqa: B009 - name-mangled

    def full(meta: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    storer.storeMeta = full
    with caplog.at_level(logging.CRITICAL), pytest.raises(Stopped):
        journal.setCurrentTerm(7, None)
    assert stops == [disk.STORAGE_FAILED_EXIT]
    assert "raft.journal.meta" in caplog.text and "No space left" in caplog.text
    journal.setRaftCommitIndex(3)
    with pytest.raises(Stopped):
        journal.onOneSecondTimer()
    journal._destroy()


def test_a_journal_write_that_fails__stops_the_member(tmp_path: Path, stops: list[int]) -> None:
    journal = disk.CheckedJournal(str(tmp_path / "raft.journal"))
    mapped: Any = getattr(journal, "_FileJournal__journalFile")  # noqa: B009 - name-mangled

    def full(offset: int, values: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    mapped.write = full
    with pytest.raises(Stopped):
        journal.add(b"command", 1, 1)
    assert stops == [disk.STORAGE_FAILED_EXIT]


def test_a_sync_that_fails__stops_the_member__in_line_and_off_the_loop(
    tmp_path: Path, stops: list[int]
) -> None:
    """A failed fsync is not tried again: Linux may call the next one a success without the
    pages on disk. The helper itself failing (`HelperFailed`) says nothing of the disk: the
    outbox syncs in line from then on."""

    def failing(descriptor: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    journal = DurableJournal(tmp_path / "raft.journal", file_sync=failing)
    journal.add(b"command", 1, 1)
    with pytest.raises(Stopped):
        journal.sync()
    outbox = Outbox(journal, lambda node, message: True)
    outbox.on_synced(HelperFailed(errno.EPIPE, "the journal sync helper exited"), 0.0)
    assert stops == [disk.STORAGE_FAILED_EXIT]
    with pytest.raises(Stopped):
        outbox.on_synced(OSError(errno.EIO, "Input/output error"), 0.01)
    assert stops == [disk.STORAGE_FAILED_EXIT] * 2
    journal._destroy()


def test_the_journal_file_grows_with_its_blocks_allocated(tmp_path: Path) -> None:
    """A sparse file is what a full disk turned into SIGBUS."""
    path = tmp_path / "raft.journal"
    made = disk.AllocatedFile(str(path), defaultContent=b"x" * 40)
    made.write(1000, b"y" * 100_000)
    assert made.read(1000, 3) == b"yyy"
    made._destroy()
    assert os.stat(path).st_blocks * 512 >= path.stat().st_size


def test_a_snapshot_that_cannot_be_written__is_said_once_a_minute(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """pysyncobj dropped the error without a word, and tries again at a later tick."""
    replica = make_replica(tmp_path / "member")
    nowhere = str(tmp_path / "no-such-directory" / "raft.snapshot.tmp")
    try:
        with caplog.at_level(logging.ERROR, logger="raftstore.replica"):
            for _ in range(3):
                with pytest.raises(OSError):
                    replica._write_snapshot(nowhere, None)
    finally:
        replica.destroy()
    said = [r.getMessage() for r in caplog.records if "cannot write the snapshot" in r.getMessage()]
    assert len(said) == 1 and "no-such-directory" in said[0], said
