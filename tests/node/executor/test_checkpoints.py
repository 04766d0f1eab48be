"""The filesystem checkpoint store: round trips, incremental chunks, corruption detected (and the
previous checkpoint used), atomic writes, limits, and garbage collection that keeps what is
referenced."""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from node.executor import checkpoints
from node.executor.checkpoints import (
    CheckpointExists,
    CheckpointTooLarge,
    CorruptCheckpoint,
    FileCheckpointStore,
    SavedCheckpoint,
)
from node.executor.context import JobContext
from node.executor.protocol import (
    CheckpointAck,
    CheckpointRef,
    CheckpointSaved,
    Message,
    TaskDescription,
)

JOB = "job-1"


def arrays(seed: int = 0) -> dict[str, np.ndarray[Any, Any]]:
    generator = np.random.default_rng(seed)
    return {
        "weights": generator.standard_normal((32, 16)).astype(np.float32),
        "counts": np.arange(10, dtype=np.int64),
        "mask": np.array([True, False, True]),
        "scalar": np.float64(3.5) * np.ones(()),
        "empty": np.zeros((0, 4), dtype=np.float16),
    }


def save(
    store: FileCheckpointStore,
    step: int,
    values: dict[str, Any],
    *,
    token: int = 1,
    job_id: str = JOB,
    meta: dict[str, Any] | None = None,
) -> SavedCheckpoint:
    return store.save(job_id, 0, step=step, token=token, arrays=values, meta=meta or {})


def all_files(root: Path) -> list[Path]:
    return sorted(path for path in root.rglob("*") if path.is_file())


def chunk_files(root: Path) -> set[str]:
    return {path.name for path in (root / "chunks").iterdir()}


# Round trips and incremental saves.


def test_round_trip__arrays_and_meta_come_back_exactly(tmp_path: Path) -> None:
    store = FileCheckpointStore(tmp_path)
    original = arrays()
    saved = save(store, 7, original, token=3, meta={"loss": 0.25, "note": "x", "nested": [1, 2]})
    assert saved.uri == "job-1/0/step-000000000007-token-3.json"
    assert saved.checksum.startswith("sha256:")

    loaded = store.load(saved.uri, saved.checksum)

    assert (loaded.step, loaded.token) == (7, 3)
    assert loaded.meta == {"loss": 0.25, "note": "x", "nested": [1, 2]}
    assert set(loaded.arrays) == set(original)
    for name, value in original.items():
        assert loaded.arrays[name].dtype == value.dtype
        assert loaded.arrays[name].shape == value.shape
        assert np.array_equal(loaded.arrays[name], value)
    loaded.arrays["weights"][0, 0] = 1.0  # restored state is writable


def test_incremental__an_unchanged_array_is_not_written_again(tmp_path: Path) -> None:
    store = FileCheckpointStore(tmp_path)
    first = save(store, 1, arrays())
    manifest_bytes = first.bytes_written - sum(value.nbytes for value in arrays().values())

    unchanged = save(store, 2, arrays())
    changed = arrays()
    changed["weights"] = changed["weights"] + 1
    one_changed = save(store, 3, changed)

    # Only the manifest (about the same size each time) is new when nothing changed.
    assert unchanged.bytes_written < 2 * manifest_bytes
    assert unchanged.bytes_written == (tmp_path / unchanged.uri).stat().st_size
    assert one_changed.bytes_written == (
        (tmp_path / one_changed.uri).stat().st_size + changed["weights"].nbytes
    )
    assert unchanged.size_bytes == first.size_bytes


def test_incremental__identical_arrays_in_one_checkpoint_share_a_chunk(tmp_path: Path) -> None:
    store = FileCheckpointStore(tmp_path)
    block = np.ones(1000, dtype=np.float64)
    saved = save(store, 1, {"a": block, "b": block.copy()})
    assert saved.bytes_written == (tmp_path / saved.uri).stat().st_size + block.nbytes
    assert len(chunk_files(tmp_path)) == 1


def test_large_arrays_are_cut_into_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checkpoints, "CHUNK_BYTES", 1000)
    store = FileCheckpointStore(tmp_path)
    value = np.arange(1000, dtype=np.float64)  # 8000 bytes: 8 chunks
    saved = save(store, 1, {"a": value})
    assert len(chunk_files(tmp_path)) == 8
    assert np.array_equal(store.load(saved.uri, saved.checksum).arrays["a"], value)


