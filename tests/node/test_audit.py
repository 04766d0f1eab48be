"""The audit log: one JSON line per write request, with who, what, when and how it ended.

Each test serves an application with its own audit file on the shared node's store. A write that
succeeds, one refused with 403 and one without a token each leave a line with every field; a read
leaves none; the token and the body sent never reach the file; the file rotates, keeping at most
`audit.files_max` files in all, each under `audit.bytes_max`; `audit.enabled = false` writes
nothing. A disk that fails its writes (ENOSPC) or its renames (a read-only directory) fails no
request: each record it loses is counted (`xr_audit_records_lost`), the failure is reported at
most once a minute, and once more when lines are written again.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from node.api.app import SERVICES, create_app
from node.api.audit import REPORT_INTERVAL_S, AuditLog, _RotatingFile, _TimeText
from node.api.auth import Principal
from node.config import AuditConfig
from node.metrics import NodeMetrics
from raftstore.clock import RealClock
from tests.node.conftest import TOKENS, ApiNode

pytestmark = pytest.mark.integration

_FIELDS = {
    "time",
    "principal",
    "method",
    "path",
    "route",
    "status",
    "error",
    "request_id",
    "remote",
    "index",
}


@dataclasses.dataclass
class _Audited:
    api: ApiNode
    client: TestClient[Any, Any]
    path: Path

    def lines(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines()]


def _serve(api: ApiNode, audit: AuditConfig) -> _Audited:
    config = dataclasses.replace(api.config, audit=audit)
    client = api.run(api.serve(create_app(config, store=api.store)))
    return _Audited(api=api, client=client, path=config.audit_path)


@pytest.fixture
def audited(api: ApiNode, tmp_path: Path) -> _Audited:
    return _serve(api, AuditConfig(path=str(tmp_path / "audit" / "audit.log")))


def test_a_successful_write__is_one_line_with_every_field(audited: _Audited) -> None:
    answer = audited.api.request(
        "PUT", "/v1/kv/audit/written", json={"value": "x"}, client=audited.client
    )
    assert answer.status == 200

    [line] = audited.lines()
    assert set(line) == _FIELDS
    assert line["principal"] == {"name": "alpha", "role": "tenant", "tenant": "alpha"}
    assert (line["method"], line["path"], line["route"]) == (
        "PUT",
        "/v1/kv/audit/written",
        "/v1/kv/{key}",
    )
    assert (line["status"], line["error"]) == (200, None)
    assert line["request_id"] == answer.headers["Xr-Request-Id"]
    assert line["index"] == int(answer.headers["Xr-Index"])
    assert line["remote"] == "127.0.0.1"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", line["time"])
    assert datetime.fromisoformat(line["time"].replace("Z", "+00:00")).utcoffset() is not None


def test_a_write_refused_with_403__is_audited_with_its_error(audited: _Audited) -> None:
    answer = audited.api.request(
        "PUT", "/v1/tenants/audit-tenant", json={"weight": 5}, client=audited.client
    )
    assert answer.status == 403

    [line] = audited.lines()
    assert line["principal"] == {"name": "alpha", "role": "tenant", "tenant": "alpha"}
    assert (line["status"], line["error"], line["index"]) == (403, "auth.forbidden", None)
    assert line["route"] == "/v1/tenants/{name}"


def test_a_write_without_a_valid_token__is_audited_without_a_principal(audited: _Audited) -> None:
    sent = {"Authorization": "Bearer audit-secret-token-value"}
    for headers in ({}, sent):
        answer = audited.api.request(
            "POST",
            "/v1/sessions",
            token=None,
            headers=headers,
            json={"ttl_ms": 1000},
            client=audited.client,
        )
        assert answer.status == 401

    lines = audited.lines()
    assert len(lines) == 2
    for line in lines:
        assert line["principal"] is None
        assert (line["status"], line["error"]) == (401, "auth.unauthenticated")
        assert (line["method"], line["route"]) == ("POST", "/v1/sessions")


def test_reads__are_not_audited(audited: _Audited) -> None:
    for path in ("/v1/kv/audit/none", "/v1/jobs", "/healthz", "/v1/cluster/status"):
        audited.api.request("GET", path, client=audited.client)
        audited.api.request("HEAD", path, client=audited.client)
    assert audited.lines() == []


def test_other_refusals_and_unknown_routes__are_audited_with_their_code(audited: _Audited) -> None:
    api, client = audited.api, audited.client
    assert api.request("POST", "/v1/jobs", json={"nope": 1}, client=client).status == 400
    assert api.request("DELETE", "/v1/nowhere", client=client).status == 404
    first, second = audited.lines()
    assert (first["status"], first["error"]) == (400, "request.invalid")
    assert (second["status"], second["error"], second["route"]) == (404, "not_found", "unmatched")


def test_tokens_and_bodies__never_reach_the_file(audited: _Audited) -> None:
    api, client = audited.api, audited.client
    body_secret = "audit-body-secret-value"
    api.request("PUT", "/v1/kv/audit/secret", json={"value": body_secret}, client=client)
    api.request(
        "PUT",
        "/v1/kv/audit/secret",
        token=None,
        headers={"Authorization": "Bearer audit-unknown-token-value"},
        json={"value": body_secret},
        client=client,
    )
    api.request("POST", "/v1/jobs?token=audit-query-secret", json={"x": 1}, client=client)
    text = audited.path.read_text()
    assert len(text.splitlines()) == 3
    for secret in (
        TOKENS["alpha"][0],
        "audit-unknown-token-value",
        body_secret,
        "audit-query-secret",
    ):
        assert secret not in text


def test_audit_disabled__writes_nothing(api: ApiNode, tmp_path: Path) -> None:
    audit = AuditConfig(enabled=False, path=str(tmp_path / "audit" / "audit.log"))
    audited = _serve(api, audit)
    assert (
        api.request("PUT", "/v1/kv/audit/off", json={"value": "x"}, client=audited.client).status
        == 200
    )
    assert not audited.path.parent.exists()


def test_an_audit_log_that_cannot_be_opened__stops_the_application_at_start(
    api: ApiNode, tmp_path: Path
) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    config = dataclasses.replace(api.config, audit=AuditConfig(path=str(blocker / "audit.log")))
    with pytest.raises(OSError):
        api.run(api.serve(create_app(config, store=api.store)))


def test_the_default_path__is_under_the_data_directory(api: ApiNode) -> None:
    # The shared node's application writes to <data_dir>/audit/audit.log.
    api.ok("PUT", "/v1/kv/audit/default-path", json={"value": "x"})
    lines = (api.data_dir / "audit" / "audit.log").read_text().splitlines()
    assert any(json.loads(line)["path"] == "/v1/kv/audit/default-path" for line in lines)


def _record(log: AuditLog, number: int) -> None:
    log.record(
        principal=Principal(name="rotating", role="tenant", tenant="t"),
        method="PUT",
        path=f"/v1/kv/rotation/{number}",
        route="/v1/kv/{key}",
        status=200,
        error=None,
        request_id=f"rotation-{number}",
        remote="127.0.0.1",
        index=number,
    )


def _fill(path: Path, *, files_max: int, lines: int) -> None:
    log = AuditLog(path, bytes_max=4096, files_max=files_max, clock=RealClock())
    try:
        for number in range(lines):
            _record(log, number)
    finally:
        log.close()


def _read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_rotation__keeps_at_most_files_max_files_under_bytes_max(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    # About 230 bytes a line: 400 lines fill more than 20 files of 4096 bytes.
    _fill(path, files_max=3, lines=400)
    files = sorted(tmp_path.iterdir())
    assert [file.name for file in files] == ["audit.log", "audit.log.1", "audit.log.2"]
    assert all(file.stat().st_size <= 4096 for file in files)
    # The newest lines are kept, in order, and each line is whole.
    newest = _read(path)
    assert newest[-1]["request_id"] == "rotation-399"
    rotated = _read(tmp_path / "audit.log.1")
    assert rotated[-1]["index"] + 1 == newest[0]["index"]
    oldest = _read(tmp_path / "audit.log.2")
    assert oldest[-1]["index"] + 1 == rotated[0]["index"]


def test_rotation__with_files_max_1_the_one_file_is_emptied_when_full(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    _fill(path, files_max=1, lines=400)
    assert [file.name for file in tmp_path.iterdir()] == ["audit.log"]
    assert path.stat().st_size <= 4096
    newest = _read(path)
    assert newest[-1]["request_id"] == "rotation-399"
    assert [line["index"] for line in newest] == list(range(400 - len(newest), 400))


def test_time_text__is_utc_iso_8601_with_milliseconds_across_seconds_and_back() -> None:
    text = _TimeText()
    # Within a second, across seconds, a clock that steps back, a leap day and the epoch.
    moments = [1_764_806_400_000, 1_764_806_400_999, 1_764_806_401_005, 1_764_806_399_500]
    moments += [951_782_400_123, 0]
    for now_ms in moments:
        expected = datetime.fromtimestamp(now_ms / 1000, tz=UTC).isoformat(timespec="milliseconds")
        assert text.text(now_ms) == expected.replace("+00:00", "Z"), now_ms


class _FullDisk:
    def write(self, text: str) -> int:
        raise OSError(28, "No space left on device")

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def test_a_line_that_cannot_be_written__is_reported_on_stderr_and_the_next_one_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "audit.log"
    log = AuditLog(path, bytes_max=1 << 20, files_max=2, clock=RealClock())
    handler = log._handler
    stream = handler.stream
    try:
        handler.stream = _FullDisk()  # type: ignore[assignment]
        _record(log, 1)  # Does not raise.
        assert "cannot write the audit log" in capsys.readouterr().err
        handler.stream = stream
        _record(log, 2)
    finally:
        log.close()
    assert [line["index"] for line in _read(path)] == [2]


def test_after_close__a_late_request_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    log = AuditLog(path, bytes_max=1 << 20, files_max=2, clock=RealClock())
    _record(log, 1)
    log.close()
    _record(log, 2)
    assert [line["index"] for line in _read(path)] == [1]


def test_close__a_file_that_cannot_be_flushed__is_reported_not_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Closing with the disk full raised ENOSPC out of the application's cleanup at shutdown.
    log = AuditLog(tmp_path / "audit.log", bytes_max=1 << 20, files_max=2, clock=RealClock())

    def full() -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(log._handler, "close", full)
    log.close()
    assert "cannot write the audit log" in capsys.readouterr().err


class _ManualClock:
    """Wall time as it is; monotonic time moves only when a test moves it."""

    def __init__(self) -> None:
        self._real = RealClock()
        self.monotonic = 1000.0

    def now_ms(self) -> int:
        return self._real.now_ms()

    def monotonic_s(self) -> float:
        return self.monotonic


@dataclasses.dataclass
class _FillingDisk:
    """The audit file's disk: its next `failures` writes fail with ENOSPC, as a full disk's do
    (with `cut`, each after writing half its text, as a disk filling in the middle of a line),
    and later ones succeed. A stream left holding text it could not write fails to close while
    the disk is full, as a buffered file does."""

    failures: int = 0
    cut: bool = False

    def attach(self, handler: _RotatingFile, monkeypatch: pytest.MonkeyPatch) -> None:
        opened = handler._open
        monkeypatch.setattr(handler, "_open", lambda: _FailingStream(opened(), self))
        assert handler.stream is not None
        handler.stream = _FailingStream(handler.stream, self)  # type: ignore[assignment]


class _FailingStream:
    def __init__(self, stream: Any, disk: _FillingDisk) -> None:
        self._stream = stream
        self._disk = disk
        self._holding = False
        self._closed = False

    def write(self, text: str) -> int:
        if self._closed:
            raise ValueError("I/O operation on closed file.")
        if self._disk.failures > 0:
            self._disk.failures -= 1
            self._holding = True
            if self._disk.cut:
                self._stream.write(text[: len(text) // 2])
                self._stream.flush()
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return int(self._stream.write(text))

    def flush(self) -> None:
        self._stream.flush()

    def close(self) -> None:
        self._closed = True
        self._stream.close()
        if self._holding and self._disk.failures > 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _messages(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return capsys.readouterr().err.splitlines()


def _lost_in(message: str) -> int:
    match = re.search(r"; (\d+) records? lost since the last message", message)
    assert match, message
    return int(match.group(1))


def test_a_full_disk__is_reported_once_a_minute_counted_and_its_end_reported(
    api: ApiNode,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A QA pass with a full disk saw 4,612 messages in 10 s, one per request, and no metric.
    clock = _ManualClock()
    path = tmp_path / "audit.log"
    log = AuditLog(path, bytes_max=1 << 20, files_max=2, clock=clock)
    metrics = NodeMetrics(api.store, "audit")
    metrics.audit = log
    disk = _FillingDisk(failures=250)
    disk.attach(log._handler, monkeypatch)
    try:
        # One record a second: 250 fail, over 4 minutes and 10 s, then the disk has room.
        for number in range(260):
            _record(log, number)
            clock.monotonic += 1.0
    finally:
        log.close()

    *failures, recovery = _messages(capsys)
    # One message when the first record is lost, then one at the first loss in each minute.
    assert len(failures) == 5
    for message in failures:
        assert message.startswith(f"xr: cannot write the audit log {path}: ")
        assert "No space left on device" in message
    assert [_lost_in(message) for message in failures] == [1, 60, 60, 60, 60]
    assert recovery.startswith(f"xr: the audit log {path} is being written again; ")
    assert _lost_in(recovery) == 250 - 241
    assert log.records_lost == 250
    assert metrics.registry.get_sample_value("xr_audit_records_lost_total") == 250
    # The file lacks exactly the lost records.
    assert [line["index"] for line in _read(path)] == list(range(250, 260))


def test_a_disk_failing_on_and_off__gives_at_most_two_messages_a_minute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    clock = _ManualClock()
    path = tmp_path / "audit.log"
    log = AuditLog(path, bytes_max=1 << 20, files_max=2, clock=clock)
    disk = _FillingDisk()
    disk.attach(log._handler, monkeypatch)
    try:
        for number in range(100):
            disk.failures = number % 2
            _record(log, number)
        assert len(_messages(capsys)) == 2
        clock.monotonic += REPORT_INTERVAL_S
        _record(log, 100)
    finally:
        log.close()
    [late] = _messages(capsys)
    # The 50 losses: the first in the first message, the others in the late one.
    assert "is being written again" in late
    assert _lost_in(late) == 49
    assert log.records_lost == 50
    assert [line["index"] for line in _read(path)] == list(range(0, 101, 2))


def test_a_line_the_disk_cut_short__is_ended_before_the_next_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "audit.log"
    log = AuditLog(path, bytes_max=1 << 20, files_max=2, clock=_ManualClock())
    disk = _FillingDisk(cut=True)
    disk.attach(log._handler, monkeypatch)
    try:
        for number in range(3):
            disk.failures = 1 if number == 1 else 0
            _record(log, number)
    finally:
        log.close()
    first, cut, second = path.read_text().splitlines()
    assert json.loads(first)["index"] == 0
    assert cut.startswith('{"time"') and not cut.endswith("}")
    assert json.loads(second)["index"] == 2
    assert log.records_lost == 1


def test_rotation_on_a_full_disk__counts_the_lost_records_and_rotates_again_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "audit.log"
    log = AuditLog(path, bytes_max=4096, files_max=3, clock=_ManualClock())
    disk = _FillingDisk()
    disk.attach(log._handler, monkeypatch)
    try:
        # About 230 bytes a line: 16 fill a file, and the 17th rotates it. The disk is full
        # from that one on: the rotation happens, and the line fails in the new file.
        for number in range(16):
            _record(log, number)
        disk.failures = 30
        for number in range(16, 46):
            _record(log, number)
        for number in range(46, 60):
            _record(log, number)
    finally:
        log.close()
    assert log.records_lost == 30
    failure, recovery = _messages(capsys)
    assert "cannot write the audit log" in failure
    assert _lost_in(recovery) == 29
    # One rotation, not one per failed line (which would have pushed the first file out).
    assert sorted(file.name for file in tmp_path.iterdir()) == ["audit.log", "audit.log.1"]
    assert [line["index"] for line in _read(tmp_path / "audit.log.1")] == list(range(16))
    assert [line["index"] for line in _read(path)] == list(range(46, 60))


def test_rotation_refused__writes_on_to_the_live_file_and_is_reported_once_a_minute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A read-only directory refuses the rename, which the tests' root user would not see.
    clock = _ManualClock()
    path = tmp_path / "audit.log"
    log = AuditLog(path, bytes_max=4096, files_max=3, clock=clock)
    handler = log._handler

    def refused(source: str, destination: str) -> None:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), source)

    try:
        with monkeypatch.context() as patch:
            patch.setattr(handler, "rotate", refused)
            for number in range(40):
                _record(log, number)
            clock.monotonic += REPORT_INTERVAL_S
            _record(log, 40)
        # The directory is writable again: the next line rotates.
        _record(log, 41)
    finally:
        log.close()
    messages = _messages(capsys)
    assert len(messages) == 2
    for message in messages:
        assert message.startswith(f"xr: cannot rotate the audit log {path}: ")
        assert "Permission denied" in message
    assert log.records_lost == 0
    assert [line["index"] for line in _read(tmp_path / "audit.log.1")] == list(range(41))
    assert [line["index"] for line in _read(path)] == [41]


def test_the_applications_audit_log__is_the_one_its_metric_reads(audited: _Audited) -> None:
    app = audited.client.app
    assert app is not None
    node = app[SERVICES]
    assert node.audit is not None and node.metrics.audit is node.audit
