"""The client against a real three-region cluster on loopback (`LocalCluster`, one per module).

Each test uses key, lock and job names of its own, and a test that kills a node starts it again
before it ends, so the tests share one cluster. Waits poll a condition with a bound; nothing
asserts on how long something took.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from node.localcluster import LocalCluster, LocalNode
from xrcore.client import AsyncClient, Client, LockLost, LockNotGranted, SessionLost, WatchEvent
from xrcore.errors import (
    CompareFailed,
    InvalidArgument,
    InvalidTransition,
    LockNotHeld,
    NotFound,
    Timeout,
    XrError,
)

pytestmark = pytest.mark.integration

# Generous: a bound on a wait that normally ends in well under a second, so a slow machine does
# not fail a correct client.
WAIT_S = 30.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    local = LocalCluster(tmp_path_factory.mktemp("client-cluster"), size=3)
    try:
        local.start()
        yield local
    finally:
        local.kill()


@pytest.fixture
def healthy(cluster: LocalCluster) -> LocalCluster:
    """The shared cluster with every node running and ready (a failed test may have left one
    down)."""
    for node in cluster.nodes:
        if not node.running:
            node.start()
    cluster.wait_ready(timeout_s=WAIT_S)
    return cluster


@pytest.fixture
def prefix(request: pytest.FixtureRequest) -> str:
    return f"{request.node.name}/"


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline_s = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline_s:
            raise AssertionError(f"{what}: not within {WAIT_S} s")
        time.sleep(0.02)


def leader_of(cluster: LocalCluster) -> LocalNode:
    found: list[LocalNode] = []

    def known() -> bool:
        node = cluster.leader()
        found[:] = [] if node is None else [node]
        return node is not None

    wait_until(known, "a leader is known")
    return found[0]


def restart(cluster: LocalCluster, node: LocalNode) -> None:
    node.start()
    cluster.wait_ready(timeout_s=WAIT_S, nodes=[node])


# KV.


def test_write_through_a_follower__is_read_back_from_another_node(
    healthy: LocalCluster, prefix: str
) -> None:
    leader = leader_of(healthy)
    follower, other = [node for node in healthy.nodes if node is not leader][:2]
    with Client(follower.url) as writer, Client(other.url) as reader:
        written = writer.kv.put(f"{prefix}text", "hello")
        writer.kv.put(f"{prefix}bytes", b"\x00\xff")
        text = reader.kv.get(f"{prefix}text")
        raw = reader.kv.get(f"{prefix}bytes")
    assert text is not None and text.text == "hello"
    assert text.mod_revision == written.revision and text.version == 1
    assert raw is not None and raw.value == b"\x00\xff"


def test_typed_errors__carry_the_server_class_and_definiteness(
    healthy: LocalCluster, prefix: str
) -> None:
    async def scenario() -> None:
        async with AsyncClient(healthy.urls) as client:
            await client.kv.put(f"{prefix}k", "v")
            with pytest.raises(CompareFailed) as compare:
                await client.kv.put(f"{prefix}k", "w", expected_mod_revision=1_000_000)
            with pytest.raises(NotFound) as missing:
                await client.sessions.keepalive("s999999999")
            with pytest.raises(InvalidArgument) as invalid:
                await client.kv.range(prefix, limit=0)
            with pytest.raises(InvalidArgument):
                await client.sessions.grant(0.01)
            session = await client.sessions.grant(5)
            with pytest.raises(LockNotHeld) as not_held:
                await client.locks.release(f"{prefix}lock", session.session_id)
            assert await client.kv.get(f"{prefix}absent") is None
            assert await client.sessions.get("s999999999") is None
            assert await client.locks.get(f"{prefix}lock") is None
            for raised in (compare, missing, invalid, not_held):
                assert raised.value.definite, raised.value

    asyncio.run(scenario())


def test_async_client__pages_lists_and_watches_keys(healthy: LocalCluster, prefix: str) -> None:
    async def scenario() -> None:
        async with AsyncClient(healthy.urls) as client:
            start = (await client.kv.range(prefix)).revision + 1
            for position in range(5):
                await client.kv.put(f"{prefix}{position}", str(position))
            await client.kv.delete(f"{prefix}4")
            first = await client.kv.range(prefix, limit=2)
            second = await client.kv.range(prefix, limit=2, after=first.next)
            assert [item.key for item in first.items + second.items] == [
                f"{prefix}{position}" for position in range(4)
            ]
            listed = [item.text async for item in client.kv.list(prefix)]
            assert listed == ["0", "1", "2", "3"]
            stale = await client.kv.get(f"{prefix}0", consistency="stale")
            assert stale is None or stale.text == "0"
            watch = client.kv.watch(prefix, from_revision=start)
            events = [await anext(watch) for _ in range(6)]
            await watch.aclose()
            assert [(event.kind, event.key) for event in events] == [
                *[("put", f"{prefix}{position}") for position in range(5)],
                ("delete", f"{prefix}4"),
            ]
            assert [event.revision for event in events] == list(range(start, start + 6))

    asyncio.run(scenario())


def test_leader_killed_during_writes__every_write_returns_and_applies_once(
    healthy: LocalCluster, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="xr.client")
    leader = leader_of(healthy)
    # The leader first: the client's connections die with it, so retries really fail over.
    endpoints = [leader.url] + [node.url for node in healthy.nodes if node is not leader]
    key = f"{prefix}counter"
    acknowledged: list[int] = []
    stop = threading.Event()
    failures: list[BaseException] = []

    def increment_until_stopped() -> None:
        try:
            with Client(endpoints, timeout_s=20) as client:
                client.kv.put(key, "0", expected_mod_revision=0)
                while not stop.is_set():
                    current = client.kv.get(key)
                    assert current is not None
                    client.kv.put(
                        key,
                        str(int(current.text) + 1),
                        expected_mod_revision=current.mod_revision,
                    )
                    acknowledged.append(int(current.text) + 1)
        except BaseException as error:
            failures.append(error)

    writer = threading.Thread(target=increment_until_stopped)
    writer.start()
    try:
        wait_until(lambda: len(acknowledged) >= 5 or bool(failures), "five increments")
        leader.kill()
        killed_at = len(acknowledged)
        wait_until(
            lambda: len(acknowledged) >= killed_at + 10 or bool(failures),
            "ten increments after the leader was killed",
        )
    finally:
        stop.set()
        writer.join(WAIT_S)
        restart(healthy, leader)
    assert not failures, failures
    with Client(healthy.urls) as client:
        final = client.kv.get(key)
    assert final is not None
    assert int(final.text) == len(acknowledged) == acknowledged[-1]
    # One put for the initial value and one per acknowledged increment: no retried put counted
    # twice.
    assert final.version == len(acknowledged) + 1
    assert any("failed" in record.getMessage() for record in caplog.records), (
        "the client never had to fail over"
    )


# Watch.


def test_watch__resumes_after_its_endpoint_is_killed__each_event_once_in_order(
    healthy: LocalCluster, prefix: str
) -> None:
    leader = leader_of(healthy)
    watched = next(node for node in healthy.nodes if node is not leader)
    others = [node.url for node in healthy.nodes if node is not watched]
    events: list[WatchEvent] = []
    failures: list[BaseException] = []
    with Client(others) as writer:
        start = writer.kv.range(prefix).revision + 1

        def follow() -> None:
            try:
                with (
                    Client([watched.url, *others], timeout_s=10) as watcher,
                    watcher.kv.watch(prefix, from_revision=start) as stream,
                ):
                    for event in stream:
                        events.append(event)
                        if len(events) == 6:
                            return
            except BaseException as error:
                failures.append(error)

        thread = threading.Thread(target=follow)
        thread.start()
        try:
            for position in range(3):
                writer.kv.put(f"{prefix}{position}", "before")
            wait_until(lambda: len(events) == 3 or bool(failures), "three events")
            watched.kill()
            for position in range(3, 6):
                writer.kv.put(f"{prefix}{position}", "after")
            wait_until(lambda: len(events) == 6 or bool(failures), "six events")
        finally:
            thread.join(WAIT_S)
            restart(healthy, watched)
    assert not failures, failures
    assert [event.key for event in events] == [f"{prefix}{position}" for position in range(6)]
    revisions = [event.revision for event in events]
    assert revisions == sorted(set(revisions)), "in revision order, none twice"


# Locks and sessions.


def test_lock_block__gives_a_token_and_releases_on_exit(healthy: LocalCluster, prefix: str) -> None:
    name = f"{prefix}lock"
    with Client(healthy.urls) as client, Client(healthy.urls) as rival:
        with client.lock(name, ttl_s=5) as lease:
            assert lease.name == name and lease.token > 0 and not lease.lost
            held = client.locks.get(name)
            assert held is not None and held.holder == lease.session_id
            assert held.token == lease.token
            assert client.locks.validate(name, lease.token).valid
            with pytest.raises(LockNotGranted), rival.lock(name, wait_s=0):
                pass
            lease.check()
        assert client.locks.get(name) is None
        assert client.sessions.get(lease.session_id) is None
        assert not client.locks.validate(name, lease.token).valid


def test_lock__handed_over_in_fifo_order__tokens_strictly_increase(
    healthy: LocalCluster, prefix: str
) -> None:
    name = f"{prefix}lock"
    holders: list[tuple[int, int]] = []
    failures: list[BaseException] = []
    with Client(healthy.urls) as first:
        session = first.sessions.grant(10)
        granted = first.locks.acquire(name, session.session_id)
        assert granted.granted and granted.token is not None

        def contend(position: int) -> None:
            try:
                with Client(healthy.urls) as client, client.lock(name, wait_s=WAIT_S) as lease:
                    holders.append((position, lease.token))
            except BaseException as error:
                failures.append(error)

        threads = []
        for position in range(3):
            thread = threading.Thread(target=contend, args=(position,))
            thread.start()
            threads.append(thread)

            # The next contender starts only once this one is in the queue.
            def queued(count: int = position + 1) -> bool:
                info = first.locks.get(name)
                return bool(failures) or (info is not None and len(info.waiters) == count)

            wait_until(queued, f"contender {position} waits in the queue")
        assert first.locks.release(name, session.session_id)
        for thread in threads:
            thread.join(WAIT_S)
        first.sessions.revoke(session.session_id)
    assert not failures, failures
    assert [position for position, _ in holders] == [0, 1, 2]
    tokens = [granted.token] + [token for _, token in holders]
    assert tokens == sorted(set(tokens)), f"tokens must strictly increase: {tokens}"


def test_lease_loss__revoked_from_elsewhere__check_and_exit_raise_lock_lost(
    healthy: LocalCluster, prefix: str
) -> None:
    with Client(healthy.urls) as client, Client(healthy.urls) as other:
        with pytest.raises(LockLost), client.lock(f"{prefix}lock", ttl_s=3) as lease:
            other.sessions.revoke(lease.session_id)
            wait_until(lambda: lease.lost, "the lease is seen lost")
            with pytest.raises(LockLost):
                lease.check()
        assert client.locks.get(f"{prefix}lock") is None


def test_async_session_block__kept_alive_past_its_ttl_then_revoked_on_exit(
    healthy: LocalCluster,
) -> None:
    async def scenario() -> None:
        async with AsyncClient(healthy.urls) as client:
            async with client.session(ttl_s=1.0) as session:
                started_s = time.monotonic()
                granted = await client.sessions.get(session.session_id)
                assert granted is not None
                # Poll until the session has outlived its TTL: only keep-alives can do that.
                while (time.monotonic() - started_s) < 2 * session.ttl_s:
                    await asyncio.sleep(0.1)
                assert await client.sessions.get(session.session_id) is not None
                session.check()
            assert await client.sessions.get(session.session_id) is None
            with pytest.raises(SessionLost):
                async with client.session(ttl_s=3) as lost:
                    await client.sessions.revoke(lost.session_id)
                    while not lost.lost:
                        await asyncio.sleep(0.02)

    asyncio.run(scenario())


# Jobs, regions and the cluster.


def test_jobs__submit_list_cancel_and_wait(healthy: LocalCluster, prefix: str) -> None:
    with Client(healthy.urls) as client:
        # A job no region may run stays pending: one that ran would fail at once ("sleep" is no
        # built-in workload) and end the wait below before its timeout.
        job_id = client.jobs.submit(
            "client-test", workload="sleep", args={"seconds": 1}, regions_allow=["nowhere"]
        )
        job = client.jobs.get(job_id)
        assert job is not None and job.state == "pending" and len(job.tasks) == 1
        assert job_id in [item.job_id for item in client.jobs.list(limit=1000).items]
        with pytest.raises(Timeout) as waited:
            client.jobs.wait(job_id, timeout_s=0.3)
        assert not waited.value.definite
        assert client.jobs.cancel(job_id, reason="test") == 1
        finished = client.jobs.wait(job_id, timeout_s=WAIT_S)
        assert finished.state == "cancelled" and finished.cancel_reason == "test"
        assert client.jobs.events(job_id)[0].kind == "submitted"
        with pytest.raises(InvalidTransition):
            client.jobs.cancel(job_id)
        with pytest.raises(NotFound):
            client.jobs.cancel("job-0")
        with pytest.raises(InvalidArgument):
            client.jobs.submit("no-workload")
        assert client.jobs.get("job-0") is None


def test_regions_cluster_and_health(healthy: LocalCluster) -> None:
    async def scenario() -> None:
        async with AsyncClient(healthy.urls) as client:
            names = [region.name for region in await client.regions.list()]
            assert names == ["r0", "r1", "r2"]
            region = await client.regions.get("r1")
            assert region is not None and region.http_address.endswith(
                str(healthy.node("r1").http_port)
            )
            assert await client.regions.get("nowhere") is None
            status = await client.cluster.status()
            assert status.leader_region in names and status.has_quorum
            members = await client.cluster.members()
            assert len(members) == 3 and sum(member.is_self for member in members) == 1
            assert not await client.cluster.transfer_leader(status.leader_region or "")
            health = await client.health()
            assert health.ready and health.region == "r0"

    asyncio.run(scenario())


def test_a_node_that_waits_less_than_the_client_asks__serves_its_long_polls(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The client long-polls 20 s at a time (and a lock wait asks for the caller's whole wait);
    a node whose `http.wait_max_s` is 1 s refused those with 400 until it served each as its
    longest wait. Now the client asks again while its own wait lasts: a watch sees a put made
    after a few polls, a job wait times out when the caller's timeout ends, and a lock wait longer
    than the node's is granted when the holder lets go."""
    local = LocalCluster(
        tmp_path_factory.mktemp("short-waits"), size=1, settings={"http.wait_max_s": "1"}
    )
    try:
        local.start()
        with Client(local.urls) as client, Client(local.urls) as rival:
            start = client.kv.range("short/").revision + 1
            seen: list[WatchEvent] = []

            def watch() -> None:
                async def first() -> None:
                    async with AsyncClient(local.urls) as watcher:
                        stream = watcher.kv.watch("short/", from_revision=start)
                        seen.append(await anext(stream))
                        await stream.aclose()

                asyncio.run(first())

            watcher = threading.Thread(target=watch)
            watcher.start()
            time.sleep(2.5)  # more than two of the node's longest waits
            client.kv.put("short/key", "v")
            watcher.join(WAIT_S)
            assert [(event.kind, event.key) for event in seen] == [("put", "short/key")]

            # A job allowed only in a region there is not stays pending.
            job_id = client.jobs.submit(name="short", workload="w", regions_allow=["nowhere"])
            with pytest.raises(Timeout):
                client.jobs.wait(job_id, timeout_s=2.5)
            job = client.jobs.get(job_id)
            assert job is not None and job.state == "pending"

            with client.lock("short-lock", ttl_s=10) as lease:
                granted: list[int] = []

                def wait_for_it() -> None:
                    with rival.lock("short-lock", ttl_s=10, wait_s=WAIT_S) as other:
                        granted.append(other.token)

                waiter = threading.Thread(target=wait_for_it)
                waiter.start()
                time.sleep(2.5)
                assert not granted
            waiter.join(WAIT_S)
            assert granted and granted[0] > lease.token
    finally:
        local.kill()


