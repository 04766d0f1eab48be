"""The KV store: revisions, compare-and-set, ranges with pagination, watch history, limits."""

from __future__ import annotations

import pytest

from xrcore import errors, kv
from xrcore.commands import KvDelete, KvPut, SessionGrant, SessionRevoke, Tick
from xrcore.limits import PAGE_BYTES_MAX, VALUE_BYTES_MAX, Limits

from .helpers import Driver


def test_put__new_key__create_and_mod_revision_are_the_new_revision() -> None:
    driver = Driver()
    assert driver.ok(KvPut(key="a", value=b"1")) == {
        "revision": 1,
        "previous_mod_revision": 0,
        "version": 1,
    }
    record = kv.get(driver.machine, "a")
    assert (record["create_revision"], record["mod_revision"], record["version"]) == (1, 1, 1)


def test_put__existing_key__version_counts_puts_and_create_revision_stays() -> None:
    driver = Driver()
    driver.ok(KvPut(key="a", value=b"1"))
    driver.ok(KvPut(key="b", value=b"x"))
    driver.ok(KvPut(key="a", value=b"2"))
    record = kv.get(driver.machine, "a")
    assert (record["value"], record["create_revision"], record["mod_revision"]) == (b"2", 1, 3)
    assert record["version"] == 2


def test_compare_and_set__matching_mod_revision__writes() -> None:
    driver = Driver()
    driver.ok(KvPut(key="a", value=b"1"))
    assert driver.ok(KvPut(key="a", value=b"2", expected_mod_revision=1))["revision"] == 2


def test_compare_and_set__stale_mod_revision__fails_and_changes_nothing() -> None:
    driver = Driver()
    driver.ok(KvPut(key="a", value=b"1"))
    driver.ok(KvPut(key="a", value=b"2"))
    before = driver.machine.revision
    assert driver.error(KvPut(key="a", value=b"3", expected_mod_revision=1)) == "kv.compare_failed"
    assert driver.machine.revision == before
    assert kv.get(driver.machine, "a")["value"] == b"2"


def test_compare_and_set__zero__means_the_key_must_not_exist() -> None:
    driver = Driver()
    driver.ok(KvPut(key="a", value=b"1", expected_mod_revision=0))
    assert driver.error(KvPut(key="a", value=b"2", expected_mod_revision=0)) == "kv.compare_failed"


def test_delete__missing_key__deletes_nothing_without_a_revision() -> None:
    driver = Driver()
    assert driver.ok(KvDelete(key="nope")) == {"deleted": 0, "revision": 0}


def test_delete__with_stale_expected_revision__fails() -> None:
    driver = Driver()
    driver.ok(KvPut(key="a", value=b"1"))
    assert driver.error(KvDelete(key="a", expected_mod_revision=7)) == "kv.compare_failed"
    assert driver.ok(KvDelete(key="a", expected_mod_revision=1)) == {"deleted": 1, "revision": 2}
    with pytest.raises(errors.NotFound):
        kv.get(driver.machine, "a")


def test_range__prefix_pages__cover_every_key_once_in_order() -> None:
    driver = Driver()
    names = [f"jobs/{n:03}" for n in range(25)] + ["other/1", "jobt"]
    for name in names:
        driver.ok(KvPut(key=name, value=b""))
    seen: list[str] = []
    after = None
    while True:
        page = kv.range_(driver.machine, "jobs/", limit=10, after=after)
        seen += [item["key"] for item in page["items"]]
        after = page["next"]
        if after is None:
            break
    assert seen == sorted(name for name in names if name.startswith("jobs/"))


def test_range__limit_outside_bounds__is_rejected() -> None:
    with pytest.raises(errors.InvalidArgument):
        kv.range_(Driver().machine, "", limit=0)


def test_watch__from_a_revision__returns_every_later_change_in_order() -> None:
    driver = Driver()
    driver.ok(KvPut(key="a", value=b"1"))
    driver.ok(KvPut(key="b", value=b"2"))
    driver.ok(KvDelete(key="a"))
    events = kv.watch(driver.machine, 2)["events"]
    assert [(event["revision"], event["kind"], event["key"]) for event in events] == [
        (2, "put", "b"),
        (3, "delete", "a"),
    ]
    assert kv.watch(driver.machine, 4) == {"revision": 3, "events": [], "next_revision": 4}


