"""What a worker's sandbox (`executor.private_tmp`) adds to starting it.

Each start runs `/bin/true` as `nobody` and waits for it to end, six ways, alternating round by
round in the same run:

- **plain**: `subprocess` switches to the user itself (what a worker got before the sandbox, and
  gets with `executor.private_tmp = false`);
- **xr sandbox**: `node/executor/sandbox.py` as the executor runs it: a mount namespace, the
  attempt's two directories bound on /tmp and /var/tmp, a tmpfs on /dev/shm, then the switch;
- **util-linux**: the same namespace and mounts made by the system's tools, the reference:
  `unshare --mount --propagation private` running `sh -c 'mount --bind ... && mount --bind ...
  && mount -t tmpfs ... && exec setpriv --reuid ... --regid ... --init-groups /bin/true'`;
- **xr sandbox + network** and **util-linux + network**: the same two with a network namespace
  of loopback alone (`executor.private_network`; util-linux's `unshare --net` and iproute2's
  `ip link set lo up`);
- **worker import**: for scale, what every worker does anyway before its job starts:
  `python -c "import node.executor.worker"` (the interpreter and NumPy loading; as root, since
  the user may not be able to run the node's interpreter, and the import costs the same).

Printed: the median wall time of a start per way, and the ratios of the xr sandbox to plain, to
util-linux and to the worker's import, and of the xr sandbox with a network to util-linux's with
one and to the xr sandbox without; the last line is JSON. Root only (the node starts
sandboxed workers as root).

Run: `sudo python bench/sandbox.py [--starts 40] [--rounds 3]`.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from node.executor import sandbox
from node.executor.job_user import lookup

USER = "nobody"
TRUE = "/bin/true"


def _at_least_1(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _time_starts(start: Callable[[], None], starts: int) -> list[float]:
    times = []
    for _ in range(starts):
        began = time.perf_counter()
        start()
        times.append(time.perf_counter() - began)
    return times


def _run(argv: list[str], **options: object) -> None:
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, **options)  # type: ignore[call-overload]
    except OSError as error:
        raise RuntimeError(f"{argv[0]}: {error.strerror}") from None
    if done.returncode != 0:
        said = done.stderr.decode(errors="replace").strip() or f"exit status {done.returncode}"
        raise RuntimeError(f"{argv[0]}: {said}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--starts", type=_at_least_1, default=40, help="starts per way per round")
    parser.add_argument("--rounds", type=_at_least_1, default=3)
    arguments = parser.parse_args(argv)
    if os.geteuid() != 0:
        print(
            "sandbox: must run as root (the node starts sandboxed workers as root)", file=sys.stderr
        )
        return 2
    tools = ("unshare", "setpriv", "mount", "ip")
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if missing:
        print(
            f"sandbox: the reference needs {', '.join(missing)} (util-linux, iproute2)",
            file=sys.stderr,
        )
        return 2
    user = lookup(USER)
    entry = pwd.getpwnam(USER)
    root = Path(tempfile.mkdtemp(prefix="xr-bench-sandbox-"))
    counter = iter(range(1 << 30))

    def fresh() -> Path:
        # Each start gets directories of its own, made beforehand as the executor makes them.
        directory = root / f"attempt-{next(counter)}"
        sandbox.make_directories(directory)
        return directory

    def plain() -> None:
        _run([TRUE], **user.spawn_options())

    def xr_sandbox(network: bool = False) -> None:
        _run(user.sandboxed(fresh(), [TRUE], network=network))

    def util_linux(network: bool = False) -> None:
        directory = fresh()
        script = (
            ("ip link set lo up && " if network else "")
            # /var/tmp first: the directories are under /tmp, which the second bind covers.
            + 'mount --bind "$1/var-tmp" /var/tmp && mount --bind "$1/tmp" /tmp && '
            "mount -t tmpfs -o nosuid,nodev,mode=1777 tmpfs /dev/shm && "
            f"exec setpriv --reuid {entry.pw_uid} --regid {entry.pw_gid} --init-groups {TRUE}"
        )
        namespaces = ["--mount", "--net"] if network else ["--mount"]
        _run(
            [
                "unshare",
                *namespaces,
                "--propagation",
                "private",
                "sh",
                "-c",
                script,
                "sh",
                str(directory),
            ]
        )

    environment = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}

    def worker_import() -> None:
        # As root: the job user may not be able to run this interpreter (one under /root), and
        # the import costs the same.
        _run([sys.executable, "-c", "import node.executor.worker"], env=environment)

    ways: dict[str, Callable[[], None]] = {
        "plain": plain,
        "xr sandbox": xr_sandbox,
        "util-linux": util_linux,
        "xr sandbox + network": lambda: xr_sandbox(network=True),
        "util-linux + network": lambda: util_linux(network=True),
        "worker import": worker_import,
    }
    times: dict[str, list[float]] = {name: [] for name in ways}
    try:
        for number in range(1, arguments.rounds + 1):
            for name, start in ways.items():
                starts = (
                    max(1, arguments.starts // 4) if name == "worker import" else arguments.starts
                )
                times[name] += _time_starts(start, starts)
                shutil.rmtree(root, ignore_errors=True)
                root.mkdir(exist_ok=True)
            medians = {name: statistics.median(values) * 1e3 for name, values in times.items()}
            print(
                f"round {number}/{arguments.rounds}: "
                + ", ".join(f"{name} {value:.2f} ms" for name, value in medians.items()),
                flush=True,
            )
    except RuntimeError as error:
        print(f"sandbox: a start failed: {error}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(root, ignore_errors=True)
    medians = {name: statistics.median(values) * 1e3 for name, values in times.items()}
    ratio = {
        "plain": medians["xr sandbox"] / medians["plain"],
        "util-linux": medians["xr sandbox"] / medians["util-linux"],
        "worker import": medians["xr sandbox"] / medians["worker import"],
        "network / util-linux": medians["xr sandbox + network"] / medians["util-linux + network"],
        "network / none": medians["xr sandbox + network"] / medians["xr sandbox"],
    }
    print()
    print("| way | median ms a start | starts |")
    print("| --- | ---: | ---: |")
    for name, value in medians.items():
        print(f"| {name} | {value:.2f} | {len(times[name])} |")
    print()
    print(
        f"xr sandbox / plain {ratio['plain']:.2f}x, / util-linux {ratio['util-linux']:.2f}x; "
        f"its extra {medians['xr sandbox'] - medians['plain']:.2f} ms is "
        f"{(medians['xr sandbox'] - medians['plain']) / medians['worker import']:.0%} of a "
        "worker's import"
    )
    print(
        f"with a network of its own: xr sandbox / util-linux {ratio['network / util-linux']:.2f}x; "
        f"{medians['xr sandbox + network'] - medians['xr sandbox']:.2f} ms more than without "
        f"({ratio['network / none']:.2f}x)"
    )
    print(
        json.dumps(
            {
                "benchmark": "sandbox",
                "starts": arguments.starts,
                "rounds": arguments.rounds,
                "median_ms": {name: round(value, 3) for name, value in medians.items()},
                "ratio": {name: round(value, 3) for name, value in ratio.items()},
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
