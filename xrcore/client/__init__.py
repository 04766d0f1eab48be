"""The client library of xr: the one part of `xrcore` that does I/O (HTTP, through aiohttp).

`AsyncClient` for asyncio code and `Client` for everything else have the same surface:

    client.kv        put, get, delete, range, list, watch
    client.sessions  grant, keepalive, revoke, get
    client.locks     acquire, release, get, validate
    client.jobs      submit, get, list, cancel, events, logs, wait
    client.regions   list, get
    client.tenants   list, set (scheduling: fair-share weight, quotas, price and carbon weights)
    client.cluster   status, members, transfer_leader
    client.health()  client.session(ttl_s=...)  client.lock(name, ttl_s=..., wait_s=...)

Endpoints are URLs (`https://10.0.0.1:8700`) or a bare `host:port` (plain http); `ca_file`,
`cert_file` and `key_file` set up TLS and mutual TLS (docs/security.md).

Calls fail over between the given endpoints and retry until their deadline; writes carry an
idempotency key so the cluster applies each exactly once however often it is retried. Errors are
the classes of `xrcore.errors`, rebuilt from the server's error codes, plus `LockLost`,
`SessionLost` and `LockNotGranted`, which only the client raises.

The cluster remembers the results of a client's 32 newest writes, which is what a retry is
answered from, so a client has at most 32 writes in flight: more (1,000 `kv.put`s gathered on
one `AsyncClient`, 100 threads sharing one `Client`) wait their turn, oldest first, within their
own `timeout_s` (`ClusterUnavailable`, definite, if their turn does not come in time). A write
that long-polls (a lock acquire waiting in the lock's queue) takes no turn and holds up no
other write. Two clients running at the same time need a `client_id` each: with the same one,
the older one's writes fail with `RequestTooOld` once the newer has made 32 writes.

An answer that is not the API's is never taken for one. An answer is read up to 1 GiB: a
longer one (from something at an endpoint that is not an xr node, or a broken one) fails that
try as a lost answer would, and the call goes on to the next endpoint; so does a 2xx answer
whose body is not a JSON object (a web server's page). An answer without a field the method
reads raises `XrError` (indefinite: the request may have taken effect). A 404 that is not the
node's own "no such key" (a web server's "404: Not Found", or the node's "no route" for an
endpoint URL with a path after the port) raises `XrError` naming the path: a `get` returns None
only for an object that does not exist.

Closing a client ends the calls still running on it (in other threads or tasks) at once, each
with an `XrError` that says whether it took effect, as a call out of time does: `UnknownOutcome`
(indefinite: it may or may not have been applied) when a try of a write had been sent, and
`ClusterUnavailable` (definite: nothing was applied) when none had, or for a read. A watch or a
`jobs.wait` running then ends with that error too; a call made after the close raises
RuntimeError. Closing also ends the keep-alives of the `session()` and `lock()` blocks still
running, so their sessions and locks are marked lost at once: `lost` turns true, and `check()`
and leaving the block raise `LockLost` (or `SessionLost`). A blocking `next()` of a watch that
is interrupted (KeyboardInterrupt, an exception from a signal handler) can be called again and
takes up where it was; see `Stream`.

Arguments are checked before anything is sent, with the cluster's own rules (`xrcore`'s checks
and limits), and the error names the argument: a wrong type raises TypeError (True is not an
int, bytes are not a str); a value
the cluster would refuse (an empty or oversized key, a name with a space, a limit out of range)
raises the `InvalidArgument` or `PayloadTooLarge` the cluster would answer; a bad client setting
(an endpoint, a token with a line break, a NaN wait or timeout, a TLS file that is not a path),
and a NaN or infinity in a request body (a job spec), raise ValueError; a string with a lone
surrogate (bytes that are not UTF-8) raises UnicodeEncodeError, a ValueError. `client.lock()`
and `client.session()` check theirs when called, before any session is granted. A job spec
with a field this version does not know is sent as given: a newer cluster may know it."""

import logging

from xrcore.client._api import (
    AsyncCluster,
    AsyncJobs,
    AsyncKv,
    AsyncLocks,
    AsyncRegions,
    AsyncSessions,
    AsyncTenants,
)
from xrcore.client._async import AsyncClient
from xrcore.client._errors import LockLost, LockNotGranted, SessionLost
from xrcore.client._leases import KeptSession, Lease
from xrcore.client._models import (
    Attempt,
    Checkpoint,
    ClusterStatus,
    DeleteResult,
    Health,
    Job,
    JobEvent,
    JobLogs,
    JobPage,
    JobSummary,
    KeyPage,
    KeyValue,
    LockAcquisition,
    LockInfo,
    Member,
    PutResult,
    Region,
    RegionGpu,
    SessionInfo,
    SubmittedSpec,
    Task,
    Tenant,
    TokenValidation,
    WatchEvent,
)
from xrcore.client._sync import (
    Client,
    Cluster,
    Jobs,
    Kv,
    Locks,
    Regions,
    Sessions,
    Stream,
    Tenants,
)

# A library leaves logging to the application: without a handler of its own, the warnings of
# keep-alives in the background would reach stderr through logging's last resort in a program
# that set up no logging.
logging.getLogger("xr.client").addHandler(logging.NullHandler())

__all__ = [
    "AsyncClient",
    "AsyncCluster",
    "AsyncJobs",
    "AsyncKv",
    "AsyncLocks",
    "AsyncRegions",
    "AsyncSessions",
    "AsyncTenants",
    "Attempt",
    "Checkpoint",
    "Client",
    "Cluster",
    "ClusterStatus",
    "DeleteResult",
    "Health",
    "Job",
    "JobEvent",
    "JobLogs",
    "JobPage",
    "JobSummary",
    "Jobs",
    "KeptSession",
    "KeyPage",
    "KeyValue",
    "Kv",
    "Lease",
    "LockAcquisition",
    "LockInfo",
    "LockLost",
    "LockNotGranted",
    "Locks",
    "Member",
    "PutResult",
    "Region",
    "RegionGpu",
    "Regions",
    "SessionInfo",
    "SessionLost",
    "Sessions",
    "Stream",
    "SubmittedSpec",
    "Task",
    "Tenant",
    "Tenants",
    "TokenValidation",
    "WatchEvent",
]
