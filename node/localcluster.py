"""A local cluster of N regions as child processes on loopback: what `xr up`, the tests, the
benchmarks and the demo start.

Each node is a real `xr node run` process with its own data directory under `base_dir`
(`<base_dir>/<region>/`), its own log (`<base_dir>/<region>.log`) and ports chosen free by the
operating system unless given. Nodes can be killed (-9), stopped (SIGTERM), paused and restarted
from their data directories.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Set in a node's environment: it stops once the process that started it is gone
# (`node.daemon`).
STOP_WITH_PARENT_VARIABLE = "XR_STOP_WITH_PARENT"

__all__ = [
    "SECRET_FILE",
    "STOP_WITH_PARENT_VARIABLE",
    "LocalCluster",
    "LocalNode",
    "check_port_free",
    "free_ports",
    "prepare_directory",
    "secret_file",
]

HOST = "127.0.0.1"
# The cluster secret `xr up` and `xr demo` make for their nodes' Raft traffic.
SECRET_FILE = "cluster-secret"


def prepare_directory(path: Path) -> None:
    """Makes `path` (and its parents) and checks that files can be made in it, as the nodes'
    data and logs will be; OSError otherwise."""
    path.mkdir(parents=True, exist_ok=True)
    descriptor, probe = tempfile.mkstemp(dir=path, prefix=".xr-probe-")
    os.close(descriptor)
    os.unlink(probe)


def secret_file(path: Path) -> Path:
    """`path`, a cluster secret file (32 random bytes, mode 0600), made if it does not exist."""
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path
    with os.fdopen(descriptor, "w") as file:
        file.write(secrets.token_urlsafe(32) + "\n")
    return path


def check_port_free(port: int, *, host: str = HOST) -> None:
    """OSError (EADDRINUSE) when `port` on `host` cannot be listened on now. Listened on as a
    node listens, with SO_REUSEADDR: a port left in TIME_WAIT by a node just stopped is free."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((host, port))
        probe.listen()


