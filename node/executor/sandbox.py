"""Starts a worker as its job's user with /tmp, /var/tmp and /dev/shm of its own
(`executor.private_tmp`).

The node, as root, runs this file in place of the worker's command (`command` below):

    python -I -S sandbox.py --uid U --gid G --groups G1,G2 --tmp DIR [--shm-size BYTES]
        [--network loopback] [--keep PATH]... -- COMMAND...

It makes a mount namespace, turns every mount in it private (nothing mounted here shows on the
host), binds DIR/tmp on /tmp and DIR/var-tmp on /var/tmp (the attempt's directories: the node
makes them and removes them when the attempt ends) and mounts a new tmpfs on /dev/shm, as large
as the host's or BYTES (`executor.shm_bytes_max`); then becomes the user (groups, gid, uid: the
switch from root drops every capability), sets the umask to 077 and executes COMMAND in its own
place, so the worker keeps the process id the node signals. A job then sees no other job's files
in those directories, cannot plant files there for another job to find, and leaves nothing
behind in them.

With `--network loopback` (`executor.private_network`) it makes a network namespace too, with
its loopback interface up and nothing else: no connection leaves it, whether to another machine
or to a port on this machine's loopback (the node's API and Raft ports, another job's server),
and abstract Unix sockets outside are out of reach. It comes before the switch of user, while
the process still has the capabilities to make it.

Each `--keep` path the new mounts would hide (xr's code, the interpreter, the checkpoint
directory, when they are under /tmp) is bound back at the same place, in directories made with
the owners and modes of the host's, so the user reaches it exactly as it would outside.

It is run with `-I -S` and imports `os`, `stat`, `sys` and `ctypes` alone: it runs as root, and
must not import anything from a path a job's user could write to; and every worker's start pays
for its imports (no `argparse` or `pathlib`: they tripled it, `bench/sandbox.py`). A failure
before COMMAND starts is one line on stderr (the task's log) and exit status `SETUP_FAILED`;
COMMAND that cannot be executed, `EXEC_FAILED`.
"""

from __future__ import annotations

import ctypes
import os
import stat
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from pathlib import Path

__all__ = [
    "EXEC_FAILED",
    "NETWORK_ERRORS",
    "SETUP_FAILED",
    "UMASK",
    "command",
    "covered_by",
    "isolate",
    "make_directories",
]

# The exit statuses when the sandbox could not be set up (as `env` and `nohup` use 125) and when
# the command could not be executed (as a shell's "cannot execute").
SETUP_FAILED = 125
EXEC_FAILED = 126
# The worker's umask: files a job makes are its user's alone unless it opens them up itself.
UMASK = 0o077
# How a failure to give the process a network of its own begins (`--network loopback`).
NETWORK_ERRORS = ("cannot make a network namespace", "cannot bring up the loopback interface")
# Where each directory of the attempt's is mounted.
BINDS = (("tmp", "/tmp"), ("var-tmp", "/var/tmp"))
SHM = "/dev/shm"

# <sched.h> and <sys/mount.h>.
_CLONE_NEWNS = 0x00020000
_CLONE_NEWNET = 0x40000000
# <sys/socket.h>, <linux/sockios.h> and <net/if.h>: the loopback interface's flags.
_AF_INET = 2
_SOCK_DGRAM = 2
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1
_IFREQ_BYTES = 40
_IFR_FLAGS = slice(16, 18)
_MS_NOSUID = 0x2
_MS_NODEV = 0x4
_MS_BIND = 0x1000
_MS_REC = 0x4000
_MS_PRIVATE = 0x40000


def command(
    python: str,
    uid: int,
    gid: int,
    groups: Iterable[int],
    directory: Path,
    then: list[str],
    keep: Iterable[Path] = (),
    shm_bytes: int | None = None,
    network: bool = False,
) -> list[str]:
    """The command line that runs `then` in a sandbox over `directory` as the given user,
    keeping `keep` in sight, with a /dev/shm of `shm_bytes` (None: the host's size) and, with
    `network`, a network of its own (loopback alone); `python` runs this file, as root: the
    node's interpreter."""
    kept = [argument for path in keep for argument in ("--keep", os.fspath(path))]
    if network:
        kept = ["--network", "loopback", *kept]
    if shm_bytes is not None:
        kept = ["--shm-size", str(shm_bytes), *kept]
    return [
        python,
        "-I",
        "-S",
        os.path.realpath(__file__),
        "--uid",
        str(uid),
        "--gid",
        str(gid),
        "--groups",
        ",".join(map(str, groups)),
        "--tmp",
        os.fspath(directory),
        *kept,
        "--",
        *then,
    ]


