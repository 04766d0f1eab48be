"""Jobs as an OS user of their own (`executor.job_user`).

A job is a tenant's code. By default its worker runs as the node's OS user and can read whatever
the node can: the cluster secret file, the tokens file, the data directory (the journal, other
tenants' logs). With `executor.job_user` set, every worker runs as that user: its uid, its primary
group and its own supplementary groups (none of the node's), with `HOME`, `USER` and `LOGNAME` its
own. Keep the node's files readable by the node's user alone (the secret file must be already) and
a job reaches none of them.

`check` runs at the node's start and in `xr node run --check`, so that a setting that cannot work
fails there and not in the first job: the node runs as root, and a process started as the user,
with a worker's environment and interpreter, imports the worker and can write in the checkpoint
directory.

Root, not capabilities: a node that is not root could switch users with CAP_SETUID and
CAP_SETGID (and signal the workers with CAP_KILL), but a switch between two users that are not
root keeps a process's capabilities, and ambient ones survive the exec, so the workers would hold
CAP_SETUID and could make themselves root. From root, the switch drops every capability.

At start the node makes the checkpoint directory, and gives it to the user, when it does not
exist.

A user per tenant (`executor.tenant_users`): every job of such a tenant runs as its user, and its
area of the checkpoint store (`checkpoints.tenant_area`) is that user's alone, mode 0700, made
for it by the node (`prepare_area`). Another tenant's job, as another user, can neither read
nor overwrite the area, nor signal, trace or read the memory of the tenant's workers (the kernel
allows those only between processes of one uid). Tenants without a user of their own share
`executor.job_user` (or the node's user) as before; their areas are the job user's, 0700 too, so
a tenant with a user of its own cannot read them either.
"""

from __future__ import annotations

import errno
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from node.config import ConfigError
from node.executor import sandbox
from raftstore.files import fsync_directory

__all__ = [
    "Check",
    "JobUser",
    "check",
    "check_all",
    "kept_paths",
    "lookup",
    "prepare_area",
    "require_root",
]

# How long the check's process may take (it imports the worker, NumPy among its dependencies).
CHECK_TIMEOUT_S = 60.0
# The check's exit status when the directory is not writable.
_NOT_WRITABLE = 5
# Run by the interpreter as the job user: the worker imports, and the directory (if given) can be
# written in.
_CHECK = (
    "import os, sys\n"
    "import node.executor.worker\n"
    "where = sys.argv[1]\n"
    f"sys.exit(0 if where == '-' or os.access(where, os.W_OK | os.X_OK) else {_NOT_WRITABLE})\n"
)


@dataclass(frozen=True)
class JobUser:
    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str

    def environment(self) -> dict[str, str]:
        """The variables that name the user, for a worker's environment."""
        return {"HOME": self.home, "USER": self.name, "LOGNAME": self.name}

    def spawn_options(self) -> dict[str, Any]:
        """`subprocess` and `asyncio.create_subprocess_exec` keywords that start a process as
        the user, with its own groups and none of the node's."""
        return {"user": self.uid, "group": self.gid, "extra_groups": list(self.groups)}

    def sandboxed(
        self,
        directory: Path,
        then: list[str],
        keep: tuple[Path, ...] = (),
        shm_bytes: int | None = None,
        network: bool = False,
    ) -> list[str]:
        """The command line that runs `then` as the user with /tmp, /var/tmp and /dev/shm of
        its own (`node.executor.sandbox`, over `directory`, `keep` kept in sight, a /dev/shm of
        `shm_bytes` or the host's size; with `network`, a network of its own, loopback alone),
        to be started as root."""
        return sandbox.command(
            sys.executable,
            self.uid,
            self.gid,
            self.groups,
            directory,
            then,
            keep,
            shm_bytes,
            network,
        )


