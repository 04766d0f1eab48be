"""The `xr` commands that run things on this machine rather than ask a cluster: `xr node run`,
`xr up`, `xr token hash`, `xr demo` and `xr version`."""

from __future__ import annotations

import json
import secrets
import sys
import tomllib
from collections.abc import Callable
from importlib.metadata import version as package_version
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from node.cli_common import EXIT_USAGE, CommandFailed, FiniteFloatRange
from node.files import (
    CONFIG_BYTES_MAX,
    SECRET_BYTES_MAX,
    TooLarge,
    read_stream_bounded,
    read_text_bounded,
)

if TYPE_CHECKING:
    from node.config import NodeConfig

__all__ = ["demo", "effective_settings", "node", "token", "up", "version"]

F = TypeVar("F", bound=Callable[..., Any])

# Flag -> setting, for the flags `xr node run` has always had; any setting also via --set.
_NODE_FLAGS = {
    "region": "region.name",
    "raft_address": "raft.address",
    "peers": "raft.peers",
    "http_address": "http.address",
    "data_dir": "data_dir",
    "cluster_secret_file": "raft.cluster_secret_file",
    "insecure": "raft.insecure",
}


def _name_value_pairs(
    context: click.Context, parameter: click.Parameter, items: tuple[str, ...]
) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for item in items:
        name, separator, value = item.partition("=")
        if not separator or not name.strip():
            raise click.BadParameter(f"{item!r} must be name=value")
        pairs[name.strip()] = value
    return pairs


def _set_option(*, meaning: str) -> Callable[[F], F]:
    return click.option(
        "--set",
        "settings",
        multiple=True,
        metavar="NAME=VALUE",
        callback=_name_value_pairs,
        help=f"{meaning} by its dotted name, e.g. --set http.wait_max_s=30 (repeatable).",
    )


@click.command()
@click.option("--quick", is_flag=True, help="A shorter run (about a minute), as CI runs it.")
@click.option(
    "--keep", is_flag=True, help="Keep the cluster running at the end until Ctrl-C (dashboard)."
)
@click.option(
    "--dir",
    "base_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Keep the regions' data and logs here (default: a temporary directory, removed).",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=FiniteFloatRange(min=10),
    default=600.0,
    show_default=True,
    help="Seconds the jobs may take before the demo gives up.",
)
def demo(quick: bool, keep: bool, base_dir: Path | None, timeout_s: float) -> int:
    """Start three regions, run a mix of jobs, kill a region half-way and watch failover.

    Real node processes on loopback with different prices, carbon and device speeds; a gemm
    benchmark, an fft array across regions and two training jobs of two tenants. The region
    running the high-priority training job is killed (-9) half-way; the job moves to a healthy
    region and resumes from its last committed checkpoint. Ends with a summary table.
    """
    from node.demo import DemoError, DemoOptions, run

    try:
        report = run(DemoOptions(quick=quick, keep=keep, base_dir=base_dir, timeout_s=timeout_s))
    except DemoError as error:
        click.echo(f"xr demo: {error}", err=True)
        return 1
    if not report.story_told:
        click.echo(f"xr demo: the story was not told in full: {report}", err=True)
        return 1
    return 0


@click.command()
def version() -> int:
    """Print the version."""
    click.echo(f"xr {package_version('xr')}")
    return 0


@click.group()
def node() -> None:
    """Run a region's node daemon."""


