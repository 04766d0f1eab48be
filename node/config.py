"""The node's configuration: one TOML file, overridden by `XR_*` environment variables, overridden
by command-line flags.

Every setting has a dotted name (`raft.address`, `http.body_bytes_max`); the environment variable
is that name upper-cased with dots as underscores and an `XR_` prefix (`XR_RAFT_ADDRESS`), and any
setting can be given as a flag with `--set raft.address=127.0.0.1:7001`. Lists in the environment
or in `--set` are comma-separated. An invalid setting stops the node at start with a message that
names the setting and the value (`ConfigError`); secrets are never echoed.
"""

from __future__ import annotations

import hashlib
import math
import os
import pwd
import tomllib
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

import msgspec

from node.files import CONFIG_BYTES_MAX, SECRET_BYTES_MAX, read_text_bounded
from raftstore.config import RaftConfig
from xrcore._validate import check_name
from xrcore.errors import InvalidArgument
from xrcore.jobs import SPEED_MAX, SPEED_MIN

__all__ = [
    "ROLES",
    "AuditConfig",
    "AuthConfig",
    "ConfigError",
    "ExecutorConfig",
    "HttpConfig",
    "NodeConfig",
    "RegionConfig",
    "TlsConfig",
    "TokenConfig",
    "hash_token",
    "load_config",
]

Role = Literal["admin", "operator", "tenant"]
ROLES: tuple[str, ...] = ("admin", "operator", "tenant")
ENV_PREFIX = "XR_"
# Names that never appear in messages or in the status API.
_SECRET_SETTINGS = frozenset({"raft.cluster_secret"})


class ConfigError(Exception):
    """The configuration is invalid; the message names the setting and the value."""


def hash_token(token: str) -> str:
    """The form a bearer token is stored in the configuration: its SHA-256, hex."""
    return hashlib.sha256(token.encode()).hexdigest()


class RegionConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: str
    provider: str = ""
    price_per_gpu_hour: float = 0.0
    carbon_g_per_kwh: float = 0.0
    # Tasks that run without a GPU at once (in CPU mode, every task).
    cpu_slots: int = 2
    labels: dict[str, str] = {}
    # Round-trip times to other regions, by region name, as the operator knows them (or as
    # `xr demo` simulates them): the scheduler's cost of moving data and checkpoints.
    rtt_ms: dict[str, float] = {}


def _raft_default(name: str) -> Any:
    """RaftConfig's default for a setting: one place defines (and explains) each Raft timing."""
    return RaftConfig.__dataclass_fields__[name].default


