"""The test network for real: namespaces joined by a bridge, a partition that drops packets, its
heal, and nothing left behind. Needs root, `ip` and `nft`: skipped without root, and failed as
root when they are missing (`make test` installs nftables as root)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from xr_jepsen.net import Network, namespaces_available

pytestmark = pytest.mark.integration

PROBLEM = namespaces_available()
PORT = 7999
# A TCP listener and a client, each a short Python program run inside a namespace.
LISTEN = (
    "import socket, sys; s = socket.create_server((sys.argv[1], int(sys.argv[2]))); "
    "print('up', flush=True)\nwhile True: s.accept()[0].close()"
)
CONNECT = (
    "import socket, sys\ntry: socket.create_connection((sys.argv[1], int(sys.argv[2])), 1.0)\n"
    "except OSError: sys.exit(1)"
)


def _skip_unless_root() -> None:
    if os.geteuid() == 0:
        pytest.fail(f"running as root, yet no network namespaces: {PROBLEM}")
    pytest.skip(f"network namespaces need root: {PROBLEM}")


@pytest.fixture
def network() -> Iterator[Network]:
    if PROBLEM is not None:
        _skip_unless_root()
    made = Network(3)
    made.create()
    try:
        yield made
    finally:
        made.destroy()


def _reaches(network: Network, source: int | None, target: int) -> bool:
    prefix = [] if source is None else network.exec_prefix(source)
    command = [*prefix, sys.executable, "-c", CONNECT, network.address(target), str(PORT)]
    return subprocess.run(command, capture_output=True, timeout=10, check=False).returncode == 0


def test_network__a_partition_drops_packets_and_its_heal_restores_them(network: Network) -> None:
    listener = subprocess.Popen(
        [*network.exec_prefix(1), sys.executable, "-c", LISTEN, network.address(1), str(PORT)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert listener.stdout is not None and listener.stdout.readline().strip() == "up"
        assert _reaches(network, 0, 1) and _reaches(network, 2, 1) and _reaches(network, None, 1)
        network.apply({1: [0], 0: [1]})
        assert not _reaches(network, 0, 1), "n1 drops what n0 sends"
        assert _reaches(network, 2, 1), "n2 is not cut off"
        assert _reaches(network, None, 1), "the harness always reaches every node"
        network.heal()
        assert _reaches(network, 0, 1)
    finally:
        listener.kill()
        listener.wait()


def test_network__destroy_leaves_no_namespace_veth_or_bridge() -> None:
    if PROBLEM is not None:
        _skip_unless_root()
    made = Network(2)
    made.create()
    made.destroy()
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True)
    spaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    assert f"xrj{made.tag}" not in links.stdout + spaces.stdout