def kept_paths(
    python: str, environment: Mapping[str, str], checkpoint_dir: Path
) -> tuple[Path, ...]:
    """What a sandboxed worker must still see of the host's /tmp, /var/tmp and /dev/shm when
    they hold it: xr's code and the rest of the module path, the interpreter's installation (a
    virtual environment's root), the checkpoint directory."""
    paths = [Path(entry) for entry in environment.get("PYTHONPATH", "").split(os.pathsep) if entry]
    interpreter = Path(shutil.which(python, path=environment.get("PATH")) or python).absolute()
    paths += [interpreter.parent.parent, checkpoint_dir]
    return tuple(path for path in paths if sandbox.covered_by(path) is not None)


def lookup(name: str, *, setting: str = "executor.job_user") -> JobUser:
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise ConfigError(f"setting {setting}: there is no user {name!r} on this machine") from None
    groups = tuple(sorted(set(os.getgrouplist(name, entry.pw_gid))))
    return JobUser(name=name, uid=entry.pw_uid, gid=entry.pw_gid, groups=groups, home=entry.pw_dir)


def check(
    user: JobUser,
    *,
    python: str,
    environment: Mapping[str, str],
    checkpoint_dir: Path,
    make_directory: bool,
    setting: str = "executor.job_user",
    sandboxes: Path | None = None,
    network: bool = False,
) -> None:
    """ConfigError naming what stops jobs from running as `user`; see the module's text. With
    `make_directory`, a checkpoint directory that does not exist is made and given to the user;
    without, it is left out of the check. With `sandboxes` (`executor.private_tmp`), the check's
    process starts as the workers do, in a sandbox over a directory made there, with a network
    of its own if `network` (`executor.private_network`)."""
    prefix = f"setting {setting}: {user.name!r}"
    require_root(setting)
    where = "-"
    if checkpoint_dir.exists():
        if not checkpoint_dir.is_dir():
            raise ConfigError(
                f"setting executor.checkpoint_dir: {checkpoint_dir} is not a directory"
            )
        where = str(checkpoint_dir)
    elif make_directory:
        try:
            checkpoint_dir.mkdir(parents=True)
            os.chown(checkpoint_dir, user.uid, user.gid)
        except OSError as error:
            raise ConfigError(
                f"setting executor.checkpoint_dir: cannot make {checkpoint_dir} for "
                f"{user.name!r}: {error.strerror}"
            ) from None
        where = str(checkpoint_dir)
    argv = [python, "-c", _CHECK, where]
    options = user.spawn_options()
    private = None
    if sandboxes is not None:
        # A directory of its own: checks run at once (`check_all`), two of one user among them.
        private = Path(tempfile.mkdtemp(prefix="check-", dir=sandboxes)) / "attempt"
        sandbox.make_directories(private)
        keep = kept_paths(python, environment, checkpoint_dir)
        argv, options = user.sandboxed(private, argv, keep, network=network), {}
    try:
        done = subprocess.run(
            argv,
            env=dict(environment),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=CHECK_TIMEOUT_S,
            **options,
        )
    except PermissionError as error:
        if error.errno == errno.EPERM:
            raise ConfigError(
                f"{prefix}: this node cannot start processes as that user ({error.strerror})"
            ) from None
        raise ConfigError(
            f"{prefix} cannot run executor.python {python!r}: {error.strerror}"
        ) from None
    except OSError as error:
        raise ConfigError(
            f"{prefix} cannot run executor.python {python!r}: {error.strerror}"
        ) from None
    except subprocess.TimeoutExpired:
        raise ConfigError(
            f"{prefix}: executor.python {python!r} did not start a worker within "
            f"{CHECK_TIMEOUT_S:.0f} s"
        ) from None
    finally:
        if private is not None:
            shutil.rmtree(private.parent, ignore_errors=True)
    said = done.stderr.decode(errors="replace").strip().splitlines()
    if private is not None and done.returncode == sandbox.SETUP_FAILED:
        if network and said and any(error in said[-1] for error in sandbox.NETWORK_ERRORS):
            raise ConfigError(
                f"setting executor.private_network: this node cannot start workers as "
                f"{user.name!r} with a network of their own ({said[-1]}): let it make network "
                'namespaces (docs/security.md, "Network") or set '
                "executor.private_network = false"
            )
        raise ConfigError(
            f"setting executor.private_tmp: this node cannot start workers as {user.name!r} with "
            f"/tmp of their own ({said[-1] if said else 'no reason given'}): let it make mount "
            'namespaces (docs/security.md, "Temporary files") or set executor.private_tmp = '
            "false"
        )
    if private is not None and done.returncode == sandbox.EXEC_FAILED:
        reason = said[-1].rpartition(": ")[2] if said else f"exit status {done.returncode}"
        raise ConfigError(f"{prefix} cannot run executor.python {python!r}: {reason}")
    if done.returncode == _NOT_WRITABLE:
        raise ConfigError(
            f"{prefix} cannot write in the checkpoint directory {checkpoint_dir} "
            "(executor.checkpoint_dir): give it that directory, and let it pass through the "
            "ones above it"
        )
    if done.returncode != 0:
        raise ConfigError(
            f"{prefix} cannot start a worker with executor.python {python!r}: "
            + (said[-1] if said else f"exit status {done.returncode}")
        )


