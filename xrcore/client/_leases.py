"""Sessions and locks held for the length of a block, kept alive in the background.

`SessionContext` grants a session and `LockContext` grants one and takes a lock with it; both
start a keeper that renews the session every TTL/3 and end the session on exit (ending it also
releases the lock, in the same log entry, and hands it to the next waiter).

The keeper marks the session lost when a keep-alive answers `NotFound` (revoked or expired), when
a whole TTL passes without a successful keep-alive (the TTL is counted from when the last
successful one was sent, so the client gives up no later than the cluster can), for a lock,
when the session no longer holds the lock, and when the client is closed while the block still
runs: the session is no longer renewed, so it expires and the lock passes on, and the code in
the block must not go on believing it holds them.

Loss reaches the code in the block, never asynchronously: `lost` turns true, `check()` raises,
and leaving the block raises (a block that raised its own error keeps it, with a note). The block
is not interrupted (no `PyThreadState_SetAsyncExc` in threads, no task cancellation in asyncio):
an exception injected at an arbitrary bytecode can land in the block's own clean-up (`finally`,
`__exit__`), in the middle of a client call whose write still completes, or after the block has
ended, and it cannot interrupt a blocking system call, so it would not even be prompt where it
matters most. What keeps a lost holder from doing harm is the fencing token the protected
resource checks, not how soon the holder hears of the loss.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable
from types import TracebackType
from typing import Any

from xrcore.client._api import (
    AsyncLocks,
    AsyncSessions,
    check_key_argument,
    check_ttl_s,
    check_wait_s,
)
from xrcore.client._errors import LockLost, LockNotGranted, SessionLost
from xrcore.errors import LockNotHeld, NotFound, XrError

__all__ = ["KeptSession", "Lease", "LockContext", "SessionContext"]

log = logging.getLogger("xr.client")
# After a failed keep-alive, the next try comes sooner than the regular TTL/3.
_RETRY_PAUSE_S = 0.25


class _Keeper:
    """Renews one session until stopped or lost. Runs on the client's event loop; `lost_reason`
    may be read from any thread."""

    def __init__(
        self,
        sessions: AsyncSessions,
        session_id: str,
        ttl_s: float,
        *,
        renewed_at_s: float,
        keepers: set[_Keeper],
    ) -> None:
        self.sessions = sessions
        self.session_id = session_id
        self.ttl_s = ttl_s
        # Set once the lock is granted: from then on the session must keep holding it.
        self.lock_name: str | None = None
        # On time.monotonic(), which every thread shares (an event loop's clock may not).
        self._deadline_s = renewed_at_s + ttl_s
        self._lost_reason: str | None = None
        self._keepers = keepers
        self._task: asyncio.Task[None] | None = None
        self._stopped = False

    @property
    def lost_reason(self) -> str | None:
        if not self._stopped:
            self._check_deadline()
        return self._lost_reason

    def _check_deadline(self) -> None:
        if self._lost_reason is None and time.monotonic() >= self._deadline_s:
            self._lose(
                f"no keep-alive of session {self.session_id} succeeded within its TTL of "
                f"{self.ttl_s} s"
            )

    def _lose(self, reason: str) -> None:
        if self._lost_reason is None:
            self._lost_reason = reason
            log.warning("%s", reason)

    def start(self) -> None:
        self._keepers.add(self)
        self._task = asyncio.ensure_future(self._run())

    async def stop(self, *, lost_reason: str | None = None) -> None:
        """Stops renewing. Whether the session was lost is settled now: once its block has
        ended, a session no longer renewed does not turn lost. `lost_reason`: the block has not
        ended (the client is closing), so the session is lost for that reason from now on."""
        self._check_deadline()
        if lost_reason is not None:
            self._lose(lost_reason)
        self._stopped = True
        self._keepers.discard(self)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        interval_s = self.ttl_s / 3
        pause_s = interval_s
        while self.lost_reason is None:
            await asyncio.sleep(max(0.0, min(pause_s, self._deadline_s - time.monotonic())))
            sent_s = time.monotonic()
            left_s = self._deadline_s - sent_s
            if left_s <= 0:
                # The loop's condition records the loss.
                continue
            try:
                info = await self.sessions._keepalive(
                    self.session_id, timeout_s=left_s, ttl_s=self.ttl_s
                )
            except NotFound:
                self._lose(f"session {self.session_id} ended (revoked or expired)")
                return
            except (XrError, RuntimeError) as error:
                log.info("keep-alive of session %s failed: %s", self.session_id, error)
                pause_s = min(interval_s, _RETRY_PAUSE_S)
                continue
            if self.lost_reason is not None:
                # The answer came after the TTL had run out: too late to count.
                return
            self._deadline_s = sent_s + self.ttl_s
            pause_s = interval_s
            if self.lock_name is not None and self.lock_name not in info.locks:
                self._lose(f"session {self.session_id} no longer holds lock {self.lock_name!r}")
                return


class KeptSession:
    """A session kept alive for the length of a `session()` block."""

    def __init__(self, keeper: _Keeper) -> None:
        self._keeper = keeper

    @property
    def session_id(self) -> str:
        return self._keeper.session_id

    @property
    def ttl_s(self) -> float:
        return self._keeper.ttl_s

    @property
    def lost(self) -> bool:
        return self._keeper.lost_reason is not None

    def check(self) -> None:
        """Raises `SessionLost` if the session was lost."""
        reason = self._keeper.lost_reason
        if reason is not None:
            raise SessionLost(reason)

    def __repr__(self) -> str:
        return f"KeptSession(session_id={self.session_id!r}, lost={self.lost})"


class Lease:
    """A lock held for the length of a `lock()` block. Pass `token` to every resource the lock
    protects: a resource that has seen a higher token rejects this one."""

    def __init__(self, name: str, token: int, keeper: _Keeper) -> None:
        self._name = name
        self._token = token
        self._keeper = keeper

    @property
    def name(self) -> str:
        return self._name

    @property
    def token(self) -> int:
        return self._token

    @property
    def session_id(self) -> str:
        return self._keeper.session_id

    @property
    def lost(self) -> bool:
        return self._keeper.lost_reason is not None

    def check(self) -> None:
        """Raises `LockLost` if the lock may have passed to someone else."""
        loss = self._loss()
        if loss is not None:
            raise loss

    def _loss(self) -> LockLost | None:
        reason = self._keeper.lost_reason
        if reason is None:
            return None
        return LockLost(f"lock {self._name!r} (token {self._token}) is lost: {reason}")

    def __repr__(self) -> str:
        return f"Lease(name={self._name!r}, token={self._token}, lost={self.lost})"


async def _quietly(work: Awaitable[Any], what: str) -> None:
    """Clean-up that must not hide the block's outcome: a session already gone is fine, and any
    other failure leaves the session to expire at the end of its TTL."""
    try:
        await work
    except (NotFound, LockNotHeld):
        pass
    except (XrError, RuntimeError) as error:
        log.warning("%s failed (%s); the session ends when its TTL runs out", what, error)


def _report_loss(error: BaseException | None, lost: Exception) -> None:
    """Raises `lost` after a block that ended normally; notes it on the block's own error."""
    if error is None:
        raise lost
    error.add_note(f"while the block ran: {lost}")


