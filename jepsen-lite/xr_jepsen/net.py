"""The test network: one network namespace per node, joined by veth pairs to a bridge, and
partitions as nftables rules inside the namespaces (real packet drops).

Layout of one run (its `tag`, four hex digits, makes every name unique, so concurrent runs on
one machine do not collide):

    root namespace: bridge xrj<tag>b, address 10.77.<subnet>.254 (the harness, its clients and
                    the protected resources live here)
    namespace xrj<tag>-n<i>: veth xrj<tag>n<i>p, address 10.77.<subnet>.<i + 1>, and lo

A partition is a *grudge*: for each node, the nodes whose packets it drops on input. Every shape
(halves, one node isolated, a ring of majorities, a bridge) is a grudge, and healing removes every
rule. `grudge_rules` is pure, so the rule text for each shape is unit-tested without root.

Each run writes a small state file under `STATE_DIR` naming its owner pid and what it made;
`clean_leftovers` removes what runs whose owner has died left behind (a crashed or killed run),
never another live run's network.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import secrets
import shutil
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "NFT_TABLE",
    "STATE_DIR",
    "Network",
    "NetworkUnavailable",
    "clean_leftovers",
    "grudge_rules",
    "heal_rules",
    "namespaces_available",
]

NFT_TABLE = "xr_jepsen"
STATE_DIR = Path("/run/xr-jepsen")
SUBNET_PREFIX = "10.77"
BRIDGE_HOST = 254
# Every ip and nft command is local and quick; one that takes longer than this is wedged.
COMMAND_TIMEOUT_S = 10.0


class NetworkUnavailable(RuntimeError):
    """Namespaces, veths or nftables cannot be used here (not root, a missing tool)."""


def heal_rules() -> str:
    """nftables text that removes this harness's table, whether or not it exists (declaring a
    table that exists is a no-op, so the delete never fails)."""
    return f"table inet {NFT_TABLE} {{}}\ndelete table inet {NFT_TABLE}\n"


def grudge_rules(dropped_sources: Sequence[str]) -> str:
    """nftables text, applied atomically inside one node's namespace, that replaces any earlier
    partition with one dropping every packet from `dropped_sources` (IPv4 addresses). No sources:
    the same as `heal_rules`."""
    if not dropped_sources:
        return heal_rules()
    addresses = ", ".join(sorted(dropped_sources, key=ipaddress.IPv4Address))
    return (
        heal_rules()
        + f"table inet {NFT_TABLE} {{\n"
        + "  chain input {\n"
        + "    type filter hook input priority filter; policy accept;\n"
        + f"    ip saddr {{ {addresses} }} drop\n"
        + "  }\n"
        + "}\n"
    )


def _run(command: Sequence[str], *, stdin: str | None = None, check: bool = True) -> str:
    completed = subprocess.run(
        list(command),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        check=False,
    )
    if check and completed.returncode != 0:
        raise NetworkUnavailable(
            f"{' '.join(command)} failed ({completed.returncode}): {completed.stderr.strip()}"
        )
    return completed.stdout


def namespaces_available() -> str | None:
    """None when this machine can run namespaced nodes with nftables partitions, or why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            return f"the {tool!r} command is missing (make jepsen-deps installs nftables)"
    probe = f"xrj{secrets.token_hex(2)}-probe"
    try:
        _run(["ip", "netns", "add", probe])
        _run(["ip", "netns", "exec", probe, "nft", "-f", "-"], stdin=grudge_rules(["10.0.0.1"]))
    except (NetworkUnavailable, OSError, subprocess.SubprocessError) as error:
        return f"namespaces or nftables do not work here: {error}"
    finally:
        _run(["ip", "netns", "delete", probe], check=False)
    return None


