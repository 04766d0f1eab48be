"""`AsyncClient`: the asyncio client of an xr cluster, and the one implementation behind the
synchronous `Client`.

    async with AsyncClient(["http://10.0.0.1:8700", "http://10.0.0.2:8700"]) as client:
        await client.kv.put("config/mode", "fast")
        async with client.lock("trainer", ttl_s=10) as lease:
            await storage.write(data, fencing_token=lease.token)

A client lives on the event loop that first uses it. Calls fail over between endpoints and retry
within `timeout_s` (see `_transport`); writes are applied exactly once however often they are
retried. A client has at most 32 writes in flight; more wait their turn (`_transport`, rule 2).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from types import TracebackType

from xrcore.client._api import (
    AsyncCluster,
    AsyncJobs,
    AsyncKv,
    AsyncLocks,
    AsyncRegions,
    AsyncSessions,
    AsyncTenants,
)
from xrcore.client._leases import LockContext, SessionContext, _Keeper
from xrcore.client._models import Health, convert
from xrcore.client._transport import Transport, check_number
from xrcore.errors import XrError, error_from_code

__all__ = ["AsyncClient"]


class AsyncClient:
    """An asyncio client of the cluster at `endpoints` (any nodes; every node takes reads and
    writes).

    `token`: the bearer token, when the cluster has authentication on. `timeout_s`: the deadline
    of one call, all tries on all endpoints together (a long poll adds its wait). `client_id`: the
    name under which the cluster remembers this client's writes for exactly-once retries; random
    unless given. Two clients running at the same time must not share one: the cluster keeps
    the results of the 32 newest writes of a `client_id`, and the newer client's writes are
    numbered above the older one's, so once the newer has made 32 writes, the older one's fail
    with `RequestTooOld`. (A client restarted with the id of one that has stopped is fine.)
    `retry_s`: how long a long-lived loop (a watch, `jobs.wait`) rides out a cluster
    that answers no call before it raises. `ca_file`: PEM file of the CA that signed the
    nodes' certificates, for `https://` endpoints (default: the system's CAs). `cert_file` and
    `key_file`: this client's certificate and key, for a cluster that requires client
    certificates (mutual TLS). A bare `host:port` endpoint is plain http.
    """

    def __init__(
        self,
        endpoints: str | Sequence[str],
        *,
        token: str | None = None,
        timeout_s: float = 10.0,
        client_id: str | None = None,
        retry_s: float = 30.0,
        ca_file: str | None = None,
        cert_file: str | None = None,
        key_file: str | None = None,
    ) -> None:
        # NaN would compare false with every elapsed time: a loop would never give up.
        if math.isnan(check_number("retry_s", retry_s)) or retry_s < 0:
            raise ValueError(f"retry_s must be a number of seconds, 0 or more, got {retry_s}")
        self._transport = Transport(
            endpoints,
            token=token,
            timeout_s=timeout_s,
            client_id=client_id,
            ca_file=ca_file,
            cert_file=cert_file,
            key_file=key_file,
        )
        self._keepers: set[_Keeper] = set()
        self.kv = AsyncKv(self._transport, retry_s=retry_s)
        self.sessions = AsyncSessions(self._transport)
        self.locks = AsyncLocks(self._transport)
        self.jobs = AsyncJobs(self._transport, retry_s=retry_s)
        self.regions = AsyncRegions(self._transport)
        self.tenants = AsyncTenants(self._transport)
        self.cluster = AsyncCluster(self._transport)

    @property
    def client_id(self) -> str:
        return self._transport.client_id

    @property
    def endpoints(self) -> tuple[str, ...]:
        return self._transport.endpoints

    async def health(self) -> Health:
        """`/readyz` of the endpoint the client is using now (no failover): whether that node
        can serve reads and writes, and if not, why."""
        status, document = await self._transport.probe("/readyz")
        if isinstance(document, dict) and "ready" in document:
            return convert(document, Health)
        info = document.get("error") if isinstance(document, dict) else None
        if isinstance(info, dict) and isinstance(info.get("code"), str):
            raise error_from_code(info["code"], str(info.get("message", "")))
        raise XrError(f"{self._transport.current_endpoint}/readyz answered HTTP {status}")

    def session(self, *, ttl_s: float = 10.0) -> SessionContext:
        """`async with client.session(ttl_s=10) as session:` a session kept alive in the
        background (every TTL/3) and revoked on exit; see `KeptSession`."""
        return SessionContext(self.sessions, ttl_s=ttl_s, keepers=self._keepers)

    def lock(self, name: str, *, ttl_s: float = 10.0, wait_s: float = 30.0) -> LockContext:
        """`async with client.lock(name) as lease:` the lock, under a session of its own that is
        kept alive in the background and ended on exit, which releases the lock. Waits up to
        `wait_s` in the lock's queue (`LockNotGranted` after, or as soon as the waiting session
        is lost, with the reason). `lease.token` is the fencing token; a lost lock shows in
        `lease.lost`, `lease.check()` and on leaving the block."""
        return LockContext(
            self.sessions,
            self.locks,
            name,
            ttl_s=ttl_s,
            wait_s=wait_s,
            keepers=self._keepers,
        )

    async def close(self) -> None:
        """Closes the connections and ends the calls still running, each with `UnknownOutcome`
        (indefinite) when a try of a write had been sent, else `ClusterUnavailable` (definite).
        Stops keeping alive the sessions of the `session()` and `lock()` blocks still running:
        their sessions expire at the end of their TTLs and their locks pass on, so each is
        marked lost at once (`lost`, `check()` raises `SessionLost` or `LockLost`, and so does
        leaving the block). Safe to call twice."""
        for keeper in list(self._keepers):
            await keeper.stop(
                lost_reason=f"the client was closed, so session {keeper.session_id} is no longer "
                "kept alive"
            )
        await self._transport.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"AsyncClient({list(self.endpoints)!r}, client_id={self.client_id!r})"
