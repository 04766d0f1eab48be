"""Jobs as an OS user of their own (`executor.job_user`, `node.executor.job_user`).

A job is a tenant's code; run as the node's user it could read the node's files (the cluster
secret among them). These tests run as root, as the node would, with `nobody` as the job user.
The job's interpreter must be one `nobody` can run with xr's dependencies: this machine's venv
interpreter lives under /root (mode 0700), so the tests that run a worker use the system's
python3.11 with the venv's packages on its path, and say so when this machine has none that works.
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from functools import partial
from pathlib import Path

import aiohttp
import pytest

from node.cli import main
from node.config import ConfigError, hash_token
from node.daemon import Node
from node.executor.checkpoints import tenant_area
from node.executor.executor import Executor, worker_environment
from node.executor.job_user import Check, JobUser, check, check_all, lookup, prepare_area
from node.localcluster import free_ports
from tests.node.executor.test_executor import _Api, _config, _run

ROOT = Path(__file__).resolve().parents[3]


def _nobody() -> JobUser:
    return lookup("nobody")


def _as_nobody(python: str, open_dir: Path) -> dict[str, str]:
    """Settings of a node whose jobs run as `nobody` with `python`, over checkpoints in
    `open_dir`."""
    return {
        "executor.job_user": "nobody",
        "executor.python": python,
        "executor.checkpoint_dir": str(open_dir / "checkpoints"),
    }


@pytest.fixture()
def open_dir() -> Iterator[Path]:
    """A directory every user can reach (pytest's own tmp_path is under a 0700 directory)."""
    path = Path(tempfile.mkdtemp(prefix="xr-job-user-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_an_unknown_job_user_is_refused_when_the_configuration_loads(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"executor\.job_user: there is no user 'no-such-xr-user'"
    ):
        _config(tmp_path, **{"executor.job_user": "no-such-xr-user"})
    with pytest.raises(ConfigError, match=r"executor\.python: must not be empty"):
        _config(tmp_path, **{"executor.python": ""})
    assert _config(tmp_path, **{"executor.job_user": "nobody"}).executor.job_user == "nobody"


def test_the_job_user_gets_its_own_groups_and_names() -> None:
    user = _nobody()
    entry = pwd.getpwnam("nobody")
    assert (user.uid, user.gid, user.home) == (entry.pw_uid, entry.pw_gid, entry.pw_dir)
    assert 0 not in user.groups and entry.pw_gid in user.groups
    assert user.environment() == {"HOME": entry.pw_dir, "USER": "nobody", "LOGNAME": "nobody"}
    assert worker_environment(user)["HOME"] == entry.pw_dir


def test_a_node_that_is_not_root__is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not root, a node could switch users only with capabilities its workers would keep (see
    `node.executor.job_user`), so it is refused, before anything is made."""
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(ConfigError, match="the node must run as root"):
        check(
            _nobody(),
            python=sys.executable,
            environment={},
            checkpoint_dir=tmp_path / "checkpoints",
            make_directory=True,
        )
    assert not (tmp_path / "checkpoints").exists()


def test_an_interpreter_the_job_user_cannot_run__is_refused(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o700)
    (locked / "python").symlink_to(sys.executable)
    with pytest.raises(
        ConfigError, match=r"'nobody' cannot run executor\.python .*Permission denied"
    ):
        check(
            _nobody(),
            python=str(locked / "python"),
            environment=worker_environment(_nobody()),
            checkpoint_dir=tmp_path,
            make_directory=False,
        )


def test_a_checkpoint_directory_the_job_user_cannot_write__is_refused_and_a_missing_one_made(
    open_dir: Path, nobodys_python: str
) -> None:
    user = _nobody()
    environment = worker_environment(user)
    taken = open_dir / "taken"
    taken.mkdir(mode=0o755)
    a_file = open_dir / "file"
    a_file.write_text("")
    for refused, reason in [
        (taken, "cannot write in the checkpoint directory"),
        (a_file, "is not a directory"),
    ]:
        with pytest.raises(ConfigError, match=reason):
            check(
                user,
                python=nobodys_python,
                environment=environment,
                checkpoint_dir=refused,
                make_directory=True,
            )
    made = open_dir / "made" / "checkpoints"
    check(
        user,
        python=nobodys_python,
        environment=environment,
        checkpoint_dir=made,
        make_directory=False,
    )
    assert not made.exists()
    check(
        user,
        python=nobodys_python,
        environment=environment,
        checkpoint_dir=made,
        make_directory=True,
    )
    info = made.stat()
    assert (info.st_uid, info.st_gid, stat.S_ISDIR(info.st_mode)) == (user.uid, user.gid, True)


def test_users_are_checked_at_once_and_the_first_failure_in_order_is_named(
    open_dir: Path, nobodys_python: str, sandboxes: Path
) -> None:
    """`check_all` (tenants' users at start, every user at `--check`): several checks of one
    user, sandboxed, at once, each in a directory of its own; of two that fail, the first in
    order is named however the two end."""
    nobody, daemon = _nobody(), lookup("daemon")
    fine = open_dir / "fine"
    fine.mkdir()
    os.chown(fine, nobody.uid, nobody.gid)
    taken = [open_dir / "taken-1", open_dir / "taken-2"]
    for path in taken:
        path.mkdir(mode=0o755)
    ok = [Check(nobody, "executor.tenant_users", fine) for _ in range(6)]
    check_all(ok, python=nobodys_python, environment_of=worker_environment, sandboxes=sandboxes)
    assert list(sandboxes.iterdir()) == []
    failing = [
        *ok[:2],
        Check(daemon, "executor.tenant_users", taken[0]),
        *ok[:2],
        Check(nobody, "executor.job_user", taken[1]),
    ]
    for _ in range(3):
        with pytest.raises(
            ConfigError,
            match=rf"executor\.tenant_users: 'daemon' cannot write in the checkpoint directory "
            rf"{taken[0]} ",
        ):
            check_all(
                failing,
                python=nobodys_python,
                environment_of=worker_environment,
                sandboxes=sandboxes,
            )


def test_a_job_runs_as_the_job_user__cannot_read_the_nodes_secret_and_checkpoints(
    tmp_path: Path, open_dir: Path, nobodys_python: str
) -> None:
    secret = open_dir / "cluster_secret"
    secret.write_text("cluster-secret\n")
    secret.chmod(0o600)

    async def body(api: _Api) -> None:
        job_id = await api.submit("who_am_i", args={"secret": str(secret)})
        job = await api.finished(job_id)
        assert job["state"] == "succeeded", job
        seen = json.loads(job["tasks"][0]["result"])
        user = _nobody()
        assert (seen["uid"], seen["gid"], seen["home"]) == (user.uid, user.gid, user.home)
        assert 0 not in seen["groups"]
        assert (seen["secret"], seen["checkpointed"]) == ("refused", True)
        # None of root's capabilities passed to the worker.
        assert int(seen["capabilities"], 16) == 0

    _run(
        tmp_path,
        body,
        **_as_nobody(nobodys_python, open_dir),
        # The secret lies in /tmp, which a sandboxed worker does not see: here the switch
        # alone (the sandbox's is test_sandbox.py's, and the tenants' test's below).
        **{"executor.private_tmp": "false"},
    )


@pytest.mark.parametrize("private", [True, False], ids=["private network", "the host's"])
def test_a_job_with_a_network_of_its_own__reaches_neither_the_nodes_ports_nor_the_network(
    tmp_path: Path, open_dir: Path, nobodys_python: str, private: bool
) -> None:
    """`executor.private_network`: the job's connections to the node's own API and Raft ports
    on 127.0.0.1 are refused, as nothing listens in its network, and it has loopback alone
    (a server of its own works). The control: without it, both are reached."""
    raft_port, http_port = free_ports(2)

    async def body(api: _Api) -> None:
        job_id = await api.submit("probe_network", args={"ports": [http_port, raft_port]})
        job = await api.finished(job_id)
        assert job["state"] == "succeeded", job
        seen = json.loads(job["tasks"][0]["result"])
        if private:
            assert seen["interfaces"] == ["lo"], seen
            assert set(seen["reached"].values()) == {"ConnectionRefusedError"}, seen
        else:
            with open("/proc/net/dev") as devices:
                host = sorted(line.split(":")[0].strip() for line in devices.readlines()[2:])
            assert seen["interfaces"] == host, seen
            assert set(seen["reached"].values()) == {"reached"}, seen

    _run(
        tmp_path,
        body,
        **_as_nobody(nobodys_python, open_dir),
        **{
            "executor.private_network": str(private).lower(),
            "raft.address": f"127.0.0.1:{raft_port}",
            "http.address": f"127.0.0.1:{http_port}",
        },
    )


@pytest.mark.parametrize("private", [True, False], ids=["its own /tmp", "the host's"])
def test_a_job_given_a_path_in_the_hosts_tmp__fails_once_saying_why_with_its_own(
    tmp_path: Path, open_dir: Path, nobodys_python: str, private: bool
) -> None:
    """With `executor.private_tmp` a job's /tmp is its own, so an input the host has there is
    not: the failure says so and is not retried. The control: without, the job reads it."""
    handle, name = tempfile.mkstemp(prefix="xr-test-input-", dir="/tmp")
    os.write(handle, b"the input")
    os.close(handle)
    os.chmod(name, 0o644)

    async def body(api: _Api) -> None:
        job = await api.finished(
            await api.submit("read_input", args={"path": name}, max_attempts=3)
        )
        task = job["tasks"][0]
        if not private:
            assert job["state"] == "succeeded", job
            assert json.loads(task["result"]) == {"read": "the input"}
            return
        assert job["state"] == "failed" and len(task["attempts"]) == 1, job
        assert task["error"].startswith(
            f"{name} is not there: this job has /tmp, /var/tmp and /dev/shm of its own"
        ), task["error"]

    try:
        _run(
            tmp_path,
            body,
            **_as_nobody(nobodys_python, open_dir),
            **{"executor.private_tmp": str(private).lower()},
        )
    finally:
        os.unlink(name)


@pytest.mark.parametrize("over", [True, False], ids=["over the bound", "under it"])
def test_a_job_whose_tmp_holds_more_than_tmp_bytes_max__is_stopped_and_fails_once_saying_why(
    tmp_path: Path, open_dir: Path, nobodys_python: str, over: bool
) -> None:
    """`executor.tmp_bytes_max` bounds what a job's /tmp and /var/tmp hold together (each file
    below is under the bound, the two over it): such a job is stopped and fails without a
    retry, saying why. The control: under a bound, it runs its course (checked many times)."""
    limit = 1_000_000 if over else 10_000_000
    files = {"/tmp/weights": 600_000, "/var/tmp/cache": 600_000}

    async def body(api: _Api) -> None:
        job_id = await api.submit(
            "fill_tmp", args={"files": files, "hold_s": 120 if over else 1.5}, max_attempts=3
        )
        job = await api.finished(job_id)
        task = job["tasks"][0]
        if not over:
            assert job["state"] == "succeeded", job
            return
        assert job["state"] == "failed" and len(task["attempts"]) == 1, job
        held = re.fullmatch(
            r"stopped: its /tmp and /var/tmp held ([\d,]+) bytes, more than "
            r"executor\.tmp_bytes_max \(1,000,000\); write large files to the checkpoint "
            r"directory or another path outside them",
            task["error"],
        )
        assert held is not None and int(held[1].replace(",", "")) > limit, task["error"]

    _run(
        tmp_path,
        body,
        **_as_nobody(nobodys_python, open_dir),
        **{"executor.tmp_bytes_max": str(limit), "executor.tmp_check_interval_s": "0.1"},
    )


def test_node_run_check__runs_the_same_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o700)
    (locked / "python").symlink_to(sys.executable)
    arguments = ["node", "run", "--check", "--region", "r0", "--data-dir", str(tmp_path)]
    arguments += ["--raft-address", "127.0.0.1:7001", "--set", "executor.job_user=nobody"]
    assert main([*arguments, "--set", f"executor.python={locked / 'python'}"]) == 2
    said = capsys.readouterr().err
    assert (
        "xr node run: invalid configuration: setting executor.job_user: 'nobody' cannot run" in said
    )
    assert main([*arguments, "--set", "executor.job_user=no-such-xr-user"]) == 2
    assert "there is no user 'no-such-xr-user'" in capsys.readouterr().err


def test_a_node_whose_jobs_cannot_run_as_the_job_user__does_not_start(tmp_path: Path) -> None:
    """The check runs before the node starts anything: it exits 2 with the reason and never
    listens (it would otherwise join the cluster and take tasks it cannot run)."""
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o700)
    (locked / "python").symlink_to(sys.executable)
    config = _config(tmp_path)
    command = [sys.executable, "-m", "node.cli", "node", "run", "--region", "r0"]
    command += ["--data-dir", str(tmp_path / "data"), "--raft-address", config.raft.self_address]
    command += ["--http-address", config.http.address, "--set", "executor.job_user=nobody"]
    command += ["--set", f"executor.python={locked / 'python'}"]
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "invalid configuration: setting executor.job_user: 'nobody' cannot run" in done.stderr
    assert "ready at" not in done.stdout
    # Nothing started: no Raft election, no API.
    assert "region r0 serving" not in done.stderr and "leader is now" not in done.stderr


# A user per tenant (`executor.tenant_users`): alpha's jobs run as nobody, beta's as daemon.
TENANT_TOKENS = {"alpha": "alpha-token-for-the-tests", "beta": "beta-token-for-the-tests"}
TENANT_USERS = {"alpha": "nobody", "beta": "daemon"}
SHM_BYTES = 16 << 20


def _run_as_tenants(
    tmp_path: Path, body: Callable[[dict[str, _Api], Node], Awaitable[None]], **settings: str
) -> None:
    """`test_executor._run` with authentication on: one API client per tenant of
    TENANT_TOKENS, each with its tenant's token; the body gets the node too."""
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(
        "".join(
            f'[[tokens]]\nname = "{tenant}"\nsha256 = "{hash_token(secret)}"\n'
            f'role = "tenant"\ntenant = "{tenant}"\n'
            for tenant, secret in TENANT_TOKENS.items()
        )
    )
    config = _config(tmp_path, **{"auth.tokens_file": str(tokens)}, **settings)

    async def main() -> None:
        node = Node(config)
        await node.start()
        sessions = [
            aiohttp.ClientSession(
                f"http://{config.http.address}", headers={"Authorization": f"Bearer {secret}"}
            )
            for secret in TENANT_TOKENS.values()
        ]
        try:
            apis = {
                tenant: _Api(session)
                for tenant, session in zip(TENANT_TOKENS, sessions, strict=True)
            }
            for api in apis.values():
                await api.until(partial(api.get, "/v1/jobs"), lambda r: "items" in r)
            await body(apis, node)
        finally:
            for session in sessions:
                await session.close()
            await node.stop()

    asyncio.run(main())


@pytest.mark.parametrize(
    "users",
    [
        "one job user",
        "one job user, shared /tmp",
        "a user per tenant",
        "a user per tenant, shared /tmp",
        "a user for beta alone",
    ],
)
def test_a_tenants_job_cannot_reach_another_tenants_checkpoints_workers_or_temporary_files(
    tmp_path: Path, open_dir: Path, nobodys_python: str, users: str
) -> None:
    """Alpha's job commits a checkpoint, leaves a file in /tmp, /var/tmp and /dev/shm and keeps
    running; beta's job then tries to list and write in alpha's checkpoint area, to signal the
    node's other workers and to read alpha's files. With one job user for every tenant it can
    do the first three (the control); with a user per tenant, none; nor with a user for beta
    alone and alpha on the shared job user, whose areas are 0700 too. Alpha's files: with
    `executor.private_tmp` (the default) each attempt has its own /tmp, /var/tmp and /dev/shm,
    so beta's job finds none of them, even as the same user; without, they are in the
    machine's, where the same user reads them (the control) and another is refused (the
    workers' umask is 077). With a user per tenant, `executor.shm_bytes_max` is set: beta's
    /dev/shm is that size, or the machine's itself without `private_tmp`."""
    checkpoints = open_dir / "checkpoints"
    area = checkpoints / tenant_area("alpha")
    mark = f"xr-test-{os.getpid()}-{time.monotonic_ns()}"
    left = [f"/tmp/{mark}", f"/var/tmp/{mark}", f"/dev/shm/{mark}"]
    shared_tmp = users.endswith("shared /tmp")
    sandboxes: list[Path] = []

    async def body(apis: dict[str, _Api], node: Node) -> None:
        assert node.executor is not None
        holder = await apis["alpha"].submit("hold_checkpoint", args={"leave": left})
        await apis["alpha"].running(holder)
        prober = await apis["beta"].submit(
            "probe_other_tenant", args={"area": str(area), "peek": left}
        )
        job = await apis["beta"].finished(prober)
        assert job["state"] == "succeeded", job
        seen = json.loads(job["tasks"][0]["result"])
        held = await apis["alpha"].get(f"/v1/jobs/{holder}")
        assert held["tasks"][0]["state"] == "running"
        peeked = set(seen["peeked"].values())
        host = os.statvfs("/dev/shm")
        assert seen["shm_bytes"] == (
            SHM_BYTES if users == "a user per tenant" else host.f_blocks * host.f_frsize
        ), seen
        if shared_tmp:
            assert node.executor.sandboxes is None
            for path in left:
                assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
            assert peeked == {"read" if users.startswith("one job user") else "refused"}, seen
        else:
            assert node.executor.sandboxes is not None
            sandboxes.append(node.executor.sandboxes)
            assert peeked == {"missing"}, seen
            # Alpha's /tmp and /var/tmp are its attempt's directories; its /dev/shm is in no
            # directory of the host's. Beta's attempt's went when it ended.
            attempts = await apis["alpha"].until(
                lambda: asyncio.to_thread(lambda: list(sandboxes[0].glob("attempt-*"))),
                lambda found: len(found) == 1,
            )
            for name in ("tmp", "var-tmp"):
                assert (attempts[0] / name / mark).read_text() == "alpha's"
            assert not any(Path(path).exists() for path in left)
        if users.startswith("one job user"):
            assert seen["uid"] == _nobody().uid
            assert holder in seen["listed"] and seen["wrote"] == "wrote", seen
            assert seen["signalled"] >= 1, seen
            return
        assert seen["uid"] == pwd.getpwnam("daemon").pw_uid
        assert (seen["listed"], seen["wrote"], seen["signalled"]) == ("refused", "refused", 0)
        assert seen["refused"] >= 1, seen
        info = area.stat()
        assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (_nobody().uid, 0o700)
        assert not (area / "planted").exists()
        # Beta's own area is beta's user's alone too.
        beta = (checkpoints / tenant_area("beta")).stat()
        assert (beta.st_uid, stat.S_IMODE(beta.st_mode)) == (seen["uid"], 0o700)
        if users == "a user per tenant":
            # Made by the node for tenants' users to pass through, whatever its umask.
            assert stat.S_IMODE(checkpoints.stat().st_mode) == 0o711

    settings = {"executor.python": nobodys_python, "executor.checkpoint_dir": str(checkpoints)}
    if users.startswith("one job user") or users == "a user for beta alone":
        settings["executor.job_user"] = "nobody"
    if users.startswith("a user per tenant"):
        settings["executor.tenant_users"] = ",".join(f"{t}={u}" for t, u in TENANT_USERS.items())
        # Beta's /dev/shm is this size where it has its own; the machine's where not.
        settings["executor.shm_bytes_max"] = str(SHM_BYTES)
    if users == "a user for beta alone":
        settings["executor.tenant_users"] = f"beta={TENANT_USERS['beta']}"
    if shared_tmp:
        settings["executor.private_tmp"] = "false"
    try:
        _run_as_tenants(tmp_path, body, **settings)
    finally:
        for path in left:
            Path(path).unlink(missing_ok=True)
    # The node removes every attempt's directories when it stops.
    assert not any(path.exists() for path in sandboxes)


def test_a_tenants_area_is_made_its_users_alone_and_one_of_another_user_refused(
    open_dir: Path,
) -> None:
    nobody = _nobody()
    own = open_dir / "tenants" / "alpha"
    previous = os.umask(0o027)  # as deploy/systemd/xr-node.service sets it
    try:
        prepare_area(own, nobody, own=True)
    finally:
        os.umask(previous)
    info = own.stat()
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (nobody.uid, nobody.gid, 0o700)
    # Passable by every tenant's user, listable by none but root.
    assert stat.S_IMODE(own.parent.stat().st_mode) == 0o711
    # Opened up by hand: closed again.
    own.chmod(0o755)
    prepare_area(own, nobody, own=True)
    assert stat.S_IMODE(own.stat().st_mode) == 0o700
    # Another uid's (root's here): refused, whether the tenant's own user or the shared one.
    taken = open_dir / "tenants" / "beta"
    taken.mkdir(mode=0o755)
    for is_own, setting in [(True, "executor.tenant_users"), (False, "executor.job_user")]:
        with pytest.raises(ConfigError, match=rf"{setting}: the checkpoint area .* uid 0"):
            prepare_area(taken, nobody, own=is_own)
    # The shared job user's: given to it, 0700 as well; no user: only made.
    shared = open_dir / "tenants" / "gamma"
    prepare_area(shared, nobody, own=False)
    assert (shared.stat().st_uid, stat.S_IMODE(shared.stat().st_mode)) == (nobody.uid, 0o700)
    plain = open_dir / "tenants" / "delta"
    prepare_area(plain, None, own=False)
    assert plain.stat().st_uid == os.geteuid()


def test_tenant_users_are_checked_when_the_configuration_loads_and_at_node_run_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for value, reason in [
        ("alpha=no-such-xr-user", "there is no user 'no-such-xr-user' \\(tenant 'alpha'\\)"),
        ("-alpha=nobody", "tenant '-alpha' must start with a letter or digit"),
        ("alpha", "'alpha' must be key=value"),
    ]:
        with pytest.raises(ConfigError, match=rf"executor\.tenant_users: {reason}"):
            _config(tmp_path, **{"executor.tenant_users": value})
    config = _config(tmp_path, **{"executor.tenant_users": "alpha=nobody, team/b=daemon"})
    assert config.executor.tenant_users == {"alpha": "nobody", "team/b": "daemon"}
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o700)
    (locked / "python").symlink_to(sys.executable)
    arguments = ["node", "run", "--check", "--region", "r0", "--data-dir", str(tmp_path)]
    arguments += ["--raft-address", "127.0.0.1:7001"]
    arguments += ["--set", "executor.tenant_users=alpha=nobody"]
    assert main([*arguments, "--set", f"executor.python={locked / 'python'}"]) == 2
    said = capsys.readouterr().err
    assert "setting executor.tenant_users: 'nobody' cannot run executor.python" in said


def test_a_node_with_tenant_users_that_is_not_root__is_refused_before_anything_is_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    config = _config(
        tmp_path,
        **{
            "executor.tenant_users": "alpha=nobody",
            "executor.checkpoint_dir": str(tmp_path / "checkpoints"),
        },
    )
    with pytest.raises(ConfigError, match=r"executor\.tenant_users: the node must run as root"):
        asyncio.run(Executor(config, store=None).prepare())  # type: ignore[arg-type]
    assert not (tmp_path / "checkpoints").exists()
