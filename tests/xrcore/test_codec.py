"""Proves that the wire format of log entries and snapshots is stable, lossless and closed.

Stable: a fixed set of envelopes, one or more per command type, encodes to the bytes stored in
`tests/xrcore/fixtures/golden_envelopes.json`, and those bytes decode back to the same envelopes,
so any change to tags, field names, field order or defaults fails here first. To change the format
deliberately, regenerate the fixture and review its diff like any other change to the format:

    XR_REGENERATE_GOLDEN=1 .venv/bin/pytest tests/xrcore/test_codec.py -k golden

Lossless: every command type round-trips through `encode` and `decode` to an equal envelope, and so
do snapshots, byte for byte.

Closed: malformed input of every kind (wrong types, unknown tags, fields and versions, missing and
oversize fields, non-finite floats, random bytes, mutated valid entries) is rejected with one
specific typed `XrError`, never with any other exception; commands built directly in Python check
the same rules; and the state machine turns an undecodable log entry into an error result while its
applied index still advances.
"""

from __future__ import annotations

import json
import math
import os
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack  # type: ignore[import-untyped]
import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.xrcore.helpers import Driver
from xrcore import StateMachine, limits
from xrcore.codec import (
    ENVELOPE_VERSION,
    SEQ_MAX,
    SNAPSHOT_MAGIC,
    Envelope,
    decode,
    decode_snapshot,
    encode,
    encode_snapshot,
    newer_version,
)
from xrcore.commands import (
    COMMAND_TYPES,
    Command,
    Gpu,
    JobCancel,
    JobSpec,
    JobSubmit,
    KvDelete,
    KvPut,
    LockAcquire,
    LockLeave,
    LockRelease,
    LockValidate,
    Placement,
    Preemption,
    RegionHeartbeat,
    RegionRegister,
    SchedulePass,
    SessionGrant,
    SessionKeepAlive,
    SessionRevoke,
    TaskAssign,
    TaskCheckpoint,
    TaskClaim,
    TaskComplete,
    TaskFail,
    TaskHeartbeat,
    TaskUnassign,
    TaskYield,
    TenantSet,
    Tick,
    Waiting,
    tag_of,
)
from xrcore.errors import CodecError, InvalidArgument, PayloadTooLarge, UnsupportedVersion, XrError
from xrcore.model import Snapshot

GOLDEN_PATH = Path(__file__).parent / "fixtures" / "golden_envelopes.json"
# The bytes of the examples whose encoding changed when fields at their defaults were left out
# (JobSpec and Preemption; TenantSet in session 30): written by earlier versions, still in
# logs and snapshots.
GOLDEN_WITH_DEFAULTS_PATH = (
    Path(__file__).parent / "fixtures" / "golden_envelopes_with_defaults.json"
)
REGENERATE_VARIABLE = "XR_REGENERATE_GOLDEN"
REGENERATE_COMMAND = (
    f"{REGENERATE_VARIABLE}=1 .venv/bin/pytest tests/xrcore/test_codec.py -k golden"
)

NOW_MS = 1_700_000_000_000
CLIENT_ID = "client-7"

# Identifiers that exist in `_base_machine()`, so that examples (and mutations of them) reach the
# handlers' real code paths and not only their "not found" answers.
SESSION_ID = "s1"
REGION = "eu-west"
JOB_ID = "job-3"
ATTEMPT_TOKEN = 1
LOCK_NAME = "locks/leader"
LOCK_TOKEN = 2


def _pack(value: Any) -> bytes:
    """Encodes with the plain msgpack library, which writes what xr's own encoder never would."""
    data: bytes = msgpack.packb(value)
    return data


def _unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, strict_map_key=False)


FULL_JOB_SPEC = JobSpec(
    name="train-resnet",
    tenant="research",
    entrypoint="xr_jobs.train:main",
    args='{"epochs": 3, "lr": 0.1}',
    gpus=2,
    gpu_memory_mb=40_000,
    gpu_model="H100",
    array_size=4,
    priority=10,
    regions_allow=("eu-west", "us-east"),
    regions_deny=("ap-south",),
    regions_prefer=("eu-west",),
    input_size_mb=512,
    input_region="eu-west",
    max_attempts=5,
    checkpoint_interval_s=600,
    wall_time_limit_s=86_400,
)


def _envelope(command: Command, seq: int | None = None, *, now_ms: int = NOW_MS) -> Envelope:
    client_id = None if seq is None else CLIENT_ID
    return Envelope(command=command, now_ms=now_ms, client_id=client_id, seq=seq)