def free_ports(count: int) -> list[int]:
    """Ports the operating system reports free now (bound and released together, so distinct)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for item in sockets:
            item.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            item.bind((HOST, 0))
        return [item.getsockname()[1] for item in sockets]
    finally:
        for item in sockets:
            item.close()


@dataclass
class LocalNode:
    region: str
    raft_port: int
    http_port: int
    data_dir: Path
    log_path: Path
    peers: list[str]
    settings: dict[str, str] = field(default_factory=dict)
    # A TOML file the node reads first (for what flags cannot say, such as auth tokens).
    config_path: Path | None = None
    process: subprocess.Popen[bytes] | None = None
    # The address the node binds and is reached at (jepsen-lite gives each node its own network
    # namespace and address), and a command the node runs under, which must exec it so the
    # process keeps its pid (`ip netns exec NAME`, `env LD_PRELOAD=...`).
    host: str = HOST
    command_prefix: list[str] = field(default_factory=list)
    # The checkout whose packages the node runs (None: this one). A benchmark points it at a copy
    # of another revision to measure both in one run.
    code_root: Path | None = None
    # The node stops once the process that started it is gone (`xr up`, the demo).
    stop_with_parent: bool = False

    @property
    def raft_address(self) -> str:
        return f"{self.host}:{self.raft_port}"

    @property
    def url(self) -> str:
        scheme = "https" if self.settings.get("tls.cert_file") else "http"
        return f"{scheme}://{self.host}:{self.http_port}"

    def ssl_context(self) -> ssl.SSLContext | None:
        """For a node given `tls.*` settings: trusts its `tls.ca_file` and, for nodes that ask for
        client certificates, presents the node's own certificate (`xr tls make-ca` makes
        certificates good for both ends)."""
        if not self.settings.get("tls.cert_file"):
            return None
        context = ssl.create_default_context(cafile=self.settings.get("tls.ca_file"))
        if self.settings.get("tls.client_certs", "none") != "none":
            context.load_cert_chain(self.settings["tls.cert_file"], self.settings["tls.key_file"])
        return context

    def get(self, path: str, *, timeout_s: float) -> Any:
        """GET `path` from this node's API (https when it serves TLS); the open answer."""
        return urllib.request.urlopen(
            f"{self.url}{path}", timeout=timeout_s, context=self.ssl_context()
        )

    def command(self) -> list[str]:
        command = [
            *self.command_prefix,
            # -P: `-m` would put the working directory first on the module path, and a node
            # started from one checkout with `code_root` another would run the first one's code.
            sys.executable, "-P", "-m", "node.cli", "node", "run",
            "--region", self.region,
            "--raft-address", self.raft_address,
            "--peers", ",".join(self.peers),
            "--http-address", f"{self.host}:{self.http_port}",
            "--data-dir", str(self.data_dir),
        ]  # fmt: skip
        for name, value in sorted(self.settings.items()):
            command += ["--set", f"{name}={value}"]
        if self.config_path is not None:
            command += ["--config", str(self.config_path)]
        return command

    def start(self) -> None:
        if self.running:
            raise RuntimeError(f"region {self.region} is already running")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        environment = {**os.environ, "PYTHONUNBUFFERED": "1"}
        # The child must import this checkout's packages (or `code_root`'s) whatever the caller's
        # directory.
        root = str(self.code_root or Path(__file__).resolve().parent.parent)
        environment["PYTHONPATH"] = os.pathsep.join(
            filter(None, [root, environment.get("PYTHONPATH")])
        )
        if self.stop_with_parent:
            environment[STOP_WITH_PARENT_VARIABLE] = "1"
        with self.log_path.open("ab") as log_file:
            self.process = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=environment,
                start_new_session=True,
            )

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def exit_code(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def healthy(self) -> bool:
        try:
            with self.get("/healthz", timeout_s=1.0) as answer:
                return bool(answer.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def ready(self) -> bool:
        try:
            with self.get("/readyz", timeout_s=2.0) as answer:
                return bool(json.load(answer).get("ready"))
        except (OSError, urllib.error.URLError, ValueError):
            return False

    def kill(self) -> None:
        """kill -9, and reap it."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
        self._reap()

    def terminate(self, *, timeout_s: float = 15.0) -> None:
        """SIGTERM (graceful), then SIGKILL if it has not stopped in `timeout_s`."""
        if self.process is not None and self.process.poll() is None:
            if self.paused:
                self.resume()
            self.process.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self._reap()

    paused: bool = False

    def pause(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGCONT)
        self.paused = False

    def _reap(self) -> None:
        if self.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(10.0)
        self.paused = False

    def log_tail(self, characters: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-characters:]
        except OSError:
            return ""


class LocalCluster:
    """N regions named `region_names` (default r0, r1, ...) under `base_dir`."""

    def __init__(
        self,
        base_dir: Path,
        *,
        size: int = 3,
        region_names: list[str] | None = None,
        settings: dict[str, str] | None = None,
        region_settings: dict[str, dict[str, str]] | None = None,
        raft_ports: list[int] | None = None,
        http_ports: list[int] | None = None,
        config_text: str | None = None,
        code_root: Path | None = None,
        stop_with_parent: bool = False,
    ) -> None:
        """`config_text` is TOML every node reads before its flags (auth tokens, for one);
        `code_root` is the checkout the nodes run (default: this one); `stop_with_parent`: each
        node stops once this process is gone, however it ended."""
        names = region_names or [f"r{position}" for position in range(size)]
        ports = free_ports(2 * len(names))
        raft_ports = raft_ports or ports[: len(names)]
        http_ports = http_ports or ports[len(names) :]
        self.base_dir = base_dir
        config_path = None
        if config_text is not None:
            base_dir.mkdir(parents=True, exist_ok=True)
            config_path = base_dir / "node.toml"
            config_path.write_text(config_text)
        addresses = [f"{HOST}:{port}" for port in raft_ports]
        self.nodes: list[LocalNode] = []
        for position, name in enumerate(names):
            node_settings = dict(settings or {})
            node_settings.update((region_settings or {}).get(name, {}))
            if "checkpoint_dir" not in (config_text or ""):
                # One checkpoint directory for every region, as a cluster's shared mount: a
                # task that moves resumes from what another region wrote (each node's default,
                # under its own data directory, would start it over).
                node_settings.setdefault("executor.checkpoint_dir", str(base_dir / "checkpoints"))
            self.nodes.append(
                LocalNode(
                    region=name,
                    raft_port=raft_ports[position],
                    http_port=http_ports[position],
                    data_dir=base_dir / name,
                    log_path=base_dir / f"{name}.log",
                    peers=[address for address in addresses if address != addresses[position]],
                    settings=node_settings,
                    config_path=config_path,
                    code_root=code_root,
                    stop_with_parent=stop_with_parent,
                )
            )

    @property
    def urls(self) -> list[str]:
        return [node.url for node in self.nodes]

    def node(self, region: str) -> LocalNode:
        for node in self.nodes:
            if node.region == region:
                return node
        raise KeyError(region)

    def start(self, *, timeout_s: float = 30.0) -> None:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        for node in self.nodes:
            node.start()
        self.wait_ready(timeout_s=timeout_s)

    def wait_ready(self, *, timeout_s: float = 30.0, nodes: list[LocalNode] | None = None) -> None:
        """Waits until every (given) running node answers /readyz with ready; raises
        RuntimeError with the logs of those that did not."""
        waiting = [node for node in (nodes or self.nodes) if node.running]
        deadline_s = time.monotonic() + timeout_s
        while waiting:
            waiting = [node for node in waiting if node.running and not node.ready()]
            crashed = [
                node
                for node in (nodes or self.nodes)
                if node.exit_code not in (None, -signal.SIGKILL, -signal.SIGTERM)
            ]
            if crashed:
                raise RuntimeError(
                    f"region {crashed[0].region} exited with {crashed[0].exit_code}:\n"
                    f"{crashed[0].log_tail()}"
                )
            if not waiting:
                return
            if time.monotonic() > deadline_s:
                logs = "\n".join(f"--- {node.region}\n{node.log_tail(1500)}" for node in waiting)
                raise RuntimeError(f"regions not ready in {timeout_s} s:\n{logs}")
            time.sleep(0.1)

    def leader(self) -> LocalNode | None:
        for node in self.nodes:
            if not node.running or node.paused:
                continue
            try:
                with node.get("/v1/cluster/status", timeout_s=1.0) as answer:
                    status = json.load(answer)
            except (OSError, urllib.error.URLError, ValueError):
                continue
            if status.get("state") == "leader":
                return node
        return None

    def stop(self) -> None:
        for node in self.nodes:
            node.terminate()

    def kill(self) -> None:
        for node in self.nodes:
            node.kill()

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.kill()
