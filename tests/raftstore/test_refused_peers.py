"""A member that refuses a peer says so: another cluster secret, a name not among its peers.

pysyncobj closes such connections without a word, so a member given the wrong secret, or
started with other spellings of the members, was a member the others never heard from, and
nothing in any log said why (found by the QA pass of session 30). `raftstore.frames` now counts
each refusal by reason in the member's status and logs it (at most once a minute for a peer host
and reason). Two real members on loopback each time, in this process.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from pathlib import Path

import pytest

from raftstore import frames
from raftstore.config import RaftConfig
from raftstore.store import RaftStore

pytestmark = pytest.mark.integration

WAIT_S = 20.0


def _addresses() -> tuple[str, str]:
    """Two free loopback addresses, the smaller first: pysyncobj connects from the larger
    address to the smaller, so only the first member gets an incoming connection."""
    sockets = [socket.socket() for _ in range(2)]
    try:
        for item in sockets:
            item.bind(("127.0.0.1", 0))
        found = sorted(f"127.0.0.1:{item.getsockname()[1]}" for item in sockets)
    finally:
        for item in sockets:
            item.close()
    return found[0], found[1]


async def _refusals_of(
    tmp_path: Path,
    *,
    reason: str,
    secrets: tuple[str | None, str | None] = (None, None),
    second_known_as: str | None = None,
) -> tuple[RaftStore, str]:
    """Runs two members, the smaller address first, until the first has refused the second's
    connection for `reason`; returns the first (stopped) and the second's address. The first
    knows the second as `second_known_as` ("{port}" for the second's port) when given."""
    first_address, second_address = _addresses()
    known = second_address if second_known_as is None else second_known_as
    first = RaftStore(
        RaftConfig(
            self_address=first_address,
            peers=(known.format(port=second_address.rpartition(":")[2]),),
            data_dir=tmp_path / "first",
            cluster_secret=secrets[0],
        )
    )
    second = RaftStore(
        RaftConfig(
            self_address=second_address,
            peers=(first_address,),
            data_dir=tmp_path / "second",
            cluster_secret=secrets[1],
        )
    )
    await first.start()
    await second.start()
    try:
        deadline_s = asyncio.get_running_loop().time() + WAIT_S
        while not first.status()["connections_refused"].get(reason):
            assert asyncio.get_running_loop().time() < deadline_s, first.status()
            await asyncio.sleep(0.05)
        return first, second_address
    finally:
        await second.stop()
        await first.stop()


@pytest.mark.parametrize(
    ("secrets", "said"),
    [
        (
            ("one secret", "another secret"),
            "did not authenticate with this member's cluster secret",
        ),
        (("one secret", None), "did not authenticate with this member's cluster secret"),
        ((None, "a secret"), "may have a raft.cluster_secret while this member has none"),
    ],
)
def test_a_peer_with_another_cluster_secret__is_counted_and_logged_once(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    secrets: tuple[str | None, str | None],
    said: str,
) -> None:
    caplog.set_level(logging.INFO, logger=frames.__name__)
    first, _ = asyncio.run(_refusals_of(tmp_path, secrets=secrets, reason="unauthenticated"))
    refused = first.status()["connections_refused"]
    assert set(refused) == {"unauthenticated"}, refused
    reports = [r for r in caplog.records if r.name == frames.__name__]
    assert reports and said in reports[0].getMessage(), [r.getMessage() for r in reports]
    assert reports[0].levelno == logging.WARNING
    assert "closed a Raft connection from 127.0.0.1:" in reports[0].getMessage()
    # The peer keeps retrying every connect interval; one report a minute says it.
    assert len(reports) == 1, [r.getMessage() for r in reports]
    assert not first.status()["has_quorum"]


def test_a_peer_knowing_a_member_by_another_name__is_named_in_the_report(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=frames.__name__)
    # The first member knows the second as "localhost:port", which reaches the same port; the
    # second's handshake names its 127.0.0.1 address, which the first does not have.
    _, second_address = asyncio.run(
        _refusals_of(tmp_path, reason="not_a_member", second_known_as="localhost:{port}")
    )
    messages = [r.getMessage() for r in caplog.records if r.name == frames.__name__]
    assert any(f"it named itself {second_address!r}" in m for m in messages), messages


def test_refusals__are_logged_once_a_minute_per_host_and_reason_with_a_count() -> None:
    refusals = frames.Refusals(secret=True)
    logged: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: logged.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger(frames.__name__)
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        for second in range(0, 59):
            refusals.record(f"10.0.0.1:{40000 + second}", "unauthenticated", float(second))
        refusals.record("10.0.0.2:1", "unauthenticated", 30.0)
        refusals.record("10.0.0.1:2", "silent", 30.0)
        refusals.record("10.0.0.1:3", "unauthenticated", 61.0)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert refusals.counts == {"unauthenticated": 61, "silent": 1}
    assert len(logged) == 4, logged
    assert logged[0].startswith("closed a Raft connection from 10.0.0.1:40000: ")
    assert "10.0.0.2:1" in logged[1] and "did not identify itself" in logged[2]
    assert logged[3].endswith("(58 more from 10.0.0.1 since the last report)")