def _under(path: str, point: str) -> bool:
    return os.path.commonpath([path, point]) == point


def covered_by(path: Path | str) -> str | None:
    """The mount point a sandboxed worker has its own of (so sees none of the host's files
    under it) that `path` lies under, if any."""
    resolved = os.path.realpath(path)
    for point in (*(target for _, target in BINDS), SHM):
        if _under(resolved, os.path.realpath(point)):
            return point
    return None


def make_directories(directory: Path) -> None:
    """Makes an attempt's directories under `directory` (itself in a directory of root's alone,
    so no other process reaches them by path), each mode 1777 as /tmp is."""
    os.mkdir(directory)
    for name, _ in BINDS:
        made = os.path.join(directory, name)
        os.mkdir(made)
        os.chmod(made, 0o1777)


def _libc_call(what: str, result: int) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


class _Kept:
    """A path to bind back over the new mounts: an open handle on it, and the owners and modes
    of the directories from its mount point down, read before they are covered."""

    def __init__(self, path: str) -> None:
        self.path = path
        point = os.path.realpath(covered_by(path) or "/")
        self.levels = []
        level = os.path.dirname(path)
        while level != point and _under(level, point):
            self.levels.append((level, os.stat(level)))
            level = os.path.dirname(level)
        self.levels.reverse()
        self.is_dir = os.path.isdir(path)
        self.handle = os.open(path, os.O_PATH | os.O_CLOEXEC)

    def bind(self, libc: ctypes.CDLL) -> None:
        for level, status in self.levels:
            if not os.path.exists(level):
                os.mkdir(level)
                os.chown(level, status.st_uid, status.st_gid)
                os.chmod(level, stat.S_IMODE(status.st_mode))
        if self.is_dir:
            os.makedirs(self.path, exist_ok=True)
        else:
            os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600))
        _libc_call(
            f"cannot keep {self.path}",
            libc.mount(
                f"/proc/self/fd/{self.handle}".encode(),
                self.path.encode(),
                None,
                _MS_BIND | _MS_REC,
                None,
            ),
        )
        os.close(self.handle)


