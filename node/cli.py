"""The `xr` command line. Each subcommand is documented by `xr <command> --help`."""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import version

__all__ = ["main"]


def _demo(arguments: argparse.Namespace) -> int:
    from node.demo import run

    return run()


def _version(arguments: argparse.Namespace) -> int:
    print(f"xr {version('xr')}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="xr", description="xr: one control plane for accelerators in many regions."
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = commands.add_parser(
        "demo",
        help="run the demo scenario",
        description="Run a scripted multi-region scenario against the replicated core: regions "
        "join, a fenced lock changes hands, a job fails over to another region and resumes from "
        "its checkpoint, a zombie is fenced off, and replicas are shown to agree.",
    )
    demo.set_defaults(handler=_demo)
    show_version = commands.add_parser("version", help="print the version")
    show_version.set_defaults(handler=_version)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    arguments = parser.parse_args(argv)
    if arguments.command is None:
        parser.print_help()
        return 2
    code: int = arguments.handler(arguments)
    return code


if __name__ == "__main__":
    sys.exit(main())
