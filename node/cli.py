"""The `xr` command line: run a node or a local cluster, and talk to a cluster.

Each command is documented by `xr <command> --help` and docs/cli.md gives a tour. The commands
live by topic in `node/cli_*.py`; this module assembles them and turns every failure into an exit
code (see `node.cli_common`): 0 success, 1 a definite error, 2 a usage error, 3 an indefinite
error (the request may have taken effect), 130 Ctrl-C. A failure prints one line,
`xr: <code>: <message>`, on stderr; a bad input or an unreachable cluster never prints a
traceback.
"""

from __future__ import annotations

import contextlib
import os
import sys

import click

from node.cli_cluster import cluster, region
from node.cli_common import (
    EXIT_DEFINITE,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    CommandFailed,
    error_line,
    exit_code_for,
)
from node.cli_job import job
from node.cli_kv import kv
from node.cli_lock import lock, session
from node.cli_node import demo, node, token, up, version
from node.cli_snapshot import snapshot
from node.cli_tenant import tenant
from node.cli_tls import tls

__all__ = ["main", "xr"]

# 128 + SIGPIPE, as a shell reports a command whose reader went away (`xr kv ls | head`).
_EXIT_BROKEN_PIPE = 141
# How much of a bad argument an error shows.
_SHOWN_CHARACTERS_MAX = 60


@click.group(
    invoke_without_command=True,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.pass_context
def xr(context: click.Context) -> None:
    """xr: one control plane for accelerators in many regions.

    Start a local cluster with `xr up`, then use the other commands with the endpoints it
    prints (XR_ENDPOINTS). Every client command takes --endpoints, --token, --token-file,
    --config, --json, --timeout, and --ca-file, --cert-file and --key-file for TLS.
    """
    if context.invoked_subcommand is None:
        click.echo(context.get_help())
        context.exit(EXIT_USAGE)


for command in (up, kv, lock, session, job, region, cluster, tenant, token, node, demo, version):
    xr.add_command(command)
xr.add_command(tls)
xr.add_command(snapshot)


def main(argv: list[str] | None = None) -> int:
    """Runs one `xr` command and returns its exit code (never raises for a failed request)."""
    from xrcore.errors import XrError

    arguments = sys.argv[1:] if argv is None else argv
    if sys.stdout is None:
        # Started with stdout closed (`>&-`): what a command prints would be lost unseen.
        click.echo(error_line("usage", "standard output is closed"), err=True)
        return EXIT_USAGE
    # Python passes an argument that is not UTF-8 on as text with surrogate escapes, which no
    # request can carry. The command of `xr lock run` (after `--`) may hold any bytes.
    for argument in arguments[: arguments.index("--") if "--" in arguments else None]:
        if not _is_utf8(argument):
            click.echo(error_line("usage", f"argument {_shown(argument)} is not UTF-8"), err=True)
            return EXIT_USAGE
    try:
        result = xr.main(args=arguments, prog_name="xr", standalone_mode=False)
    except (click.exceptions.Abort, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    except click.ClickException as error:
        error.show()
        return error.exit_code
    except XrError as error:
        click.echo(error_line(error.code, error.message), err=True)
        return exit_code_for(definite=error.definite)
    except CommandFailed as error:
        click.echo(error_line(error.code, error.message), err=True)
        return error.exit_code
    except UnicodeEncodeError as error:
        # Text that is not UTF-8 from elsewhere: the environment, stdin, or after `--`.
        if not isinstance(error.object, str) or error.reason != "surrogates not allowed":
            raise
        click.echo(error_line("usage", f"text {_shown(error.object)} is not UTF-8"), err=True)
        return EXIT_USAGE
    except BrokenPipeError:
        _discard_output()
        return _EXIT_BROKEN_PIPE
    except OSError as error:
        # Output that cannot be written (`> /dev/full`, a full disk, an I/O error); the
        # commands name the files they read and write themselves.
        try:
            sys.stdout.flush()
        except OSError:
            _discard_output()
        what = "cannot write the output" if error.filename is None else str(error.filename)
        reason = error.strerror or str(error)
        click.echo(error_line("io.failed", f"{what}: {reason}"), err=True)
        return EXIT_DEFINITE
    return result if isinstance(result, int) else 0


def _discard_output() -> None:
    """Points stdout at /dev/null: Python would fail again when it flushes stdout at exit."""
    with contextlib.suppress(OSError, ValueError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _is_utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _shown(text: str) -> str:
    """Text that is not UTF-8 as the bytes it came from, e.g. b'key\\xff', cut short."""
    cut = text[:_SHOWN_CHARACTERS_MAX]
    try:
        return repr(cut.encode(errors="surrogateescape"))
    except UnicodeEncodeError:
        # A lone surrogate that no byte decodes to (from a JSON escape, say).
        return ascii(cut)


if __name__ == "__main__":
    sys.exit(main())