def test_job_ids_with_slashes_stay_one_directory_level(tmp_path: Path) -> None:
    store = FileCheckpointStore(tmp_path)
    saved = save(store, 1, {"a": np.ones(3)}, job_id="team/a/job")
    assert saved.uri == "team%2Fa%2Fjob/0/step-000000000001-token-1.json"
    assert [info.uri for info in store.list_checkpoints("team/a/job", 0)] == [saved.uri]
    assert store.load(saved.uri, saved.checksum).step == 1


# Corruption.


def test_corrupt_manifest__the_checksum_does_not_match(tmp_path: Path) -> None:
    store = FileCheckpointStore(tmp_path)
    saved = save(store, 1, arrays(), meta={"loss": 0.5})
    path = tmp_path / saved.uri
    path.write_bytes(path.read_bytes().replace(b"0.5", b"0.6"))

    with pytest.raises(CorruptCheckpoint, match="manifest checksum is"):
        store.load(saved.uri, saved.checksum)
    # Without the log's checksum, the manifest's own digest catches it.
    with pytest.raises(CorruptCheckpoint, match="does not match its digest"):
        store.load(saved.uri, None)


def test_corrupt_manifest__truncated_or_missing(tmp_path: Path) -> None:
    store = FileCheckpointStore(tmp_path)
    saved = save(store, 1, arrays())
    path = tmp_path / saved.uri
    path.write_bytes(path.read_bytes()[:50])
    with pytest.raises(CorruptCheckpoint, match="unreadable"):
        store.load(saved.uri, None)
    path.unlink()
    with pytest.raises(CorruptCheckpoint, match="manifest is missing"):
        store.load(saved.uri, saved.checksum)


def test_corrupt_chunk__a_flipped_byte_or_a_missing_chunk_is_detected(tmp_path: Path) -> None:
    store = FileCheckpointStore(tmp_path)
    saved = save(store, 1, {"weights": arrays()["weights"]})
    (chunk,) = (tmp_path / "chunks").iterdir()
    data = bytearray(chunk.read_bytes())
    data[100] ^= 0xFF
    chunk.write_bytes(bytes(data))

    with pytest.raises(CorruptCheckpoint, match="does not match its hash"):
        store.load(saved.uri, saved.checksum)
    chunk.unlink()
    with pytest.raises(CorruptCheckpoint, match="is missing"):
        store.load(saved.uri, saved.checksum)


def test_a_save_repairs_a_truncated_chunk(tmp_path: Path) -> None:
    store = FileCheckpointStore(tmp_path)
    value = {"weights": arrays()["weights"]}
    save(store, 1, value)
    (chunk,) = (tmp_path / "chunks").iterdir()
    chunk.write_bytes(chunk.read_bytes()[:10])
    saved = save(store, 2, value)
    assert np.array_equal(store.load(saved.uri, saved.checksum).arrays["weights"], value["weights"])


@pytest.mark.parametrize(
    "uri", ["../escape/0/step-000000000001-token-1.json", "job-1/0/other.json", "a/b", ""]
)
def test_uris_outside_the_store_are_refused(tmp_path: Path, uri: str) -> None:
    with pytest.raises(CorruptCheckpoint, match="not a checkpoint URI"):
        FileCheckpointStore(tmp_path).load(uri, None)


class _NoSender:
    def send(self, message: Message) -> None:
        raise AssertionError(f"nothing should be sent, got {message}")


def restoring_context(root: Path, committed: SavedCheckpoint, step: int) -> JobContext:
    task = TaskDescription(
        job_id=JOB,
        task_index=0,
        attempt=2,
        token=9,
        workload="mlp_train",
        checkpoint=CheckpointRef(uri=committed.uri, checksum=committed.checksum, step=step),
        checkpoint_dir=str(root),
    )
    return JobContext(task, sender=_NoSender(), store=FileCheckpointStore(root), xp=np)