# The examples are the golden fixtures and the round-trip cases. Never edit one in place: the
# stored bytes would stop matching. Add a new name instead, and regenerate.
EXAMPLES: dict[str, Envelope] = {
    "tick": _envelope(Tick()),
    "tick.at_zero": _envelope(Tick(), now_ms=0),
    "kv.put": _envelope(
        KvPut(
            key="config/alpha",
            value=b"\x00\x01value\xff",
            expected_mod_revision=4,
            session_id=SESSION_ID,
        ),
        seq=1,
    ),
    "kv.put.minimal": _envelope(KvPut(key="k", value=b"")),
    "kv.delete": _envelope(KvDelete(key="config/alpha", expected_mod_revision=0), seq=2),
    "session.grant": _envelope(SessionGrant(ttl_ms=10_000, owner="worker-1"), seq=3),
    "session.keepalive": _envelope(SessionKeepAlive(session_id=SESSION_ID)),
    "session.revoke": _envelope(SessionRevoke(session_id=SESSION_ID), seq=4),
    "lock.acquire": _envelope(
        LockAcquire(name="locks/scheduler", session_id=SESSION_ID, wait=True), seq=5
    ),
    "lock.release": _envelope(LockRelease(name=LOCK_NAME, session_id=SESSION_ID), seq=6),
    "lock.leave": _envelope(LockLeave(name=LOCK_NAME, session_id=SESSION_ID)),
    "lock.validate": _envelope(LockValidate(name=LOCK_NAME, token=LOCK_TOKEN)),
    "region.register": _envelope(
        RegionRegister(
            name="us-east",
            http_address="http://10.0.0.2:8080",
            raft_address="10.0.0.2:4321",
            provider="aws",
            price_per_gpu_hour=2.5,
            carbon_g_per_kwh=120.0,
            labels={"zone": "us-east-1a", "tier": "spot"},
            cpu_slots=8,
        ),
        seq=7,
    ),
    "region.heartbeat": _envelope(
        RegionHeartbeat(
            name=REGION,
            gpus=(
                Gpu(model="H100", memory_mb=81_920, free_mb=40_960, compute_capability="9.0"),
                Gpu(model="A100", memory_mb=40_960, free_mb=0),
            ),
            rtt_ms={"us-east": 72.5, "ap-south": 140.25},
        )
    ),
    "job.submit": _envelope(JobSubmit(spec=FULL_JOB_SPEC), seq=8),
    "job.submit.workload": _envelope(JobSubmit(spec=JobSpec(name="bench", workload="matmul"))),
    "job.submit.weights": _envelope(
        JobSubmit(spec=JobSpec(name="green", workload="matmul", cost_weight=0.0, carbon_weight=2.5))
    ),
    "job.cancel": _envelope(JobCancel(job_id=JOB_ID, reason="superseded"), seq=9),
    "task.assign": _envelope(TaskAssign(job_id=JOB_ID, task_index=1, region=REGION)),
    "task.unassign": _envelope(TaskUnassign(job_id=JOB_ID, task_index=1)),
    "schedule.pass": _envelope(
        SchedulePass(
            revision=41,
            assigns=(Placement(job_id=JOB_ID, task_index=0, region="eu", reason="fastest"),),
            unassigns=(Waiting(job_id=JOB_ID, task_index=1, reason="region died"),),
            preempts=(
                Preemption(job_id=JOB_ID, task_index=2, token=9, reason="priority"),
                Preemption(job_id=JOB_ID, task_index=4, token=8, reason="late", force=True),
            ),
            waiting=(Waiting(job_id=JOB_ID, task_index=3, reason="no room"),),
        )
    ),
    "schedule.pass.move_up": _envelope(
        SchedulePass(
            revision=42,
            preempts=(
                Preemption(
                    job_id=JOB_ID, task_index=5, token=10, reason="faster", moving_to="us-west"
                ),
            ),
        )
    ),
    "task.yield": _envelope(TaskYield(job_id=JOB_ID, task_index=2, token=9)),
    "tenant.set": _envelope(
        TenantSet(name="acme", weight=2.0, gpus_max=16, cost_weight=0.5, carbon_weight=2.0)
    ),
    "tenant.set.quotas": _envelope(
        TenantSet(name="acme", keys_max=1_000, sessions_max=10, jobs_max=100, clients_max=50)
    ),
    "task.claim": _envelope(
        TaskClaim(
            job_id=JOB_ID,
            task_index=1,
            region=REGION,
            executor_id="executor-1",
            lease_ttl_ms=30_000,
        ),
        seq=10,
    ),
    "task.heartbeat": _envelope(
        TaskHeartbeat(
            job_id=JOB_ID,
            task_index=0,
            token=ATTEMPT_TOKEN,
            done=40,
            total=100,
            metrics={"loss": 0.25, "throughput": 1_500.0},
        ),
        seq=11,
    ),
    "task.checkpoint": _envelope(
        TaskCheckpoint(
            job_id=JOB_ID,
            task_index=0,
            token=ATTEMPT_TOKEN,
            step=1_200,
            uri="s3://checkpoints/job-3/0/1200.pt",
            checksum="sha256:9f86d081884c7d659a2feaa0c55ad015",
            size_bytes=1 << 30,
        ),
        seq=12,
    ),
    "task.complete": _envelope(
        TaskComplete(job_id=JOB_ID, task_index=0, token=ATTEMPT_TOKEN, result='{"accuracy": 0.9}'),
        seq=13,
    ),
    "task.fail": _envelope(
        TaskFail(
            job_id=JOB_ID,
            task_index=0,
            token=ATTEMPT_TOKEN,
            error="CUDA out of memory",
            retryable=False,
        ),
        seq=14,
    ),
}
EXAMPLE_NAMES = sorted(EXAMPLES)
EXAMPLE_BYTES = [encode(EXAMPLES[name]) for name in EXAMPLE_NAMES]


def _raises_exactly(expected: type[XrError], action: Callable[[], object]) -> XrError:
    """Runs `action` and checks that it raised `expected` itself, not a parent or a subclass:
    clients match on codes, so `CodecError` where `UnsupportedVersion` was due is a bug."""
    with pytest.raises(XrError) as caught:
        action()
    error = caught.value
    assert type(error) is expected, f"expected {expected.__name__}, got {error!r}"
    assert error.code == expected.code
    return error