# Many writes in flight from one client.


def test_many_concurrent_puts_from_one_async_client__all_apply(
    healthy: LocalCluster, prefix: str
) -> None:
    """The cluster keeps the results of a client's 32 newest seqs; of 1,000 puts at once, some
    used to be refused as too old (`RequestTooOld`) once newer seqs had overtaken them (a 429
    retried after its Retry-After, say). The client keeps at most 32 writes in flight, so every
    one is applied and answered."""
    count = 1000

    async def scenario() -> None:
        async with AsyncClient(healthy.urls, timeout_s=WAIT_S) as client:
            await asyncio.gather(
                *(client.kv.put(f"{prefix}{number:04}", str(number)) for number in range(count))
            )
            listed = [item async for item in client.kv.list(prefix)]
        assert [(item.key, item.text) for item in listed] == [
            (f"{prefix}{number:04}", str(number)) for number in range(count)
        ]
        assert all(item.version == 1 for item in listed)

    asyncio.run(scenario())


def test_many_threads_sharing_one_client__every_write_applies(
    healthy: LocalCluster, prefix: str
) -> None:
    threads_count, writes_count = 100, 20
    failures: list[BaseException] = []
    with Client(healthy.urls, timeout_s=WAIT_S) as client:

        def write(thread: int) -> None:
            try:
                for number in range(writes_count):
                    client.kv.put(f"{prefix}{thread:03}-{number}", "v")
            except BaseException as error:
                failures.append(error)

        threads = [
            threading.Thread(target=write, args=(number,)) for number in range(threads_count)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT_S)
        assert not failures, failures[:3]
        assert len(list(client.kv.list(prefix))) == threads_count * writes_count


