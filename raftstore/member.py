"""One `RaftStore` member in its own process, with a tiny control server for tests and benchmarks.

This is test and benchmark infrastructure, not the region daemon: the node issue builds the real
HTTP daemon (`node/`), and this module stays only to drive real processes in
`tests/raftstore/test_processes.py` and `bench/raftstore.py`. Run it as

    python -m raftstore.member --self 127.0.0.1:7001 --peers 127.0.0.1:7002,127.0.0.1:7003 \
        --data-dir /tmp/m1 --control-port 7101 [--raft-min-timeout-s 0.4 ...]

Every numeric `RaftConfig` field has a flag of the same name (`--propose-timeout-s`). The process
prints the line "ready" once its control server listens, and stops gracefully on SIGTERM, SIGINT
or a `stop` request.

The control protocol runs on 127.0.0.1 only. Each frame is a 4-byte big-endian length followed by
a msgpack map; a connection carries one request at a time, answered in order. Requests (`op`):
- `put` key, value, client_id, seq: proposes `KvPut`; answers `{"ok": true, "revision", "index",
  "duplicate"}` or `{"ok": false, "code", "message", "definite"}`. An error from the state machine
  carries the definiteness of its error class (all definite except `request.too_old`).
- `get` key: a linearizable read; `{"ok": true, "found", "value", "mod_revision", "version",
  "index"}`. `range` prefix, after, limit: a linearizable page of keys.
- `status`: `RaftStore.status()` plus `is_leader` and `pid`.
- `hash`: sha256 of the state machine's snapshot and the index it was taken at, read under the
  replica's state lock, so members can be compared at an equal index.
- `load` concurrency, count, value_size, duration_s: a write load run inside this process (so the
  load generator does not compete for the CPU as another Python process); reports commits/s and
  latency percentiles.
- `stop`: answers, then stops the member.

The module also holds what tests and benchmarks need to use such processes: `MemberClient`,
`MemberProcess`, `free_ports` and the framing helpers.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import logging
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any, Union

import msgspec

from raftstore.config import RaftConfig
from raftstore.store import RaftStore
from xrcore import StateMachine, kv
from xrcore.commands import KvPut
from xrcore.errors import InvalidArgument, XrError
from xrcore.limits import RANGE_LIMIT_MAX, VALUE_BYTES_MAX

__all__ = [
    "FRAME_BYTES_MAX",
    "HOST",
    "MemberClient",
    "MemberProcess",
    "MemberUnreachable",
    "free_ports",
    "latency_summary",
    "main",
    "read_frame",
    "write_frame",
]

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
# A frame larger than this closes the connection: a range page or a load report is far smaller.
FRAME_BYTES_MAX = 8 * 1024 * 1024
_LENGTH = struct.Struct(">I")
# Bounds of the `load` request, so a mistyped benchmark cannot exhaust the member.
LOAD_CONCURRENCY_MAX = 10_000
LOAD_DURATION_MAX_S = 600.0
# A load worker that hits an error waits this long before its next proposal, so a leaderless
# cluster is not hammered in a tight loop.
LOAD_ERROR_PAUSE_S = 0.01
# The configuration fields that are not timing or sizing flags.
_STRUCTURAL_FIELDS = frozenset({"self_address", "peers", "data_dir", "cluster_secret"})


# Framing.


async def read_frame(reader: asyncio.StreamReader) -> bytes | None:
    """The next frame's body, or None when the peer closed the connection between frames."""
    try:
        header = await reader.readexactly(_LENGTH.size)
    except asyncio.IncompleteReadError as error:
        if error.partial:
            raise
        return None
    (length,) = _LENGTH.unpack(header)
    if length > FRAME_BYTES_MAX:
        raise ValueError(f"frame of {length} bytes is over {FRAME_BYTES_MAX}")
    return await reader.readexactly(length)


def write_frame(writer: asyncio.StreamWriter, body: bytes) -> None:
    writer.write(_LENGTH.pack(len(body)) + body)


