"""`xr tenant set`: quotas out of the cluster's range are a usage error naming the cluster's bound
(a QA pass found `--tasks-max 18446744073709551616` answered with the bound of a 64-bit integer,
while the cluster takes at most 1048576)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from node.cli import xr
from node.cli_tenant import SCHEDULING_QUOTA_MAX, TABLE_QUOTA_MAX
from xrcore.commands import TABLE_QUOTAS, TenantSet
from xrcore.errors import InvalidArgument


@pytest.mark.parametrize(
    ("flag", "bound"),
    [
        ("--tasks-max", SCHEDULING_QUOTA_MAX),
        ("--gpus-max", SCHEDULING_QUOTA_MAX),
        ("--jobs-max", TABLE_QUOTA_MAX),
        ("--unfinished-tasks-max", TABLE_QUOTA_MAX),
    ],
)
def test_a_quota_past_the_clusters_bound_is_a_usage_error_naming_it(flag: str, bound: int) -> None:
    for value in (bound + 1, 2**64):
        result = CliRunner().invoke(xr, ["tenant", "set", "team-x", flag, str(value)])
        assert result.exit_code == 2, result.output
        assert f"0<=x<={bound}" in result.output


def test_the_bounds_are_the_clusters() -> None:
    for field in ("gpus_max", "tasks_max"):
        TenantSet(name="t", **{field: SCHEDULING_QUOTA_MAX})
        with pytest.raises(InvalidArgument, match=f"between 0 and {SCHEDULING_QUOTA_MAX}"):
            TenantSet(name="t", **{field: SCHEDULING_QUOTA_MAX + 1})
    for field in TABLE_QUOTAS:
        TenantSet(name="t", **{field: TABLE_QUOTA_MAX})
        with pytest.raises(InvalidArgument, match=f"between 0 and {TABLE_QUOTA_MAX}"):
            TenantSet(name="t", **{field: TABLE_QUOTA_MAX + 1})
