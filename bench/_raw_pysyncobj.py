"""Raw pysyncobj member: the baseline that `bench/raftstore.py` measures raftstore against.

A `SyncObj` subclass with one `@replicated` method taking bytes and doing nothing but count, as
plain as pysyncobj gets: `appendEntriesUseBatch=False` (without it a lone write waits for the next
100 ms heartbeat), `autoTick` left on (pysyncobj's own thread), every other option at pysyncobj's
default except, by default, a journal and dump file like raftstore's, so both keep the same data
on disk. Proposals use callbacks; the load is generated inside the process on pysyncobj's own
thread: each completion callback proposes the next command, with no event loop in between.

It speaks the control protocol of `raftstore.member` (same argv, same frames): `status`,
`load` (concurrency, count, duration_s, command: the bytes to replicate) and `stop`. Run as
`python -m bench._raw_pysyncobj --self ... --peers ... --data-dir ... --control-port ...`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated

# Run as a file rather than with -m, its own folder would come first on the path and
# bench/raftstore.py shadow the package, so the repository root takes its place.
_BENCH_DIRECTORY = Path(__file__).resolve().parent
sys.path[:] = [str(_BENCH_DIRECTORY.parent)] + [
    entry for entry in sys.path if Path(entry or ".").resolve() != _BENCH_DIRECTORY
]

from raftstore.member import HOST, latency_summary, read_frame, write_frame  # noqa: E402

# How long after its window a load may take to collect the answers still in flight.
DRAIN_TIMEOUT_S = 30.0

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(dict[str, Any])


class RawReplica(SyncObj):
    def __init__(self, self_address: str, peers: list[str], conf: SyncObjConf) -> None:
        self.applied = 0
        super().__init__(self_address, peers, conf)

    @replicated
    def apply_command(self, command: bytes) -> int:
        self.applied += 1
        return self.applied


class ClosedLoopLoad:
    """`concurrency` slots, each proposing its next command from the previous one's callback."""

    def __init__(
        self,
        replica: RawReplica,
        *,
        command: bytes,
        concurrency: int,
        count: int,
        duration_s: float,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.replica = replica
        self.command = command
        self.concurrency = concurrency
        self.count = count
        self.loop = loop
        self.finished: asyncio.Future[None] = loop.create_future()
        self.lock = threading.Lock()
        self.sent_s = [0.0] * concurrency
        self.latencies_s: list[float] = []
        self.errors: Counter[str] = Counter()
        self.issued = 0
        self.active = concurrency
        self.started_s = time.perf_counter()
        self.deadline_s = self.started_s + duration_s

    def start(self) -> None:
        for slot in range(self.concurrency):
            self._issue(slot)

    def _issue(self, slot: int) -> None:
        with self.lock:
            self.issued += 1
            self.sent_s[slot] = time.perf_counter()

        def on_done(result: Any, reason: int) -> None:
            self._on_done(slot, reason)

        self.replica.apply_command(self.command, callback=on_done)  # type: ignore[call-arg]

    def _on_done(self, slot: int, reason: int) -> None:
        # Runs on pysyncobj's thread (or on the proposer's, for an immediate failure).
        now_s = time.perf_counter()
        with self.lock:
            if now_s <= self.deadline_s:
                if reason == FAIL_REASON.SUCCESS:
                    self.latencies_s.append(now_s - self.sent_s[slot])
                else:
                    self.errors[f"pysyncobj.{reason}"] += 1
            more = now_s < self.deadline_s and self.issued < self.count
            last = False
            if not more:
                self.active -= 1
                last = self.active == 0
        if more:
            self._issue(slot)
        elif last:
            self.loop.call_soon_threadsafe(self._finish)

    def _finish(self) -> None:
        if not self.finished.done():
            self.finished.set_result(None)

    def report(self) -> dict[str, Any]:
        with self.lock:
            latencies_s = list(self.latencies_s)
            errors = dict(self.errors)
        elapsed_s = min(time.perf_counter(), self.deadline_s) - self.started_s
        return {
            "ok": True,
            "concurrency": self.concurrency,
            "commits": len(latencies_s),
            "elapsed_s": elapsed_s,
            "commits_per_s": len(latencies_s) / elapsed_s if elapsed_s > 0 else 0.0,
            "errors": errors,
            **latency_summary(latencies_s),
        }


class RawMember:
    def __init__(self, replica: RawReplica) -> None:
        self.replica = replica
        self.stopping = asyncio.Event()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while (body := await read_frame(reader)) is not None:
                write_frame(writer, _encoder.encode(await self._answer(_decoder.decode(body))))
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError, ValueError, msgspec.DecodeError):
            pass
        except asyncio.CancelledError:
            # Stopping; see raftstore.member for why a cancelled handler ends quietly.
            pass
        finally:
            writer.close()

    async def _answer(self, request: dict[str, Any]) -> dict[str, Any]:
        operation = request.get("op")
        if operation == "status":
            status = self.replica.getStatus()
            leader = status["leader"]
            return {
                "ok": True,
                "is_leader": bool(self.replica._isLeader()),
                "has_quorum": bool(status["has_quorum"]),
                "leader": None if leader is None else str(leader),
                "commit_index": status["commit_idx"],
                "applied": self.replica.applied,
            }
        if operation == "load":
            load = ClosedLoopLoad(
                self.replica,
                command=bytes(request["command"]),
                concurrency=int(request["concurrency"]),
                count=int(request["count"]),
                duration_s=float(request["duration_s"]),
                loop=asyncio.get_running_loop(),
            )
            load.start()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    asyncio.shield(load.finished), float(request["duration_s"]) + DRAIN_TIMEOUT_S
                )
            return load.report()
        if operation == "stop":
            asyncio.get_running_loop().call_soon(self.stopping.set)
            return {"ok": True}
        return {"ok": False, "code": "request.invalid", "message": f"unknown op {operation!r}"}


async def serve(arguments: argparse.Namespace) -> None:
    data_dir = Path(arguments.data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    options: dict[str, Any] = {"appendEntriesUseBatch": False}
    if arguments.journal:
        options["journalFile"] = str(data_dir / "raw.journal")
        options["fullDumpFile"] = str(data_dir / "raw.dump")
    peers = [peer for peer in arguments.peers.split(",") if peer]
    replica = RawReplica(arguments.self_address, peers, SyncObjConf(**options))
    member = RawMember(replica)
    loop = asyncio.get_running_loop()
    for signal_number in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signal_number, member.stopping.set)
    server = await asyncio.start_server(member.serve, HOST, arguments.control_port)
    try:
        print("ready", flush=True)
        await member.stopping.wait()
    finally:
        server.close()
        replica.destroy()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--self", dest="self_address", required=True)
    parser.add_argument("--peers", required=True)
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--control-port", required=True, type=int)
    parser.add_argument(
        "--journal",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="keep the log in a journal file, as raftstore does (default: on)",
    )
    arguments = parser.parse_args(argv)
    try:
        import uvloop

        loop_factory = uvloop.new_event_loop
    except ImportError:  # pragma: no cover
        loop_factory = None
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(serve(arguments))
    return 0


if __name__ == "__main__":
    sys.exit(main())