# Requests. Tagged by `op`; unknown fields are refused so a typo in a test is not silently ignored.


class _Request(
    msgspec.Struct, frozen=True, kw_only=True, tag_field="op", forbid_unknown_fields=True
):
    pass


class PutRequest(_Request, frozen=True, tag="put"):
    key: str
    value: bytes
    client_id: str | None = None
    seq: int | None = None
    timeout_s: float | None = None


class GetRequest(_Request, frozen=True, tag="get"):
    key: str
    timeout_s: float | None = None


class RangeRequest(_Request, frozen=True, tag="range"):
    prefix: str
    after: str | None = None
    limit: int = 1_000
    timeout_s: float | None = None


class StatusRequest(_Request, frozen=True, tag="status"):
    pass


class HashRequest(_Request, frozen=True, tag="hash"):
    pass


class LoadRequest(_Request, frozen=True, tag="load"):
    concurrency: int
    count: int
    value_size: int = 64
    # The load stops at `count` commits or after `duration_s`, whichever comes first.
    duration_s: float = 10.0
    timeout_s: float | None = None


class StopRequest(_Request, frozen=True, tag="stop"):
    pass


_AnyRequest = Union[  # noqa: UP007 - msgspec needs a Union object at run time
    PutRequest,
    GetRequest,
    RangeRequest,
    StatusRequest,
    HashRequest,
    LoadRequest,
    StopRequest,
]
_request_decoder: msgspec.msgpack.Decoder[Any] = msgspec.msgpack.Decoder(_AnyRequest)
_encoder = msgspec.msgpack.Encoder()
_response_decoder = msgspec.msgpack.Decoder(dict[str, Any])


def _failure(error: XrError) -> dict[str, Any]:
    return {"ok": False, "code": error.code, "message": error.message, "definite": error.definite}


def latency_summary(latencies_s: list[float]) -> dict[str, float | None]:
    """p50 and p99 in milliseconds (nearest rank), or None without samples."""
    if not latencies_s:
        return {"latency_p50_ms": None, "latency_p99_ms": None}
    ordered = sorted(latencies_s)
    last = len(ordered) - 1
    return {
        "latency_p50_ms": ordered[round(0.50 * last)] * 1000,
        "latency_p99_ms": ordered[round(0.99 * last)] * 1000,
    }


# Queries, run under the replica's state lock: they copy what they return, because the tick
# thread mutates the records once the lock is released.


def _key_query(key: str) -> Callable[[StateMachine], dict[str, Any]]:
    def query(machine: StateMachine) -> dict[str, Any]:
        record = machine.keys.get(key)
        if record is None:
            return {"found": False, "revision": machine.revision}
        return {
            "found": True,
            "value": record.value,
            "create_revision": record.create_revision,
            "mod_revision": record.mod_revision,
            "version": record.version,
            "revision": machine.revision,
        }

    return query


def _state_hash(machine: StateMachine) -> tuple[int, str]:
    return machine.index, hashlib.sha256(machine.snapshot()).hexdigest()


# The member.


