"""The `xr` command line. Each subcommand is documented by `xr <command> --help`."""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import version

__all__ = ["main"]


def _demo(arguments: argparse.Namespace) -> int:
    from node.demo import run

    return run()


def _node_run(arguments: argparse.Namespace) -> int:
    from pathlib import Path

    from node.config import ConfigError, load_config
    from node.daemon import run

    overrides: dict[str, str] = {}
    for name, setting in (
        ("region", "region.name"),
        ("raft_address", "raft.address"),
        ("peers", "raft.peers"),
        ("http_address", "http.address"),
        ("data_dir", "data_dir"),
        ("cluster_secret_file", "raft.cluster_secret_file"),
    ):
        value = getattr(arguments, name)
        if value is not None:
            overrides[setting] = value
    for item in arguments.set or []:
        setting, separator, value = item.partition("=")
        if not separator:
            print(f"xr node run: --set {item!r} must be name=value", file=sys.stderr)
            return 2
        overrides[setting.strip()] = value
    try:
        config = load_config(
            path=None if arguments.config is None else Path(arguments.config),
            overrides=overrides,
        )
    except ConfigError as error:
        print(f"xr node run: invalid configuration: {error}", file=sys.stderr)
        return 2
    return run(config)


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
    node = commands.add_parser("node", help="run a region's node daemon")
    node_commands = node.add_subparsers(dest="node_command", metavar="COMMAND", required=True)
    node_run = node_commands.add_parser("run", help="run this region's node")
    node_run.add_argument("--config", help="TOML configuration file")
    node_run.add_argument("--region", help="region name (region.name)")
    node_run.add_argument("--raft-address", help="host:port for Raft (raft.address)")
    node_run.add_argument("--peers", help="comma-separated Raft addresses of the other nodes")
    node_run.add_argument("--http-address", help="host:port for the API (http.address)")
    node_run.add_argument("--data-dir", help="data directory (data_dir)")
    node_run.add_argument("--cluster-secret-file", help="file holding the cluster secret")
    node_run.add_argument(
        "--set",
        action="append",
        metavar="NAME=VALUE",
        help="any setting, e.g. --set http.wait_max_s=30",
    )
    node_run.set_defaults(handler=_node_run)
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
