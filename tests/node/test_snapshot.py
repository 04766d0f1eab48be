"""`xr snapshot save` from a running cluster, `xr snapshot restore` into a NEW cluster.

A 3-node cluster gets KV data, a held lock and a job; `xr snapshot save` writes a backup; each
member of a second cluster (other ports, other directories) is seeded with `xr snapshot restore`;
the second cluster starts with the same data and takes new writes. Corrupt, truncated and foreign
files are refused with a message that says so, and only admins may save.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import hashlib
import io
import json
import os
import re
import stat
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from node.api import snapshot as snapshot_api
from node.api.snapshot import BACKUP_FORMAT, MAGIC, Backup, decode_backup, encode_backup
from node.cli import main
from node.config import ConfigError, NodeConfig, load_config
from node.daemon import check_members
from node.data_dir import DataDirLock
from node.localcluster import LocalCluster
from raftstore import disk
from tests.node.conftest import ApiNode
from xrcore import StateMachine
from xrcore.client import Client
from xrcore.errors import InvalidArgument

READY_TIMEOUT_S = 60.0


@dataclass
class Ran:
    exit_code: int
    output: str


def _run(*arguments: str) -> Ran:
    """Runs `xr` in this process as `main` does (exit codes, the error line on stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(arguments))
    return Ran(exit_code=code, output=out.getvalue() + err.getvalue())


# The file format.


def _backup() -> bytes:
    state = StateMachine().snapshot()
    return encode_backup(
        Backup(machine_index=0, raft_index=2, raft_term=1, taken_at_ms=1, state=state)
    )


