"""The region daemon (imperative shell): HTTP API, executor, scheduler loop, metrics and the CLI.

It owns every clock, socket, thread, subprocess and file; the rules live in `xrcore`.
"""

__all__: list[str] = []