class SessionContext:
    """`async with client.session(ttl_s=...) as session:`"""

    def __init__(self, sessions: AsyncSessions, *, ttl_s: float, keepers: set[_Keeper]) -> None:
        self._sessions = sessions
        self._ttl_s = check_ttl_s(ttl_s)
        self._keepers = keepers
        self._keeper: _Keeper | None = None

    async def __aenter__(self) -> KeptSession:
        if self._keeper is not None:
            raise RuntimeError("this session block is already in use")
        sent_s = time.monotonic()
        info = await self._sessions.grant(self._ttl_s)
        self._keeper = _Keeper(
            self._sessions,
            info.session_id,
            self._ttl_s,
            renewed_at_s=sent_s,
            keepers=self._keepers,
        )
        self._keeper.start()
        return KeptSession(self._keeper)

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        keeper = self._keeper
        assert keeper is not None, "__aexit__ without __aenter__"
        self._keeper = None
        await keeper.stop()
        reason = keeper.lost_reason
        await _quietly(
            self._sessions.revoke(keeper.session_id), f"revoking session {keeper.session_id}"
        )
        if reason is not None:
            _report_loss(error, SessionLost(reason))

    def leave_closed(self, error: BaseException | None) -> None:
        """Leaves the block of a client that was closed inside it (nothing can be sent): the
        close marked the session lost, and that is reported as `__aexit__` would."""
        keeper = self._keeper
        if keeper is None:
            raise RuntimeError("the client was closed while this block was being left")
        self._keeper = None
        reason = keeper.lost_reason
        if reason is not None:
            _report_loss(error, SessionLost(reason))


