"""Test-only network drops inside the node: the partition mechanism jepsen-lite falls back to
where it cannot make network namespaces (no root, no nftables).

A node started with `XR_TEST_PARTITIONS=1` (allowed only together with `XR_TEST_RUN=1`, like the
fault modes in `raftstore.faults`; refused otherwise) drops every Raft message it would send to,
or receives from, the peers in its drop list, and serves `PUT /v1/test/drops` for the harness to
set that list. Dropping on both sides of each link gives the same cut as packet filters between
namespaces, on loopback. It logs a warning at start and is never on outside a test run.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from raftstore.faults import TEST_RUN_VARIABLE, FaultsRefused

if TYPE_CHECKING:
    from raftstore.replica import Replica

__all__ = ["PARTITIONS_VARIABLE", "Drops"]

log = logging.getLogger(__name__)

PARTITIONS_VARIABLE = "XR_TEST_PARTITIONS"


class Drops:
    """The peers (Raft addresses) this node exchanges no messages with."""

    def __init__(self) -> None:
        # Replaced whole, never mutated: the ticking thread reads it without a lock.
        self._peers: frozenset[str] = frozenset()

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> Drops | None:
        """Drops when `XR_TEST_PARTITIONS=1` in a test run; None when unset; `FaultsRefused`
        outside a test run or for another value."""
        value = environ.get(PARTITIONS_VARIABLE, "").strip()
        if not value:
            return None
        if value != "1":
            raise FaultsRefused(f"{PARTITIONS_VARIABLE} must be 1 or unset, not {value!r}")
        if environ.get(TEST_RUN_VARIABLE) != "1":
            raise FaultsRefused(
                f"{PARTITIONS_VARIABLE}=1 lets anyone cut this node off and is allowed only in a "
                f"test run ({TEST_RUN_VARIABLE}=1)"
            )
        log.warning(
            "TEST NETWORK DROPS ENABLED (%s): PUT /v1/test/drops cuts this node off from peers; "
            "never run it outside a test",
            PARTITIONS_VARIABLE,
        )
        return cls()

    @property
    def peers(self) -> list[str]:
        return sorted(self._peers)

    def set(self, peers: Iterable[str]) -> None:
        self._peers = frozenset(peers)
        log.warning("test network drops now: %s", ", ".join(sorted(self._peers)) or "none")

    def install(self, replica: Replica) -> None:
        """Wraps the replica's transport so messages to and from dropped peers vanish."""
        transport: Any = getattr(replica, "_SyncObj__transport")  # noqa: B009 - name-mangled
        receive = transport._onMessageReceivedCallback
        send = transport.send

        def receive_unless_dropped(node: Any, message: Any) -> None:
            if node is not None and getattr(node, "address", None) in self._peers:
                return
            receive(node, message)

        def send_unless_dropped(node: Any, message: Any) -> bool:
            if getattr(node, "address", None) in self._peers:
                return False
            return bool(send(node, message))

        transport.setOnMessageReceivedCallback(receive_unless_dropped)
        transport.send = send_unless_dropped
