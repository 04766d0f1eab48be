"""The sync `Client` mirrors `AsyncClient` exactly, and the package exports what it documents.

These read the classes only; nothing is started.
"""

from __future__ import annotations

import inspect

import pytest

import xrcore.client as client_package
from xrcore.client import (
    AsyncClient,
    AsyncCluster,
    AsyncJobs,
    AsyncKv,
    AsyncLocks,
    AsyncRegions,
    AsyncSessions,
    Client,
    Cluster,
    Jobs,
    Kv,
    Locks,
    Member,
    Regions,
    Sessions,
)
from xrcore.client._models import convert

PAIRS = [
    (AsyncClient, Client),
    (AsyncKv, Kv),
    (AsyncSessions, Sessions),
    (AsyncLocks, Locks),
    (AsyncJobs, Jobs),
    (AsyncRegions, Regions),
    (AsyncCluster, Cluster),
]


def _public(cls: type) -> dict[str, object]:
    return {name: member for name, member in vars(cls).items() if not name.startswith("_")}


def _parameters(function: object) -> list[tuple[str, object, object]]:
    signature = inspect.signature(function)  # type: ignore[arg-type]
    return [(item.name, item.kind, item.default) for item in signature.parameters.values()]


@pytest.mark.parametrize(("async_class", "sync_class"), PAIRS, ids=lambda cls: cls.__name__)
def test_sync_class__has_the_same_methods_and_parameters_as_the_async_one(
    async_class: type, sync_class: type
) -> None:
    async_members, sync_members = _public(async_class), _public(sync_class)
    assert sorted(async_members) == sorted(sync_members)
    for name, member in async_members.items():
        if callable(member):
            assert _parameters(member) == _parameters(sync_members[name]), name


def test_clients__expose_the_same_groups() -> None:
    groups = ("kv", "sessions", "locks", "jobs", "regions", "cluster")
    asynchronous = AsyncClient("127.0.0.1:1")
    with Client("127.0.0.1:1") as synchronous:
        for group in groups:
            assert (
                _public(type(getattr(asynchronous, group))).keys()
                == _public(type(getattr(synchronous, group))).keys()
            )


def test_package__exports_everything_in_all() -> None:
    for name in client_package.__all__:
        assert hasattr(client_package, name), name
    assert client_package.__all__ == sorted(client_package.__all__)


def test_endpoints__are_normalised_to_urls() -> None:
    with Client(["127.0.0.1:1", "http://127.0.0.1:2/"]) as synchronous:
        assert synchronous.endpoints == ("http://127.0.0.1:1", "http://127.0.0.1:2")
        assert synchronous.client_id.startswith("client-")


def test_member__reads_the_self_field() -> None:
    member = convert(
        {
            "raft_address": "a:1",
            "region": "r0",
            "http_address": "a:2",
            "self": True,
            "leader": False,
            "connected": True,
            "match_index": None,
            "last_contact_s": None,
        },
        Member,
    )
    assert member.is_self and not member.leader