# Closing a client inside a lock block.


def test_client_closed_inside_a_lock_block__the_lease_is_lost_and_its_successor_fenced(
    healthy: LocalCluster, prefix: str
) -> None:
    name = f"{prefix}lock"
    holder = Client(healthy.urls)
    with (
        pytest.raises(LockLost, match="the client was closed"),
        holder.lock(name, ttl_s=1) as lease,
    ):
        holder.close()
        assert lease.lost
        # Its session, no longer kept alive, expires, and the lock passes on.
        with Client(healthy.urls) as rival, rival.lock(name, ttl_s=5, wait_s=WAIT_S) as won:
            assert won.token > lease.token
        with pytest.raises(LockLost, match="no longer kept alive"):
            lease.check()


# An endpoint that is not the API.


def test_endpoint_with_a_path__a_missing_route_is_not_a_missing_key(healthy: LocalCluster) -> None:
    with Client(f"{healthy.urls[0]}/prefix", timeout_s=5) as client:
        with pytest.raises(XrError, match=r"has no such route \(no route /prefix/v1/kv/k") as got:
            client.kv.get("k")
        assert not isinstance(got.value, NotFound)
        for read in (
            lambda: client.sessions.get("s1"),
            lambda: client.locks.get("l"),
            lambda: client.jobs.get("job-1"),
            lambda: client.regions.get("r0"),
        ):
            with pytest.raises(XrError, match="no such route") as raised:
                read()
            assert not isinstance(raised.value, NotFound)