@node.command("run")
@click.option("--config", "config_path", metavar="FILE", help="TOML configuration file.")
@click.option("--region", help="Region name (region.name).")
@click.option("--raft-address", metavar="HOST:PORT", help="Address for Raft (raft.address).")
@click.option("--peers", metavar="ADDRESSES", help="Comma-separated Raft addresses of the others.")
@click.option("--http-address", metavar="HOST:PORT", help="Address for the API (http.address).")
@click.option("--data-dir", metavar="DIR", help="Data directory (data_dir).")
@click.option("--cluster-secret-file", metavar="FILE", help="File holding the cluster secret.")
@click.option(
    "--insecure",
    is_flag=True,
    default=None,
    help="Allow Raft off loopback without a cluster secret (raft.insecure; logged at every start).",
)
@_set_option(meaning="Any setting")
@click.option(
    "--check",
    is_flag=True,
    help="Validate the configuration, print the effective settings (secrets hidden) and exit.",
)
def node_run(config_path: str | None, settings: dict[str, str], check: bool, **flags: Any) -> int:
    """Run this region's node until SIGTERM or Ctrl-C.

    Settings come from the TOML file, then XR_* environment variables (the dotted name upper-cased
    with dots as underscores, e.g. XR_RAFT_ADDRESS), then the flags, later ones winning. An
    invalid configuration exits with code 2 and a message naming the setting.
    """
    from node.config import ConfigError, load_config

    overrides = {
        _NODE_FLAGS[name]: "true" if value is True else value
        for name, value in flags.items()
        if value is not None
    }
    overrides.update(settings)
    path = None if config_path is None else Path(config_path)
    try:
        config = load_config(path=path, overrides=overrides)
    except ConfigError as error:
        click.echo(f"xr node run: invalid configuration: {error}", err=True)
        return EXIT_USAGE
    if check:
        try:
            _check_files(config)
        except ConfigError as error:
            click.echo(f"xr node run: invalid configuration: {error}", err=True)
            return EXIT_USAGE
        click.echo(f"configuration is valid (region {config.region.name})")
        click.echo(_settings_table(config, path))
        import datetime

        from node.tls import certificate_warnings

        for warning in certificate_warnings(config.tls, datetime.datetime.now(datetime.UTC)):
            click.echo(f"xr node run: warning: {warning}", err=True)
        return 0
    from node.daemon import run

    return run(config)


def _check_files(config: NodeConfig) -> None:
    """What `run` reads or writes at start besides the configuration, checked without starting:
    the TLS files, the tokens file, the audit log's path, the data directory and, with
    `executor.job_user` or `executor.tenant_users`, that jobs can run as those users, so that a
    bad one shows in `--check` rather than at start (`ConfigError`)."""
    from node.api.audit import check_audit_path
    from node.api.auth import Authenticator
    from node.config import ConfigError
    from node.tls import client_context, server_context

    server_context(config.tls)
    client_context(config.tls)
    Authenticator(config.auth)
    if config.data_dir.exists() and not config.data_dir.is_dir():
        raise ConfigError(f"setting data_dir: {config.data_dir}: not a directory")
    from node.daemon import check_members

    check_members(config)
    if config.audit.enabled:
        try:
            check_audit_path(config.audit_path)
        except OSError as error:
            raise ConfigError(
                f"setting audit.path: {config.audit_path}: {error.strerror}"
            ) from None
    if not config.executor.enabled:
        return
    from node.executor.checkpoints import tenant_area
    from node.executor.executor import check_paths, worker_environment

    check_paths(config)
    from node.executor.job_user import Check, check_all, lookup
    from node.executor.sandbox_root import SandboxRoot

    named = (
        []
        if config.executor.job_user is None
        else [("executor.job_user", "", config.executor.job_user)]
    )
    named += [
        ("executor.tenant_users", tenant_area(tenant), name)
        for tenant, name in config.executor.tenant_users.items()
    ]
    checks = [
        Check(lookup(name, setting=setting), setting, config.checkpoint_dir / area)
        for setting, area, name in named
    ]
    root = SandboxRoot("xr-check-") if checks and config.executor.private_tmp else None
    try:
        check_all(
            checks,
            python=config.executor.python or sys.executable,
            environment_of=worker_environment,
            sandboxes=None if root is None else root.path,
            network=config.executor.private_network,
        )
    finally:
        if root is not None:
            root.close()


