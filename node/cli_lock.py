"""`xr lock` and `xr session`: fenced locks held by sessions, and running a command under a lock.

`xr lock run` is the one to use in scripts: it holds the lock with a session it keeps alive for
as long as the command runs, hands the command the fencing token, and stops the command if the
lock is lost (the session was revoked or could not be kept alive), since from then on someone else
may hold it. `xr lock acquire` holds a lock only until its session's TTL runs out (nothing keeps
it alive after the command exits), for handing the session and token to something else.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import TYPE_CHECKING, Any, TypeVar

import click

from node.cli_common import (
    EXIT_INDEFINITE,
    CommandFailed,
    FiniteFloatRange,
    client_options,
    connect,
    emit,
    format_time_ms,
    key_values,
    non_empty,
)

if TYPE_CHECKING:
    from xrcore.client import Lease

__all__ = ["lock", "session"]

# After SIGTERM, how long a command whose lock was lost has to exit before SIGKILL.
GRACE_S_DEFAULT = 10.0
_POLL_S = 0.05
_FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# Shell conventions for a command that could not be started.
_EXIT_NOT_EXECUTABLE = 126
_EXIT_NOT_FOUND = 127

F = TypeVar("F", bound=Callable[..., Any])


@click.group()
def lock() -> None:
    """Acquire, inspect and release fenced locks; run a command under one."""


def _ttl_option(*, default_s: float, meaning: str) -> Callable[[F], F]:
    return click.option(
        "--ttl",
        "ttl_s",
        type=FiniteFloatRange(1.0, 3600.0),
        default=default_s,
        show_default=True,
        metavar="SECONDS",
        help=meaning,
    )


_wait_option = click.option(
    "--wait",
    "wait_s",
    type=FiniteFloatRange(min=0),
    default=0.0,
    show_default=True,
    metavar="SECONDS",
    help="How long to wait in line for the lock (0: fail at once if it is held).",
)


@lock.command("acquire")
@click.argument("name", callback=non_empty)
@_ttl_option(
    default_s=60.0, meaning="How long the lock is held: nothing keeps its session alive later."
)
@_wait_option
@client_options
def lock_acquire(name: str, ttl_s: float, wait_s: float) -> int:
    """Acquire lock NAME with a new session and print the session and the fencing token.

    Nothing keeps the session alive after this command exits: the lock is held until the
    session's TTL (--ttl) runs out, or until `xr lock release NAME --session ID`.
    Keep it longer with `xr session keepalive ID`. Exit code 1 with lock.not_granted if the lock
    is not granted within --wait seconds.
    """
    from xrcore.client import LockNotGranted

    with connect() as client:
        granted = client.sessions.grant(ttl_s)
        session_id = granted.session_id
        try:
            acquisition = client.locks.acquire(name, session_id, wait_s=wait_s)
            if not acquisition.granted:
                held_by = "" if acquisition.holder is None else f" (held by {acquisition.holder})"
                waited = f" within {wait_s:g} s" if wait_s else ""
                raise LockNotGranted(f"lock {name!r} was not granted{waited}{held_by}")
        except BaseException:
            # The session exists only to hold this lock.
            with contextlib.suppress(Exception):
                client.sessions.revoke(session_id)
            raise
    document = {"name": name, "session_id": session_id, "token": acquisition.token, "ttl_s": ttl_s}
    human = key_values(
        [("lock", name), ("session", session_id), ("token", acquisition.token), ("ttl s", ttl_s)]
    )
    emit(document, human)
    return 0


@lock.command("release")
@click.argument("name", callback=non_empty)
@click.option(
    "--session",
    "session_id",
    required=True,
    callback=non_empty,
    metavar="ID",
    help="The holder's session.",
)
@client_options
def lock_release(name: str, session_id: str) -> int:
    """Release lock NAME held by session ID (the session itself lives on until its TTL)."""
    with connect() as client:
        released = client.locks.release(name, session_id)
    # Not released but no error: the session was waiting in the lock's queue, and has left it.
    human = f"released {name}" if released else f"session {session_id} left the queue of {name}"
    emit({"name": name, "session_id": session_id, "released": released}, human)
    return 0


@lock.command("show")
@click.argument("name", callback=non_empty)
@client_options
def lock_show(name: str) -> int:
    """Show who holds lock NAME, its fencing token and who waits for it."""
    with connect() as client:
        info = client.locks.get(name)
    if info is None:
        emit({"name": name, "holder": None}, f"lock {name} is free")
        return 0
    human = key_values(
        [
            ("lock", info.name),
            ("holder", info.holder),
            ("token", info.token),
            ("granted", format_time_ms(info.granted_at_ms)),
            ("waiters", list(info.waiters)),
        ]
    )
    emit(info, human)
    return 0


@lock.command("run")
@click.argument("name", callback=non_empty)
@_ttl_option(
    default_s=10.0,
    meaning="TTL of the lock's session, kept alive while CMD runs: how soon the lock frees if "
    "this machine dies.",
)
@_wait_option
@click.option(
    "--grace",
    "grace_s",
    type=FiniteFloatRange(min=0),
    default=GRACE_S_DEFAULT,
    show_default=True,
    metavar="SECONDS",
    help="If the lock is lost: how long CMD has after SIGTERM before SIGKILL.",
)
@click.argument("command", nargs=-1, type=click.UNPROCESSED, metavar="-- CMD [ARGS]...")
@client_options
def lock_run(
    name: str, ttl_s: float, wait_s: float, grace_s: float, command: tuple[str, ...]
) -> int:
    """Run CMD while holding lock NAME; exit with CMD's exit code.

    The lock is held by a session kept alive while CMD runs. CMD gets the fencing token in
    XR_LOCK_TOKEN (pass it to everything the lock protects), and XR_LOCK_NAME and
    XR_LOCK_SESSION. The lock is released when CMD exits. CMD runs in its own process group
    (given the terminal, if any); SIGINT, SIGTERM and SIGHUP sent to this command are passed on
    to it.

    If the lock is lost while CMD runs (its session was revoked or could not be kept alive),
    someone else may hold it: CMD's process group gets SIGTERM, then SIGKILL after --grace
    seconds, and the exit code is 3 with lock.lost on stderr.
    """
    if not command:
        raise click.UsageError("give the command to run after --, e.g. xr lock run NAME -- make")
    _check_runnable(command[0])
    with connect() as client, client.lock(name, ttl_s=ttl_s, wait_s=wait_s) as lease:
        environment = {
            **os.environ,
            "XR_LOCK_NAME": name,
            "XR_LOCK_TOKEN": str(lease.token),
            "XR_LOCK_SESSION": str(lease.session_id),
        }
        with _SignalsForwarded() as forwarding:
            try:
                child = subprocess.Popen(list(command), env=environment, process_group=0)
            except OSError as error:
                if isinstance(error, PermissionError):
                    problem, exit_code = "command.not_executable", _EXIT_NOT_EXECUTABLE
                else:
                    problem, exit_code = "command.not_found", _EXIT_NOT_FOUND
                raise CommandFailed(
                    problem, f"cannot run {command[0]!r}: {error.strerror}", exit_code=exit_code
                ) from None
            forwarding.to(child.pid)
            with _terminal_given_to(child.pid):
                lost = _wait_or_lose(child, lease)
            if lost is not None:
                # Raised inside the lock's block, which then ends the session and keeps this
                # error rather than its own.
                how = _stop_group(child, grace_s)
                raise CommandFailed(
                    "lock.lost",
                    f"{lost}; stopped {command[0]!r} with {how}",
                    exit_code=EXIT_INDEFINITE,
                )
        code = child.returncode
        # A command killed by a signal exits as a shell reports it.
        return 128 - code if code < 0 else code


def _check_runnable(program: str) -> None:
    """Fails before taking the lock if the command cannot be started at all."""
    if "/" in program:
        if not os.path.exists(program):
            raise CommandFailed(
                "command.not_found", f"{program}: no such file", exit_code=_EXIT_NOT_FOUND
            )
        if not os.access(program, os.X_OK):
            raise CommandFailed(
                "command.not_executable",
                f"{program}: not executable",
                exit_code=_EXIT_NOT_EXECUTABLE,
            )
    elif shutil.which(program) is None:
        raise CommandFailed(
            "command.not_found", f"{program}: command not found", exit_code=_EXIT_NOT_FOUND
        )


def _wait_or_lose(child: subprocess.Popen[bytes], lease: Lease) -> str | None:
    """Waits for the child to exit: None when it did, or why the lock was lost first."""
    from xrcore.client import LockLost

    while child.poll() is None:
        if lease.lost:
            try:
                lease.check()
            except LockLost as error:
                return error.message
        time.sleep(_POLL_S)
    return None


def _stop_group(child: subprocess.Popen[bytes], grace_s: float) -> str:
    """SIGTERM to the child's process group, SIGKILL after `grace_s`; reaps the child. Says
    which signal stopped it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGTERM)
    how = "SIGTERM"
    try:
        child.wait(grace_s)
    except subprocess.TimeoutExpired:
        how = f"SIGKILL ({grace_s:g} s after SIGTERM)"
    # Whatever the command started in its group goes too, even if the command itself exited.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGKILL)
    child.wait()
    return how