class Member:
    """A `RaftStore` and the control server in front of it."""

    def __init__(self, store: RaftStore) -> None:
        self.store = store
        self.stopping = asyncio.Event()
        # Load workers keep their sequence numbers across `load` requests, so the exactly-once
        # table holds one client per worker; the process id keeps two processes' clients apart.
        self._load_seqs: dict[int, int] = {}
        self._load_client_prefix = f"load-{os.getpid()}"
        self._handlers: dict[type[_Request], Callable[[Any], Coroutine[Any, Any, Any]]] = {
            PutRequest: self._put,
            GetRequest: self._get,
            RangeRequest: self._range,
            StatusRequest: self._status,
            HashRequest: self._hash,
            LoadRequest: self._load,
            StopRequest: self._stop,
        }

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                body = await read_frame(reader)
                if body is None:
                    break
                response = await self._answer(body)
                write_frame(writer, _encoder.encode(response))
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError, ValueError) as error:
            log.debug("control connection closed: %s", error)
        except asyncio.CancelledError:
            # The process is stopping. Ending quietly is deliberate: on Python 3.11, asyncio's
            # stream server logs a cancelled handler as an unhandled exception.
            pass
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def _answer(self, body: bytes) -> dict[str, Any]:
        try:
            request = _request_decoder.decode(body)
        except (msgspec.DecodeError, msgspec.ValidationError) as error:
            return _failure(InvalidArgument(f"malformed control request: {error}"))
        try:
            response: dict[str, Any] = await self._handlers[type(request)](request)
        except XrError as error:
            return _failure(error)
        return response

    async def _put(self, request: PutRequest) -> dict[str, Any]:
        command = KvPut(key=request.key, value=request.value)
        applied = await self.store.propose(
            command, client_id=request.client_id, seq=request.seq, timeout_s=request.timeout_s
        )
        result = applied.result
        if result.error is not None:
            # The state machine applied the entry and rejected the command; its class says
            # whether an earlier attempt might have taken effect (`request.too_old`).
            failure = _failure(result.error.to_error())
            failure["index"] = applied.index
            return failure
        assert result.value is not None
        return {
            "ok": True,
            "revision": result.value["revision"],
            "index": applied.index,
            "duplicate": applied.duplicate,
        }

    async def _get(self, request: GetRequest) -> dict[str, Any]:
        read = await self.store.read(_key_query(request.key), timeout_s=request.timeout_s)
        return {"ok": True, "index": read.index, **read.value}

    async def _range(self, request: RangeRequest) -> dict[str, Any]:
        limit, prefix, after = request.limit, request.prefix, request.after
        if not 1 <= limit <= RANGE_LIMIT_MAX:
            raise InvalidArgument(f"limit must be between 1 and {RANGE_LIMIT_MAX}, got {limit}")
        read = await self.store.read(
            lambda machine: kv.range_(machine, prefix, limit=limit, after=after),
            timeout_s=request.timeout_s,
        )
        return {"ok": True, "index": read.index, **read.value}

    async def _status(self, request: StatusRequest) -> dict[str, Any]:
        return {
            "ok": True,
            "is_leader": self.store.is_leader,
            "pid": os.getpid(),
            **self.store.status(),
        }

    async def _hash(self, request: HashRequest) -> dict[str, Any]:
        index, digest = self.store.replica.read(_state_hash)
        return {"ok": True, "machine_index": index, "sha256": digest}

    async def _stop(self, request: StopRequest) -> dict[str, Any]:
        # Answer first; the main coroutine stops the store once the event is set.
        asyncio.get_running_loop().call_soon(self.stopping.set)
        return {"ok": True}

    async def _load(self, request: LoadRequest) -> dict[str, Any]:
        if not 1 <= request.concurrency <= LOAD_CONCURRENCY_MAX:
            raise InvalidArgument(
                f"concurrency must be between 1 and {LOAD_CONCURRENCY_MAX}, "
                f"got {request.concurrency}"
            )
        if request.count < 1:
            raise InvalidArgument(f"count must be positive, got {request.count}")
        if not 0 < request.duration_s <= LOAD_DURATION_MAX_S:
            raise InvalidArgument(
                f"duration_s must be in (0, {LOAD_DURATION_MAX_S}], got {request.duration_s}"
            )
        if not 0 <= request.value_size <= VALUE_BYTES_MAX:
            raise InvalidArgument(
                f"value_size must be between 0 and {VALUE_BYTES_MAX}, got {request.value_size}"
            )
        return await self._run_load(request)

    async def _run_load(self, request: LoadRequest) -> dict[str, Any]:
        """Closed-loop load: each worker proposes its next write when the previous one answers.
        Only answers within the window count, so the rate is commits inside `duration_s`."""
        value = b"x" * request.value_size
        latencies_s: list[float] = []
        errors: Counter[str] = Counter()
        duplicates = 0
        issued = 0
        started_s = time.perf_counter()
        deadline_s = started_s + request.duration_s

        async def worker(number: int) -> None:
            nonlocal duplicates, issued
            client_id = f"{self._load_client_prefix}-{number}"
            # Each worker writes its own key, so the key table stays small however long it runs.
            command = KvPut(key=f"load/{number}", value=value)
            while issued < request.count and time.perf_counter() < deadline_s:
                issued += 1
                seq = self._load_seqs.get(number, 0) + 1
                self._load_seqs[number] = seq
                sent_s = time.perf_counter()
                try:
                    applied = await self.store.propose(
                        command, client_id=client_id, seq=seq, timeout_s=request.timeout_s
                    )
                except XrError as error:
                    errors[error.code] += 1
                    await asyncio.sleep(LOAD_ERROR_PAUSE_S)
                    continue
                answered_s = time.perf_counter()
                if answered_s > deadline_s:
                    break
                if applied.result.error is not None:
                    errors[applied.result.error.code] += 1
                    continue
                duplicates += applied.duplicate
                latencies_s.append(answered_s - sent_s)

        await asyncio.gather(*(worker(number) for number in range(request.concurrency)))
        elapsed_s = min(time.perf_counter(), deadline_s) - started_s
        return {
            "ok": True,
            "concurrency": request.concurrency,
            "commits": len(latencies_s),
            "elapsed_s": elapsed_s,
            "commits_per_s": len(latencies_s) / elapsed_s if elapsed_s > 0 else 0.0,
            "duplicates": duplicates,
            "errors": dict(errors),
            **latency_summary(latencies_s),
        }


