"""`bench/api.py` and `bench/durability.py` with etcd missing or failing: one line and exit 2
before anything starts, or the members' last log lines before their directory goes; and the
order of the systems in a cell alternates round by round."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from bench import api
from tests.bench._script import run_script


def test_round_order__alternates_so_no_system_always_runs_first() -> None:
    systems = ["xr", "etcd", "etcd-nofsync"]
    assert api.round_order(systems, 0) == ["xr", "etcd", "etcd-nofsync"]
    assert api.round_order(systems, 1) == ["etcd-nofsync", "etcd", "xr"]
    assert api.round_order(systems, 2) == systems


@pytest.mark.parametrize("script", ["api.py", "durability.py"])
def test_a_missing_etcd_script_is_one_line_before_anything_starts(script: str) -> None:
    answer = run_script(
        script, "--duration", "1", "--rounds", "1", "--concurrency", "1",
        environment={"XR_ETCD_CLUSTER": "/nonexistent/etcd-cluster"},
    )  # fmt: skip
    assert answer.returncode == 2
    assert answer.stderr.strip().splitlines() == [
        f"{script.removesuffix('.py')}: the etcd cluster script /nonexistent/etcd-cluster does "
        "not exist (XR_ETCD_CLUSTER names another)"
    ]
    assert "starting xr" not in answer.stdout


def test_etcd_that_does_not_start__the_error_holds_its_members_last_log_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = tmp_path / "etcd-cluster"
    script.write_text(
        "#!/bin/sh\n"
        'while [ "$1" != --dir ]; do shift; done; dir=$2\n'
        'mkdir -p "$dir"\n'
        'for i in 0 1 2; do echo "member $i: address in use" > "$dir/m$i.log"; done\n'
        'echo "etcd-cluster: members did not become ready; logs in $dir" >&2; exit 1\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(api, "ETCD_SCRIPT", script)
    etcd = api.EtcdSystem(tmp_path / "root", name="etcd", fsync=True, base_port=24_000)
    with pytest.raises(api.StartFailed) as failure:
        etcd.start()
    message = str(failure.value)
    assert "members did not become ready" in message
    for member in range(3):
        assert f"--- last lines of m{member}.log ---\nmember {member}: address in use" in message
    assert os.access(script, os.X_OK)