class _SignalsForwarded:
    """While active, SIGINT, SIGTERM and SIGHUP go to the child's process group instead of
    stopping this process (which must outlive the child to release the lock). A signal that
    arrives before the child exists is passed on as soon as it does."""

    def __init__(self) -> None:
        self._process_group: int | None = None
        self._pending: list[int] = []
        self._previous: dict[int, Any] = {}

    def _handle(self, signal_number: int, frame: FrameType | None) -> None:
        if self._process_group is None:
            self._pending.append(signal_number)
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._process_group, signal_number)

    def to(self, process_group: int) -> None:
        self._process_group = process_group
        for signal_number in self._pending:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process_group, signal_number)
        self._pending.clear()

    def __enter__(self) -> _SignalsForwarded:
        for number in _FORWARDED_SIGNALS:
            self._previous[number] = signal.signal(number, self._handle)
        return self

    def __exit__(self, *exc_info: object) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)


@contextlib.contextmanager
def _terminal_given_to(process_group: int) -> Iterator[None]:
    """Makes the child's process group the terminal's foreground group while it runs (when this
    command is itself in the foreground of a terminal), so CMD can read the terminal and Ctrl-C
    reaches it, as if a shell had started it."""
    try:
        terminal = sys.stdin.fileno()
        ours = os.getpgrp()
        foreground = os.isatty(terminal) and os.tcgetpgrp(terminal) == ours
    except (OSError, ValueError):
        foreground = False
    if not foreground:
        yield
        return
    # A background group that sets the foreground group gets SIGTTOU unless it ignores it.
    previous = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        with contextlib.suppress(OSError):
            os.tcsetpgrp(terminal, process_group)
        yield
    finally:
        with contextlib.suppress(OSError):
            os.tcsetpgrp(terminal, ours)
        signal.signal(signal.SIGTTOU, previous)


