"""jepsen-lite: the chaos harness that runs real xr clusters under faults and checks histories.

One role per module:
    db.py         the cluster: real `xr node run` processes, in network namespaces when possible
    net.py        namespaces, veths, the bridge and nftables partitions
    nemesis.py    faults with their heals, on a schedule drawn from the seed
    generator.py  each worker's next operation and pause, from the seed
    workloads/    register, locks, queue, set: clients on `xrcore.client`
    resource.py   the protected resources that check fencing tokens
    history.py    operations as JSON lines;  checkers/  the verdicts
    runner.py     one run, end to end;  report.py  its HTML page;  cli.py  `xr-jepsen`

`run` and `RunConfig` are the entry points for code (imported on first use, so that a job
running `xr_jepsen.workloads.queue_job` in a node's worker does not load the harness).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from xr_jepsen.runner import RunConfig, run

__all__ = ["RunConfig", "run"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from xr_jepsen import runner

        return getattr(runner, name)
    raise AttributeError(f"module 'xr_jepsen' has no attribute {name!r}")
