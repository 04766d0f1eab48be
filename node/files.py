"""Reading the small files a user names: configurations, token tables, tokens, secrets,
certificates, and a value piped to `xr kv put KEY -`.

Each is read up to a bound and refused past it, so that a path to a device that never ends
(`/dev/zero`, `/dev/urandom`) or a file far larger than any such file is refused at once,
instead of being read into memory until the process runs out of it; and a named pipe that
nobody writes to reads as empty instead of waiting for a writer forever.
"""

from __future__ import annotations

import errno
import os
from typing import BinaryIO

__all__ = [
    "CONFIG_BYTES_MAX",
    "SECRET_BYTES_MAX",
    "TooLarge",
    "open_to_read",
    "read_bounded",
    "read_stream_bounded",
    "read_text_bounded",
]

# A configuration file, a token table or a PEM bundle.
CONFIG_BYTES_MAX = 1 << 20
# A bearer token or a cluster secret.
SECRET_BYTES_MAX = 64 << 10


class TooLarge(OSError):
    """An OSError (EFBIG) whose `strerror` says the bound, so that the callers' existing
    "cannot read PATH: REASON" messages name it."""

    def __init__(self, limit: int) -> None:
        super().__init__(errno.EFBIG, f"larger than the maximum of {limit} bytes")


def read_bounded(path: str | os.PathLike[str], limit: int) -> bytes:
    """The bytes of `path`, reading at most `limit` + 1 of them; `TooLarge` past `limit`."""
    with open_to_read(path) as file:
        return read_stream_bounded(file, limit)


def open_to_read(path: str | os.PathLike[str]) -> BinaryIO:
    """`path` opened to read in binary, without waiting for a writer: a named pipe that nobody
    writes to reads as empty at once, where a plain `open` would wait for a writer forever. A
    pipe with a writer (a shell's `<(command)`) is read as usual, to its end."""
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        # Only the open must not wait: reads wait for the data as usual.
        os.set_blocking(descriptor, True)
        return os.fdopen(descriptor, "rb")
    except BaseException:
        os.close(descriptor)
        raise


def read_stream_bounded(stream: BinaryIO, limit: int) -> bytes:
    """What is left of `stream`, as `read_bounded` reads a file."""
    data = stream.read(limit + 1)
    if len(data) > limit:
        raise TooLarge(limit)
    return data


def read_text_bounded(path: str | os.PathLike[str], limit: int) -> str:
    """`read_bounded` as UTF-8 text (UnicodeDecodeError when it is not)."""
    return read_bounded(path, limit).decode("utf-8")
