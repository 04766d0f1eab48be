"""jepsen-lite: the chaos harness that runs real xr clusters under faults and checks histories.

Built by the jepsen-lite issue; until then it exports nothing.
"""

__all__: list[str] = []