class RaftSection(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    address: str
    peers: list[str] = []
    cluster_secret: str | None = None
    cluster_secret_file: str | None = None
    bind_address: str | None = None
    # Let Raft listen or connect off loopback without a cluster secret (the `--insecure` flag):
    # anyone who reaches the port can then pose as a member and rewrite the cluster's state.
    # Logged at every start.
    insecure: bool = False
    # "write": a write is acknowledged once a majority has it in its journal file (the page
    # cache: it survives a crash of the process, not a power loss of a majority). "fsync": the
    # journal is synced to disk before the write is acknowledged.
    durability: Literal["write", "fsync"] = _raft_default("durability")
    # With "fsync" on Linux: a helper process syncs the journal while the node goes on serving;
    # false syncs in line, stopping the node's event loop for each sync (docs/durability.md).
    background_sync: bool = _raft_default("background_sync")
    # Syncs run off the loop only while they take at least this long on average (0: always).
    background_sync_min_ms: float = _raft_default("background_sync_min_ms")
    raft_min_timeout_s: float = _raft_default("raft_min_timeout_s")
    raft_max_timeout_s: float = _raft_default("raft_max_timeout_s")
    append_entries_period_s: float = _raft_default("append_entries_period_s")
    leader_fallback_timeout_s: float = _raft_default("leader_fallback_timeout_s")
    connection_timeout_s: float = _raft_default("connection_timeout_s")
    connection_retry_time_s: float = _raft_default("connection_retry_time_s")
    log_compaction_min_entries: int = _raft_default("log_compaction_min_entries")
    log_compaction_min_time_s: float = _raft_default("log_compaction_min_time_s")
    pre_vote: bool = _raft_default("pre_vote")
    lease_tick_interval_s: float = _raft_default("lease_tick_interval_s")
    proposals_in_flight_max: int = _raft_default("proposals_in_flight_max")
    propose_timeout_s: float = _raft_default("propose_timeout_s")


class HttpConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    address: str = "127.0.0.1:8700"
    # The address other nodes and clients reach this one at (defaults to `address`).
    advertise_address: str | None = None
    body_bytes_max: int = 1 << 20
    # The longest a request may wait: lock waits, long-poll watches, job waits.
    wait_max_s: float = 60.0
    # Requests waiting on a lock, a watch or a job at once; beyond it 429.
    waiting_requests_max: int = 1_000
    # Of those, one tenant's at most (with authentication on): one tenant holding every place
    # left the others none.
    waiting_requests_per_tenant_max: int = 250
    # A lock wait that ends without a grant, or whose client went away, takes its session out
    # of the queue with `lock.leave`, which never releases a grant the session got meanwhile
    # (through another node its client retried on). False: the earlier `lock.release`, which
    # can; set false on every node while any runs a version without `lock.leave`
    # (docs/operations.md, "Upgrades").
    lock_leave_command: bool = True
    # Requests being handled at once (besides health checks and waiting requests, which have
    # their own bound); beyond it 429 with Retry-After, so admitted requests keep a bounded
    # latency under overload.
    requests_in_flight_max: int = 256
    # Server-Sent Event streams open at once, and one tenant's at most (with authentication on).
    streams_max: int = 200
    streams_per_tenant_max: int = 50
    # An event stream one of whose writes waits this long for its client to take data is closed:
    # a client that keeps its connection but stops reading would hold a stream's place for ever.
    stream_write_timeout_s: float = 30.0
    # How long a request's body may take to arrive once the node reads it; beyond it 408
    # request.body_timeout (a body sent slowly, or announced and not sent, would hold a place
    # among the requests in flight).
    request_timeout_s: float = 10.0
    # Request bodies being received at once. A body is received before its request is counted
    # among those in flight, so a slow upload holds no place there; this bounds the memory the
    # bodies take (each at most `body_bytes_max`); beyond it 429 with Retry-After.
    bodies_arriving_max: int = 256
    # A connection with no request being handled is closed after this long without one: idle
    # between requests, or still sending its request's headers (a slow client holding a
    # connection open byte by byte). aiohttp's own default is about an hour.
    idle_timeout_s: float = 75.0
    # Connections open at once; beyond it a new one is answered 429 and closed
    # (`node.api.connections`). 0: the descriptor limit (raised toward the hard limit, up to
    # 65,536) less what the rest of the node needs.
    connections_max: int = 0
    # Seconds to finish in-flight requests on SIGTERM before closing.
    shutdown_grace_s: float = 10.0


class TlsConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """TLS for the HTTP API. With `cert_file` and `key_file` the node serves https only."""

    # PEM files: this node's certificate (with its chain) and private key.
    cert_file: str | None = None
    key_file: str | None = None
    # PEM file of the CA that signs the nodes' and the clients' certificates: verifies client
    # certificates, and the other nodes when this node forwards a request to one of them.
    ca_file: str | None = None
    # Client certificates: "none" (not asked for), "optional" (verified when sent), "required"
    # (mutual TLS: a caller without a certificate the CA signed is refused in the handshake).
    client_certs: Literal["none", "optional", "required"] = "none"


class AuditConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The audit log: one JSON line per write request (who, what, when, result)."""

    enabled: bool = True
    # Default: <data_dir>/audit/audit.log.
    path: str | None = None
    # The file is rotated at this size; at most files_max files are kept in all: the live one and
    # files_max - 1 rotated ones (the oldest deleted).
    bytes_max: int = 64 << 20
    files_max: int = 5


class TokenConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: str
    # SHA-256 of the bearer token, hex (`xr token hash` prints it); the token itself is never
    # stored in the configuration.
    sha256: str
    role: Role = "tenant"
    tenant: str = "default"


class AuthConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    # No tokens: authentication is off and every caller is an admin of tenant "default" (a local
    # development cluster). With tokens, every request needs one.
    tokens: list[TokenConfig] = []
    # A TOML file of more tokens (`[[tokens]]` tables, as above), read at start and again
    # whenever it changes or the node gets SIGHUP: tokens are added, rotated and revoked without
    # a restart. An invalid file is refused with a logged error and the previous tokens stay.
    tokens_file: str | None = None
    # Leave /healthz, /readyz and /metrics open to callers without a token.
    open_health: bool = True


class ExecutorConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    # Run tasks in this region (a control-plane-only node sets false).
    enabled: bool = True
    # A directory every region reaches (a shared mount; one local directory for `xr up`).
    # Default: <data_dir>/checkpoints, which only suits a single machine.
    checkpoint_dir: str | None = None
    # An attempt's lease: a task whose region stops renewing it for this long moves elsewhere.
    lease_ttl_s: float = 10.0
    # Tasks are polled for and claimed this often.
    poll_interval_s: float = 0.5
    # A region that cannot reach a quorum keeps its tasks running (their leases are frozen with
    # replicated time); after this long without contact it stops them to free its devices.
    contact_lost_limit_s: float = 300.0
    # Cancellation and lost leases: SIGTERM, then SIGKILL after this grace.
    kill_grace_s: float = 10.0
    # Captured stdout and stderr per attempt; beyond it the oldest half is dropped.
    log_bytes_max: int = 1 << 20
    # Retry backoff after a failed attempt: base * 2^(failures - 1), at most max.
    retry_backoff_base_s: float = 1.0
    retry_backoff_max_s: float = 60.0
    # Run every job as this OS user (a name), with its primary group and its own supplementary
    # groups, so that a job, which is a tenant's code, cannot read the node's files (the cluster
    # secret, the tokens file, the data directory). The node must run as root; it checks at
    # start that the user can run `executor.python` and write in the checkpoint directory
    # (docs/security.md). Default: the node's own user.
    job_user: str | None = None
    # Tenants whose jobs run as an OS user of their own, tenant name = user name: a tenant's
    # checkpoint area is then that user's alone (mode 0700), and its workers cannot signal or
    # read other tenants' (docs/security.md, "A user per tenant"). Other tenants' jobs run as
    # job_user, or as the node's user. The node must run as root, and each user must have the
    # same uid in every region (the checkpoint directory is shared).
    tenant_users: dict[str, str] = {}
    # Workers started as job_user or a tenant's user get /tmp, /var/tmp and /dev/shm of their
    # own, in a mount namespace per attempt (files a job leaves there are not seen by others and
    # go with the attempt; docs/security.md, "Temporary files"). Needs mount namespaces: set
    # false where the node may not make them (a container without CAP_SYS_ADMIN); the node's
    # start-up check says so.
    private_tmp: bool = True
    # With private_tmp, each worker's /dev/shm (a tmpfs of its own) holds at most this many
    # bytes (rounded up to whole pages), as Docker's --shm-size. Default: as much as the
    # machine's /dev/shm, for each worker (their pages count against the node's cgroup).
    shm_bytes_max: int | None = None
    # With private_tmp, workers started as job_user or a tenant's user also get a network of
    # their own: loopback alone, so no connection leaves the worker, not to another machine,
    # not to the node's API or Raft ports, not to another job (docs/security.md, "Network").
    # For jobs that need no network; the node needs CAP_NET_ADMIN too.
    private_network: bool = False
    # With private_tmp, a worker whose /tmp and /var/tmp together hold more than this many
    # bytes on disk (blocks, as du counts them) is stopped and its task fails, not retried,
    # saying so: a job cannot fill the disk under the machine's temporary directory (the
    # node's data directory is often on it). Checked every tmp_check_interval_s, as
    # Kubernetes checks a pod's ephemeral storage, so a job may pass it for that long.
    # Default: no bound.
    tmp_bytes_max: int | None = None
    tmp_check_interval_s: float = 10.0
    # The Python interpreter that runs the workers. Default: the node's own. With job_user, one
    # that user can run and import xr and its dependencies with.
    python: str | None = None


class SchedulerConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The leader's scheduling policy (`xrcore.scheduler`). Only the leader schedules, so a
    region with other values changes the policy while it leads, never the replicated state's
    consistency; keep them the same everywhere."""

    # A running task is preempted only after it has run this long (no preemption storms).
    preemption_min_run_s: float = 120.0
    # A preempted task has this long to checkpoint and stop before it is ended at once.
    preemption_grace_s: float = 60.0
    # Tasks preempted in one pass, at most.
    preemptions_max: int = 4
    # Run time assumed for an entrypoint with no completed run yet (long: a short wrong guess
    # would let backfill delay the head of the queue).
    default_estimate_s: float = 3600.0
    # How many seconds of completion time $1 (and 1 kg of CO2) is worth, before each tenant's
    # cost and carbon weights.
    seconds_per_dollar: float = 600.0
    seconds_per_kg_carbon: float = 600.0
    # Moving up (docs/scheduler.md, step 6): at most this many running tasks move to a faster
    # region at once (0: never; keep 0 while upgrading from a version without it, which cannot
    # read the passes that carry it), each after this long in its attempt, when it saves at least
    # this long and this fraction of its estimated rest.
    move_ups_max: int = 4
    move_up_min_run_s: float = 600.0
    move_up_saving_min_s: float = 3600.0
    move_up_saving_fraction: float = 0.3
    # Moving aside (docs/scheduler.md, step 7): a running task that may run elsewhere makes way
    # for a waiting task that may run only in its region, moving to one no faster, when
    # it loses at most this long by moving (within `move_ups_max`).
    move_aside: bool = True
    move_aside_loss_max_s: float = 600.0
    # Pending tasks one pass looks at, at most, shared between the (priority, tenant) queues
    # (`xrcore.placement._in_view`): the pass runs on the thread that runs Raft.
    pass_pending_max: int = 10_000


class LogConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    json: bool = False
    level: Literal["debug", "info", "warning", "error"] = "info"


class _File(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    data_dir: str
    region: RegionConfig
    raft: RaftSection
    http: HttpConfig = HttpConfig()
    tls: TlsConfig = TlsConfig()
    auth: AuthConfig = AuthConfig()
    audit: AuditConfig = AuditConfig()
    executor: ExecutorConfig = ExecutorConfig()
    scheduler: SchedulerConfig = SchedulerConfig()
    log: LogConfig = LogConfig()


@dataclass(frozen=True, kw_only=True)
class NodeConfig:
    data_dir: Path
    region: RegionConfig
    raft: RaftConfig
    http: HttpConfig
    auth: AuthConfig
    executor: ExecutorConfig
    log: LogConfig
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    tls: TlsConfig = field(default_factory=TlsConfig)
    audit: AuditConfig = field(default_factory=AuditConfig)
    # Where the settings came from, for `xr node run --check` and the logs (secrets left out).
    sources: dict[str, str] = field(default_factory=dict)

    @property
    def http_advertise_address(self) -> str:
        return self.http.advertise_address or self.http.address

    @property
    def http_scheme(self) -> str:
        return "https" if self.tls.cert_file else "http"

    @property
    def audit_path(self) -> Path:
        return Path(self.audit.path) if self.audit.path else self.data_dir / "audit" / "audit.log"

    @property
    def checkpoint_dir(self) -> Path:
        configured = self.executor.checkpoint_dir
        return Path(configured) if configured else self.data_dir / "checkpoints"


def _split_list(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = tree
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"setting {dotted!r}: {part!r} is not a section")
        node = child
    node[parts[-1]] = value


def _known_settings() -> dict[str, Any]:
    """Every dotted setting name and its type, from the file's structure."""
    known: dict[str, Any] = {"data_dir": str}
    sections = (
        RegionConfig,
        RaftSection,
        HttpConfig,
        TlsConfig,
        AuthConfig,
        AuditConfig,
        ExecutorConfig,
        SchedulerConfig,
        LogConfig,
    )
    for section in sections:
        name = {
            RegionConfig: "region",
            RaftSection: "raft",
            HttpConfig: "http",
            TlsConfig: "tls",
            AuthConfig: "auth",
            AuditConfig: "audit",
            ExecutorConfig: "executor",
            SchedulerConfig: "scheduler",
            LogConfig: "log",
        }[section]
        for item in msgspec.structs.fields(section):
            known[f"{name}.{item.name}"] = item.type
    return known


def _coerce_text(dotted: str, text: str, kind: Any) -> Any:
    """A setting given as text (environment, --set) in the shape the file would have."""
    if kind is list or getattr(kind, "__origin__", None) is list:
        return _split_list(text)
    if dotted in ("region.labels", "region.rtt_ms", "executor.tenant_users"):
        pairs: dict[str, str] = {}
        for pair in _split_list(text):
            key, separator, value = pair.partition("=")
            if not separator:
                raise ConfigError(f"setting {dotted}: {pair!r} must be key=value")
            pairs[key.strip()] = value.strip()
        if dotted != "region.rtt_ms":
            return pairs
        try:
            return {key: float(value) for key, value in pairs.items()}
        except ValueError:
            raise ConfigError(
                f"setting {dotted}: round-trip times must be numbers ({text!r})"
            ) from None
    return text


def _describe(dotted: str, value: Any) -> str:
    return "(hidden)" if dotted in _SECRET_SETTINGS else repr(value)


def load_config(
    *,
    path: Path | None = None,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, str] | None = None,
) -> NodeConfig:
    """Reads the file, then the environment, then `overrides` (flags), later ones winning."""
    tree: dict[str, Any] = {}
    sources: dict[str, str] = {}
    if path is not None:
        try:
            tree = tomllib.loads(read_text_bounded(path, CONFIG_BYTES_MAX))
        except OSError as error:
            raise ConfigError(f"cannot read config file {path}: {error.strerror}") from None
        except UnicodeDecodeError:
            raise ConfigError(f"config file {path} is not UTF-8 text") from None
        except tomllib.TOMLDecodeError as error:
            raise ConfigError(f"config file {path} is not valid TOML: {error}") from None
        sources = {name: str(path) for name in tree}
    known = _known_settings()
    environ = os.environ if environ is None else environ
    for dotted, kind in known.items():
        variable = ENV_PREFIX + dotted.upper().replace(".", "_")
        if variable in environ:
            _set_dotted(tree, dotted, _coerce_text(dotted, environ[variable], kind))
            sources[dotted] = variable
    for dotted, text in (overrides or {}).items():
        if dotted not in known:
            raise ConfigError(
                f"unknown setting {dotted!r}; known settings: {', '.join(sorted(known))}"
            )
        _set_dotted(tree, dotted, _coerce_text(dotted, text, known[dotted]))
        sources[dotted] = "flag"
    return _build(tree, sources)


def _choices(dotted: str) -> tuple[str, ...] | None:
    """The values a setting of a `Literal` type may take, or None for any other setting."""
    kind: Any = _File
    for part in dotted.split("."):
        try:
            kind = typing.get_type_hints(kind)[part]
        except (KeyError, TypeError):
            return None
    if typing.get_origin(kind) is not Literal:
        return None
    return tuple(str(choice) for choice in typing.get_args(kind))


def _build(tree: dict[str, Any], sources: dict[str, str]) -> NodeConfig:
    try:
        parsed = msgspec.convert(tree, _File, strict=False)
    except msgspec.ValidationError as error:
        message = str(error)
        # msgspec says "... - at `$.raft.address`"; turn the path into the setting's name.
        detail, _, where = message.partition(" - at `$.")
        where = where.rstrip("`")
        # A table's entries are `[...]` to msgspec, which does not name the key.
        in_entry = "[...]" in where
        dotted = where.replace("[...]", "").replace("[", ".").replace("]", "")
        if dotted:
            value = _MISSING if in_entry else _lookup(tree, dotted)
            # A table is not shown: it may hold a secret (raft, a token), and the detail
            # names the field that is wrong.
            shown = (
                ""
                if value is _MISSING or isinstance(value, dict | list)
                else f" (got {_describe(dotted, value)})"
            )
            entry = " in one of its entries" if in_entry else ""
            choices = _choices(dotted) if detail.startswith("Invalid enum value") else None
            if choices is not None:
                # msgspec names the value, which `shown` names again, and not the choices.
                detail = f"must be one of {', '.join(choices)}"
            raise ConfigError(f"setting {dotted}{entry}: {detail}{shown}") from None
        raise ConfigError(f"configuration: {detail}") from None
    _check_numbers(parsed)
    if not parsed.data_dir.strip():
        raise ConfigError("setting data_dir: must not be empty")
    secret = parsed.raft.cluster_secret
    if parsed.raft.cluster_secret_file is not None:
        if secret is not None:
            raise ConfigError("set raft.cluster_secret or raft.cluster_secret_file, not both")
        try:
            secret = read_text_bounded(parsed.raft.cluster_secret_file, SECRET_BYTES_MAX).strip()
        except OSError as error:
            raise ConfigError(
                f"setting raft.cluster_secret_file: cannot read "
                f"{parsed.raft.cluster_secret_file!r}: {error.strerror}"
            ) from None
        except UnicodeDecodeError:
            raise ConfigError(
                f"setting raft.cluster_secret_file: {parsed.raft.cluster_secret_file!r} is not "
                "UTF-8 text"
            ) from None
        if not secret:
            raise ConfigError(
                f"setting raft.cluster_secret_file: {parsed.raft.cluster_secret_file!r} is "
                "empty; a cluster secret must not be empty (leave the setting out for none)"
            )
    elif secret is not None and not secret.strip():
        raise ConfigError(
            "setting raft.cluster_secret: must not be empty (leave the setting out for none)"
        )
    if secret:
        _check_cluster_secret(
            "raft.cluster_secret_file"
            if parsed.raft.cluster_secret_file is not None
            else "raft.cluster_secret",
            secret,
        )
    data_dir = Path(parsed.data_dir)
    raft_fields = {item.name for item in fields(RaftConfig)}
    timing = {
        name: getattr(parsed.raft, name)
        for name in parsed.raft.__struct_fields__
        if name in raft_fields and name not in ("cluster_secret", "peers")
    }
    _check_address("raft.address", parsed.raft.address)
    for peer in parsed.raft.peers:
        _check_address("raft.peers", peer)
    try:
        raft = RaftConfig(
            self_address=parsed.raft.address,
            peers=tuple(parsed.raft.peers),
            data_dir=data_dir / "raft",
            cluster_secret=secret or None,
            **timing,
        )
    except InvalidArgument as error:
        raise ConfigError(f"setting {error}") from None
    _check_http(parsed.http)
    raft_port = parsed.raft.address.rpartition(":")[2]
    if parsed.http.address.rpartition(":")[2] == raft_port:
        # pysyncobj listens on every interface at the Raft port, whatever the host part says.
        raise ConfigError(
            f"setting http.address: {parsed.http.address!r} uses port {raft_port}, which "
            f"raft.address ({parsed.raft.address!r}) takes on every interface"
        )
    _check_tls(parsed.tls)
    _check_audit(parsed.audit)
    _check_region(parsed.region)
    _check_auth(parsed.auth)
    _check_executor(parsed.executor)
    _check_scheduler(parsed.scheduler)
    return NodeConfig(
        data_dir=data_dir,
        region=parsed.region,
        raft=raft,
        http=parsed.http,
        auth=parsed.auth,
        executor=parsed.executor,
        log=parsed.log,
        scheduler=parsed.scheduler,
        tls=parsed.tls,
        audit=parsed.audit,
        sources=sources,
    )


# A cluster secret shorter than this is refused: pysyncobj derives the Raft traffic's key from
# the secret with a fixed salt, so a short one can be guessed offline from captured traffic
# (`openssl rand -hex 32` gives 64 characters).
CLUSTER_SECRET_BYTES_MIN = 16
# The text the example files (deploy/k8s/secret.yaml) hold where the secret goes: a secret that
# still holds it was applied without being replaced, and is known to everyone.
_PLACEHOLDER = "REPLACE-WITH"


def _check_cluster_secret(dotted: str, secret: str) -> None:
    """Refuses a cluster secret that is too short or is an example file's placeholder; the
    message names the setting, never the secret."""
    make_one = "make one with `openssl rand -hex 32`, the same on every node"
    if _PLACEHOLDER in secret:
        raise ConfigError(
            f"setting {dotted}: the cluster secret is still the placeholder of an example file "
            f"({_PLACEHOLDER}...); {make_one}"
        )
    if len(secret.encode()) < CLUSTER_SECRET_BYTES_MIN:
        raise ConfigError(
            f"setting {dotted}: the cluster secret is shorter than {CLUSTER_SECRET_BYTES_MIN} "
            f"bytes; {make_one}"
        )


class _Missing:
    pass


_MISSING = _Missing()


def _lookup(tree: dict[str, Any], dotted: str) -> Any:
    node: Any = tree
    for part in dotted.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return _MISSING
    return node


# The largest duration any setting may have: a year. Nothing in a node waits that long, and a
# bound keeps absurd values (1e308 s) out of timers and of the milliseconds that go into commands.
_DURATION_S_MAX = 365 * 24 * 3600
# The largest count or size: exact in a double and in JSON.
_INTEGER_MAX = 2**53


def _check_numbers(parsed: _File) -> None:
    """Refuses NaN and infinity in any number setting (NaN compares false with every bound, so
    the range checks below would let it through, and TOML, the environment and --set all
    spell both), durations over a year (settings named `..._s` or `..._ms`) and integers over
    2^53."""
    for section in parsed.__struct_fields__:
        settings = getattr(parsed, section)
        if not isinstance(settings, msgspec.Struct):
            continue
        for name in settings.__struct_fields__:
            value = getattr(settings, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                continue
            dotted = f"{section}.{name}"
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"setting {dotted}: must be a finite number (got {value})")
            if name.endswith("_s") and value > _DURATION_S_MAX:
                raise ConfigError(
                    f"setting {dotted}: must be at most {_DURATION_S_MAX} s, a year (got {value})"
                )
            if name.endswith("_ms") and value > _DURATION_S_MAX * 1000:
                raise ConfigError(
                    f"setting {dotted}: must be at most {_DURATION_S_MAX * 1000} ms, a year "
                    f"(got {value})"
                )
            if isinstance(value, int) and abs(value) > _INTEGER_MAX:
                raise ConfigError(f"setting {dotted}: must be at most {_INTEGER_MAX} (got {value})")


def _check_address(dotted: str, address: str) -> None:
    host, separator, port = address.rpartition(":")
    if not separator or not host or not port.isdigit():
        raise ConfigError(f"setting {dotted}: {address!r} must be host:port")
    if not 0 < int(port) < 65536:
        raise ConfigError(f"setting {dotted}: {address!r}: the port must be 1 to 65535")


def _check_positive(dotted: str, value: float) -> None:
    if value <= 0:
        raise ConfigError(f"setting {dotted}: must be positive (got {value!r})")


def _check_http(http: HttpConfig) -> None:
    _check_address("http.address", http.address)
    if http.advertise_address is not None:
        _check_address("http.advertise_address", http.advertise_address)
    for name in (
        "body_bytes_max",
        "wait_max_s",
        "waiting_requests_max",
        "waiting_requests_per_tenant_max",
        "requests_in_flight_max",
        "streams_max",
        "streams_per_tenant_max",
        "stream_write_timeout_s",
        "request_timeout_s",
        "bodies_arriving_max",
        "idle_timeout_s",
        "shutdown_grace_s",
    ):
        _check_positive(f"http.{name}", getattr(http, name))
    if http.connections_max < 0:
        raise ConfigError(
            f"setting http.connections_max: must be 0 (from the descriptor limit) or positive "
            f"(got {http.connections_max})"
        )


def _check_tls(tls: TlsConfig) -> None:
    """The shape only; the node loads the files at start (`node.tls`) and names a bad one."""
    if (tls.cert_file is None) != (tls.key_file is None):
        raise ConfigError("settings tls.cert_file and tls.key_file must be set together")
    if tls.client_certs != "none":
        if tls.cert_file is None:
            raise ConfigError(
                f"setting tls.client_certs: {tls.client_certs!r} needs TLS "
                "(tls.cert_file and tls.key_file)"
            )
        if tls.ca_file is None:
            raise ConfigError(
                f"setting tls.client_certs: {tls.client_certs!r} needs tls.ca_file, the CA "
                "that signs client certificates"
            )
    for name in ("cert_file", "key_file", "ca_file"):
        value = getattr(tls, name)
        if value is not None and not Path(value).is_file():
            raise ConfigError(f"setting tls.{name}: {value!r} is not a readable file")


def _check_audit(audit: AuditConfig) -> None:
    if audit.bytes_max < 4096:
        raise ConfigError(f"setting audit.bytes_max: must be at least 4096 (got {audit.bytes_max})")
    if not 1 <= audit.files_max <= 1000:
        raise ConfigError(
            f"setting audit.files_max: must be between 1 and 1000 (got {audit.files_max})"
        )


def _check_region(region: RegionConfig) -> None:
    from xrcore._validate import check_name

    try:
        check_name("region.name", region.name)
    except InvalidArgument as error:
        raise ConfigError(f"setting {error}") from None
    if region.cpu_slots < 0:
        raise ConfigError(f"setting region.cpu_slots: must be 0 or more (got {region.cpu_slots})")
    for name in ("price_per_gpu_hour", "carbon_g_per_kwh"):
        if getattr(region, name) < 0:
            raise ConfigError(f"setting region.{name}: must be 0 or more")
    for peer, rtt_ms in region.rtt_ms.items():
        if not 0 <= rtt_ms <= 3_600_000:
            raise ConfigError(
                f"setting region.rtt_ms: {peer} = {rtt_ms!r} must be between 0 and 3600000 ms"
            )
    speed = region.labels.get("speed")
    if speed is not None:
        # The scheduler reads this label as the region's device speed and takes anything it
        # cannot read as 1.0 (`xrcore.jobs.region_speed`): a typo would go unnoticed.
        try:
            value = float(speed)
        except ValueError:
            value = math.nan
        if not SPEED_MIN <= value <= SPEED_MAX:
            raise ConfigError(
                f"setting region.labels: speed = {speed!r} must be a number from {SPEED_MIN:g} "
                f"to {SPEED_MAX:g}, the relative speed of the region's devices (1 = reference)"
            )


# Durations the scheduler counts in whole milliseconds (`node.daemon`): anything shorter would
# become 0, which means "at once" (a grace of 0.0004 s ended preempted tasks with no chance to
# checkpoint) or, for an estimate, nothing.
_SCHEDULER_MS = (
    "preemption_min_run_s",
    "preemption_grace_s",
    "default_estimate_s",
    "move_up_min_run_s",
    "move_up_saving_min_s",
    "move_aside_loss_max_s",
)


_SCHEDULER_POSITIVE = ("preemption_grace_s", "default_estimate_s", "pass_pending_max")


def _check_scheduler(scheduler: SchedulerConfig) -> None:
    for name in _SCHEDULER_POSITIVE:
        _check_positive(f"scheduler.{name}", getattr(scheduler, name))
    for name in _SCHEDULER_MS:
        value = getattr(scheduler, name)
        if 0 < value < 0.001:
            least = "at least" if name in _SCHEDULER_POSITIVE else "0 or at least"
            raise ConfigError(
                f"setting scheduler.{name}: must be {least} 0.001 s, as the scheduler counts "
                f"whole milliseconds (got {value!r}, which would be 0)"
            )
    # A move saves less than the whole rest of a run (it still has to run there), so a
    # fraction of 1 or more would silently turn moving up off: move_ups_max = 0 does that.
    if not scheduler.move_up_saving_fraction < 1:
        raise ConfigError(
            "setting scheduler.move_up_saving_fraction: must be below 1, a fraction of a task's "
            f"rest that moving must save (got {scheduler.move_up_saving_fraction!r}; "
            "scheduler.move_ups_max = 0 turns moving up off)"
        )
    # Like a duration: a year of completion time per dollar or kg is far beyond any use, and a
    # bound keeps the score finite (1e300 s per dollar made price and carbon infinite).
    for name in ("seconds_per_dollar", "seconds_per_kg_carbon"):
        if getattr(scheduler, name) > _DURATION_S_MAX:
            raise ConfigError(
                f"setting scheduler.{name}: must be at most {_DURATION_S_MAX} s, a year "
                f"(got {getattr(scheduler, name)!r})"
            )
    for name in (
        "preemption_min_run_s",
        "preemptions_max",
        "seconds_per_dollar",
        "seconds_per_kg_carbon",
        "move_ups_max",
        "move_up_min_run_s",
        "move_up_saving_min_s",
        "move_up_saving_fraction",
        "move_aside_loss_max_s",
    ):
        if getattr(scheduler, name) < 0:
            raise ConfigError(
                f"setting scheduler.{name}: must be 0 or more (got {getattr(scheduler, name)})"
            )


def _check_executor(executor: ExecutorConfig) -> None:
    for name in (
        "lease_ttl_s",
        "poll_interval_s",
        "contact_lost_limit_s",
        "kill_grace_s",
        "log_bytes_max",
        "retry_backoff_base_s",
        "retry_backoff_max_s",
    ):
        _check_positive(f"executor.{name}", getattr(executor, name))
    if executor.kill_grace_s > 86_400.0:
        # Each worker is told it (node.executor.protocol.TaskDescription), which takes a day.
        raise ConfigError(
            f"setting executor.kill_grace_s: must be at most 86400 (got {executor.kill_grace_s})"
        )
    if not 1.0 <= executor.lease_ttl_s <= 3600.0:
        raise ConfigError(
            f"setting executor.lease_ttl_s: must be between 1 and 3600 (got {executor.lease_ttl_s})"
        )
    if executor.contact_lost_limit_s < executor.lease_ttl_s:
        raise ConfigError(
            "setting executor.contact_lost_limit_s: must be at least executor.lease_ttl_s "
            f"(got {executor.contact_lost_limit_s} < {executor.lease_ttl_s})"
        )
    if executor.job_user is not None:
        try:
            pwd.getpwnam(executor.job_user)
        except KeyError:
            raise ConfigError(
                f"setting executor.job_user: there is no user {executor.job_user!r} on this machine"
            ) from None
    for tenant, user in executor.tenant_users.items():
        try:
            check_name("tenant", tenant)
        except InvalidArgument as error:
            raise ConfigError(f"setting executor.tenant_users: {error}") from None
        try:
            pwd.getpwnam(user)
        except KeyError:
            raise ConfigError(
                f"setting executor.tenant_users: there is no user {user!r} (tenant {tenant!r}) "
                "on this machine"
            ) from None
    if executor.shm_bytes_max is not None:
        _check_positive("executor.shm_bytes_max", executor.shm_bytes_max)
    sandboxed = executor.private_tmp and bool(executor.job_user or executor.tenant_users)
    if executor.private_network and not sandboxed:
        raise ConfigError(
            "setting executor.private_network: applies to workers started as executor.job_user "
            "or a user of executor.tenant_users, with executor.private_tmp (the same sandbox): "
            "set those, or leave it false"
        )
    if executor.tmp_bytes_max is not None:
        _check_positive("executor.tmp_bytes_max", executor.tmp_bytes_max)
        if not sandboxed:
            raise ConfigError(
                "setting executor.tmp_bytes_max: bounds the /tmp and /var/tmp of workers "
                "started as executor.job_user or a user of executor.tenant_users, with "
                "executor.private_tmp (other workers share the machine's): set those, or "
                "leave it out"
            )
    _check_positive("executor.tmp_check_interval_s", executor.tmp_check_interval_s)
    if executor.python is not None and not executor.python:
        raise ConfigError(
            "setting executor.python: must not be empty (leave it out for the node's)"
        )


def _check_auth(auth: AuthConfig) -> None:
    names: set[str] = set()
    digests: set[str] = set()
    for position, token in enumerate(auth.tokens):
        where = f"auth.tokens.{position}"
        if token.name in names:
            raise ConfigError(f"setting {where}.name: {token.name!r} is used twice")
        names.add(token.name)
        digest = token.sha256.lower()
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise ConfigError(
                f"setting {where}.sha256: must be 64 hex digits, the SHA-256 of the token "
                "(`xr token hash` prints it)"
            )
        if digest in digests:
            raise ConfigError(f"setting {where}.sha256: the same token is configured twice")
        digests.add(digest)
        if not token.tenant or "/" in token.tenant:
            raise ConfigError(
                f"setting {where}.tenant: {token.tenant!r} must be non-empty without '/'"
            )