@click.group()
def session() -> None:
    """Sessions: what holds locks and session-bound keys alive."""


@session.command("grant")
@click.option(
    "--ttl",
    "ttl_s",
    type=FiniteFloatRange(1.0, 3600.0),
    default=60.0,
    show_default=True,
    metavar="SECONDS",
    help="The session ends this long after its last keep-alive.",
)
@client_options
def session_grant(ttl_s: float) -> int:
    """Create a session and print its id."""
    with connect() as client:
        granted = client.sessions.grant(ttl_s)
    emit(granted, granted.session_id)
    return 0


@session.command("show")
@click.argument("session_id", metavar="ID", callback=non_empty)
@client_options
def session_show(session_id: str) -> int:
    """Show a session: its TTL, time left, and the locks and keys it holds."""
    with connect() as client:
        info = client.sessions.get(session_id)
    if info is None:
        raise CommandFailed(
            "not_found", f"session {session_id!r} does not exist (it may have expired)"
        )
    human = key_values(
        [
            ("session", info.session_id),
            ("ttl s", info.ttl_ms / 1000),
            ("remaining s", info.remaining_ms / 1000),
            ("granted", format_time_ms(info.granted_at_ms)),
            ("locks", list(info.locks)),
            ("keys", list(info.keys)),
        ]
    )
    emit(info, human)
    return 0


@session.command("keepalive")
@click.argument("session_id", metavar="ID", callback=non_empty)
@client_options
def session_keepalive(session_id: str) -> int:
    """Renew a session's TTL once."""
    with connect() as client:
        info = client.sessions.keepalive(session_id)
    emit(info, f"kept {session_id} alive")
    return 0


@session.command("revoke")
@click.argument("session_id", metavar="ID", callback=non_empty)
@client_options
def session_revoke(session_id: str) -> int:
    """End a session now: its locks pass to the next waiter and its keys are deleted."""
    with connect() as client:
        client.sessions.revoke(session_id)
    emit({"session_id": session_id, "revoked": True}, f"revoked {session_id}")
    return 0
