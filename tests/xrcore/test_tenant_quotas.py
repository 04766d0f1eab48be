"""A tenant's shares of the replicated tables (`xrcore.tenants`, session 30).

Without them one tenant filled any table for all: every session, every client record, every
job slot (its unfinished jobs evicting other tenants' finished ones). Each quota is the tenant's
own, set with `tenant.set`; a tenant without one is bounded only by the cluster's capacities.
"""

from __future__ import annotations

import pytest

from tests.xrcore.helpers import Driver
from xrcore import kv, tenants
from xrcore.commands import (
    JobCancel,
    JobSpec,
    JobSubmit,
    KvDelete,
    KvPut,
    SessionGrant,
    SessionRevoke,
    TenantSet,
)
from xrcore.errors import InvalidArgument
from xrcore.limits import Limits


def _submit(driver: Driver, tenant: str, *, array_size: int = 1) -> str:
    spec = JobSpec(name="j", workload="gemm", tenant=tenant, array_size=array_size)
    job_id: str = driver.ok(JobSubmit(spec=spec))["job_id"]
    return job_id


def test_keys__a_tenant_at_its_quota_adds_none_but_may_overwrite_and_others_are_unbounded() -> None:
    driver = Driver()
    driver.ok(TenantSet(name="bob", keys_max=2))
    driver.ok(KvPut(key="bob/a", value=b"1"))
    driver.ok(KvPut(key="bob/b", value=b"1"))
    assert driver.error(KvPut(key="bob/c", value=b"1")) == "limit.capacity"
    message = driver.apply(KvPut(key="bob/c", value=b"1")).result.error
    assert (
        message is not None and "tenant 'bob' holds 2 keys, and its quota is 2" in message.message
    )
    driver.ok(KvPut(key="bob/a", value=b"2"))  # an existing key
    # Neighbouring namespaces do not count ("bob0" sorts right after every "bob/..." key).
    for key in ("alice/a", "alice/b", "alice/c", "bob0", "bo/x", "bobby/x"):
        driver.ok(KvPut(key=key, value=b"1"))
    driver.ok(KvDelete(key="bob/a"))
    driver.ok(KvPut(key="bob/c", value=b"1"))
    assert [item["key"] for item in kv.range_(driver.machine, "bob/")["items"]] == [
        "bob/b",
        "bob/c",
    ]


def test_sessions__a_tenant_at_its_quota_is_refused_until_one_ends() -> None:
    driver = Driver()
    driver.ok(TenantSet(name="bob", sessions_max=2))
    held = [driver.ok(SessionGrant(ttl_ms=60_000, owner="bob"))["session_id"] for _ in range(2)]
    assert driver.error(SessionGrant(ttl_ms=60_000, owner="bob")) == "limit.capacity"
    driver.ok(SessionGrant(ttl_ms=60_000, owner="alice"))
    driver.ok(SessionRevoke(session_id=held[0]))
    driver.ok(SessionGrant(ttl_ms=60_000, owner="bob"))


def test_clients__a_tenant_at_its_quota_may_write_with_its_known_client_ids_only() -> None:
    driver = Driver()
    driver.ok(TenantSet(name="bob", clients_max=2))
    for number, client in enumerate(("bob/c1", "bob/c2")):
        driver.ok(KvPut(key=f"bob/{number}", value=b""), client_id=client, seq=1)
    refused = driver.apply(KvPut(key="bob/x", value=b""), client_id="bob/c3", seq=1).result
    assert refused.error is not None and refused.error.code == "limit.capacity"
    assert "holds 2 client records, and its quota is 2" in refused.error.message
    assert "bob/x" not in driver.machine.keys
    driver.ok(KvPut(key="bob/y", value=b""), client_id="bob/c1", seq=2)
    driver.ok(KvPut(key="alice/x", value=b""), client_id="alice/c3", seq=1)


def test_jobs__a_tenant_at_its_quota_evicts_its_own_oldest_finished_job_never_anothers() -> None:
    # The cluster's table holds 4 jobs. Alice has 2 finished jobs; bob, with a quota of 2,
    # floods: he used to evict alice's finished jobs (and their results) to make room.
    driver = Driver(Limits(jobs_max=4))
    alice = [_submit(driver, "alice") for _ in range(2)]
    for job_id in alice:
        driver.ok(JobCancel(job_id=job_id))
    driver.ok(TenantSet(name="bob", jobs_max=2))
    first, second = _submit(driver, "bob"), _submit(driver, "bob")
    refused = driver.apply(JobSubmit(spec=JobSpec(name="j", workload="gemm", tenant="bob")))
    assert refused.result.error is not None
    assert "holds 2 jobs (0 finished), and its quota is 2" in refused.result.error.message
    driver.ok(JobCancel(job_id=first))
    third = _submit(driver, "bob")
    assert list(driver.machine.jobs) == [*alice, second, third]


def test_unfinished_tasks__count_every_unfinished_task_of_the_tenant() -> None:
    driver = Driver()
    driver.ok(TenantSet(name="bob", unfinished_tasks_max=5))
    first = _submit(driver, "bob", array_size=3)
    refused = driver.apply(
        JobSubmit(spec=JobSpec(name="j", workload="gemm", tenant="bob", array_size=3))
    ).result
    assert refused.error is not None and "3 more would pass its quota of 5" in refused.error.message
    _submit(driver, "bob", array_size=2)
    _submit(driver, "alice", array_size=50)
    driver.ok(JobCancel(job_id=first))
    _submit(driver, "bob", array_size=3)


def test_quotas__are_listed_and_checked() -> None:
    driver = Driver()
    driver.ok(TenantSet(name="bob", keys_max=0, jobs_max=7))
    [view] = tenants.list_(driver.machine)["items"]
    assert (view["keys_max"], view["jobs_max"], view["sessions_max"]) == (0, 7, None)
    assert driver.error(KvPut(key="bob/a", value=b"")) == "limit.capacity"
    with pytest.raises(InvalidArgument):
        TenantSet(name="bob", sessions_max=-1)
    # Setting a tenant replaces all of its settings: the quotas go with the rest.
    driver.ok(TenantSet(name="bob", weight=2.0))
    driver.ok(KvPut(key="bob/a", value=b""))


def test_jobs__a_quota_lowered_below_what_a_tenant_holds_is_reached_again() -> None:
    # A submission used to evict one finished job and add one, so bob stayed over for good.
    driver = Driver()
    held = [_submit(driver, "bob") for _ in range(4)]
    for job_id in held[:3]:
        driver.ok(JobCancel(job_id=job_id))
    driver.ok(TenantSet(name="bob", jobs_max=2))
    newest = _submit(driver, "bob")
    # Three finished jobs went for one new: 1 unfinished + 1 new = 2 = the quota.
    assert list(driver.machine.jobs) == [held[3], newest]
    refused = driver.apply(JobSubmit(spec=JobSpec(name="j", workload="gemm", tenant="bob")))
    assert refused.result.error is not None
    assert "holds 2 jobs (0 finished), and its quota is 2" in refused.result.error.message
