"""The HTTP server's own CPU per request: aiohttp, as xr's nodes run it, against a bare protocol.

How much of a put's cost is the HTTP framework? Two servers answer the same put, each in a process
of its own on uvloop: aiohttp (`web.AppRunner` with `access_log=None` and
`handler_cancellation=True` as `node.daemon` starts it, one route with a key in its path, the
body read and decoded with msgspec and the answer encoded with it, as `node.api.wire` does) and the
reference, an `asyncio.Protocol` with the least HTTP/1.1 a keep-alive client needs (the request
line, `Content-Length`, the body; nothing checked), which decodes and answers the same way. Neither
does anything else: no Raft, no authorization, no audit line. The load is bench/api.py's put
(bench/_load.py: a closed loop, a 64-byte value, keep-alive connections), the two servers
alternating cell by cell, and a server's figure is its own CPU time (user and system, from /proc)
over the timed window per request answered. What aiohttp spends beyond the reference is the most
that serving HTTP some other way could save a node per request.

Run: `python bench/http_server.py [--concurrency 1,16,64] [--duration 3] [--warmup 1]
[--rounds 3] [--json PATH]` (about 40 s with the defaults). The last line is one JSON object.
"""

from __future__ import annotations

import sys
from pathlib import Path

# As in bench/scheduler.py: the repository root comes first on the path, not this folder.
_BENCH_DIRECTORY = Path(__file__).resolve().parent
sys.path[:] = [str(_BENCH_DIRECTORY.parent)] + [
    entry for entry in sys.path if Path(entry or ".").resolve() != _BENCH_DIRECTORY
]

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from contextlib import contextmanager  # noqa: E402
from typing import Any  # noqa: E402

import msgspec  # noqa: E402
import uvloop  # noqa: E402

from bench._arguments import check_output_path, write_output  # noqa: E402
from bench._load import Worker, run_cell  # noqa: E402

SERVERS = ("aiohttp", "bare")
REQUEST_TIMEOUT_S = 10.0
_VALUE = "v" * 64
_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder()


def _answer(key: str, body: bytes) -> bytes:
    """What both servers do with a put: decode the body, encode an answer."""
    document = _decoder.decode(body)
    return _encoder.encode({"key": key, "revision": 1, "value": document["value"]}) + b"\n"


async def _serve_aiohttp() -> None:
    from aiohttp import web

    async def put(request: web.Request) -> web.Response:
        body = await request.read()
        return web.Response(
            body=_answer(request.match_info["key"], body), content_type="application/json"
        )

    app = web.Application()
    app.router.add_put("/v1/kv/{key:.+}", put)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    _announce(runner.addresses[0][1])  # the port the kernel chose
    await asyncio.Event().wait()


class _BareHttp(asyncio.Protocol):
    """Keep-alive HTTP/1.1 for well-formed requests with a `Content-Length` body."""

    def __init__(self) -> None:
        self._buffer = b""
        self._transport: Any = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # uvloop's TCPTransport, not an asyncio.Transport

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        while True:
            head_end = self._buffer.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = self._buffer[:head_end].split(b"\r\n")
            length = 0
            for line in head[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            end = head_end + 4 + length
            if len(self._buffer) < end:
                return
            body, self._buffer = self._buffer[head_end + 4 : end], self._buffer[end:]
            key = head[0].split(b" ")[1].decode().removeprefix("/v1/kv/")
            answer = _answer(key, body)
            self._transport.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                % len(answer)
                + answer
            )


async def _serve_bare() -> None:
    server = await asyncio.get_running_loop().create_server(_BareHttp, "127.0.0.1", 0)
    _announce(server.sockets[0].getsockname()[1])
    await server.serve_forever()


def _announce(port: int) -> None:
    """Tells the benchmark the server's port, on its first line of output."""
    print(port, flush=True)