def isolate(
    directory: str,
    keep: Iterable[str] = (),
    shm_bytes: int | None = None,
    network: bool = False,
) -> None:
    """Moves this process into a mount namespace of its own with the attempt's directories on
    /tmp and /var/tmp, a new tmpfs on /dev/shm (of `shm_bytes`, else as large as the host's)
    and the `keep` paths among them bound back (see the module's text). Mount points this
    machine does not have are left out. With `network`, a network namespace of its own with
    the loopback interface alone, up."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_ulong,
        ctypes.c_char_p,
    ]
    _libc_call("cannot make a mount namespace", libc.unshare(_CLONE_NEWNS))
    _libc_call(
        "cannot make the mounts private", libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None)
    )
    # Opened in the new namespace (a bind's source must be one of its mounts), before they are
    # covered. Outermost first; one inside another comes with it.
    kept: list[_Kept] = []
    for path in sorted({os.path.realpath(path) for path in keep}, key=len):
        if (
            covered_by(path)
            and os.path.exists(path)
            and not any(_under(path, other.path) for other in kept)
        ):
            kept.append(_Kept(path))
    # The sources by a path relative to `directory`, which may itself be under /tmp: once /tmp
    # is covered, only the working directory still leads there.
    back = os.open(".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            os.chdir(directory)
        except OSError as error:
            raise OSError(error.errno, f"cannot reach {directory}: {error.strerror}") from None
        for name, target in BINDS:
            if os.path.isdir(target):
                _libc_call(
                    f"cannot mount {os.path.join(directory, name)} on {target}",
                    libc.mount(name.encode(), target.encode(), None, _MS_BIND, None),
                )
        os.fchdir(back)
    finally:
        os.close(back)
    if os.path.isdir(SHM):
        if shm_bytes is None:
            host = os.statvfs(SHM)
            shm_bytes = host.f_blocks * host.f_frsize
        options = f"mode=1777,size={shm_bytes}".encode()
        _libc_call(
            f"cannot mount a tmpfs on {SHM}",
            libc.mount(b"tmpfs", SHM.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, options),
        )
    for each in kept:
        each.bind(libc)
    if network:
        _libc_call(NETWORK_ERRORS[0], libc.unshare(_CLONE_NEWNET))
        _loopback_up(libc)


def _loopback_up(libc: ctypes.CDLL) -> None:
    """Brings up the loopback interface of this process's network namespace (a new one has
    it down; up, it has 127.0.0.1 and ::1)."""
    what = NETWORK_ERRORS[1]
    libc.ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_char_p]
    handle = libc.socket(_AF_INET, _SOCK_DGRAM, 0)
    if handle < 0:
        _libc_call(what, handle)
    try:
        request = ctypes.create_string_buffer(b"lo", _IFREQ_BYTES)
        _libc_call(what, libc.ioctl(handle, _SIOCGIFFLAGS, request))
        raw = bytearray(request.raw)
        flags = int.from_bytes(raw[_IFR_FLAGS], sys.byteorder) | _IFF_UP
        raw[_IFR_FLAGS] = flags.to_bytes(2, sys.byteorder)
        request = ctypes.create_string_buffer(bytes(raw), _IFREQ_BYTES)
        _libc_call(what, libc.ioctl(handle, _SIOCSIFFLAGS, request))
    finally:
        os.close(handle)


_USAGE = (
    "usage: sandbox.py --uid U --gid G [--groups G1,G2] --tmp DIR [--shm-size BYTES] "
    "[--network loopback] [--keep PATH]... -- COMMAND"
)


def _parse(argv: list[str]) -> tuple[dict[str, str], list[str], list[str]]:
    """(options, kept paths, command) from the command line `command` makes; ValueError."""
    options: dict[str, str] = {"--groups": ""}
    keep: list[str] = []
    position = 0
    while position < len(argv) and argv[position] != "--":
        name = argv[position]
        if name not in ("--uid", "--gid", "--groups", "--tmp", "--shm-size", "--network", "--keep"):
            raise ValueError(f"unknown option {name!r}")
        if position + 1 >= len(argv):
            raise ValueError(f"{name} needs a value")
        if name == "--keep":
            keep.append(argv[position + 1])
        else:
            options[name] = argv[position + 1]
        position += 2
    then = argv[position + 1 :]
    missing = [name for name in ("--uid", "--gid", "--tmp") if name not in options]
    if missing or not then:
        raise ValueError(f"missing {', '.join(missing) or 'the command'}")
    return options, keep, then


def main(argv: list[str]) -> int:
    try:
        options, keep, then = _parse(argv)
        uid, gid = int(options["--uid"]), int(options["--gid"])
        groups = [int(part) for part in options["--groups"].split(",") if part]
        shm_bytes = int(options["--shm-size"]) if "--shm-size" in options else None
        if shm_bytes is not None and shm_bytes <= 0:
            raise ValueError(f"--shm-size must be more than 0, not {shm_bytes}")
        network = options.get("--network", "host")
        if network not in ("host", "loopback"):
            raise ValueError(f"--network must be host or loopback, not {network!r}")
    except ValueError as error:
        print(f"xr sandbox: {error}\n{_USAGE}", file=sys.stderr, flush=True)
        return SETUP_FAILED
    try:
        isolate(options["--tmp"], keep, shm_bytes, network == "loopback")
    except OSError as error:
        print(f"xr sandbox: {error.strerror}", file=sys.stderr, flush=True)
        return SETUP_FAILED
    try:
        os.setgroups(groups)
        os.setgid(gid)
        os.setuid(uid)
    except OSError as error:
        print(
            f"xr sandbox: cannot become uid {uid} (gid {gid}): {error.strerror}",
            file=sys.stderr,
            flush=True,
        )
        return SETUP_FAILED
    os.umask(UMASK)
    try:
        os.execvp(then[0], then)
    except OSError as error:
        print(f"xr sandbox: cannot run {then[0]}: {error.strerror}", file=sys.stderr, flush=True)
    return EXEC_FAILED  # execvp returns only by raising


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
