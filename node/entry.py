"""The `xr` command's entry point: `node.cli`, imported here so that a Ctrl-C while Python
imports it (click, aiohttp and the rest take a few tenths of a second) ends the command with
130, as Ctrl-C does at any later moment, instead of a KeyboardInterrupt traceback."""

from __future__ import annotations

__all__ = ["main"]

EXIT_INTERRUPTED = 130


def main() -> int:
    try:
        from node.cli import main as cli_main
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    return cli_main()