# Users checked at once (`check_all`): each check starts an interpreter that imports the worker.
CHECKS_AT_ONCE = 4


@dataclass(frozen=True)
class Check:
    """A user to check (`check`), named by `setting`, over the directory it must write in."""

    user: JobUser
    setting: str
    checkpoint_dir: Path


def check_all(
    checks: Sequence[Check],
    *,
    python: str,
    environment_of: Callable[[JobUser], Mapping[str, str]],
    sandboxes: Path | None,
    network: bool = False,
) -> None:
    """`check` for each (nothing made), `CHECKS_AT_ONCE` at a time; the ConfigError of the first
    in order that fails, so the same configuration always names the same user."""
    with ThreadPoolExecutor(max_workers=CHECKS_AT_ONCE, thread_name_prefix="xr-check") as pool:
        running = [
            pool.submit(
                check,
                each.user,
                python=python,
                environment=environment_of(each.user),
                checkpoint_dir=each.checkpoint_dir,
                make_directory=False,
                setting=each.setting,
                sandboxes=sandboxes,
                network=network,
            )
            for each in checks
        ]
    for done in running:
        done.result()


def require_root(setting: str) -> None:
    """ConfigError unless the node runs as root (see the module's text for why)."""
    if os.geteuid() != 0:
        raise ConfigError(
            f"setting {setting}: the node must run as root to start its workers as another user "
            '(docs/security.md, "What a job can reach")'
        )


def prepare_area(area: Path, user: JobUser | None, *, own: bool) -> None:
    """Makes a tenant's area of the checkpoint store if it is missing (and the directory of
    areas, mode 0711 whatever the umask: passable, not listable). With a `user` (the tenant's
    own with `own`, else the shared job user) the area is that user's alone: given to it when
    made, mode 0700 always, and ConfigError when it belongs to another uid (a tenant whose user
    changed, or another tenant's). Without one (jobs as the node's user) it is only made."""
    made = not area.is_dir()
    if made:
        if not area.parent.is_dir():
            # Every tenant's user must pass through it; none may list the others' areas.
            area.parent.mkdir(parents=True, exist_ok=True)
            area.parent.chmod(0o711)
        area.mkdir(exist_ok=True)
        for level in (area.parent, area.parent.parent):
            fsync_directory(level)
    if user is None:
        return
    if made:
        os.chown(area, user.uid, user.gid)
    status = area.stat()
    owner = status.st_uid
    if owner != user.uid:
        setting = "executor.tenant_users" if own else "executor.job_user"
        raise ConfigError(
            f"setting {setting}: the checkpoint area {area} belongs to uid {owner}, not to "
            f"{user.name!r} (uid {user.uid}); give it to that user (chown -R) or remove it"
        )
    # The job user's areas too: a tenant with a user of its own must not read them either. Only
    # when it differs: this runs before every attempt, often on a network mount.
    if stat.S_IMODE(status.st_mode) != 0o700:
        area.chmod(0o700)