class LockContext:
    """`async with client.lock(name, ttl_s=..., wait_s=...) as lease:`"""

    def __init__(
        self,
        sessions: AsyncSessions,
        locks: AsyncLocks,
        name: str,
        *,
        ttl_s: float,
        wait_s: float,
        keepers: set[_Keeper],
    ) -> None:
        # Checked here, not when the lock is asked for: by then a session would have been granted.
        self._sessions = sessions
        self._locks = locks
        self._name = check_key_argument("name", name)
        self._ttl_s = check_ttl_s(ttl_s)
        self._wait_s = check_wait_s(wait_s)
        self._keepers = keepers
        self._lease: Lease | None = None

    async def __aenter__(self) -> Lease:
        if self._lease is not None:
            raise RuntimeError("this lock block is already in use")
        sent_s = time.monotonic()
        info = await self._sessions.grant(self._ttl_s)
        # Kept alive from the start: a wait in the lock's queue may outlast the TTL.
        keeper = _Keeper(
            self._sessions,
            info.session_id,
            self._ttl_s,
            renewed_at_s=sent_s,
            keepers=self._keepers,
        )
        keeper.start()
        try:
            token = await self._acquire(keeper)
        except BaseException:
            await keeper.stop()
            await _quietly(
                self._sessions.revoke(info.session_id), f"revoking session {info.session_id}"
            )
            raise
        keeper.lock_name = self._name
        self._lease = Lease(self._name, token, keeper)
        return self._lease

    async def _acquire(self, keeper: _Keeper) -> int:
        """The token of the lock, taken for the keeper's session; `LockNotGranted` when the wait
        ends first, or when the session is lost first (then with the keeper's reason)."""
        session_id = keeper.session_id
        try:
            result = await self._locks.acquire(self._name, session_id, wait_s=self._wait_s)
        except NotFound as error:
            # The session is the one thing an acquire can find missing: it ended (revoked, or
            # expired while the acquire waited or was retried).
            ended = keeper.lost_reason or f"session {session_id} ended (revoked or expired)"
            raise LockNotGranted(
                f"lock {self._name!r} was not granted: {ended} (the cluster answered: "
                f"{error.message})"
            ) from error
        except XrError as error:
            lost = keeper.lost_reason
            if lost is None:
                raise
            raise LockNotGranted(
                f"lock {self._name!r} was not granted: {lost} (the last try to acquire it: "
                f"{error.message})"
            ) from error
        reason = keeper.lost_reason
        if reason is not None:
            # Granted after the session was lost: its lock may pass on at any moment.
            granted = (
                "" if result.token is None else f"; the grant (token {result.token}) came later"
            )
            raise LockNotGranted(f"lock {self._name!r} was not granted: {reason}{granted}")
        if not result.granted or result.token is None:
            # A wait that timed out is not told the holder, and the lock may be free by now.
            held_by = "" if result.holder is None else f" (held by session {result.holder})"
            raise LockNotGranted(
                f"lock {self._name!r} was not granted within {self._wait_s:g} s{held_by}"
            )
        return result.token

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        lease = self._lease
        assert lease is not None, "__aexit__ without __aenter__"
        self._lease = None
        keeper = lease._keeper
        await keeper.stop()
        loss = lease._loss()
        # Ending the session releases the lock and hands it to the next waiter in one entry.
        await _quietly(
            self._sessions.revoke(keeper.session_id),
            f"releasing lock {self._name!r} (revoking session {keeper.session_id})",
        )
        if loss is not None:
            _report_loss(error, loss)

    def leave_closed(self, error: BaseException | None) -> None:
        """Leaves the block of a client that was closed inside it (nothing can be sent): the
        close marked the lock lost, and that is reported as `__aexit__` would."""
        lease = self._lease
        if lease is None:
            raise RuntimeError("the client was closed while this block was being left")
        self._lease = None
        loss = lease._loss()
        if loss is not None:
            _report_loss(error, loss)