def _decode_or_none(data: bytes) -> Envelope | None:
    """Decodes, letting through only an `Envelope` or an `XrError`; any other exception fails."""
    try:
        envelope = decode(data)
    except XrError:
        return None
    assert type(envelope) is Envelope
    return envelope


# Golden fixtures.


def _write_golden() -> None:
    stored = {name: encode(EXAMPLES[name]).hex() for name in EXAMPLE_NAMES}
    GOLDEN_PATH.parent.mkdir(parents=True, exist_ok=True)
    GOLDEN_PATH.write_text(json.dumps(stored, indent=2, sort_keys=True) + "\n")


@pytest.fixture(scope="module")
def golden_hex() -> dict[str, str]:
    if os.environ.get(REGENERATE_VARIABLE) == "1":
        _write_golden()
    stored: dict[str, str] = json.loads(GOLDEN_PATH.read_text())
    return stored


def _stored_bytes(golden_hex: dict[str, str], name: str) -> bytes:
    if name not in golden_hex:
        pytest.fail(f"no golden bytes stored for {name!r}; regenerate with: {REGENERATE_COMMAND}")
    return bytes.fromhex(golden_hex[name])


def test_golden__fixture_holds_exactly_the_examples(golden_hex: dict[str, str]) -> None:
    assert sorted(golden_hex) == EXAMPLE_NAMES, f"regenerate with: {REGENERATE_COMMAND}"


def test_golden__examples_cover_the_required_commands() -> None:
    covered = {type(envelope.command) for envelope in EXAMPLES.values()}
    required = {Tick, KvPut, LockAcquire, SessionGrant, JobSubmit, TaskCheckpoint, RegionHeartbeat}
    assert required <= covered


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_golden__encode_gives_the_stored_bytes(golden_hex: dict[str, str], name: str) -> None:
    stored = _stored_bytes(golden_hex, name)
    encoded = encode(EXAMPLES[name])
    assert encoded == stored, (
        f"the wire format of {name!r} changed:\n"
        f"  stored  {stored.hex()}\n  encoded {encoded.hex()}\n"
        f"if the change is deliberate, regenerate with: {REGENERATE_COMMAND}"
    )


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_golden__stored_bytes_decode_to_the_example(golden_hex: dict[str, str], name: str) -> None:
    assert decode(_stored_bytes(golden_hex, name)) == EXAMPLES[name]


@pytest.mark.parametrize("name", sorted(json.loads(GOLDEN_WITH_DEFAULTS_PATH.read_text())))
def test_golden__bytes_written_with_every_default_still_decode_to_the_example(name: str) -> None:
    stored = json.loads(GOLDEN_WITH_DEFAULTS_PATH.read_text())[name]
    assert decode(bytes.fromhex(stored)) == EXAMPLES[name]


def test_fields_left_at_their_defaults_are_not_on_the_wire() -> None:
    """A node of an earlier version refuses fields it does not know; it reads a job spec that
    leaves the price and carbon weights unset, and a preemption without `moving_to`."""
    spec = _unpack(encode(EXAMPLES["job.submit.workload"]))["command"]["spec"]
    assert spec == {"name": "bench", "workload": "matmul"}
    weighted = _unpack(encode(EXAMPLES["job.submit.weights"]))["command"]["spec"]
    assert (weighted["cost_weight"], weighted["carbon_weight"]) == (0.0, 2.5)
    preempts = _unpack(encode(EXAMPLES["schedule.pass"]))["command"]["preempts"]
    assert all("moving_to" not in item for item in preempts)
    # Nor a tenant.set that sets no table quota (session 30).
    tenant = _unpack(encode(EXAMPLES["tenant.set"]))["command"]
    assert sorted(tenant) == ["carbon_weight", "cost_weight", "gpus_max", "name", "type", "weight"]
    assert preempts[0] == {"job_id": JOB_ID, "task_index": 2, "token": 9, "reason": "priority"}
    moving = _unpack(encode(EXAMPLES["schedule.pass.move_up"]))["command"]["preempts"]
    assert all("moving_to" in item for item in moving)


def test_golden__envelope_is_the_documented_map() -> None:
    # The stored hex is opaque, so one entry is also checked against the layout the codec's
    # docstring promises, read back with a plain msgpack reader.
    raw = _unpack(encode(EXAMPLES["kv.put"]))
    assert raw == {
        "v": 1,
        "now_ms": NOW_MS,
        "command": {
            "type": "kv.put",
            "key": "config/alpha",
            "value": b"\x00\x01value\xff",
            "expected_mod_revision": 4,
            "session_id": SESSION_ID,
        },
        "client_id": CLIENT_ID,
        "seq": 1,
    }


# Round trip.


def test_round_trip__examples_cover_every_command_type() -> None:
    covered = {type(envelope.command) for envelope in EXAMPLES.values()}
    missing = sorted(tag_of(command_type) for command_type in set(COMMAND_TYPES) - covered)
    assert not missing, f"add an example for: {missing}"


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_round_trip__every_example_decodes_to_an_equal_envelope(name: str) -> None:
    envelope = EXAMPLES[name]
    decoded = decode(encode(envelope))
    assert decoded == envelope
    assert type(decoded.command) is type(envelope.command)
    assert encode(decoded) == encode(envelope)


