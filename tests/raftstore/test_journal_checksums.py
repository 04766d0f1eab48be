"""Journal records checked by their CRC-32 (`raftstore.disk.CheckedJournal`, format 2).

Found by the disk QA pass of session 32: 35 bytes of garbage written into the middle of two
members' journals, of a record whose sizes stayed intact, were read back as a command that does
not decode; both members skipped it as a malformed entry and served on, without an acknowledged
write and with a counter 200 increments behind the third member. Now a damaged record is found
before pysyncobj reads the file, and the member refuses to start, naming it; a torn tail (a
power loss during writeback) is still cut, as before.
"""

from __future__ import annotations

import asyncio
import pickle
import struct
from pathlib import Path

import pytest

from raftstore import disk
from raftstore.config import RaftConfig
from raftstore.replica import check_snapshot_present, repair_journal
from raftstore.store import RaftStore
from tests.raftstore.one_member import free_port
from xrcore.commands import KvPut

COMMANDS = [bytes([n]) * (50 + n) for n in range(1, 6)]


def _journal(path: Path, commands: list[bytes] = COMMANDS) -> None:
    journal = disk.CheckedJournal(str(path))
    for index, command in enumerate(commands, start=1):
        journal.add(command, index, 1)
    journal._destroy()


def _entries(path: Path) -> list[tuple[bytes, int, int]]:
    journal = disk.CheckedJournal(str(path))
    try:
        return [(bytes(journal[n][0]), journal[n][1], journal[n][2]) for n in range(len(journal))]
    finally:
        journal._destroy()


def _offsets(path: Path) -> list[int]:
    """The offset of each record."""
    data = path.read_bytes()
    end = struct.unpack_from("<I", data, 36)[0]
    offsets, offset = [], 40
    while offset < end:
        offsets.append(offset)
        offset += struct.unpack_from("<I", data, offset)[0] + 8
    return offsets


def _damage(path: Path, offset: int) -> None:
    with path.open("r+b") as file:
        file.seek(offset)
        file.write(b"GARBAGE")


@pytest.fixture(autouse=True)
def _installed() -> None:
    disk.install()


def test_a_new_journal__is_format_2_and_reads_back_its_commands(tmp_path: Path) -> None:
    path = tmp_path / "raft.journal"
    _journal(path)
    assert struct.unpack_from("<I", path.read_bytes(), disk.FORMAT_OFFSET)[0] == 2
    assert repair_journal(path) == 0
    assert _entries(path) == [(command, n, 1) for n, command in enumerate(COMMANDS, start=1)]


def test_a_damaged_record_before_intact_ones__refuses_the_journal_and_cuts_nothing(
    tmp_path: Path,
) -> None:
    path = tmp_path / "raft.journal"
    _journal(path)
    before = path.read_bytes()
    second = _offsets(path)[1]
    _damage(path, second + 30)
    damaged = path.read_bytes()
    with pytest.raises(disk.JournalDamaged) as refused:
        repair_journal(path)
    assert f"offset {second} (entry 2" in str(refused.value)
    assert "not a torn tail" in str(refused.value)
    assert path.read_bytes() == damaged != before


def test_a_damaged_last_record__is_a_torn_tail_and_is_cut(tmp_path: Path) -> None:
    path = tmp_path / "raft.journal"
    _journal(path)
    _damage(path, _offsets(path)[-1] + 30)
    assert repair_journal(path) > 0
    assert [index for _, index, _ in _entries(path)] == [1, 2, 3, 4]


def test_a_journal_of_format_1__is_read_as_it_is_and_checked_once_emptied(tmp_path: Path) -> None:
    """Journals written before 0.32.0 carry no checksums; log compaction empties the journal and
    writes it again from its first record, in format 2."""
    path = tmp_path / "raft.journal"
    plain = disk.PlainFileJournal(str(path))
    for index, command in enumerate(COMMANDS[:3], start=1):
        plain.add(command, index, 1)
    plain._destroy()
    journal = disk.CheckedJournal(str(path))
    assert not journal.checked
    journal.add(COMMANDS[3], 4, 1)
    assert [journal[n][1] for n in range(len(journal))] == [1, 2, 3, 4]
    journal.deleteEntriesTo(2)
    assert journal.checked
    journal._destroy()
    assert struct.unpack_from("<I", path.read_bytes(), disk.FORMAT_OFFSET)[0] == 2
    assert repair_journal(path) == 0
    assert _entries(path) == [(COMMANDS[2], 3, 1), (COMMANDS[3], 4, 1)]


@pytest.mark.integration
def test_a_member_whose_journal_was_damaged__refuses_to_start_naming_it(tmp_path: Path) -> None:
    config = RaftConfig(
        self_address=f"127.0.0.1:{free_port()}", peers=(), data_dir=tmp_path / "raft"
    )

    async def write() -> None:
        store = RaftStore(config)
        await store.start()
        try:
            for number in range(20):
                (await store.propose(KvPut(key=f"k{number}", value=b"v" * 100))).result.unwrap()
        finally:
            await store.stop()

    async def start_again() -> None:
        store = RaftStore(config)
        await store.start()
        await store.stop()

    asyncio.run(write())
    _damage(config.journal_file, _offsets(config.journal_file)[5] + 30)
    with pytest.raises(disk.JournalDamaged, match="is damaged"):
        asyncio.run(start_again())


@pytest.mark.parametrize("damage", [b"GARBAGE-IN-THE-META-FILE", b"", pickle.dumps([1, 2])])
def test_a_metadata_file_that_cannot_be_read__refuses_the_journal(
    tmp_path: Path, damage: bytes
) -> None:
    """pysyncobj read it as empty: the member forgot its term and its vote, and could vote
    twice in one term (found by the second disk QA pass of session 32)."""
    path = tmp_path / "raft.journal"
    journal = disk.CheckedJournal(str(path))
    journal.setCurrentTerm(50, "127.0.0.1:1")
    journal._destroy()
    assert disk.CheckedJournal(str(path)).getCurrentTerm() == 50
    Path(f"{path}.meta").write_bytes(damage)
    with pytest.raises(disk.JournalDamaged, match=r"raft\.journal\.meta cannot be read"):
        disk.CheckedJournal(str(path))


@pytest.mark.integration
def test_a_member_whose_snapshot_is_missing__refuses_to_start_naming_it(tmp_path: Path) -> None:
    """Its journal starts past the entries the snapshot holds: it applied nothing and served an
    empty state while voting and acknowledging appends (the second disk QA pass)."""
    config = RaftConfig(
        self_address=f"127.0.0.1:{free_port()}",
        peers=(),
        data_dir=tmp_path / "raft",
        log_compaction_min_entries=20,
        log_compaction_min_time_s=0.1,
    )

    async def write() -> None:
        store = RaftStore(config)
        await store.start()
        try:
            for number in range(200):
                (await store.propose(KvPut(key=f"k{number}", value=b"v"))).result.unwrap()
                if config.snapshot_file.exists() and number > 100:
                    break
                await asyncio.sleep(0.005)
        finally:
            await store.stop()

    asyncio.run(write())
    assert config.snapshot_file.exists(), "the log never compacted"
    check_snapshot_present(config)
    config.snapshot_file.rename(tmp_path / "moved-away")
    with pytest.raises(disk.JournalDamaged, match=r"raft\.snapshot is missing, but the journal"):
        check_snapshot_present(config)
    with pytest.raises(disk.JournalDamaged, match="is missing"):
        asyncio.run(write())
