"""Workers with /tmp, /var/tmp and /dev/shm of their own (`executor.private_tmp`,
`node.executor.sandbox`). Run as root, as the node would; the end-to-end case, two tenants'
jobs on one node, is in test_job_user.py."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from node.config import ConfigError
from node.executor import sandbox
from node.executor.executor import worker_environment
from node.executor.job_user import check, kept_paths, lookup

ROOT = Path(__file__).resolve().parents[3]

# Run as the sandboxed user: where its files go, who it is, what it may do.
_PROBE = """
name=$1
echo mine > /tmp/$name; echo mine > /var/tmp/$name; echo mine > /dev/shm/$name
id -u; id -G; umask
grep CapEff /proc/self/status
ls -A /tmp; ls -A /dev/shm
stat -c %a /tmp/$name
"""


def test_a_sandboxed_process_has_its_own_tmp_var_tmp_and_shm_as_the_user_without_capabilities(
    sandboxes: Path,
) -> None:
    nobody = lookup("nobody")
    directory = sandboxes / "attempt-1"
    sandbox.make_directories(directory)
    name = f"xr-test-{os.getpid()}"
    done = subprocess.run(
        nobody.sandboxed(directory, ["/bin/sh", "-c", _PROBE, "probe", name]),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    uid, groups, umask, capabilities, tmp, shm, mode = done.stdout.splitlines()
    assert int(uid) == nobody.uid
    assert sorted(map(int, groups.split())) == sorted(nobody.groups)
    assert umask == "0077" and mode == "600"
    assert capabilities.split() == ["CapEff:", "0000000000000000"]
    # Its /tmp and /dev/shm hold its files alone.
    assert tmp == name and shm == name
    for place in ("tmp", "var-tmp"):
        made = directory / place / name
        assert made.read_text() == "mine\n"
        assert made.stat().st_uid == nobody.uid
    # Nothing of it on the host: not the files, not the mounts.
    for path in (f"/tmp/{name}", f"/var/tmp/{name}", f"/dev/shm/{name}"):
        assert not Path(path).exists()
    assert str(directory) not in Path("/proc/self/mountinfo").read_text()


# Run as the sandboxed user: the size of its /dev/shm, then whether 5 and then 4 more MiB fit.
_FILL_SHM = """
df -B1 --output=size /dev/shm | tail -n 1
head -c 5242880 /dev/zero > /dev/shm/five && echo five
head -c 4194304 /dev/zero > /dev/shm/four && echo four
"""


def test_a_sandboxs_shm_holds_as_much_as_it_is_given__the_hosts_size_by_default(
    sandboxes: Path,
) -> None:
    """`executor.shm_bytes_max`: each worker's /dev/shm is a tmpfs of that size; without it,
    of the host's /dev/shm's size."""
    nobody = lookup("nobody")
    host = os.statvfs("/dev/shm")
    for number, (size, fits) in enumerate([(8 << 20, ["five"]), (None, ["five", "four"])], start=1):
        directory = sandboxes / f"attempt-{number}"
        sandbox.make_directories(directory)
        done = subprocess.run(
            nobody.sandboxed(directory, ["/bin/sh", "-c", _FILL_SHM], shm_bytes=size),
            capture_output=True,
            text=True,
            timeout=60,
        )
        said = done.stdout.split()
        assert int(said[0]) == (host.f_blocks * host.f_frsize if size is None else size), said
        assert said[1:] == fits, done.stderr
        if size is not None:
            assert "No space left on device" in done.stderr


def test_a_sandbox_given_a_size_of_nothing__runs_nothing(sandboxes: Path) -> None:
    nobody = lookup("nobody")
    directory = sandboxes / "attempt-1"
    sandbox.make_directories(directory)
    done = subprocess.run(
        nobody.sandboxed(directory, ["/bin/touch", str(sandboxes / "ran")], shm_bytes=0),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == sandbox.SETUP_FAILED
    assert done.stderr.startswith("xr sandbox: --shm-size must be more than 0, not 0\nusage:")
    assert not (sandboxes / "ran").exists()


def test_a_sandbox_that_cannot_be_set_up__runs_nothing_and_says_why(sandboxes: Path) -> None:
    nobody = lookup("nobody")
    ran = sandboxes / "ran"
    missing = sandboxes / "never-made"
    done = subprocess.run(
        nobody.sandboxed(missing, ["/bin/touch", str(ran)]),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == sandbox.SETUP_FAILED
    assert done.stderr == (f"xr sandbox: cannot reach {missing}: No such file or directory\n")
    assert not ran.exists()
    directory = sandboxes / "attempt-2"
    sandbox.make_directories(directory)
    done = subprocess.run(
        nobody.sandboxed(directory, ["/no/such/program"]), capture_output=True, text=True
    )
    assert done.returncode == sandbox.EXEC_FAILED
    assert "cannot run /no/such/program: No such file or directory" in done.stderr


def test_the_start_up_check_names_the_setting_when_workers_cannot_be_sandboxed(
    sandboxes: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check's process starts as every worker would; here the sandbox is given a
    directory that is not there (as a host that refuses mount namespaces refuses it: the
    sandbox exits SETUP_FAILED before the user's code runs)."""
    nobody = lookup("nobody")
    command = sandbox.command
    monkeypatch.setattr(
        sandbox,
        "command",
        lambda python, uid, gid, groups, directory, *rest: command(
            python, uid, gid, groups, directory / "never-made", *rest
        ),
    )
    with pytest.raises(
        ConfigError,
        match=r"setting executor\.private_tmp: this node cannot start workers as 'nobody' with "
        r"/tmp of their own \(xr sandbox: cannot reach .*never-made: No such file",
    ):
        check(
            nobody,
            python=sys.executable,
            environment=worker_environment(nobody),
            checkpoint_dir=sandboxes,
            make_directory=False,
            sandboxes=sandboxes,
        )
    # The check's directory is removed whatever the outcome.
    assert list(sandboxes.iterdir()) == []