def test_round_trip__bytearray_and_memoryview_decode_like_bytes() -> None:
    data = encode(EXAMPLES["job.submit"])
    # The type hint says bytes, but the log may hand over any buffer.
    as_bytearray: Any = bytearray(data)
    as_memoryview: Any = memoryview(data)
    assert decode(as_bytearray) == decode(as_memoryview) == EXAMPLES["job.submit"]


# Typed errors for malformed input.


def _raw(name: str) -> dict[str, Any]:
    """A valid example as plain msgpack data, to break one thing in."""
    raw: dict[str, Any] = _unpack(encode(EXAMPLES[name]))
    return raw


def _with(name: str, **changes: Any) -> bytes:
    return _pack({**_raw(name), **changes})


def _without(name: str, field: str) -> bytes:
    raw = _raw(name)
    del raw[field]
    return _pack(raw)


def _with_command(name: str, **changes: Any) -> bytes:
    raw = _raw(name)
    raw["command"] = {**raw["command"], **changes}
    return _pack(raw)


def _without_command_field(name: str, field: str) -> bytes:
    raw = _raw(name)
    del raw["command"][field]
    return _pack(raw)


def _with_spec(**changes: Any) -> bytes:
    raw = _raw("job.submit")
    raw["command"]["spec"] = {**raw["command"]["spec"], **changes}
    return _pack(raw)


def _with_gpu(**changes: Any) -> bytes:
    raw = _raw("region.heartbeat")
    raw["command"]["gpus"][0] = {**raw["command"]["gpus"][0], **changes}
    return _pack(raw)