def effective_settings(config: NodeConfig, path: Path | None) -> list[tuple[str, str, str]]:
    """(setting, value, source) for every setting, secrets hidden. A setting's source is the
    flag or environment variable that set it, else the file that has it, else the default."""
    from node.config import RaftSection

    in_file = _file_settings(path)
    raft = config.raft
    values: dict[str, Any] = {"data_dir": str(config.data_dir)}
    for name in config.region.__struct_fields__:
        values[f"region.{name}"] = getattr(config.region, name)
    values["raft.address"] = raft.self_address
    values["raft.peers"] = list(raft.peers)
    values["raft.cluster_secret"] = "(hidden)" if raft.cluster_secret else "(not set)"
    # The timing settings: those of the file's [raft] section that RaftConfig carries as is.
    for name in RaftSection.__struct_fields__:
        if name not in ("address", "peers", "cluster_secret") and hasattr(raft, name):
            values[f"raft.{name}"] = getattr(raft, name)
    for name in config.http.__struct_fields__:
        values[f"http.{name}"] = getattr(config.http, name)
    for name in config.tls.__struct_fields__:
        values[f"tls.{name}"] = getattr(config.tls, name)
    # A token's digest is not the token, but it is all an attacker needs to test guesses.
    values["auth.tokens"] = [
        f"{token.name} (role {token.role}, tenant {token.tenant})" for token in config.auth.tokens
    ]
    values["auth.tokens_file"] = config.auth.tokens_file
    values["auth.open_health"] = config.auth.open_health
    for name in config.audit.__struct_fields__:
        values[f"audit.{name}"] = getattr(config.audit, name)
    for name in config.scheduler.__struct_fields__:
        values[f"scheduler.{name}"] = getattr(config.scheduler, name)
    for name in config.executor.__struct_fields__:
        values[f"executor.{name}"] = getattr(config.executor, name)
    for name in config.log.__struct_fields__:
        values[f"log.{name}"] = getattr(config.log, name)
    rows = []
    for name, value in values.items():
        source = config.sources.get(name)
        if source is None and name == "raft.cluster_secret":
            source = config.sources.get("raft.cluster_secret_file")
        if source is None or source == str(path):
            source = str(path) if name in in_file else "default"
        shown = value if isinstance(value, str) and value.startswith("(") else json.dumps(value)
        rows.append((name, shown, source))
    return rows


def _file_settings(path: Path | None) -> set[str]:
    """The dotted names a configuration file sets (it was read once already, so it parses)."""
    if path is None:
        return set()
    try:
        tree = tomllib.loads(read_text_bounded(path, CONFIG_BYTES_MAX))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return set()
    names: set[str] = set()
    for key, value in tree.items():
        if isinstance(value, dict):
            names.update(f"{key}.{name}" for name in value)
        else:
            names.add(key)
    if "raft.cluster_secret_file" in names:
        names.add("raft.cluster_secret")
    return names


def _settings_table(config: NodeConfig, path: Path | None) -> str:
    from node.cli_common import table

    return table(["SETTING", "VALUE", "SOURCE"], effective_settings(config, path))


def _region_names(
    context: click.Context, parameter: click.Parameter, names: tuple[str, ...]
) -> list[str]:
    from xrcore._validate import check_name
    from xrcore.errors import InvalidArgument

    for name in names:
        try:
            check_name("region name", name)
        except InvalidArgument as error:
            raise click.BadParameter(error.message) from None
        # Each region's data directory and log are named after it.
        if "/" in name:
            raise click.BadParameter(f"region name {name!r} must not contain '/' here")
    if len(set(names)) != len(names):
        raise click.BadParameter("each region name may be given once")
    return list(names)


@click.command()
@click.option(
    "--regions",
    "region_count",
    type=click.IntRange(1, 99),
    metavar="N",
    help="Number of regions, named r0, r1, ... [default 3].",
)
@click.option(
    "--region",
    "region_names",
    multiple=True,
    metavar="NAME",
    callback=_region_names,
    help="A region by name (repeatable), instead of --regions.",
)
@click.option(
    "--dir",
    "base_dir",
    metavar="DIR",
    type=click.Path(file_okay=False, path_type=Path),
    help="Keep data and logs here (kept at exit; running again restarts the same cluster). "
    "Default: a temporary directory removed at exit.",
)
@click.option(
    "--base-port",
    type=click.IntRange(1, 65535),
    metavar="PORT",
    help="API ports PORT, PORT+1, ...; Raft ports PORT+100, PORT+101, ... "
    "Default: free ports chosen by the system.",
)
@click.option("--keep-data", is_flag=True, help="Keep the temporary data directory at exit.")
@_set_option(meaning="A setting for every node")
@click.option(
    "--start-timeout",
    "start_timeout_s",
    type=FiniteFloatRange(min=0, min_open=True),
    default=60.0,
    show_default=True,
    metavar="SECONDS",
    help="How long every region has to become ready.",
)
def up(
    region_count: int | None,
    region_names: list[str],
    base_dir: Path | None,
    base_port: int | None,
    keep_data: bool,
    settings: dict[str, str],
    start_timeout_s: float,
) -> int:
    """Start a local cluster of regions and run it until Ctrl-C.

    Each region is an `xr node run` process on 127.0.0.1. Once every region is ready this prints
    a table of regions, API URLs, Raft addresses, logs and data directories, and the
    `export XR_ENDPOINTS=...` line for the other commands. Ctrl-C (or SIGTERM) stops every node
    cleanly; a node that fails to start shows its log and stops the rest (exit code 1). A `--set`
    the nodes would refuse (or any tls.* one: it starts no TLS nodes), a port something already
    listens on, or a `--dir` no file can be made in, exits 2 before any node starts.
    """
    from node.up import UpError, UpOptions, run_up

    if region_count is not None and region_names:
        raise click.UsageError("give --regions or --region, not both")
    names = region_names or [f"r{position}" for position in range(region_count or 3)]
    up_options = UpOptions(
        region_names=names,
        base_dir=base_dir,
        base_port=base_port,
        keep_data=keep_data,
        settings=settings,
        start_timeout_s=start_timeout_s,
    )
    try:
        return run_up(up_options, echo=click.echo, warn=lambda line: click.echo(line, err=True))
    except UpError as error:
        raise CommandFailed("up.invalid", str(error), exit_code=EXIT_USAGE) from None