def test_paths_under_tmp_it_must_see_are_kept__reached_as_on_the_host(sandboxes: Path) -> None:
    """xr's code, the interpreter or the checkpoint directory under /tmp (a checkout there, a
    test's directories) would be hidden by the worker's own /tmp: they are bound back, under
    directories with the host's owners and modes, so the user reaches each as it would outside
    (here: reads through a 0755 directory, not through a 0700 one, and writes only where it
    may), and sees nothing else of the host's /tmp."""
    nobody = lookup("nobody")
    host = Path(tempfile.mkdtemp(prefix="xr-test-kept-"))  # under /tmp, 0700
    try:
        host.chmod(0o755)
        (host / "open").mkdir(mode=0o755)
        (host / "open" / "code").write_text("code")
        (host / "closed").mkdir(mode=0o700)
        (host / "closed" / "secret").write_text("secret")
        (host / "beside").write_text("not kept")
        keep = (host / "open", host / "closed", Path("/etc"))
        directory = sandboxes / "attempt-3"
        sandbox.make_directories(directory)
        probe = (
            f"cat {host}/open/code; echo; cat {host}/closed/secret || echo refused; "
            f"cat {host}/beside || echo missing; touch {host}/open/new || echo read-only; "
            "ls -A /tmp"
        )
        done = subprocess.run(
            nobody.sandboxed(directory, ["/bin/sh", "-c", probe], keep),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines() == [
            "code",
            "refused",
            "missing",
            "read-only",
            host.name,
        ]
        assert not (host / "open" / "new").exists()
    finally:
        shutil.rmtree(host, ignore_errors=True)


def test_kept_paths_are_the_code_the_interpreter_and_checkpoints_under_private_directories(
    tmp_path: Path,
) -> None:
    python = tmp_path / "venv" / "bin" / "python"
    environment = {"PYTHONPATH": os.pathsep.join([str(tmp_path / "code"), "/usr/lib/xr"])}
    assert kept_paths(str(python), environment, tmp_path / "checkpoints") == (
        tmp_path / "code",
        tmp_path / "venv",
        tmp_path / "checkpoints",
    )
    assert kept_paths("/usr/bin/python3", {}, Path("/var/lib/xr/checkpoints")) == ()
    assert sandbox.covered_by(Path("/var/tmp/x")) == "/var/tmp"
    assert sandbox.covered_by(Path("/dev/shm")) == "/dev/shm"
    assert sandbox.covered_by(Path("/var/lib/xr/checkpoints")) is None


@pytest.mark.parametrize(
    ("dropped", "setting", "said"),
    [
        (
            "sys_admin",
            "private_tmp",
            "/tmp of their own (xr sandbox: cannot make a mount namespace: Operation not "
            "permitted): let it make mount namespaces",
        ),
        (
            "net_admin",
            "private_network",
            "a network of their own (xr sandbox: cannot bring up the loopback interface: "
            "Operation not permitted): let it make network namespaces",
        ),
    ],
)
def test_a_node_that_may_not_make_its_workers_namespaces__is_refused_naming_the_setting(
    tmp_path: Path, dropped: str, setting: str, said: str
) -> None:
    """As in a container without CAP_SYS_ADMIN, or one without CAP_NET_ADMIN (here: root with
    it out of the bounding set, by util-linux's setpriv; without CAP_NET_ADMIN the network
    namespace is made and its loopback interface cannot be brought up), `xr node run --check`
    names the setting and says what to allow; with the setting false, that check is not made."""
    command = ["setpriv", "--bounding-set", f"-{dropped}", "--", sys.executable, "-m", "node.cli"]
    command += ["node", "run", "--check", "--region", "r0", "--data-dir", str(tmp_path)]
    command += ["--raft-address", "127.0.0.1:7001", "--set", "executor.job_user=nobody"]
    runs = {
        value: subprocess.run(
            [*command, "--set", f"executor.{setting}={value}"],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
        )
        for value in ("true", "false")
    }
    assert runs["true"].returncode == 2, runs["true"].stdout + runs["true"].stderr
    assert (
        f"setting executor.{setting}: this node cannot start workers as 'nobody' with {said}"
        in runs["true"].stderr
    ), runs["true"].stderr
    assert setting not in runs["false"].stderr


# Run as the sandboxed user: a server of its own on loopback, then each port given.
_CONNECT = """
import socket, sys
with socket.create_server(("127.0.0.1", 0)) as server:
    socket.create_connection(server.getsockname(), timeout=5).close()
print("loopback")
for port in sys.argv[1:]:
    try:
        socket.create_connection(("127.0.0.1", int(port)), timeout=5).close()
        print("reached")
    except OSError as error:
        print(type(error).__name__)
"""


def test_a_sandbox_with_a_network_of_its_own__has_loopback_and_reaches_no_port_outside(
    sandboxes: Path, nobodys_python: str
) -> None:
    nobody = lookup("nobody")
    with socket.create_server(("127.0.0.1", 0)) as outside:
        port = str(outside.getsockname()[1])
        for number, (network, reached) in enumerate(
            [(True, "ConnectionRefusedError"), (False, "reached")], start=1
        ):
            directory = sandboxes / f"attempt-{number}"
            sandbox.make_directories(directory)
            done = subprocess.run(
                nobody.sandboxed(
                    directory,
                    [nobodys_python, "-I", "-S", "-c", _CONNECT, port],
                    network=network,
                ),
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert done.stdout.split() == ["loopback", reached], done.stderr