MALFORMED: dict[str, tuple[bytes, type[XrError]]] = {
    # Not an envelope at all.
    "empty": (b"", CodecError),
    "invalid msgpack opcode": (b"\xc1", CodecError),
    "truncated": (encode(EXAMPLES["job.submit"])[:-1], CodecError),
    "trailing bytes": (encode(EXAMPLES["tick"]) + b"\x00", CodecError),
    "top level is a list": (_pack([1, NOW_MS, {"type": "tick"}]), CodecError),
    "top level is nil": (_pack(None), CodecError),
    # Versions.
    "version 2": (_with("tick", v=2), UnsupportedVersion),
    "version 0": (_with("tick", v=0), UnsupportedVersion),
    "version 2 with an unknown tag": (
        _with("tick", v=2, command={"type": "tick.v2"}),
        UnsupportedVersion,
    ),
    "version 2 with an unknown field": (_with("tick", v=2, deadline_ms=5), UnsupportedVersion),
    "version is missing": (_without("tick", "v"), CodecError),
    # Tags.
    "unknown tag": (_with_command("tick", type="kv.compact"), CodecError),
    "tag of an internal base class": (_with_command("task.fail", type="_TaskUpdate"), CodecError),
    "tag is not a string": (_with_command("tick", type=1), CodecError),
    "tag is missing": (_with("tick", command={}), CodecError),
    "command is not a map": (_with("tick", command="tick"), CodecError),
    # Unknown fields, at every level.
    "unknown envelope field": (_with("tick", trace_id="abc"), CodecError),
    "unknown command field": (_with_command("kv.put", lease_id=1), CodecError),
    "unknown job spec field": (_with_spec(gpu_count=1), CodecError),
    "unknown gpu field": (_with_gpu(temperature_c=60), CodecError),
    # Missing fields.
    "now_ms is missing": (_without("tick", "now_ms"), CodecError),
    "command is missing": (_without("tick", "command"), CodecError),
    "kv.put without value": (_without_command_field("kv.put", "value"), CodecError),
    "task.checkpoint without uri": (_without_command_field("task.checkpoint", "uri"), CodecError),
    "job spec without name": (
        _with("job.submit", command={"type": "job.submit", "spec": {}}),
        CodecError,
    ),
    # Wrong types.
    "now_ms is a string": (_with("tick", now_ms=str(NOW_MS)), CodecError),
    "now_ms is a float": (_with("tick", now_ms=float(NOW_MS)), CodecError),
    "now_ms is nil": (_with("tick", now_ms=None), CodecError),
    "key is bytes": (_with_command("kv.put", key=b"config/alpha"), CodecError),
    "value is a string": (_with_command("kv.put", value="text"), CodecError),
    "gpus is a map": (_with_command("region.heartbeat", gpus={"0": {}}), CodecError),
    "labels value is an int": (_with_command("region.register", labels={"zone": 1}), CodecError),
    "metrics value is a string": (
        _with_command("task.heartbeat", metrics={"loss": "low"}),
        CodecError,
    ),
    "spec is a string": (_with_command("job.submit", spec="train"), CodecError),
    "regions_allow is a string": (_with_spec(regions_allow="eu-west"), CodecError),
    "client_id is an int": (_with("kv.put", client_id=7), CodecError),
    "now_ms is an extension type": (_with("tick", now_ms=msgpack.ExtType(1, b"\xff")), CodecError),
    # Bool where an int is expected, and the reverse: msgpack tells them apart, and so must xr.
    "now_ms is a bool": (_with("tick", now_ms=True), CodecError),
    "seq is a bool": (_with("kv.put", seq=True), CodecError),
    "task_index is a bool": (_with_command("task.assign", task_index=False), CodecError),
    "array_size is a bool": (_with_spec(array_size=True), CodecError),
    "wait is an int": (_with_command("lock.acquire", wait=1), CodecError),
    "retryable is nil": (_with_command("task.fail", retryable=None), CodecError),
    # Oversize fields and entries.
    "key longer than KEY_BYTES_MAX": (
        _with_command("kv.put", key="k" * (limits.KEY_BYTES_MAX + 1)),
        PayloadTooLarge,
    ),
    "multibyte key longer than KEY_BYTES_MAX in bytes": (
        _with_command("kv.put", key="é" * (limits.KEY_BYTES_MAX // 2 + 1)),
        PayloadTooLarge,
    ),
    "value longer than VALUE_BYTES_MAX": (
        _with_command("kv.put", value=b"v" * (limits.VALUE_BYTES_MAX + 1)),
        PayloadTooLarge,
    ),
    "job args longer than JOB_ARGS_BYTES_MAX": (
        _with_spec(args='{"a": "' + "x" * limits.JOB_ARGS_BYTES_MAX + '"}'),
        PayloadTooLarge,
    ),
    "entry longer than ENVELOPE_BYTES_MAX": (
        _with_command("kv.put", value=b"v" * limits.ENVELOPE_BYTES_MAX),
        PayloadTooLarge,
    ),
    # Non-finite floats.
    "metric is NaN": (_with_command("task.heartbeat", metrics={"loss": math.nan}), InvalidArgument),
    "rtt is infinite": (
        _with_command("region.heartbeat", rtt_ms={"us-east": math.inf}),
        InvalidArgument,
    ),
    "price is minus infinity": (
        _with_command("region.register", price_per_gpu_hour=-math.inf),
        InvalidArgument,
    ),
    # Request ids.
    "client_id without seq": (_with("kv.put", seq=None), InvalidArgument),
    "seq without client_id": (_with("kv.put", client_id=None), InvalidArgument),
    "seq is zero": (_with("kv.put", seq=0), InvalidArgument),
    "seq is beyond SEQ_MAX": (_with("kv.put", seq=SEQ_MAX + 1), InvalidArgument),
    "client_id is not a name": (_with("kv.put", client_id="client 7"), InvalidArgument),
    # Values that break a command's rules.
    "now_ms is negative": (_with("tick", now_ms=-1), InvalidArgument),
    "key is empty": (_with_command("kv.put", key=""), InvalidArgument),
    "session ttl below the minimum": (
        _with_command("session.grant", ttl_ms=limits.SESSION_TTL_MIN_MS - 1),
        InvalidArgument,
    ),
    "token is zero": (_with_command("lock.validate", token=0), InvalidArgument),
    "free memory above total": (_with_gpu(free_mb=1 << 20), InvalidArgument),
    "job spec with entrypoint and workload": (_with_spec(workload="matmul"), InvalidArgument),
    "job spec with array_size 0": (_with_spec(array_size=0), InvalidArgument),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_decode__malformed_entry__raises_its_specific_typed_error(case: str) -> None:
    data, expected = MALFORMED[case]
    _raises_exactly(expected, lambda: decode(data))


def test_decode__not_bytes__raises_codec_error() -> None:
    not_bytes: Any = "tick"
    _raises_exactly(CodecError, lambda: decode(not_bytes))


def test_decode__future_version_with_a_command_breaking_version_1_rules__is_unsupported() -> None:
    # A version 2 entry must be reported as UnsupportedVersion whatever its command holds: version
    # 1's field rules mean nothing to it. Fails today (bug): `decode` validates the command before
    # it looks at the version, so the entry below is reported as PayloadTooLarge.
    data = _with_command("kv.put", key="k" * (limits.KEY_BYTES_MAX + 1))
    future = _pack({**_unpack(data), "v": ENVELOPE_VERSION + 1})
    _raises_exactly(UnsupportedVersion, lambda: decode(future))


@pytest.mark.parametrize(
    ("version", "newer"),
    [
        (ENVELOPE_VERSION + 1, ENVELOPE_VERSION + 1),
        (1 << 40, 1 << 40),
        (ENVELOPE_VERSION, None),
        (0, None),
        (-2, None),
        (True, None),
        ("2", None),
        (2.0, None),
        (None, None),
    ],
)
def test_newer_version__is_only_an_integer_version_above_this_releases(
    version: Any, newer: int | None
) -> None:
    """A replica stops at an entry of a newer release (`raftstore.replica`); a malformed one, an
    older or odd version included, it skips as every member does."""
    entry = _pack({**_unpack(_with_command("tick")), "v": version})
    assert newer_version(entry) == newer


@pytest.mark.parametrize("data", [b"", b"\xc1", b"\x92\x01\x02", b"\x81\xa1v\x02"[:-1]])
def test_newer_version__of_bytes_that_are_no_envelope__is_none(data: bytes) -> None:
    assert newer_version(data) is None


def test_encode__entry_longer_than_envelope_bytes_max__raises_payload_too_large() -> None:
    # Every field is within its own bound, but together they exceed the entry bound.
    gpu = Gpu(model="m" * limits.LABEL_VALUE_BYTES_MAX, memory_mb=1, free_mb=1)
    command = RegionHeartbeat(name=REGION, gpus=(gpu,) * limits.GPUS_PER_REGION_MAX)
    _raises_exactly(PayloadTooLarge, lambda: encode(_envelope(command)))


# Construction-time validation: a command that exists is well-formed, however it was built.


def _spec(**changes: Any) -> JobSpec:
    fields: dict[str, Any] = {"name": "train", "workload": "matmul", **changes}
    return JobSpec(**fields)


ILL_FORMED: dict[str, tuple[Callable[[], object], type[InvalidArgument]]] = {
    "key is empty": (lambda: KvPut(key="", value=b""), InvalidArgument),
    "key longer than KEY_BYTES_MAX": (
        lambda: KvPut(key="k" * (limits.KEY_BYTES_MAX + 1), value=b""),
        PayloadTooLarge,
    ),
    "value longer than VALUE_BYTES_MAX": (
        lambda: KvPut(key="k", value=b"v" * (limits.VALUE_BYTES_MAX + 1)),
        PayloadTooLarge,
    ),
    "key is bytes": (lambda: KvPut(key=b"k", value=b""), InvalidArgument),  # type: ignore[arg-type]
    "negative expected revision": (
        lambda: KvDelete(key="k", expected_mod_revision=-1),
        InvalidArgument,
    ),
    "session id is not a name": (lambda: SessionKeepAlive(session_id="../s1"), InvalidArgument),
    "ttl above the maximum": (
        lambda: SessionGrant(ttl_ms=limits.SESSION_TTL_MAX_MS + 1),
        InvalidArgument,
    ),
    "task_index is a bool": (
        lambda: TaskAssign(job_id=JOB_ID, task_index=True, region=REGION),
        InvalidArgument,
    ),
    "wait is an int": (
        lambda: LockAcquire(name=LOCK_NAME, session_id=SESSION_ID, wait=1),  # type: ignore[arg-type]
        InvalidArgument,
    ),
    "gpus is a list": (
        lambda: RegionHeartbeat(name=REGION, gpus=[]),  # type: ignore[arg-type]
        InvalidArgument,
    ),
    "rtt is NaN": (lambda: RegionHeartbeat(name=REGION, rtt_ms={"b": math.nan}), InvalidArgument),
    "free memory above total": (lambda: Gpu(model="H100", memory_mb=1, free_mb=2), InvalidArgument),
    "invalid json result": (
        lambda: TaskComplete(job_id=JOB_ID, task_index=0, token=1, result="{"),
        InvalidArgument,
    ),
    "job spec with entrypoint and workload": (
        lambda: _spec(entrypoint="pkg.module:main"),
        InvalidArgument,
    ),
    "job spec with neither entrypoint nor workload": (
        lambda: _spec(workload=None),
        InvalidArgument,
    ),
    "entrypoint is a path": (
        lambda: _spec(workload=None, entrypoint="pkg/module.py"),
        InvalidArgument,
    ),
    "entrypoint without a function": (
        lambda: _spec(workload=None, entrypoint="pkg.module"),
        InvalidArgument,
    ),
    "entrypoint with a call": (
        lambda: _spec(workload=None, entrypoint="pkg.module:main()"),
        InvalidArgument,
    ),
    "region both allowed and denied": (
        lambda: _spec(regions_allow=("eu-west", "us-east"), regions_deny=("us-east",)),
        InvalidArgument,
    ),
    "duplicate allowed regions": (
        lambda: _spec(regions_allow=("eu-west", "eu-west")),
        InvalidArgument,
    ),
    "too many preferred regions": (
        lambda: _spec(regions_prefer=tuple(f"r{n}" for n in range(limits.LIST_ITEMS_MAX + 1))),
        InvalidArgument,
    ),
    "array_size 0": (lambda: _spec(array_size=0), InvalidArgument),
    "array_size above the maximum": (
        lambda: _spec(array_size=limits.ARRAY_SIZE_MAX + 1),
        InvalidArgument,
    ),
    "args is a JSON array": (lambda: _spec(args="[1, 2]"), InvalidArgument),
    "args is a JSON string": (lambda: _spec(args='"x"'), InvalidArgument),
    "args is not JSON": (lambda: _spec(args="{epochs: 3}"), InvalidArgument),
    "args is a dict": (lambda: _spec(args={"epochs": 3}), InvalidArgument),
    "spec is a dict": (
        lambda: JobSubmit(spec={"name": "train"}),  # type: ignore[arg-type]
        InvalidArgument,
    ),
    "envelope without a command": (
        lambda: Envelope(command=_spec(), now_ms=0),  # type: ignore[arg-type]
        InvalidArgument,
    ),
    "envelope with client_id and no seq": (
        lambda: Envelope(command=Tick(), now_ms=0, client_id=CLIENT_ID),
        InvalidArgument,
    ),
    "envelope with negative now_ms": (lambda: Envelope(command=Tick(), now_ms=-5), InvalidArgument),
}


@pytest.mark.parametrize("case", sorted(ILL_FORMED))
def test_construction__ill_formed_value__raises_invalid_argument(case: str) -> None:
    build, expected = ILL_FORMED[case]
    assert issubclass(expected, InvalidArgument)
    _raises_exactly(expected, build)


def test_construction__envelope_of_another_version__raises_unsupported_version() -> None:
    _raises_exactly(UnsupportedVersion, lambda: Envelope(command=Tick(), now_ms=0, v=2))


def test_construction__lone_surrogate__raises_invalid_argument() -> None:
    # Strings from JSON bodies may hold lone surrogates ("\ud800" is valid JSON), and they have no
    # UTF-8 encoding. Fails today (bug): the size check calls `str.encode()`, which raises
    # UnicodeEncodeError instead of a typed error.
    builders: dict[str, Callable[[str], object]] = {
        "key": lambda text: KvPut(key=text, value=b""),
        "name": lambda text: SessionKeepAlive(session_id=text),
        "text": lambda text: TaskFail(job_id=JOB_ID, task_index=0, token=1, error=text),
        "client_id": lambda text: Envelope(command=Tick(), now_ms=0, client_id=text, seq=1),
    }
    untyped: dict[str, str] = {}
    for field, build in builders.items():
        try:
            build("a\ud800")
        except InvalidArgument:
            continue
        except Exception as error:
            untyped[field] = repr(error)
        else:
            untyped[field] = "accepted"
    assert not untyped, f"lone surrogates not rejected with InvalidArgument: {untyped}"


def test_construction__mapping_that_encode_cannot_write__is_rejected() -> None:
    # A struct that exists must be encodable. Fails today (bug): the mapping check accepts any
    # Mapping, so a read-only mapping is accepted here and `encode` raises TypeError later.
    labels: Any = types.MappingProxyType({"zone": "a"})
    try:
        command = RegionRegister(name=REGION, http_address="h", raft_address="r", labels=labels)
    except InvalidArgument:
        return
    encode(_envelope(command))


# Fuzzing: whatever the bytes, `decode` answers with an Envelope or a typed error.


@given(st.binary(max_size=512))
def test_fuzz__random_bytes__decode_raises_only_typed_errors(data: bytes) -> None:
    _decode_or_none(data)


_scalars: st.SearchStrategy[Any] = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(1 << 63), max_value=(1 << 64) - 1)
    | st.floats()
    | st.text(max_size=24)
    | st.binary(max_size=24)
)
_structures: st.SearchStrategy[Any] = st.recursive(
    _scalars,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.text(max_size=12) | st.integers(-4, 4), children, max_size=4)
    ),
    max_leaves=24,
)


