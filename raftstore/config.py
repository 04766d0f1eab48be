"""The configuration of one replica: addresses, files, and every pysyncobj timing option.

Every pysyncobj option that affects timing or safety is set from here explicitly, so an upgrade of
pysyncobj's defaults cannot change xr's behaviour unnoticed. `validate` names the field and the
value of anything wrong.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Literal

from xrcore.errors import InvalidArgument

__all__ = ["RaftConfig"]


def _host_of(address: str) -> str:
    host, separator, port = address.rpartition(":")
    if not separator or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidArgument(f"address {address!r} must be host:port")
    return host


def _is_loopback(address: str) -> bool:
    host = _host_of(address)
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# Numeric settings where 0 means something (every other must be positive).
_MAY_BE_ZERO = frozenset({"background_sync_min_ms"})


@dataclass(frozen=True, kw_only=True)
class RaftConfig:
    """One replica's Raft settings. Times are in seconds, as pysyncobj takes them."""

    # This replica's Raft address and its peers' (host:port each).
    self_address: str
    peers: tuple[str, ...]
    # Where the journal and the snapshot live; a restarted replica keeps its term, vote and log.
    data_dir: Path
    # pysyncobj's `password`: encrypts and authenticates Raft traffic. Required off loopback.
    cluster_secret: str | None = None
    # Where the Raft port listens (host:port). Default: `self_address`, so a node on loopback
    # is reachable on loopback only (pysyncobj's own default is every interface). Set it when
    # the advertised address is not on this host (NAT), e.g. "0.0.0.0:7001".
    bind_address: str | None = None
    # Allow Raft off loopback without a cluster secret (`xr node run --insecure`).
    insecure: bool = False
    # "write": the journal is written (to the page cache) before a write is acknowledged;
    # "fsync": it is also synced to disk (docs/durability.md).
    durability: Literal["write", "fsync"] = "write"
    # With "fsync" on Linux: a helper process syncs the journal while the event loop goes on
    # (`raftstore.background_sync`); false syncs on the event loop, which stands still meanwhile.
    background_sync: bool = True
    # With background_sync: a sync runs off the loop only while the disk's recent syncs (a moving
    # average of their time) took at least this long; a faster one runs in line, where it costs
    # less than the helper's round trip. 0: every sync off the loop (docs/durability.md).
    background_sync_min_ms: float = 1.0

    # Election timeout bounds: a follower that hears nothing for a random time in this range
    # starts an election. They bound failover time: the first of the followers times out after
    # about min + (max - min) / (followers + 1). pysyncobj's default maximum is 1.4 s; 1.0 s (as
    # etcd's default election timeout) brings the median failover under a second.
    raft_min_timeout_s: float = 0.4
    raft_max_timeout_s: float = 1.0
    # The leader's heartbeat period when idle. Proposals do not wait for it: batching is off.
    append_entries_period_s: float = 0.1
    # A leader that hears from no quorum for this long steps down. pysyncobj's default is 30 s;
    # xr never serves default reads from local state, so this only bounds how long an isolated
    # leader keeps accepting proposals that will fail.
    leader_fallback_timeout_s: float = 5.0
    # A peer connection silent this long is closed; an incoming one must also identify itself
    # within it of its accept (`raftstore.frames`).
    connection_timeout_s: float = 3.5
    connection_retry_time_s: float = 1.0
    # Entries larger than this are sent in chunks, and pysyncobj 0.3.17 computes the end of a
    # chunked entry from the command's length rather than the pickled entry's, so followers
    # fail to unpickle it until the next chunk. Large enough that groups are never chunked.
    append_entries_batch_bytes: int = 16 << 20
    # pysyncobj's own queue of commands; xr's bound on proposals in flight is below it.
    commands_queue_size: int = 100_000
    # Snapshot (log compaction) when the log has this many entries or is this old.
    log_compaction_min_entries: int = 50_000
    log_compaction_min_time_s: float = 600.0
    # The longest time between two ticks of pysyncobj when no message or proposal comes.
    tick_wait_s: float = 0.005
    # How long the leader may hold back telling followers that entries committed, waiting for
    # the next entries to carry the news (every append_entries message holds the commit index).
    # pysyncobj sends a message to every follower after each commit, and each follower answers
    # it: at 1 write in flight that doubled the messages per write. Commits that a follower
    # waits on (commands it forwarded) are announced at once.
    commit_notice_delay_s: float = 0.001
    # Pre-vote (Raft thesis 9.6): a member whose election timeout passed first asks the others
    # whether they would vote for it, and campaigns (raising its term) only if a majority would.
    # A member that still hears from a leader says no, so a follower that was paused (a stalled
    # process or machine) or cut off from the leader alone cannot depose a healthy leader.
    pre_vote: bool = True

    # xr's own settings.
    # The leader proposes a tick this often, so the lease clock follows real time while the
    # cluster commits. Must stay well below xrcore's Limits.lease_step_max_ms.
    lease_tick_interval_s: float = 0.25
    proposals_in_flight_max: int = 10_000
    propose_timeout_s: float = 5.0
    # Group commit: commands that arrive together are packed into one log entry.
    group_commands_max: int = 512
    group_bytes_max: int = 1 << 20

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            if item.name in _MAY_BE_ZERO:
                if not value >= 0:
                    raise InvalidArgument(f"raft.{item.name} must be 0 or more, got {value!r}")
            elif isinstance(value, int | float) and not isinstance(value, bool) and value <= 0:
                raise InvalidArgument(f"raft.{item.name} must be positive, got {value!r}")
        _host_of(self.self_address)
        if self.bind_address is not None:
            _host_of(self.bind_address)
        for peer in self.peers:
            _host_of(peer)
        if self.self_address in self.peers:
            raise InvalidArgument(f"raft.peers must not contain self_address {self.self_address!r}")
        if len(set(self.peers)) != len(self.peers):
            raise InvalidArgument(f"raft.peers has duplicates: {list(self.peers)}")
        if self.raft_min_timeout_s >= self.raft_max_timeout_s:
            raise InvalidArgument(
                f"raft.raft_min_timeout_s ({self.raft_min_timeout_s}) must be below "
                f"raft.raft_max_timeout_s ({self.raft_max_timeout_s})"
            )
        if self.append_entries_period_s * 3 >= self.raft_min_timeout_s:
            # pysyncobj asserts this too, with a bare AssertionError.
            raise InvalidArgument(
                f"raft.append_entries_period_s ({self.append_entries_period_s}) must be below "
                f"a third of raft.raft_min_timeout_s ({self.raft_min_timeout_s}), or followers "
                "start elections against a healthy leader"
            )
        if self.commit_notice_delay_s > self.append_entries_period_s:
            raise InvalidArgument(
                f"raft.commit_notice_delay_s ({self.commit_notice_delay_s}) must be at most "
                f"raft.append_entries_period_s ({self.append_entries_period_s})"
            )
        if self.leader_fallback_timeout_s < self.raft_max_timeout_s:
            raise InvalidArgument(
                f"raft.leader_fallback_timeout_s ({self.leader_fallback_timeout_s}) must be at "
                f"least raft.raft_max_timeout_s ({self.raft_max_timeout_s})"
            )
        if self.group_bytes_max * 4 > self.append_entries_batch_bytes:
            raise InvalidArgument(
                f"raft.group_bytes_max ({self.group_bytes_max}) must be at most a quarter of "
                f"raft.append_entries_batch_bytes ({self.append_entries_batch_bytes}): pickling "
                "can double an entry twice, and chunked entries hit a pysyncobj bug"
            )
        off_loopback = self.off_loopback_addresses
        if self.durability not in ("write", "fsync"):
            raise InvalidArgument(
                f'raft.durability must be "write" or "fsync", got {self.durability!r}'
            )
        if off_loopback and not self.cluster_secret and not self.insecure:
            raise InvalidArgument(
                f"raft.cluster_secret is required when Raft listens or connects off loopback "
                f"({', '.join(off_loopback)}): without it anyone who reaches the port can pose "
                "as a member and rewrite the cluster's state (--insecure allows it)"
            )

    @property
    def off_loopback_addresses(self) -> list[str]:
        """The Raft addresses this replica listens on or connects to that are not loopback."""
        listened = (self.self_address, self.bind_address or self.self_address, *self.peers)
        return [address for address in dict.fromkeys(listened) if not _is_loopback(address)]

    @property
    def journal_file(self) -> Path:
        return self.data_dir / "raft.journal"

    @property
    def snapshot_file(self) -> Path:
        return self.data_dir / "raft.snapshot"