@dataclass
class Network:
    """The namespaces, veths and bridge of one run, for `size` nodes."""

    size: int
    tag: str = field(default_factory=lambda: secrets.token_hex(2))
    subnet: int = 0
    made: bool = False

    @property
    def bridge(self) -> str:
        return f"xrj{self.tag}b"

    def namespace(self, index: int) -> str:
        return f"xrj{self.tag}-n{index}"

    def _veth(self, index: int) -> str:
        return f"xrj{self.tag}n{index}"

    def address(self, index: int) -> str:
        return f"{SUBNET_PREFIX}.{self.subnet}.{index + 1}"

    @property
    def host_address(self) -> str:
        """The bridge's address in the root namespace: where nodes reach the harness."""
        return f"{SUBNET_PREFIX}.{self.subnet}.{BRIDGE_HOST}"

    def exec_prefix(self, index: int) -> list[str]:
        return ["ip", "netns", "exec", self.namespace(index)]

    def create(self) -> None:
        """Makes the bridge and every namespace; on any failure removes what it made."""
        self.subnet = _free_subnet()
        self._write_state()
        self.made = True
        try:
            _run(["ip", "link", "add", self.bridge, "type", "bridge"])
            _run(["ip", "addr", "add", f"{self.host_address}/24", "dev", self.bridge])
            _run(["ip", "link", "set", self.bridge, "up"])
            for index in range(self.size):
                self._add_node(index)
        except BaseException:
            self.destroy()
            raise

    def _add_node(self, index: int) -> None:
        namespace, veth, peer = self.namespace(index), self._veth(index), f"{self._veth(index)}p"
        _run(["ip", "netns", "add", namespace])
        _run(["ip", "link", "add", veth, "type", "veth", "peer", "name", peer])
        _run(["ip", "link", "set", veth, "master", self.bridge])
        _run(["ip", "link", "set", veth, "up"])
        _run(["ip", "link", "set", peer, "netns", namespace])
        inside = self.exec_prefix(index)
        _run([*inside, "ip", "addr", "add", f"{self.address(index)}/24", "dev", peer])
        _run([*inside, "ip", "link", "set", peer, "up"])
        _run([*inside, "ip", "link", "set", "lo", "up"])

    def apply(self, grudge: Mapping[int, Sequence[int]]) -> None:
        """Replaces the partition: node i drops packets from every node in grudge[i]; nodes
        not in `grudge` drop nothing."""
        for index in range(self.size):
            sources = [self.address(other) for other in grudge.get(index, ())]
            self._nft(index, grudge_rules(sources))

    def heal(self) -> None:
        for index in range(self.size):
            self._nft(index, heal_rules())

    def _nft(self, index: int, rules: str) -> None:
        _run([*self.exec_prefix(index), "nft", "-f", "-"], stdin=rules)

    def destroy(self) -> None:
        """Removes every namespace, veth and the bridge (what is already gone is skipped)."""
        if not self.made:
            return
        _destroy(self.tag, self.size)
        self.made = False
        with contextlib.suppress(OSError):
            (STATE_DIR / f"{self.tag}.json").unlink()

    def _write_state(self) -> None:
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        state = {"pid": os.getpid(), "tag": self.tag, "size": self.size, "subnet": self.subnet}
        (STATE_DIR / f"{self.tag}.json").write_text(json.dumps(state))


def _destroy(tag: str, size: int) -> None:
    # A namespace lives on while a process is in it: kill what a crashed run left running there
    # (the run's own nodes are already stopped by then). Deleting a namespace deletes the veth
    # end inside it, and with it its peer on the bridge.
    for index in range(size):
        namespace = f"xrj{tag}-n{index}"
        for pid in _run(["ip", "netns", "pids", namespace], check=False).split():
            with contextlib.suppress(ValueError, OSError):
                os.kill(int(pid), signal.SIGKILL)
        _run(["ip", "netns", "delete", namespace], check=False)
        _run(["ip", "link", "delete", f"xrj{tag}n{index}"], check=False)
    _run(["ip", "link", "delete", f"xrj{tag}b"], check=False)


def _used_subnets() -> set[int]:
    used = set()
    for line in _run(["ip", "-o", "-4", "addr", "show"], check=False).splitlines():
        for word in line.split():
            if word.startswith(f"{SUBNET_PREFIX}."):
                with contextlib.suppress(ValueError, IndexError):
                    used.add(int(word.split(".")[2]))
    for state_file in STATE_DIR.glob("*.json") if STATE_DIR.exists() else []:
        with contextlib.suppress(OSError, ValueError, KeyError):
            used.add(int(json.loads(state_file.read_text())["subnet"]))
    return used


def _free_subnet() -> int:
    used = _used_subnets()
    # Not the seeded random: the subnet does not change what a run does, only where.
    candidates = [subnet for subnet in range(1, 250) if subnet not in used]
    if not candidates:
        raise NetworkUnavailable(f"every {SUBNET_PREFIX}.x.0/24 subnet is in use")
    return candidates[secrets.randbelow(len(candidates))]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_leftovers() -> list[str]:
    """Removes the networks of runs whose owner process has died; returns their tags."""
    cleaned: list[str] = []
    if not STATE_DIR.exists():
        return cleaned
    for state_file in sorted(STATE_DIR.glob("*.json")):
        try:
            state = json.loads(state_file.read_text())
            pid, tag, size = int(state["pid"]), str(state["tag"]), int(state["size"])
        except (OSError, ValueError, KeyError):
            continue
        if _alive(pid):
            continue
        _destroy(tag, size)
        with contextlib.suppress(OSError):
            state_file.unlink()
        cleaned.append(tag)
    return cleaned