@given(_structures)
def test_fuzz__any_msgpack_structure__decode_raises_only_typed_errors(structure: Any) -> None:
    _decode_or_none(_pack(structure))


_FIELD_NAMES = sorted(
    {"type"}
    | {name for command_type in COMMAND_TYPES for name in command_type.__struct_fields__}
    | set(JobSpec.__struct_fields__)
    | set(Gpu.__struct_fields__)
)


@given(
    name=st.sampled_from(EXAMPLE_NAMES),
    field=st.sampled_from(_FIELD_NAMES),
    value=_structures,
    in_command=st.booleans(),
)
def test_fuzz__one_field_of_a_valid_entry_replaced__decode_raises_only_typed_errors(
    name: str, field: str, value: Any, in_command: bool
) -> None:
    # Random structures seldom look like an envelope; starting from a valid one and replacing a
    # single field reaches the per-field checks. When the result still decodes, it must round-trip.
    raw = _raw(name)
    target = raw["command"] if in_command else raw
    target[field] = value
    envelope = _decode_or_none(_pack(raw))
    if envelope is not None:
        assert decode(encode(envelope)) == envelope


@st.composite
def _mutated(draw: st.DrawFn, originals: list[bytes]) -> bytes:
    """A valid entry with a few bytes flipped, replaced, inserted or deleted, or cut short."""
    data = bytearray(draw(st.sampled_from(originals)))
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        operation = draw(st.sampled_from(["flip", "replace", "insert", "delete", "truncate"]))
        if operation == "insert":
            position = draw(st.integers(min_value=0, max_value=len(data)))
            data[position:position] = draw(st.binary(min_size=1, max_size=4))
            continue
        if not data:
            break
        position = draw(st.integers(min_value=0, max_value=len(data) - 1))
        if operation == "flip":
            data[position] ^= 1 << draw(st.integers(min_value=0, max_value=7))
        elif operation == "replace":
            data[position] = draw(st.integers(min_value=0, max_value=255))
        elif operation == "delete":
            del data[position]
        else:
            del data[position:]
    return bytes(data)


