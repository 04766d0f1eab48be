"""RaftConfig refuses bad settings with a message that names the field and the value."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from raftstore.config import RaftConfig
from xrcore.errors import InvalidArgument


def _config(**overrides: object) -> RaftConfig:
    fields: dict[str, object] = {
        "self_address": "127.0.0.1:9000",
        "peers": ("127.0.0.1:9001", "127.0.0.1:9002"),
        "data_dir": Path("/tmp/unused"),
        **overrides,
    }
    return RaftConfig(**fields)  # type: ignore[arg-type]


def test_defaults__are_valid_and_files_live_in_the_data_directory() -> None:
    config = _config()
    assert config.journal_file == Path("/tmp/unused/raft.journal")
    assert config.snapshot_file == Path("/tmp/unused/raft.snapshot")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"raft_min_timeout_s": 0.0}, "raft.raft_min_timeout_s must be positive, got 0.0"),
        ({"proposals_in_flight_max": -1}, "raft.proposals_in_flight_max must be positive"),
        ({"raft_min_timeout_s": 2.0}, "raft.raft_min_timeout_s (2.0) must be below"),
        ({"append_entries_period_s": 0.3}, "raft.append_entries_period_s (0.3) must be below"),
        # pysyncobj's own bound (it asserts raftMinTimeout > 3 * appendEntriesPeriod).
        ({"append_entries_period_s": 0.2}, "raft.append_entries_period_s (0.2) must be below"),
        ({"commit_notice_delay_s": 0.2}, "raft.commit_notice_delay_s (0.2) must be at most"),
        ({"leader_fallback_timeout_s": 0.5}, "raft.leader_fallback_timeout_s (0.5) must be"),
        ({"self_address": "nohost"}, "address 'nohost' must be host:port"),
        ({"peers": ("127.0.0.1:9000",)}, "must not contain self_address"),
        ({"peers": ("127.0.0.1:1", "127.0.0.1:1")}, "raft.peers has duplicates"),
    ],
)
def test_bad_setting__is_refused_naming_the_field(
    overrides: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidArgument, match=re.escape(message)):
        _config(**overrides)


def test_off_loopback_without_a_cluster_secret__is_refused() -> None:
    with pytest.raises(InvalidArgument, match=re.escape("raft.cluster_secret is required")):
        _config(self_address="10.0.0.5:9000", peers=("10.0.0.6:9000",))
    _config(self_address="10.0.0.5:9000", peers=("10.0.0.6:9000",), cluster_secret="s3cret")


def test_bind_address__off_loopback_needs_the_cluster_secret_too(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="cluster_secret is required"):
        RaftConfig(
            self_address="127.0.0.1:7001",
            peers=(),
            data_dir=tmp_path,
            bind_address="0.0.0.0:7001",
        )
    with pytest.raises(InvalidArgument, match="host:port"):
        RaftConfig(self_address="127.0.0.1:7001", peers=(), data_dir=tmp_path, bind_address="x")