def test_restore__a_corrupt_checkpoint_falls_back_to_the_previous_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = FileCheckpointStore(tmp_path)
    save(store, 10, {"w": np.full(4, 10.0)})
    previous = save(store, 20, {"w": np.full(4, 20.0)})
    committed = save(store, 30, {"w": np.full(4, 30.0)}, token=2)
    # A newer manifest than the committed one was never committed: it is not a fallback.
    save(store, 40, {"w": np.full(4, 40.0)}, token=2)
    path = tmp_path / committed.uri
    path.write_bytes(path.read_bytes().replace(b'"step":30', b'"step":31'))

    with caplog.at_level(logging.INFO):
        restored = restoring_context(tmp_path, committed, 30).restore()

    assert restored is not None
    assert restored["step"] == 20
    assert np.array_equal(restored["arrays"]["w"], np.full(4, 20.0))
    assert "committed checkpoint is unusable" in caplog.text
    assert f"restoring the older checkpoint {previous.uri}" in caplog.text


def test_restore__skips_older_checkpoints_that_are_corrupt_too(tmp_path: Path) -> None:
    store = FileCheckpointStore(tmp_path)
    save(store, 10, {"w": np.full(4, 10.0)})
    previous = save(store, 20, {"w": np.full(4, 20.0), "extra": np.arange(7)})
    committed = save(store, 30, {"w": np.full(4, 30.0)})
    (tmp_path / committed.uri).unlink()
    for chunk_name in chunk_files(tmp_path):
        chunk = tmp_path / "chunks" / chunk_name
        if chunk.stat().st_size == np.arange(7).nbytes:
            chunk.unlink()

    restored = restoring_context(tmp_path, committed, 30).restore()

    assert previous.uri.endswith("step-000000000020-token-1.json")
    assert restored is not None and restored["step"] == 10