@given(_mutated(EXAMPLE_BYTES))
def test_fuzz__mutated_valid_entry__decode_raises_only_typed_errors(data: bytes) -> None:
    envelope = _decode_or_none(data)
    if envelope is not None:
        assert decode(encode(envelope)) == envelope


# The state machine and undecodable entries.


def _base_machine() -> bytes:
    """A snapshot of a state in which the examples' session, region, job, attempt and lock exist."""
    driver = Driver()
    driver.ok(SessionGrant(ttl_ms=60_000))
    driver.ok(RegionRegister(name=REGION, http_address="http://a", raft_address="a:1", cpu_slots=4))
    driver.ok(JobSubmit(spec=JobSpec(name="train", workload="matmul", array_size=2)))
    driver.ok(TaskAssign(job_id=JOB_ID, task_index=0, region=REGION))
    claimed = driver.ok(
        TaskClaim(
            job_id=JOB_ID,
            task_index=0,
            region=REGION,
            executor_id="executor-1",
            lease_ttl_ms=30_000,
        )
    )
    locked = driver.ok(LockAcquire(name=LOCK_NAME, session_id=SESSION_ID))
    assert driver.machine.sessions.keys() == {SESSION_ID}
    assert (claimed["token"], locked["token"]) == (ATTEMPT_TOKEN, LOCK_TOKEN)
    return driver.machine.snapshot()


