"""A request id reused for another kind of command: the exactly-once table refuses it.

A retry repeats its command with the same `(client_id, seq)` and gets the stored result. A client
that reuses a seq for a different command has a bug; answering it with the stored result of the
other command gives it a result of the wrong shape (the HTTP API failed on one with a 500, found
by tests/node/test_schemathesis.py). It is refused with `InvalidArgument` and changes nothing.
"""

from __future__ import annotations

import msgspec

from xrcore import Applied, Envelope, StateMachine, encode
from xrcore.codec import decode_snapshot
from xrcore.commands import Command, KvPut, SessionGrant
from xrcore.errors import InvalidArgument

NOW_MS = 1_700_000_000_000


def _apply(machine: StateMachine, command: Command, seq: int) -> Applied:
    envelope = Envelope(command=command, now_ms=NOW_MS, client_id="client-1", seq=seq)
    return machine.apply(encode(envelope), machine.index + 1)


def _comparable(machine: StateMachine) -> object:
    snapshot = decode_snapshot(machine.snapshot())
    return msgspec.structs.replace(snapshot, index=0)


def test_seq_reused_for_another_command_type__is_invalid_and_changes_nothing() -> None:
    machine = StateMachine()
    put = _apply(machine, KvPut(key="a", value=b"x"), seq=1)
    before = _comparable(machine)
    reused = _apply(machine, SessionGrant(ttl_ms=60_000), seq=1)
    assert reused.result.error is not None
    assert reused.result.error.code == InvalidArgument.code
    assert not reused.duplicate
    assert _comparable(machine) == before
    retried = _apply(machine, KvPut(key="a", value=b"x"), seq=1)
    assert retried.duplicate
    assert retried.result == put.result


def test_command_types_are_kept_and_dropped_with_their_results() -> None:
    machine = StateMachine()
    for seq in range(1, machine.limits.results_per_client_max + 5):
        _apply(machine, KvPut(key=f"k{seq}", value=b"x"), seq=seq)
    record = machine.clients["client-1"]
    assert record.command_types.keys() == record.results.keys()
    assert set(record.command_types.values()) == {"kv.put"}
    restored = StateMachine.restore(machine.snapshot())
    assert restored.clients["client-1"].command_types == record.command_types