def test_watch__resumes_from_next_revision_in_pages() -> None:
    driver = Driver()
    for n in range(7):
        driver.ok(KvPut(key="k", value=bytes([n])))
    first = kv.watch(driver.machine, 1, limit=4)
    second = kv.watch(driver.machine, first["next_revision"], limit=4)
    revisions = [event["revision"] for event in first["events"] + second["events"]]
    assert revisions == list(range(1, 8))


def test_pages_of_large_values__hold_about_page_bytes_max_and_still_cover_every_key() -> None:
    # 1,000 values of 64 KiB in one answer was 140 MB (a node ran out of memory under a few
    # hundred such reads): a page stops at PAGE_BYTES_MAX of keys and values.
    driver = Driver()
    big = bytes(VALUE_BYTES_MAX)
    names = [f"big/{n:02}" for n in range(40)]
    for name in names:
        driver.ok(KvPut(key=name, value=big))
    seen: list[str] = []
    after = None
    while True:
        page = kv.range_(driver.machine, "big/", limit=1000, after=after)
        assert 1 <= len(page["items"]) <= PAGE_BYTES_MAX // VALUE_BYTES_MAX
        seen += [item["key"] for item in page["items"]]
        after = page["next"]
        if after is None:
            break
    assert seen == names
    revisions: list[int] = []
    next_revision = 1
    while next_revision <= driver.machine.revision:
        page = kv.watch(driver.machine, next_revision, limit=1000)
        assert 1 <= len(page["events"]) <= PAGE_BYTES_MAX // VALUE_BYTES_MAX
        revisions += [event["revision"] for event in page["events"]]
        next_revision = page["next_revision"]
    assert revisions == list(range(1, 41))
    # One value larger than the bound alone still makes a page of one.
    assert len(kv.range_(driver.machine, "big/", limit=1)["items"]) == 1


def test_watch__older_than_retained_history__is_compacted() -> None:
    driver = Driver(Limits(watch_history_max=3))
    for n in range(5):
        driver.ok(KvPut(key="k", value=bytes([n])))
    with pytest.raises(errors.Compacted, match="oldest retained is 3"):
        kv.watch(driver.machine, 2)
    assert [event["revision"] for event in kv.watch(driver.machine, 3)["events"]] == [3, 4, 5]


def test_keys_max__new_key_beyond_it__is_rejected_but_updates_still_work() -> None:
    driver = Driver(Limits(keys_max=2))
    driver.ok(KvPut(key="a", value=b""))
    driver.ok(KvPut(key="b", value=b""))
    assert driver.error(KvPut(key="c", value=b"")) == "limit.capacity"
    driver.ok(KvPut(key="a", value=b"again"))


def test_session_key__deleted_when_its_session_is_revoked() -> None:
    driver = Driver()
    session_id = driver.ok(SessionGrant(ttl_ms=5_000))["session_id"]
    driver.ok(KvPut(key="leader", value=b"me", session_id=session_id))
    driver.ok(SessionRevoke(session_id=session_id))
    with pytest.raises(errors.NotFound):
        kv.get(driver.machine, "leader")
    assert kv.watch(driver.machine, 2)["events"][0]["kind"] == "delete"


def test_session_key__deleted_when_its_session_expires() -> None:
    driver = Driver()
    session_id = driver.ok(SessionGrant(ttl_ms=2_000))["session_id"]
    driver.ok(KvPut(key="leader", value=b"me", session_id=session_id))
    for _ in range(3):
        driver.ok(Tick(), advance_ms=1_000)
    with pytest.raises(errors.NotFound):
        kv.get(driver.machine, "leader")


def test_session_key__rewritten_without_session__survives_the_session() -> None:
    driver = Driver()
    session_id = driver.ok(SessionGrant(ttl_ms=5_000))["session_id"]
    driver.ok(KvPut(key="leader", value=b"me", session_id=session_id))
    driver.ok(KvPut(key="leader", value=b"kept"))
    driver.ok(SessionRevoke(session_id=session_id))
    assert kv.get(driver.machine, "leader")["value"] == b"kept"


def test_put__with_unknown_session__is_rejected() -> None:
    assert Driver().error(KvPut(key="a", value=b"", session_id="s99")) == "not_found"