BASE_SNAPSHOT = _base_machine()


def _without_index(snapshot: bytes) -> Snapshot:
    return msgspec.structs.replace(decode_snapshot(snapshot), index=0)


@given(
    entries=st.lists(
        st.tuples(st.binary(max_size=64) | _mutated(EXAMPLE_BYTES), st.integers(1, 3)),
        min_size=1,
        max_size=6,
    )
)
def test_fuzz__garbage_entries__apply_returns_an_error_result_and_the_index_advances(
    entries: list[tuple[bytes, int]],
) -> None:
    machine = StateMachine.restore(BASE_SNAPSHOT)
    for entry, gap in entries:
        index = machine.index + gap
        before = machine.snapshot()
        try:
            decode(entry)
        except XrError as error:
            rejected: XrError | None = error
        else:
            rejected = None
        applied = machine.apply(entry, index)
        assert applied.index == index == machine.index
        if rejected is not None:
            # An undecodable entry is answered with the decoder's own error and changes nothing
            # but the applied index, the same way on every replica.
            assert applied.result.error is not None
            assert applied.result.error.code == rejected.code
            assert applied.effects == ()
            assert _without_index(machine.snapshot()) == _without_index(before)


# Snapshots.


def _example_machine() -> StateMachine:
    """The base state with every example applied, in name order, as far as each one succeeds."""
    machine = StateMachine.restore(BASE_SNAPSHOT)
    for name in EXAMPLE_NAMES:
        machine.apply(encode(EXAMPLES[name]), machine.index + 1)
    return machine


def test_snapshot__round_trip_is_byte_identical() -> None:
    snapshot = _example_machine().snapshot()
    assert encode_snapshot(decode_snapshot(snapshot)) == snapshot
    assert StateMachine.restore(snapshot).snapshot() == snapshot


def _snapshot_raw() -> dict[str, Any]:
    raw: dict[str, Any] = _unpack(BASE_SNAPSHOT[len(SNAPSHOT_MAGIC) :])
    return raw


def _snapshot_with(**changes: Any) -> bytes:
    return SNAPSHOT_MAGIC + _pack({**_snapshot_raw(), **changes})


GARBAGE_SNAPSHOTS: dict[str, bytes] = {
    "empty": b"",
    "no magic": b"garbage",
    "an envelope": encode(EXAMPLES["tick"]),
    "magic only": SNAPSHOT_MAGIC,
    "magic and an invalid opcode": SNAPSHOT_MAGIC + b"\xc1",
    "magic and an empty map": SNAPSHOT_MAGIC + _pack({}),
    "magic and a list": SNAPSHOT_MAGIC + _pack([1, 2, 3]),
    "truncated": BASE_SNAPSHOT[:-1],
    "trailing bytes": BASE_SNAPSHOT + b"\x00",
    "negative limit": _snapshot_with(limits={"keys_max": -1}),
    "unknown limit": _snapshot_with(limits={"keys_per_tenant_max": 1}),
    "index is a string": _snapshot_with(index="7"),
    "unknown task state": _snapshot_with(
        jobs={JOB_ID: {**_snapshot_raw()["jobs"][JOB_ID], "tasks": [{"index": 0, "state": "lost"}]}}
    ),
}


@pytest.mark.parametrize("case", sorted(GARBAGE_SNAPSHOTS))
def test_snapshot__garbage__raises_codec_error(case: str) -> None:
    _raises_exactly(CodecError, lambda: decode_snapshot(GARBAGE_SNAPSHOTS[case]))


def test_snapshot__other_format__raises_unsupported_version() -> None:
    _raises_exactly(UnsupportedVersion, lambda: decode_snapshot(_snapshot_with(format=2)))


def test_snapshot__record_breaking_a_command_rule__raises_codec_error() -> None:
    # A corrupt snapshot is a CodecError, not a client's InvalidArgument. Fails today (bug): the
    # job spec inside a job record validates itself while the snapshot decodes, and its
    # InvalidArgument escapes `decode_snapshot` unchanged.
    raw = _snapshot_raw()
    job = raw["jobs"][JOB_ID]
    corrupt = {**job, "spec": {**job["spec"], "array_size": 0}}
    _raises_exactly(CodecError, lambda: decode_snapshot(_snapshot_with(jobs={JOB_ID: corrupt})))


@given(st.binary(max_size=256))
def test_fuzz__random_bytes_after_the_magic__decode_snapshot_raises_codec_error(
    data: bytes,
) -> None:
    with pytest.raises(CodecError):
        decode_snapshot(SNAPSHOT_MAGIC + data)


@given(_mutated([BASE_SNAPSHOT]))
def test_fuzz__mutated_snapshot__decode_snapshot_raises_only_typed_errors(data: bytes) -> None:
    # Only XrError, not CodecError, is asserted here: a mutation can make a job spec break a rule,
    # which today raises InvalidArgument (see the test above), and a fuzz test that fails only on
    # some seeds would be flaky.
    try:
        snapshot = decode_snapshot(data)
    except XrError:
        return
    assert type(snapshot) is Snapshot
