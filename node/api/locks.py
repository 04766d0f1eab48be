"""Locks: acquire (optionally waiting), release, inspect and validate a fencing token.

A waiting acquire joins the lock's FIFO queue in the log and then waits on this node for the
grant to be applied (the grant is made in the log when the holder releases or its session ends,
so handoff costs one commit, not a poll interval). If the wait ends without the grant (timeout,
the client went away, the node is stopping) the session leaves the queue with `lock.leave`,
which never releases: the client may have retried the same session on another node (its
connection here broke, a partition cut this node off) and been told there that the lock is its
own, while this node's leave was still on its way to the log. If the grant raced the end of the
wait, the answer is the grant; an answer "not granted" comes after the session left the queue,
so its caller does not hold the lock (a leave the log does not answer, the session still
queued, is answered with the log's error, not "not granted"). `http.lock_leave_command =
false` proposes the earlier `lock.release` instead, which releases such a grant: for clusters
with nodes of a version without `lock.leave`.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from node.api.app import Services, principal, read, services, wait_s, waiting_slot, write
from node.api.auth import Principal
from node.api.sessions import own_session
from node.api.wire import field, read_body, reject_unknown, respond
from raftstore.faults import Fault
from raftstore.store import RaftStore
from xrcore import locks
from xrcore._validate import NAME_BYTES_MAX
from xrcore.commands import LockAcquire, LockLeave, LockRelease, LockValidate
from xrcore.errors import InvalidArgument, XrError

__all__ = ["routes"]

routes = web.RouteTableDef()


def _name(request: web.Request, caller: Principal) -> str:
    name = caller.scoped(request.match_info["name"])
    if len(name.encode()) > NAME_BYTES_MAX:
        raise InvalidArgument(
            f"the lock name is too long: with the tenant prefix it must fit {NAME_BYTES_MAX} bytes"
        )
    return name


def _view(caller: Principal, view: dict[str, Any]) -> dict[str, Any]:
    shown = dict(view)
    shown["name"] = caller.unscoped(view["name"])
    return shown


def _handed_out(request: web.Request, name: str, answer: dict[str, Any]) -> dict[str, Any]:
    """A grant as answered to the caller. Under the test fault `unfenced-locks` its token is the
    first one this node answered for the lock, so a new holder's token no longer fences off the
    old holder."""
    faults = services(request).store.faults
    if answer.get("granted") and faults.active(Fault.UNFENCED_LOCKS):
        return {**answer, "token": faults.first_token(name, answer["token"])}
    return answer


def _state(store: RaftStore, name: str, session_id: str) -> tuple[str, int, int | None]:
    """("granted", index, token), ("waiting", index, None) or ("gone", index, None): where the
    session stands on the lock in this replica's applied state."""

    def query(machine: Any) -> tuple[str, int, int | None]:
        lock = machine.locks.get(name)
        if lock is not None and lock.holder == session_id:
            return "granted", machine.index, lock.token
        if lock is not None and session_id in lock.waiters:
            return "waiting", machine.index, None
        return "gone", machine.index, None

    return store.replica.read(query)


async def _leave(node: Services, name: str, session_id: str) -> XrError | None:
    """Takes the session out of the lock's queue (see the module's text); the error when the
    log did not answer."""
    command: LockLeave | LockRelease = (
        LockLeave(name=name, session_id=session_id)
        if node.config.http.lock_leave_command
        else LockRelease(name=name, session_id=session_id)
    )
    try:
        await node.store.propose(command)
    except XrError as error:
        return error
    return None


@routes.post("/v1/locks/{name}/acquire")
async def acquire(request: web.Request) -> web.Response:
    caller = principal(request)
    name = _name(request, caller)
    body = await read_body(request)
    reject_unknown(body, {"session_id", "wait_s"})
    session_id = field(body, "session_id", str)
    waited_s = wait_s(request, field(body, "wait_s", float, default=0.0))
    await own_session(request, caller, session_id)
    if waited_s == 0:
        result = await write(request, LockAcquire(name=name, session_id=session_id))
        return respond(request, _handed_out(request, name, _view(caller, result)))
    # The waiting place is taken before the session joins the queue: a request refused with 429
    # must not leave its session queued for a grant that nobody waits for.
    async with waiting_slot(request):
        result = await write(request, LockAcquire(name=name, session_id=session_id, wait=True))
        if result["granted"] or not result.get("queued"):
            return respond(request, _handed_out(request, name, _view(caller, result)))
        granted = await _wait_for_grant(request, name, session_id, waited_s)
    if granted is None:
        return respond(
            request,
            {"name": caller.unscoped(name), "granted": False, "queued": False, "timed_out": True},
        )
    grant = {"name": caller.unscoped(name), "granted": True, "token": granted, "holder": session_id}
    return respond(request, _handed_out(request, name, grant))


async def _wait_for_grant(
    request: web.Request, name: str, session_id: str, timeout_s: float
) -> int | None:
    node = services(request)
    store = node.store
    loop = asyncio.get_running_loop()
    deadline_s = loop.time() + timeout_s
    try:
        while True:
            where, index, token = _state(store, name, session_id)
            if where == "granted":
                return token
            remaining_s = deadline_s - loop.time()
            if where == "gone" or remaining_s <= 0 or node.stopping.is_set():
                break
            await store.wait_applied(index, timeout_s=min(remaining_s, 1.0))
    except asyncio.CancelledError:
        # The client went away while the session waited: leave the queue in the background
        # (this task is being cancelled).
        node.spawn(_leave(node, name, session_id))
        raise
    failed = await _leave(node, name, session_id)
    # A grant that raced the end of the wait is the caller's.
    where, _, token = _state(store, name, session_id)
    if where == "granted":
        return token
    if where == "waiting" and failed is not None:
        # Still queued, and whether it will be granted is not known here: not "not granted".
        raise failed
    return None


@routes.post("/v1/locks/{name}/release")
async def release(request: web.Request) -> web.Response:
    caller = principal(request)
    name = _name(request, caller)
    body = await read_body(request)
    reject_unknown(body, {"session_id"})
    session_id = field(body, "session_id", str)
    await own_session(request, caller, session_id)
    result = await write(request, LockRelease(name=name, session_id=session_id))
    return respond(request, _view(caller, result))


@routes.get("/v1/locks/{name}")
async def show(request: web.Request) -> web.Response:
    caller = principal(request)
    name = _name(request, caller)
    result = await read(request, lambda machine: locks.get(machine, name))
    return respond(request, {**_view(caller, result.value), "stale": result.stale})


@routes.post("/v1/locks/{name}/validate")
async def validate(request: web.Request) -> web.Response:
    caller = principal(request)
    name = _name(request, caller)
    body = await read_body(request)
    reject_unknown(body, {"token"})
    token = field(body, "token", int)
    if token < 1:
        raise InvalidArgument(f"token must be a positive integer, got {token}")
    command = LockValidate(name=name, token=token)
    result = await read(request, lambda machine: locks.validate(machine, command, 0))
    answer = {**_view(caller, result.value), "stale": result.stale}
    if services(request).store.faults.active(Fault.UNFENCED_LOCKS):
        # The fault's check: any token up to the current one passes, not only the current one.
        current = answer["current_token"]
        answer["valid"] = current is not None and token <= current
    return respond(request, answer)