def test_restore__nothing_verifies__starts_from_scratch(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = FileCheckpointStore(tmp_path)
    committed = save(store, 30, {"w": np.full(4, 30.0)})
    (tmp_path / committed.uri).write_bytes(b"{}")
    with caplog.at_level(logging.INFO):
        assert restoring_context(tmp_path, committed, 30).restore() is None
    assert "starting over" in caplog.text


# Atomic writes and limits.


def test_an_interrupted_write_leaves_no_partial_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FileCheckpointStore(tmp_path)
    real_fsync = os.fsync
    calls = {"files": 0}

    def fsync_failing_on_the_manifest(descriptor: int) -> None:
        # Directories are fsynced too; only regular files count toward the failure.
        if os.path.isfile(f"/proc/self/fd/{descriptor}"):
            calls["files"] += 1
            if calls["files"] == 2:  # the chunk went through; the manifest is interrupted
                raise OSError(5, "Input/output error")
        real_fsync(descriptor)

    monkeypatch.setattr(os, "fsync", fsync_failing_on_the_manifest)
    with pytest.raises(OSError, match="Input/output error"):
        save(store, 1, {"w": np.ones(8)})

    assert store.list_checkpoints(JOB, 0) == []
    assert [path.name for path in all_files(tmp_path)] == list(chunk_files(tmp_path))
    assert not any(path.name.endswith(".tmp") for path in all_files(tmp_path))


def test_limits__too_many_arrays_too_many_bytes_and_large_meta_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FileCheckpointStore(tmp_path)
    monkeypatch.setattr(checkpoints, "ARRAYS_PER_CHECKPOINT_MAX", 2)
    with pytest.raises(CheckpointTooLarge, match="at most 2 arrays"):
        save(store, 1, {"a": np.ones(1), "b": np.ones(1), "c": np.ones(1)})
    monkeypatch.setattr(checkpoints, "CHECKPOINT_BYTES_MAX", 100)
    with pytest.raises(CheckpointTooLarge, match="at most 100 bytes"):
        save(store, 1, {"a": np.ones(20)})
    with pytest.raises(CheckpointTooLarge, match="checkpoint meta is"):
        save(store, 1, {}, meta={"text": "x" * (checkpoints.META_BYTES_MAX + 1)})
    with pytest.raises(ValueError, match="arrays of numbers"):
        save(store, 1, {"a": np.array([object()])})
    with pytest.raises(ValueError, match="meta must be JSON"):
        save(store, 1, {}, meta={"a": object()})
    assert not (tmp_path / JOB).exists()


# Garbage collection.


def test_gc__keeps_what_is_referenced_and_deletes_the_rest(tmp_path: Path) -> None:
    store = FileCheckpointStore(tmp_path, chunk_grace_s=0.0)
    saved = [save(store, step, {"w": np.full(100, float(step))}) for step in (1, 2, 3, 4)]
    shared = save(store, 1, {"w": np.full(100, 3.0)}, job_id="other-job")

    collected = store.garbage_collect(JOB, 0, [saved[2].uri, saved[3].uri], token=1)

    assert collected.manifests_deleted == [saved[0].uri, saved[1].uri]
    assert collected.chunks_deleted == 2
    assert collected.bytes_freed == 2 * 800
    assert [info.step for info in store.list_checkpoints(JOB, 0)] == [3, 4]
    for kept in (saved[2], saved[3], shared):
        store.load(kept.uri, kept.checksum)


def test_gc__never_deletes_a_newer_attempts_checkpoints(tmp_path: Path) -> None:
    store = FileCheckpointStore(tmp_path, chunk_grace_s=0.0)
    old = save(store, 1, {"w": np.ones(4)}, token=1)
    newer = save(store, 2, {"w": np.zeros(4)}, token=5)

    # A superseded attempt (token 1) still running collects with only its own checkpoint kept.
    store.garbage_collect(JOB, 0, [old.uri], token=1)

    store.load(newer.uri, newer.checksum)


def test_gc__spares_chunks_within_the_grace_period(tmp_path: Path) -> None:
    now_s = [1_000_000.0]
    store = FileCheckpointStore(tmp_path, chunk_grace_s=60.0, wall_clock=lambda: now_s[0])
    saved = save(store, 1, {"w": np.ones(4)})
    (chunk,) = (tmp_path / "chunks").iterdir()
    os.utime(chunk, (now_s[0] - 30, now_s[0] - 30))
    stale_temporary = tmp_path / "chunks" / ".abc.123.tmp"
    stale_temporary.write_bytes(b"partial")
    os.utime(stale_temporary, (now_s[0] - 120, now_s[0] - 120))

    store.garbage_collect(JOB, 0, [], token=1)
    assert chunk.exists()  # unreferenced now, but young: a save may be about to reference it
    assert not stale_temporary.exists()
    assert not (tmp_path / saved.uri).exists()

    os.utime(chunk, (now_s[0] - 61, now_s[0] - 61))
    assert store.garbage_collect(JOB, 0, [], token=1).chunks_deleted == 1
    assert not chunk.exists()


def test_reusing_a_chunk_refreshes_it_so_gc_spares_it(tmp_path: Path) -> None:
    store = FileCheckpointStore(tmp_path, chunk_grace_s=60.0)
    save(store, 1, {"w": np.ones(4)})
    (chunk,) = (tmp_path / "chunks").iterdir()
    os.utime(chunk, (1.0, 1.0))
    save(store, 2, {"w": np.ones(4)})
    assert chunk.stat().st_mtime > 1.0


# Tenants' areas.


def test_areas__a_tenants_checkpoints_and_chunks_live_in_its_area_alone(tmp_path: Path) -> None:
    assert checkpoints.tenant_area("team/a") == "tenants/team%2Fa"
    alpha = FileCheckpointStore(tmp_path, area=checkpoints.tenant_area("team/a"), chunk_grace_s=0)
    beta = FileCheckpointStore(tmp_path, area=checkpoints.tenant_area("beta"), chunk_grace_s=0)
    value = {"w": np.full(100, 2.0)}
    mine, theirs = save(alpha, 1, value), save(beta, 1, value)
    assert mine.uri == "tenants/team%2Fa/job-1/0/step-000000000001-token-1.json"
    # The same bytes are stored once per tenant: no chunk is shared across tenants.
    assert chunk_files(tmp_path / "tenants" / "team%2Fa") == chunk_files(tmp_path / "tenants/beta")
    assert not (tmp_path / "chunks").exists()
    assert all("tenants" in path.parts for path in all_files(tmp_path))
    # Each lists and collects its own: alpha's collection leaves beta's checkpoint whole.
    assert [info.uri for info in alpha.list_checkpoints(JOB, 0)] == [mine.uri]
    collected = alpha.garbage_collect(JOB, 0, [], token=1)
    assert (collected.manifests_deleted, collected.chunks_deleted) == ([mine.uri], 1)
    assert np.array_equal(beta.load(theirs.uri, theirs.checksum).arrays["w"], value["w"])
    # Another area's URI is not this store's, though its file is readable here.
    with pytest.raises(CorruptCheckpoint, match="not a checkpoint URI of this store"):
        alpha.load(theirs.uri, theirs.checksum)
    with pytest.raises(ValueError, match="not a checkpoint URI of this store"):
        alpha.delete(theirs.uri)
    beta.load(theirs.uri, theirs.checksum)


def test_areas__a_checkpoint_from_before_areas_still_loads_but_is_never_deleted(
    tmp_path: Path,
) -> None:
    """A task resumed after an upgrade: its committed checkpoint was written at the store's
    root, chunks and all."""
    before = save(FileCheckpointStore(tmp_path), 3, arrays())
    store = FileCheckpointStore(tmp_path, area=checkpoints.tenant_area("alpha"), chunk_grace_s=0)
    loaded = store.load(before.uri, before.checksum)
    assert loaded.step == 3 and np.array_equal(loaded.arrays["weights"], arrays()["weights"])
    with pytest.raises(ValueError, match="not a checkpoint of this store's area"):
        store.delete(before.uri)
    after = save(store, 4, arrays())
    store.garbage_collect(JOB, 0, [after.uri], token=1)
    FileCheckpointStore(tmp_path).load(before.uri, before.checksum)
    # A store at the root sees no tenant's area as a job, nor its URIs as its own.
    with pytest.raises(CorruptCheckpoint, match="not a checkpoint URI"):
        FileCheckpointStore(tmp_path).load(after.uri, after.checksum)
    assert FileCheckpointStore(tmp_path).list_checkpoints("tenants", 0) == []


@pytest.mark.parametrize("area", ["../up", "/absolute", "tenants//a", "tenants/.", "a/../b"])
def test_areas__outside_the_store_are_refused(tmp_path: Path, area: str) -> None:
    with pytest.raises(ValueError, match="not an area"):
        FileCheckpointStore(tmp_path, area=area)
    with pytest.raises(ValueError, match="checkpoint_area must be a relative path down"):
        TaskDescription(
            job_id=JOB,
            task_index=0,
            attempt=1,
            token=1,
            workload="mlp_train",
            checkpoint_dir=str(tmp_path),
            checkpoint_area=area,
        )


def test_areas__an_unreadable_checkpoint_is_corrupt_to_the_restore_not_a_crash(
    tmp_path: Path,
) -> None:
    """A manifest the worker may not read (another tenant's files, after a change of users)
    is reported as unusable, so the restore falls back instead of failing the task."""
    store = FileCheckpointStore(tmp_path, area=checkpoints.tenant_area("alpha"))
    saved = save(store, 1, arrays())
    (tmp_path / saved.uri).unlink()
    (tmp_path / saved.uri).mkdir()  # reading it fails with an OSError other than "missing"
    with pytest.raises(CorruptCheckpoint, match="manifest cannot be read"):
        store.load(saved.uri, saved.checksum)


# One attempt never replaces what it wrote (found by the job author's QA pass, session 31).


class _Log:
    """Stands in for the executor and the log: commits a checkpoint whose step is newer than the
    last committed one (as `task.checkpoint` does), refuses the others as not newer, and
    answers from a thread of its own a moment later, as the executor's answers arrive."""

    def __init__(self, committed: CheckpointRef | None = None) -> None:
        self.context: JobContext | None = None
        self.committed = committed
        self.commits: list[int] = []
        self._lock = threading.Lock()

    def send(self, message: Message) -> None:
        if not isinstance(message, CheckpointSaved):
            return
        with self._lock:
            newer = self.committed is None or message.step > self.committed.step
            if newer:
                self.committed = CheckpointRef(
                    uri=message.uri, checksum=message.checksum, step=message.step
                )
                self.commits.append(message.step)
        ack = CheckpointAck(
            ok=newer,
            error=None if newer else "job.invalid_argument: not newer",
            superseded=False,
            step=message.step,
        )
        assert self.context is not None
        threading.Timer(0.05, self.context.handle, (ack,)).start()


def _attempt(
    root: Path, log: _Log, *, attempt: int = 1, token: int = 3, ack_wait_s: float = 5.0
) -> JobContext:
    task = TaskDescription(
        job_id=JOB,
        task_index=0,
        attempt=attempt,
        token=token,
        workload="w",
        checkpoint=log.committed,
        checkpoint_dir=str(root),
    )
    context = JobContext(
        task, sender=log, store=FileCheckpointStore(root), xp=np, ack_wait_s=ack_wait_s
    )
    log.context = context
    return context


def test_context__a_step_already_committed_is_not_written_again_and_the_next_attempt_restores_it(
    tmp_path: Path,
) -> None:
    log = _Log()
    context = _attempt(tmp_path, log)
    assert context.checkpoint(10, {"a": np.array([10, 10])}, {"v": 10})
    # Neither an older step nor the same step again is written: the second would have replaced
    # the manifest the log names (same step, same token), and the next attempt, finding it
    # fail its checksum, restored the older, never committed step 5.
    assert not context.checkpoint(5, {"a": np.array([-5, -5])}, {"v": "never committed"})
    assert not context.checkpoint(10, {"a": np.array([1, 1])}, {"v": 10, "again": True})
    assert log.commits == [10]
    names = [path.name for path in tmp_path.rglob("step-*.json")]
    assert names == ["step-000000000010-token-3.json"]

    restored = _attempt(tmp_path, log, attempt=2, token=4).restore()

    assert restored is not None and restored["step"] == 10
    assert restored["arrays"]["a"].tolist() == [10, 10] and restored["meta"] == {"v": 10}


def test_context__checkpoints_from_several_threads_each_get_their_own_answer(
    tmp_path: Path,
) -> None:
    log = _Log()
    context = _attempt(tmp_path, log, ack_wait_s=3.0)
    results: dict[int, bool] = {}

    def checkpoint(step: int) -> None:
        results[step] = context.checkpoint(step, {"a": np.full(1000, step)})

    threads = [threading.Thread(target=checkpoint, args=(step,)) for step in (1, 2, 3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # Each call says whether its own checkpoint was committed (with one answer awaited at a
    # time, an answer for another step was dropped and its call said False after the wait).
    assert sorted(step for step, committed in results.items() if committed) == log.commits
    assert log.commits


def test_context__restore_returns_what_this_attempt_committed_since_it_began(
    tmp_path: Path,
) -> None:
    log = _Log()
    context = _attempt(tmp_path, log)
    assert context.restore() is None
    assert context.checkpoint(5, {"a": np.arange(3)}, {"lr": 0.1})
    restored = context.restore()
    assert restored is not None and restored["step"] == 5
    assert restored["arrays"]["a"].tolist() == [0, 1, 2] and restored["meta"] == {"lr": 0.1}


def test_save__never_replaces_a_manifest_an_attempt_wrote(tmp_path: Path) -> None:
    store = FileCheckpointStore(tmp_path)
    first = save(store, 7, {"w": np.zeros(2)})
    with pytest.raises(CheckpointExists, match="never replaced"):
        save(store, 7, {"w": np.ones(2)})
    assert store.load(first.uri, first.checksum).arrays["w"].tolist() == [0.0, 0.0]
    # Another attempt (another token) writes its own.
    save(store, 7, {"w": np.ones(2)}, token=2)


@pytest.mark.parametrize(
    ("values", "meta", "message"),
    [
        # NumPy cannot read such elements back from bytes: every restore failed.
        ({"v": np.zeros(3, dtype="V0")}, {}, "no bytes"),
        ({"m": np.ma.masked_array([1, 2], mask=[False, True])}, {}, "masked array"),
        # JSON turns the key into "1": what a restore gave back was not what was saved.
        ({"w": np.zeros(1)}, {1: "a"}, "keys must be strings"),
        ({"w": np.zeros(1)}, {"nested": [{None: 1}]}, "keys must be strings"),
    ],
)
def test_save__refuses_what_it_could_not_give_back_as_given(
    tmp_path: Path, values: dict[str, Any], meta: dict[Any, Any], message: str
) -> None:
    store = FileCheckpointStore(tmp_path)
    with pytest.raises(ValueError, match=message):
        store.save(JOB, 0, step=1, token=1, arrays=values, meta=meta)
    assert all_files(tmp_path) == []