# The process.


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m raftstore.member",
        description="One RaftStore member with a loopback control server (tests and benchmarks).",
    )
    parser.add_argument("--self", dest="self_address", required=True, help="host:port for Raft")
    parser.add_argument("--peers", required=True, help="comma-separated host:port of the others")
    parser.add_argument("--data-dir", required=True, type=Path)
    parser.add_argument("--control-port", required=True, type=int)
    parser.add_argument("--cluster-secret", default=None)
    parser.add_argument("--log-level", default="WARNING")
    # Every timing and sizing option of RaftConfig, with its own default.
    for item in fields(RaftConfig):
        if item.name in _STRUCTURAL_FIELDS:
            continue
        parser.add_argument(
            "--" + item.name.replace("_", "-"), type=type(item.default), default=item.default
        )
    return parser


def config_from_arguments(arguments: argparse.Namespace) -> RaftConfig:
    peers = tuple(peer for peer in arguments.peers.split(",") if peer)
    options = {
        item.name: getattr(arguments, item.name)
        for item in fields(RaftConfig)
        if item.name not in _STRUCTURAL_FIELDS
    }
    return RaftConfig(
        self_address=arguments.self_address,
        peers=peers,
        data_dir=arguments.data_dir,
        cluster_secret=arguments.cluster_secret,
        **options,
    )


async def serve_member(config: RaftConfig, control_port: int) -> None:
    store = RaftStore(config)
    member = Member(store)
    loop = asyncio.get_running_loop()
    for signal_number in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signal_number, member.stopping.set)
    await store.start()
    server = await asyncio.start_server(member.serve, HOST, control_port)
    try:
        print("ready", flush=True)
        await member.stopping.wait()
    finally:
        server.close()
        await store.stop()


