"""Replication of the xrcore state machine across regions with pysyncobj (see the raftstore issue).

This package holds the pysyncobj glue: one replicated entry point, snapshots, the asyncio bridge,
the read barrier and the simulated network for tests. It is built by the raftstore issue; until
then it exports nothing.
"""

__all__: list[str] = []
