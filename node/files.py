"""Reading the small files a user names: configurations, token tables, tokens, secrets,
certificates, and a value piped to `xr kv put KEY -`.

Each is read up to a bound and refused past it, so that a path to a device that never ends
(`/dev/zero`, `/dev/urandom`) or a file far larger than any such file is refused at once,
instead of being read into memory until the process runs out of it.
"""

from __future__ import annotations

import errno
import os
from typing import BinaryIO

__all__ = [
    "CONFIG_BYTES_MAX",
    "SECRET_BYTES_MAX",
    "TooLarge",
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
    with open(path, "rb") as file:
        return read_stream_bounded(file, limit)


def read_stream_bounded(stream: BinaryIO, limit: int) -> bytes:
    """What is left of `stream`, as `read_bounded` reads a file."""
    data = stream.read(limit + 1)
    if len(data) > limit:
        raise TooLarge(limit)
    return data


def read_text_bounded(path: str | os.PathLike[str], limit: int) -> str:
    """`read_bounded` as UTF-8 text (UnicodeDecodeError when it is not)."""
    return read_bounded(path, limit).decode("utf-8")