@contextmanager
def _server(kind: str) -> Iterator[tuple[int, int]]:
    """A server process of `kind`: its pid and port, stopped on the way out."""
    process = subprocess.Popen(
        [sys.executable, __file__, "--serve", kind], stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line.strip().isdigit():
            raise RuntimeError(f"the {kind} server did not start (exit code {process.wait()})")
        yield process.pid, int(line)
    finally:
        process.terminate()
        process.wait()


class _Put:
    """bench/api.py's put: a 64-byte value to the worker's own key."""

    async def prepare(self, worker: Worker) -> None:
        worker.state["path"] = f"/v1/kv/bench/{worker.index}"

    async def run(self, worker: Worker) -> None:
        await worker.request("PUT", worker.state["path"], {"value": _VALUE})

    async def finish(self, worker: Worker) -> None:
        return None


def _error_code(status: int, document: Any) -> str:
    return str(status)


def run(arguments: argparse.Namespace) -> dict[str, Any]:
    # cells[server][concurrency]: (CPU us per request, requests per second), one per round.
    cells: dict[str, dict[int, list[tuple[float, float]]]] = {
        kind: {c: [] for c in arguments.concurrency} for kind in SERVERS
    }
    with _server("aiohttp") as aiohttp_server, _server("bare") as bare_server:
        servers = {"aiohttp": aiohttp_server, "bare": bare_server}
        for concurrency in arguments.concurrency:
            for number in range(arguments.rounds):
                order = SERVERS if number % 2 == 0 else SERVERS[::-1]
                for kind in order:
                    pid, port = servers[kind]
                    result = asyncio.run(
                        run_cell(
                            _Put(),
                            [f"http://127.0.0.1:{port}"],
                            concurrency=concurrency,
                            warmup_s=arguments.warmup,
                            duration_s=arguments.duration,
                            request_timeout_s=REQUEST_TIMEOUT_S,
                            error_code=_error_code,
                            cpu_pids=[pid],
                        )
                    )
                    if result.failures or result.members_cpu_us_per_op is None:
                        raise RuntimeError(f"{kind} at c={concurrency}: {result.failures}")
                    cells[kind][concurrency].append(
                        (result.members_cpu_us_per_op, result.ops_per_s)
                    )
                print(
                    f"c={concurrency} round {number + 1}/{arguments.rounds}: "
                    + ", ".join(
                        f"{kind} {cells[kind][concurrency][-1][0]:.1f} us a request "
                        f"({cells[kind][concurrency][-1][1]:,.0f}/s)"
                        for kind in SERVERS
                    ),
                    flush=True,
                )
    rows = []
    for concurrency in arguments.concurrency:
        ours, reference = cells["aiohttp"][concurrency], cells["bare"][concurrency]
        rows.append(
            {
                "concurrency": concurrency,
                "aiohttp_cpu_us": round(statistics.median(c for c, _ in ours), 1),
                "bare_cpu_us": round(statistics.median(c for c, _ in reference), 1),
                "aiohttp_per_s": round(statistics.median(r for _, r in ours)),
                "bare_per_s": round(statistics.median(r for _, r in reference)),
                # aiohttp over the reference, the median of the rounds' ratios.
                "cpu_ratio": round(
                    statistics.median(
                        a / b for (a, _), (b, _) in zip(ours, reference, strict=True)
                    ),
                    2,
                ),
            }
        )
    print(
        f"\n| put, median of {arguments.rounds} x {arguments.duration:g} s | aiohttp: server CPU "
        "a request (requests/s) | bare protocol | aiohttp / bare | aiohttp's extra |"
    )
    print("| --- | ---: | ---: | ---: | ---: |")
    for row in rows:
        extra_us = row["aiohttp_cpu_us"] - row["bare_cpu_us"]
        print(
            f"| c={row['concurrency']} | {row['aiohttp_cpu_us']:.1f} us "
            f"({row['aiohttp_per_s']:,}/s) | {row['bare_cpu_us']:.1f} us ({row['bare_per_s']:,}/s)"
            f" | {row['cpu_ratio']:.2f}x | {extra_us:.1f} us |"
        )
    figures = {"benchmark": "http_server", "rounds": arguments.rounds, "cells": rows}
    written = arguments.json is None or write_output(
        arguments.json, json.dumps(figures, indent=2) + "\n", program="http_server"
    )
    print(json.dumps(figures))
    if not written:
        sys.exit(1)
    return figures


def _concurrencies(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected numbers such as 1,16,64") from None
    if not values or any(not 1 <= value <= 1024 for value in values):
        raise argparse.ArgumentTypeError(f"{text!r}: each must be from 1 to 1024")
    return values


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value <= 600:
        raise argparse.ArgumentTypeError(f"must be over 0 and at most 600 seconds: {value:g}")
    return value


def _rounds(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 1 <= value <= 100:
        raise argparse.ArgumentTypeError(f"must be from 1 to 100: {value}")
    return value


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=_concurrencies, default=[1, 16, 64])
    parser.add_argument("--duration", type=_seconds, default=3.0, help="timed seconds per cell")
    parser.add_argument("--warmup", type=_seconds, default=1.0, help="untimed seconds per cell")
    parser.add_argument("--rounds", type=_rounds, default=3, help="cells per server and load")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    parser.add_argument("--serve", choices=SERVERS, help=argparse.SUPPRESS)
    arguments = parser.parse_args(argv)
    check_output_path(parser, "--json", arguments.json)
    if arguments.serve is not None:
        uvloop.run(_serve_aiohttp() if arguments.serve == "aiohttp" else _serve_bare())
        return
    try:
        run(arguments)
    except RuntimeError as error:
        sys.exit(f"http_server: {error}")


if __name__ == "__main__":
    main()