@click.group()
def token() -> None:
    """Make bearer tokens for the nodes' configuration."""


@token.command("hash")
@click.option(
    "--generate", is_flag=True, help="Make a new random token instead of reading one from stdin."
)
@click.option("--name", default="NAME", show_default=True, help="Token name for the snippet.")
@click.option(
    "--role",
    type=click.Choice(["admin", "operator", "tenant"]),
    default="tenant",
    show_default=True,
    help="Role for the snippet.",
)
@click.option("--tenant", default="default", show_default=True, help="Tenant for the snippet.")
def token_hash(generate: bool, name: str, role: str, tenant: str) -> int:
    """Print the SHA-256 of a token, the form the node configuration stores.

    Reads the token from stdin (prompting without echo on a terminal), or makes a new random one
    with --generate and prints it once: only its digest goes into the configuration, so keep
    the token itself where the clients read it (XR_TOKEN or --token-file). The first line of the
    output is the digest alone; the rest is a snippet for the node configuration.
    """
    from node.config import hash_token

    _check_token_fields(name=name, role=role, tenant=tenant)
    if generate:
        secret = secrets.token_urlsafe(32)
    elif sys.stdin is None:
        raise click.UsageError("there is no standard input to read the token from (--generate?)")
    elif sys.stdin.isatty():
        secret = click.prompt("token", hide_input=True, err=True).strip()
    else:
        try:
            secret = read_stream_bounded(sys.stdin.buffer, SECRET_BYTES_MAX).decode().strip()
        except TooLarge as error:
            raise click.UsageError(f"the token on stdin is {error.strerror}") from None
        except UnicodeDecodeError:
            raise click.UsageError("the token on stdin is not UTF-8 text") from None
    if not secret:
        raise click.UsageError("no token on stdin; pipe one in, or use --generate")
    digest = hash_token(secret)
    click.echo(digest)
    if generate:
        click.echo(f"# the token (shown once; give it to the clients): {secret}")
    # JSON strings are valid TOML basic strings, quotes and escapes included.
    click.echo(
        "# for the node configuration:\n"
        "# (in a tokens file, auth.tokens_file, the table is [[tokens]] instead)\n"
        f"[[auth.tokens]]\nname = {json.dumps(name)}\n"
        f'sha256 = "{digest}"\nrole = "{role}"\ntenant = {json.dumps(tenant)}'
    )
    return 0


def _check_token_fields(*, name: str, role: str, tenant: str) -> None:
    """Refuses, as a usage error, a name, role or tenant the node would refuse in the snippet:
    by the check the node's configuration loader makes of `auth.tokens`, and an empty name as the
    tokens file's loader refuses it. Before any token is read or made, so nothing is printed."""
    import msgspec

    from node.config import AuthConfig, ConfigError, TokenConfig
    from node.config import _check_auth as check_auth

    if not name:
        raise click.BadParameter("must not be empty", param_hint="--name")
    # Any well-formed digest: only the fields given on the command line are checked here.
    document = {"name": name, "sha256": "0" * 64, "role": role, "tenant": tenant}
    try:
        check_auth(AuthConfig(tokens=[msgspec.convert(document, TokenConfig)]))
    except msgspec.ValidationError as error:
        raise click.UsageError(f"the token's {error}") from None
    except ConfigError as error:
        # "setting auth.tokens.0.tenant: ..." names the field, which is the flag's name.
        where, _, problem = str(error).partition(": ")
        raise click.BadParameter(problem, param_hint=f"--{where.rpartition('.')[2]}") from None