def test_backup__round_trips() -> None:
    backup = decode_backup(_backup())
    assert (backup.machine_index, backup.raft_index, backup.raft_term) == (0, 2, 1)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda data: data[: len(data) // 2], "truncated or corrupt"),
        (lambda data: data[:12], "truncated"),
        (lambda data: data[:40] + bytes([data[40] ^ 1]) + data[41:], "truncated or corrupt"),
        (lambda data: b"PK\x03\x04 a zip file" + data, "not an xr backup"),
        (lambda data: b"", "not an xr backup"),
    ],
    ids=["half", "header-only", "flipped-bit", "foreign", "empty"],
)
def test_backup__damaged_or_foreign_files_are_refused(damage: Any, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        decode_backup(damage(_backup()))


def _sealed(header: bytes) -> bytes:
    """A file with a valid mark and checksum around `header`, as only a crafted file has."""
    body = MAGIC + len(header).to_bytes(4, "big") + header
    return body + hashlib.sha256(body).digest()


@pytest.mark.parametrize(
    "header",
    [
        b"[" * 30_000 + b"]" * 30_000,
        b'{"format": %d, "state_bytes": 0, "machine_index": 1e999}' % BACKUP_FORMAT,
    ],
    ids=["nested-too-deeply", "infinite-index"],
)
def test_backup__a_crafted_header_is_refused(header: bytes) -> None:
    with pytest.raises(InvalidArgument, match="header is malformed"):
        decode_backup(_sealed(header))


def test_restore__bad_arguments_and_an_unwritable_data_dir_are_clear_errors(
    tmp_path: Path,
) -> None:
    file = tmp_path / "backup.xr"
    file.write_bytes(_backup())
    in_a_file = tmp_path / "backup.xr" / "node"
    result = _run(
        "snapshot", "restore", str(file), "--data-dir", str(in_a_file),
        "--raft-address", "127.0.0.1:7001",
    )  # fmt: skip
    assert result.exit_code == 1
    assert (
        "xr: restore.failed: cannot write in" in result.output
        and "Not a directory" in result.output
    )
    # An address is the command's mistake, not the file's.
    result = _run(
        "snapshot", "restore", str(file), "--data-dir", str(tmp_path / "node"),
        "--raft-address", "nonsense",
    )  # fmt: skip
    assert result.exit_code == 2
    assert "snapshot.invalid" not in result.output and "must be host:port" in result.output
    # An empty directory (an unset variable) is not the working directory.
    for empty in ("", " "):
        result = _run(
            "snapshot", "restore", str(file), "--data-dir", empty,
            "--raft-address", "127.0.0.1:7001",
        )  # fmt: skip
        assert result.exit_code == 2 and "must not be empty" in result.output, result.output
    assert not Path("raft").exists()


def test_restore__refuses_a_corrupt_file_and_writes_nothing(tmp_path: Path) -> None:
    file = tmp_path / "backup.xr"
    file.write_bytes(_backup()[:-1])
    data_dir = tmp_path / "node"
    result = _run(
        "snapshot", "restore", str(file), "--data-dir", str(data_dir),
        "--raft-address", "127.0.0.1:7001",
    )  # fmt: skip
    assert result.exit_code == 1
    assert "snapshot.invalid" in result.output and "corrupt" in result.output
    assert not (data_dir / "raft").exists()


def test_restore__refuses_a_data_dir_a_node_holds(tmp_path: Path) -> None:
    # A node on the directory (or one starting on it) holds its lock before its journal exists:
    # the restore must not write under it.
    file = tmp_path / "backup.xr"
    file.write_bytes(_backup())
    data_dir = tmp_path / "node"
    held = DataDirLock(data_dir)
    try:
        result = _run(
            "snapshot", "restore", str(file), "--data-dir", str(data_dir),
            "--raft-address", "127.0.0.1:7001",
        )  # fmt: skip
    finally:
        held.release()
    assert result.exit_code == 1, result.output
    assert "restore.refused" in result.output and "in use by another node" in result.output
    assert not (data_dir / "raft").exists()
    # Once the node is gone the restore goes ahead, and lets go of the directory.
    result = _run(
        "snapshot", "restore", str(file), "--data-dir", str(data_dir),
        "--raft-address", "127.0.0.1:7001",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    DataDirLock(data_dir).release()


def test_restored_member__started_with_other_members__is_refused(tmp_path: Path) -> None:
    # pysyncobj takes the members from the snapshot: a member restored without --peers ran as
    # a cluster of one beside the other two, and the cluster had two leaders.
    file = tmp_path / "backup.xr"
    file.write_bytes(_backup())
    data_dir = tmp_path / "node"
    result = _run(
        "snapshot", "restore", str(file), "--data-dir", str(data_dir),
        "--raft-address", "127.0.0.1:7001",
    )  # fmt: skip
    assert result.exit_code == 0, result.output

    def config(address: str, peers: str) -> NodeConfig:
        settings = {"region.name": "r0", "raft.address": address, "data_dir": str(data_dir)}
        if peers:
            settings["raft.peers"] = peers
        return load_config(environ={}, overrides=settings)

    check_members(config("127.0.0.1:7001", ""))
    for address, peers in [
        ("127.0.0.1:7001", "127.0.0.1:7002,127.0.0.1:7003"),
        ("localhost:7001", ""),  # pysyncobj matches members by their spelling
    ]:
        with pytest.raises(ConfigError, match=re.escape("members are 127.0.0.1:7001, but raft")):
            check_members(config(address, peers))
    # `xr node run --check` says so too, with the usage exit code.
    result = _run(
        "node", "run", "--check", "--region", "r0", "--data-dir", str(data_dir),
        "--raft-address", "127.0.0.1:7001", "--peers", "127.0.0.1:7002,127.0.0.1:7003",
    )  # fmt: skip
    assert result.exit_code == 2 and "holds the Raft data of a cluster" in result.output


def test_restore__that_fails_half_way__leaves_no_raft_data_and_a_node_names_an_empty_journal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A restore that met a full disk left the snapshot and an empty journal: the next restore
    # was refused ("exists") and the node failed at every start with a traceback from mmap.
    file = tmp_path / "backup.xr"
    file.write_bytes(_backup())
    data_dir = tmp_path / "node"
    arguments = ["snapshot", "restore", str(file), "--data-dir", str(data_dir)]
    arguments += ["--raft-address", "127.0.0.1:7001"]

    def full(*_: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as patched:
        # The class a restore writes its journal with (`raftstore.disk.PlainFileJournal`),
        # whichever class pysyncobj's module holds now (`disk.install`).
        patched.setattr(disk.PlainFileJournal, "add", full)
        result = _run(*arguments)
    assert result.exit_code == 1 and "No space left on device" in result.output, result.output
    assert sorted(path.name for path in (data_dir / "raft").iterdir()) == []
    assert _run(*arguments).exit_code == 0
    # A journal left empty by something else is named, not a traceback.
    (data_dir / "raft" / "raft.journal").write_bytes(b"")
    config = load_config(
        environ={},
        overrides={
            "region.name": "r0",
            "raft.address": "127.0.0.1:7001",
            "data_dir": str(data_dir),
        },
    )
    with pytest.raises(ConfigError, match="is empty"):
        check_members(config)


def test_restore__refuses_a_pipe_without_reading_it(tmp_path: Path) -> None:
    # A pipe (or a device such as /dev/zero) would block, or never end: only a regular file is
    # read. Here a writer stands ready with a whole backup, which the restore must not take.
    fifo = tmp_path / "backup.pipe"
    os.mkfifo(fifo)

    def write() -> None:
        with contextlib.suppress(BrokenPipeError):
            fifo.write_bytes(_backup())

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    data_dir = tmp_path / "node"
    try:
        result = _run(
            "snapshot", "restore", str(fifo), "--data-dir", str(data_dir),
            "--raft-address", "127.0.0.1:7001",
        )  # fmt: skip
    finally:
        # Let the writer finish: a reader that opens the pipe and closes it.
        os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
        writer.join(timeout=5)
    assert result.exit_code == 1
    assert "snapshot.invalid" in result.output and "not a regular file" in result.output
    assert not (data_dir / "raft").exists()


@pytest.mark.parametrize(
    ("failure", "said"),
    [
        (PermissionError(13, "Permission denied"), "cannot read it: Permission denied"),
        (MemoryError(), "too large to read into this process's memory"),
    ],
)
def test_restore__a_file_that_cannot_be_read_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: BaseException, said: str
) -> None:
    file = tmp_path / "backup.xr"
    file.write_bytes(_backup())

    def refuse(self: Path, *arguments: Any, **keywords: Any) -> Any:
        raise failure

    monkeypatch.setattr(Path, "open", refuse)
    result = _run(
        "snapshot", "restore", str(file), "--data-dir", str(tmp_path / "node"),
        "--raft-address", "127.0.0.1:7001",
    )  # fmt: skip
    assert result.exit_code == 1
    assert "snapshot.invalid" in result.output and said in result.output


def test_save__a_target_that_cannot_be_written_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A missing or non-directory parent was a traceback after the whole transfer, and a device
    or a pipe as the target was replaced by the backup (as root, /dev/full itself)."""
    from node import cli_snapshot

    fetched: list[str] = []

    async def fetch(path: str) -> dict[str, object]:
        fetched.append(path)
        return {"file": base64.b64encode(_backup()).decode()}

    monkeypatch.setattr(cli_snapshot, "_fetch", fetch)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    for target, said in [
        (tmp_path / "missing" / "b.xr", "does not exist"),
        (a_file / "b.xr", "is not a directory"),
        (fifo, "it exists and is not a regular file"),
    ]:
        result = _run("snapshot", "save", str(target))
        assert result.exit_code == 1, target
        assert f"xr: save.failed: cannot write {target}: " in result.output
        assert said in result.output
        assert "Traceback" not in result.output
    assert fetched == []  # refused before the transfer
    assert stat.S_ISFIFO(fifo.stat().st_mode)

    # A failure while writing, after the transfer, says so too.
    def refuse(path: Path, data: bytes) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cli_snapshot, "write_file_durably", refuse)
    result = _run("snapshot", "save", str(tmp_path / "b.xr"))
    assert result.exit_code == 1
    assert "save.failed: cannot write" in result.output and "No space left" in result.output
    assert fetched == ["/v1/snapshot"]


# Two real clusters.


@pytest.fixture
def source(tmp_path: Path) -> Iterator[LocalCluster]:
    cluster = LocalCluster(tmp_path / "source")
    try:
        cluster.start(timeout_s=READY_TIMEOUT_S)
        yield cluster
    finally:
        cluster.kill()


@pytest.mark.integration
def test_save_then_restore_into_a_new_cluster__data_is_there_and_new_writes_work(
    source: LocalCluster, tmp_path: Path
) -> None:
    with Client(source.urls, timeout_s=10.0) as client:
        for number in range(20):
            last_put = client.kv.put(f"data/{number}", f"value-{number}")
        session = client.sessions.grant(600.0)
        acquired = client.locks.acquire("backup-lock", session.session_id)
        job_id = client.jobs.submit("kept-job", workload="sleep", args={"seconds": 1})
    file = tmp_path / "backup.xr"
    saved = _run("snapshot", "save", str(file), "--endpoints", ",".join(source.urls), "--json")
    assert saved.exit_code == 0, saved.output
    document = json.loads(saved.output)
    assert document["machine_index"] > 20
    source.kill()

    target = LocalCluster(tmp_path / "target")
    try:
        for node in target.nodes:
            restored = _run(
                "snapshot", "restore", str(file), "--data-dir", str(node.data_dir),
                "--raft-address", node.raft_address, "--peers", ",".join(node.peers),
            )  # fmt: skip
            assert restored.exit_code == 0, restored.output
        # A second restore into a used directory is refused.
        again = _run(
            "snapshot", "restore", str(file), "--data-dir", str(target.nodes[0].data_dir),
            "--raft-address", target.nodes[0].raft_address,
        )  # fmt: skip
        assert again.exit_code == 1 and "new data directory" in again.output
        target.start(timeout_s=READY_TIMEOUT_S)
        with Client(target.urls, timeout_s=10.0) as client:
            for number in range(20):
                found = client.kv.get(f"data/{number}")
                assert found is not None and found.value == f"value-{number}".encode()
            lock = client.locks.get("backup-lock")
            assert lock is not None and lock.token == acquired.token
            job = client.jobs.get(job_id)
            assert job is not None and job.name == "kept-job"
            written = client.kv.put("after/restore", "new")
            # Revisions go on from the backup's.
            assert written.revision > last_put.revision
            assert client.kv.get("after/restore") is not None
    finally:
        target.kill()


@pytest.mark.integration
def test_save__needs_an_admin_token(tmp_path: Path) -> None:
    from node.config import hash_token

    config = (
        "[auth]\n"
        f'[[auth.tokens]]\nname = "a"\nsha256 = "{hash_token("admin-secret")}"\nrole = "admin"\n'
        f'[[auth.tokens]]\nname = "t"\nsha256 = "{hash_token("tenant-secret")}"\n'
        'role = "tenant"\ntenant = "t"\n'
    )
    cluster = LocalCluster(tmp_path / "auth", size=1, config_text=config)
    try:
        cluster.start(timeout_s=READY_TIMEOUT_S)
        endpoints = ",".join(cluster.urls)
        file = tmp_path / "backup.xr"
        refused = _run("snapshot", "save", str(file), "--endpoints", endpoints, "--token",
                       "tenant-secret")  # fmt: skip
        assert refused.exit_code == 1 and "auth.forbidden" in refused.output, refused.output
        assert not file.exists()
        saved = _run("snapshot", "save", str(file), "--endpoints", endpoints, "--token",
                     "admin-secret")  # fmt: skip
        assert saved.exit_code == 0, saved.output
        assert decode_backup(file.read_bytes()).machine_index > 0
    finally:
        cluster.kill()


@pytest.mark.parametrize(
    ("flags", "config", "expected_s"),
    [
        ((), None, 60.0),  # A backup can be large: more than a plain request's 10 s.
        (("--timeout", "2.5"), None, 2.5),  # The user's choice, shorter or longer, is honoured.
        (("--timeout", "600"), None, 600.0),
        ((), "timeout_s = 4\n", 4.0),
    ],
)
def test_save__uses_the_timeout_given_and_60_s_otherwise_and_a_bound_past_1_gib(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    flags: tuple[str, ...],
    config: str | None,
    expected_s: float,
) -> None:
    import base64

    from xrcore.client import _transport

    timeouts: list[float] = []
    bounds: list[int] = []

    class Answering:
        def __init__(
            self,
            endpoints: object,
            *,
            timeout_s: float,
            answer_bytes_max: int = _transport.ANSWER_BYTES_MAX,
            **_: object,
        ) -> None:
            timeouts.append(timeout_s)
            bounds.append(answer_bytes_max)

        async def call(self, method: str, path: str) -> dict[str, object]:
            assert (method, path) == ("GET", "/v1/snapshot")
            return {"file": base64.b64encode(_backup()).decode()}

        async def close(self) -> None:
            pass

    monkeypatch.setattr(_transport, "Transport", Answering)
    extra: tuple[str, ...] = ()
    if config is not None:
        (tmp_path / "client.toml").write_text(config)
        extra = ("--config", str(tmp_path / "client.toml"))
    file = tmp_path / "backup.xr"
    saved = _run("snapshot", "save", str(file), "--endpoints", "127.0.0.1:1", *flags, *extra)
    assert saved.exit_code == 0, saved.output
    assert timeouts == [expected_s]
    # A backup is one answer and may be larger than the client's usual bound (1 GiB).
    assert bounds == [16 << 30]
    assert decode_backup(file.read_bytes()).raft_index == 2


@pytest.mark.integration
def test_save__encodes_the_backup_off_the_thread_that_runs_raft(
    api: ApiNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Hashing, framing, base64 and JSON of a 240 MB state took 1.6 s: on the loop, which runs
    # pysyncobj, a save from the leader cost it its term. Only the state's bytes are taken there.
    threads: list[str] = []
    answer = snapshot_api._answer

    def recorded(request: Any, backup: Backup) -> Any:
        threads.append(threading.current_thread().name)
        return answer(request, backup)

    monkeypatch.setattr(snapshot_api, "_answer", recorded)
    saved = api.ok("GET", "/v1/snapshot", token="admin")
    assert decode_backup(base64.b64decode(saved["file"])).sha256 == saved["sha256"]
    assert threads and threads[0] != "api-test-loop", threads
