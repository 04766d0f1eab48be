"""`xr snapshot`: back up a running cluster's replicated state, and start a new cluster from it.

`save` asks the cluster (admins only) for a consistent backup (`GET /v1/snapshot`, answered after
a linearizable read barrier) and writes it to a file durably. `restore` is offline: it checks the
file (its checksum, that it is an xr backup, that xrcore can read it) and seeds a new node's data
directory, so a NEW cluster starts from that state (run it once per member, with that member's
address, then start the members). See docs/durability.md.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import stat
from pathlib import Path

import click

from node.api.snapshot import decode_backup
from node.cli_common import (
    CommandFailed,
    client_options_timed,
    emit,
    endpoints_hinted,
    key_values,
    options,
    resolve_settings,
)
from node.config import ConfigError
from node.data_dir import DataDirLock
from raftstore.config import RaftConfig
from raftstore.files import write_file_durably
from raftstore.replica import seed_data_dir
from xrcore.errors import InvalidArgument

__all__ = ["snapshot"]

# A backup can be large; unless --timeout or the client configuration says otherwise, give the
# barrier and the transfer more than a plain request's time.
_SAVE_TIMEOUT_S_DEFAULT = 60.0
# A backup is one answer, read whole: above the client's usual bound (`ANSWER_BYTES_MAX`, 1 GiB),
# since the replicated tables at their default capacities (`xrcore.limits.Limits`: 100,000 keys
# of 64 KiB, 10,000 jobs with 64 KiB of arguments and of result, the watch history) hold about
# 8.5 GB, some 11.5 GB as base64 in JSON.
_BACKUP_ANSWER_BYTES_MAX = 16 << 30


@click.group()
def snapshot() -> None:
    """Back up the replicated state of a running cluster, and start a new cluster from a
    backup."""


async def _fetch(path: str) -> dict[str, object]:
    from xrcore.client._transport import Transport

    settings = resolve_settings(options(), os.environ, default_timeout_s=_SAVE_TIMEOUT_S_DEFAULT)
    transport = Transport(
        settings.endpoints,
        token=settings.token,
        timeout_s=settings.timeout_s,
        ca_file=settings.ca_file,
        cert_file=settings.cert_file,
        key_file=settings.key_file,
        answer_bytes_max=_BACKUP_ANSWER_BYTES_MAX,
    )
    try:
        with endpoints_hinted(settings):
            answer = await transport.call("GET", path)
    finally:
        await transport.close()
    if not isinstance(answer, dict):
        raise CommandFailed("snapshot.invalid", "the node answered with something not an object")
    return answer


def _target_problem(file: Path) -> str | None:
    """Why a backup cannot be written to `file`, or None. The backup replaces `file` by renaming
    a new file over it: a device or a pipe would be replaced, not written to."""
    try:
        if file.exists() and not stat.S_ISREG(file.stat().st_mode):
            return "it exists and is not a regular file"
        parent = file.absolute().parent
        if not parent.is_dir():
            return f"{parent} is not a directory" if parent.exists() else f"{parent} does not exist"
    except OSError as error:
        return str(error.strerror)
    return None


@snapshot.command("save")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@client_options_timed(_SAVE_TIMEOUT_S_DEFAULT)
def snapshot_save(file: Path) -> int:
    """Save a consistent backup of the cluster's replicated state (KV, sessions, locks, jobs,
    regions, tenants) to FILE (admins only). It holds every write acknowledged before the
    command started."""
    # Before the transfer, which may be long: where the backup goes.
    problem = _target_problem(file)
    if problem is not None:
        raise CommandFailed("save.failed", f"cannot write {file}: {problem}")
    answer = asyncio.run(_fetch("/v1/snapshot"))
    data = base64.b64decode(str(answer["file"]))
    # Check what arrived before writing it: the same checks `restore` makes.
    backup = decode_backup(data)
    try:
        write_file_durably(file, data)
    except OSError as error:
        raise CommandFailed("save.failed", f"cannot write {file}: {error.strerror}") from None
    emit(
        {
            "file": str(file),
            "bytes": len(data),
            "machine_index": backup.machine_index,
            "raft_index": backup.raft_index,
            "raft_term": backup.raft_term,
            "sha256": backup.sha256,
        },
        lambda: click.echo(
            f"saved {file} ({len(data)} bytes): state at index {backup.machine_index} "
            f"(raft index {backup.raft_index}, term {backup.raft_term}), sha256 {backup.sha256}"
        ),
    )
    return 0


def _read_backup(file: Path) -> bytes:
    """The bytes of a backup file. Only a regular file is read: a pipe or a device (`/dev/zero`)
    would block or never end, and the whole file is held in memory to check its checksum."""
    try:
        status = file.stat()
        if not stat.S_ISREG(status.st_mode):
            raise InvalidArgument(
                "not a regular file (a backup is a file that `xr snapshot save` wrote)"
            )
        with file.open("rb") as stream:
            return stream.read()
    except OSError as error:
        raise InvalidArgument(f"cannot read it: {error.strerror}") from None
    except MemoryError:
        raise InvalidArgument(
            f"too large to read into this process's memory ({status.st_size} bytes)"
        ) from None


def _directory(value: str) -> Path:
    if not value.strip():
        raise click.BadParameter("must not be empty (an unset variable?)")
    checked: Path = click.Path(file_okay=False, path_type=Path).convert(value, None, None)
    return checked


@snapshot.command("restore")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--data-dir",
    required=True,
    # Checked before click's Path, which reads "" as the working directory.
    callback=lambda _context, _parameter, value: _directory(value),
    metavar="DIRECTORY",
    help="The new node's data directory (as `xr node run --data-dir`); must hold no Raft data.",
)
@click.option(
    "--raft-address",
    required=True,
    help="This member's Raft address in the new cluster (as `xr node run --raft-address`).",
)
@click.option(
    "--peers",
    default="",
    help="The other members' Raft addresses, comma-separated (as `xr node run --peers`).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def snapshot_restore(
    file: Path, data_dir: Path, raft_address: str, peers: str, as_json: bool
) -> int:
    """Seed a new node's data directory from a backup FILE, offline, so that a NEW cluster
    starts from the backed-up state. Run it for every member of the new cluster with the same
    FILE and that member's address, then start the members. The new cluster's Raft log starts
    afresh (term 1); the state's own index, revisions and fencing tokens go on from the
    backup's."""
    try:
        config = RaftConfig(
            self_address=raft_address,
            peers=tuple(peer.strip() for peer in peers.split(",") if peer.strip()),
            data_dir=data_dir / "raft",
            insecure=True,
        )
    except InvalidArgument as error:
        raise click.UsageError(error.message) from None
    try:
        backup = decode_backup(_read_backup(file))
    except InvalidArgument as error:
        raise CommandFailed("snapshot.invalid", f"{file}: {error.message}") from None
    try:
        # The node's own lock: a node starting on the directory meanwhile is refused, and a
        # directory a node runs on is refused here even before its journal exists.
        lock = DataDirLock(data_dir)
    except ConfigError as error:
        raise CommandFailed("restore.refused", str(error)) from None
    except OSError as error:
        raise CommandFailed(
            "restore.failed", f"cannot write in {data_dir}: {error.strerror}"
        ) from None
    try:
        seed_data_dir(config, backup.state)
    except InvalidArgument as error:
        raise CommandFailed("restore.refused", error.message) from None
    except OSError as error:
        raise CommandFailed(
            "restore.failed", f"cannot write in {data_dir}: {error.strerror}"
        ) from None
    finally:
        lock.release()
    members = [raft_address, *config.peers]
    document = {
        "file": str(file),
        "data_dir": str(data_dir),
        "machine_index": backup.machine_index,
        "members": members,
        "sha256": backup.sha256,
    }
    if as_json:
        click.echo(json.dumps(document))
    else:
        click.echo(
            key_values(
                [
                    ("restored", str(file)),
                    ("into", str(data_dir)),
                    ("state index", backup.machine_index),
                    ("members", ", ".join(members)),
                ]
            )
        )
    return 0