def main(argv: Sequence[str] | None = None) -> int:
    arguments = _parser().parse_args(argv)
    logging.basicConfig(
        level=arguments.log_level.upper(),
        format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    try:
        config = config_from_arguments(arguments)
    except XrError as error:
        print(f"error: {error.message}", file=sys.stderr)
        return 2
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None
    try:
        import uvloop

        loop_factory = uvloop.new_event_loop
    except ImportError:  # pragma: no cover - uvloop is a dependency where it builds
        pass
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(serve_member(config, arguments.control_port))
    return 0


# Using members from tests and benchmarks.


def free_ports(count: int) -> list[int]:
    """Ports that were free a moment ago: all are bound at once, so they are distinct."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for item in sockets:
            item.bind((HOST, 0))
        return [int(item.getsockname()[1]) for item in sockets]
    finally:
        for item in sockets:
            item.close()


class MemberUnreachable(Exception):
    """The control connection failed or timed out: the request may or may not have run."""


class MemberClient:
    """A control connection to one member; one request at a time, reconnecting after errors."""

    def __init__(self, port: int) -> None:
        self.port = port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def call(self, request: dict[str, Any], *, timeout_s: float = 10.0) -> dict[str, Any]:
        try:
            return await asyncio.wait_for(self._call(request), timeout_s)
        except (OSError, asyncio.IncompleteReadError, TimeoutError, ValueError) as error:
            await self.close()
            raise MemberUnreachable(f"port {self.port}: {type(error).__name__}: {error}") from None

    async def _call(self, request: dict[str, Any]) -> dict[str, Any]:
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(HOST, self.port)
        assert self._reader is not None
        write_frame(self._writer, _encoder.encode(request))
        await self._writer.drain()
        body = await read_frame(self._reader)
        if body is None:
            raise asyncio.IncompleteReadError(b"", None)
        return _response_decoder.decode(body)

    async def close(self) -> None:
        writer, self._reader, self._writer = self._writer, None, None
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


class MemberProcess:
    """A member started as a child process; its stderr goes to `log_path`."""

    def __init__(
        self,
        *,
        raft_port: int,
        peer_ports: Sequence[int],
        control_port: int,
        data_dir: Path,
        options: Sequence[str] = (),
        module: str = "raftstore.member",
    ) -> None:
        self.raft_port = raft_port
        self.peer_ports = tuple(peer_ports)
        self.control_port = control_port
        self.data_dir = data_dir
        self.options = tuple(options)
        self.module = module
        self.log_path = data_dir.parent / f"{data_dir.name}.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"{HOST}:{self.raft_port}"

    def start(self) -> None:
        assert self.process is None or self.process.poll() is not None, "already running"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        command = [
            sys.executable,
            "-m",
            self.module,
            "--self",
            self.address,
            "--peers",
            ",".join(f"{HOST}:{port}" for port in self.peer_ports),
            "--data-dir",
            str(self.data_dir),
            "--control-port",
            str(self.control_port),
            *self.options,
        ]
        with self.log_path.open("ab") as log_file:
            self.process = subprocess.Popen(
                command,
                stdout=subprocess.PIPE,
                stderr=log_file,
                stdin=subprocess.DEVNULL,
                cwd=Path(__file__).resolve().parent.parent,
            )

    def wait_ready(self, timeout_s: float) -> None:
        """Blocks until the child prints "ready"; raises RuntimeError (with its log) if it exits
        or stays silent for `timeout_s`."""
        process = self.process
        assert process is not None and process.stdout is not None
        deadline_s = time.monotonic() + timeout_s
        received = b""
        while b"\n" not in received:
            remaining_s = deadline_s - time.monotonic()
            if remaining_s <= 0:
                raise RuntimeError(f"{self.address} not ready in {timeout_s} s\n{self.log_tail()}")
            readable, _, _ = select.select([process.stdout], [], [], min(remaining_s, 0.1))
            if readable:
                chunk = os.read(process.stdout.fileno(), 4096)
                if not chunk:
                    raise RuntimeError(f"{self.address} exited before ready\n{self.log_tail()}")
                received += chunk
        if received.split(b"\n", 1)[0].strip() != b"ready":
            raise RuntimeError(f"{self.address} printed {received!r}, not ready")

    def kill(self) -> None:
        """kill -9, and reap it."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
        self._reap(timeout_s=10.0)

    def terminate(self, *, timeout_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL if it has not stopped in `timeout_s`."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self._reap(timeout_s=10.0)

    def _reap(self, *, timeout_s: float) -> None:
        if self.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout_s)
            if self.process.stdout is not None:
                self.process.stdout.close()

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, characters: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-characters:]
        except OSError:
            return ""


if __name__ == "__main__":
    sys.exit(main())
