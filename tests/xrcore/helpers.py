"""A tiny driver that applies commands to a StateMachine as encoded log entries."""

from __future__ import annotations

from typing import Any

from xrcore import Applied, Envelope, StateMachine, encode
from xrcore.commands import Command
from xrcore.limits import DEFAULT_LIMITS, Limits

START_MS = 1_700_000_000_000


class Driver:
    """Applies commands in log order with a simulated proposer clock."""

    def __init__(self, limits: Limits = DEFAULT_LIMITS) -> None:
        self.machine = StateMachine(limits)
        self.index = 0
        self.now_ms = START_MS
        self.log: list[bytes] = []

    def apply(
        self,
        command: Command,
        *,
        advance_ms: int = 0,
        client_id: str | None = None,
        seq: int | None = None,
    ) -> Applied:
        self.now_ms += advance_ms
        entry = encode(Envelope(command=command, now_ms=self.now_ms, client_id=client_id, seq=seq))
        self.log.append(entry)
        self.index += 1
        return self.machine.apply(entry, self.index)

    def ok(self, command: Command, **kwargs: Any) -> dict[str, Any]:
        """Applies a command that must succeed and returns its value."""
        return self.apply(command, **kwargs).result.unwrap()

    def error(self, command: Command, **kwargs: Any) -> str:
        """Applies a command that must fail and returns its error code."""
        result = self.apply(command, **kwargs).result
        assert result.error is not None, f"expected an error, got {result.value}"
        return result.error.code
