"""The executor: runs the tasks placed in this region, each in a worker subprocess, fenced by its
attempt's token.

Rules:
- It claims tasks assigned to its region while it has room (GPU devices, or CPU slots in CPU
  mode); a claim creates the attempt, its fencing token and its lease in the log.
- Each attempt runs in `python -m node.executor.worker` in its own process group, pinned to its
  devices with `CUDA_VISIBLE_DEVICES`; stdout and stderr go to a bounded log file; messages go
  over a socketpair (`node.executor.protocol`). Its environment is the node's without any `XR_`
  variable (`job_environment`): those are the node's settings, the cluster secret among them, and
  the `xr` client's credentials, and a job's log is shown to its tenant.
- As another user (`executor.job_user`, `executor.tenant_users`), a worker runs with umask 077
  and, with `executor.private_tmp`, in a sandbox (`node.executor.sandbox`): /tmp, /var/tmp and
  /dev/shm of its own, the first two the attempt's directories, removed when it ends.
- Every update it proposes carries the attempt's token: heartbeats (which renew the lease and
  carry progress), checkpoint commits, the completion or the failure. A definite rejection means
  the attempt was superseded (its lease expired and the task moved, or the job was cancelled):
  the worker is stopped at once.
- Losing contact is not job death: while proposals fail without a definite answer (no quorum)
  the worker keeps computing; a still-current attempt simply continues when contact returns.
  After `executor.contact_lost_limit_s` without contact the worker is stopped to free devices.
- Stopping a worker: a `stop` message, then SIGTERM to its process group once the worker has had
  a moment to read it (`STOP_MESSAGE_WAIT_S`: the first reason the job sees is the one it keeps),
  then SIGKILL `executor.kill_grace_s` after the message. It may checkpoint meanwhile.
- When a worker exits, its process group is killed: processes the job started and left running
  end with the attempt (one that left the group, with `setsid`, is out of reach).
- Final updates (completion, failure) are retried with one idempotency key until the log answers,
  so a leader change cannot apply them twice or lose them.
- An attempt holds its devices or CPU slot (its grant) exactly while it is in `attempts`, from its
  claim to its end, and whatever ends it lets go of them: a worker that cannot be started (its
  log directory or file cannot be made on a full disk, no processes) fails the attempt at once,
  naming what failed and why, and so does an error of the executor's own while it supervises one.
  A grant held on by an attempt nobody ran kept the region's room taken while the region still
  showed it free, and the tasks placed there waited forever.
- A job's log that cannot be written (a full disk) is not the job's failure: the rest of its
  output is read and dropped, so the worker never blocks on a full pipe, and the node's log says
  so once.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import sys
import time
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from node.config import ENV_PREFIX, ConfigError, NodeConfig
from node.executor import protocol, sandbox
from node.executor.checkpoints import tenant_area
from node.executor.job_user import (
    Check,
    JobUser,
    check,
    check_all,
    kept_paths,
    lookup,
    prepare_area,
    require_root,
)
from node.executor.sandbox_root import SandboxRoot, used_bytes
from raftstore.store import RaftStore
from xrcore.commands import (
    Command,
    JobSpec,
    TaskCheckpoint,
    TaskClaim,
    TaskComplete,
    TaskFail,
    TaskHeartbeat,
    TaskYield,
)
from xrcore.devices import DeviceLedger, Grant
from xrcore.errors import XrError
from xrcore.limits import MESSAGE_BYTES_MAX, METRICS_PER_UPDATE_MAX
from xrcore.model import TaskState

__all__ = ["Executor", "job_environment", "logs_path", "worker_environment"]

log = logging.getLogger("xr.executor")

# How long a final update is retried while the cluster has no quorum before giving up (the
# attempt's lease then expires and the task runs again elsewhere).
FINAL_UPDATE_RETRY_S = 600.0
# How long a worker has to read a `stop` message before SIGTERM follows it (half the kill grace
# when that is shorter). Its SIGTERM handler sets the stop reason "signal" (after which a job
# expects its task to run again), and the first reason wins: sent together, SIGTERM often won.
STOP_MESSAGE_WAIT_S = 1.0
# How often a worker's exit is looked for (`_exited`).
EXIT_POLL_S = 0.1


def job_environment(node_environment: Mapping[str, str]) -> dict[str, str]:
    """What a worker inherits of the node's environment: everything but the variables named
    `XR_...`. Those configure the node (`XR_RAFT_CLUSTER_SECRET` among them) or carry the `xr`
    client's credentials (`XR_TOKEN`); a job (any tenant's code) could print them to its log, which
    its tenant reads. The worker's own (`XR_TASK`, `XR_CONTROL_FD`) are added after."""
    return {
        name: value
        for name, value in node_environment.items()
        if not name.upper().startswith(ENV_PREFIX)
    }


def worker_environment(job_user: JobUser | None) -> dict[str, str]:
    """Every worker's environment before its task's: the node's without its `XR_` variables,
    xr's code on the module path, and the job user's names (`executor.job_user`)."""
    environment = job_environment(os.environ)
    root = str(Path(__file__).resolve().parent.parent.parent)
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [root, environment.get("PYTHONPATH")]))
    if job_user is not None:
        environment.update(job_user.environment())
    return environment


# Why a worker may be stopping while its attempt's lease is still renewed: its task's end says
# why (failed for its wall time or its /tmp, or yielded), and a lease that expired while a job
# ignored SIGTERM would instead end the attempt as lost and run the task elsewhere.
_KEPT_WHILE_STOPPING = frozenset({"wall_time", "preempted", "tmp_limit"})


def check_paths(config: NodeConfig) -> None:
    """ConfigError when the checkpoint directory is there and is not a directory, or when
    `executor.python` is not a file the node can run (a job user's reach is `job_user.check`'s):
    every task would fail to start, with a message that does not say why."""
    checkpoints = config.checkpoint_dir
    if checkpoints.exists() and not checkpoints.is_dir():
        raise ConfigError(f"setting executor.checkpoint_dir: {checkpoints}: not a directory")
    python = config.executor.python
    if python is not None and not (os.path.isfile(python) and os.access(python, os.X_OK)):
        reason = "not an executable file" if os.path.exists(python) else "no such file"
        raise ConfigError(f"setting executor.python: {python}: {reason}")


def logs_path(data_dir: Path, job_id: str, task_index: int, attempt: int) -> Path:
    return data_dir / "logs" / job_id / f"{task_index}-{attempt}.log"


@dataclass
class _Attempt:
    job_id: str
    task_index: int
    token: int
    attempt: int
    grant: Grant
    wall_time_limit_s: int
    process: asyncio.subprocess.Process | None = None
    writer: asyncio.StreamWriter | None = None
    done: int = 0
    total: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    result: dict[str, Any] | None = None
    failure: tuple[str, bool] | None = None
    stop_reason: str | None = None
    started_s: float = field(default_factory=time.monotonic)
    # Set by the first progress message: the first heartbeat goes out at once, so the log shows
    # a task's start without waiting a heartbeat interval.
    first_progress: asyncio.Event = field(default_factory=asyncio.Event)
    last_contact_s: float = field(default_factory=time.monotonic)
    # What its /tmp and /var/tmp held when it was stopped for it (`executor.tmp_bytes_max`).
    tmp_bytes: int = 0
    # Set when `_end` begins: its outcome is being (or has been) reported.
    ended: bool = False

    @property
    def key(self) -> tuple[str, int]:
        return self.job_id, self.task_index

    def heartbeat(self) -> TaskHeartbeat:
        """Renews the lease and reports the progress the worker last sent."""
        return TaskHeartbeat(
            job_id=self.job_id,
            task_index=self.task_index,
            token=self.token,
            done=self.done,
            total=self.total,
            metrics=self.metrics,
        )

    def fail(self, error: str, *, retryable: bool) -> TaskFail:
        return TaskFail(
            job_id=self.job_id,
            task_index=self.task_index,
            token=self.token,
            error=fit_message(error),
            retryable=retryable,
        )


def fit_message(text: str, bytes_max: int = MESSAGE_BYTES_MAX) -> str:
    """`text` within `bytes_max` bytes of UTF-8: whole when it fits, else its first line (what
    failed, cut to a quarter of the room) and as much of its end (a traceback's last frames) as
    fits. Cutting the front off, as before, left a long traceback without the error it was of."""
    if len(text.encode()) <= bytes_max:
        return text
    first, _, _ = text.partition("\n")
    head = first.encode()[: bytes_max // 4].decode(errors="ignore")
    marker = "\n[...]\n"
    room = bytes_max - len(head.encode()) - len(marker)
    return head + marker + text.encode()[-room:].decode(errors="ignore")


class Executor:
    def __init__(
        self,
        config: NodeConfig,
        store: RaftStore,
        *,
        gpu_memory_mb: list[int] | None = None,
        gpu_models: list[str] | None = None,
    ) -> None:
        self.config = config
        self.settings = config.executor
        self.store = store
        self.region = config.region.name
        self.executor_id = f"{self.region}-{secrets.token_hex(4)}"
        self.python = config.executor.python or sys.executable
        self.job_user = (
            None if config.executor.job_user is None else lookup(config.executor.job_user)
        )
        # Tenants whose jobs run as a user of their own (`executor.tenant_users`).
        self.tenant_users = {
            tenant: lookup(name, setting="executor.tenant_users")
            for tenant, name in config.executor.tenant_users.items()
        }
        # The region's devices, whole or shared, counted as the placement policy counts them.
        self.ledger = DeviceLedger(
            memory_mb=list(gpu_memory_mb or []), models=list(gpu_models or [])
        )
        self.free_slots = config.region.cpu_slots
        self.attempts: dict[tuple[str, int], _Attempt] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop_task: asyncio.Task[None] | None = None
        self._stopping = False
        # Where attempts' private /tmp and /var/tmp are made (`executor.private_tmp`): a
        # directory of root's alone, made by `prepare` when workers run as another user
        # (`sandbox_root`: one a crashed node left is removed then).
        self._sandbox_root: SandboxRoot | None = None
        self.sandboxes: Path | None = None
        # What of the host's /tmp they still see (`job_user.kept_paths`).
        self.kept: tuple[Path, ...] = ()
        # Idempotency keys for final updates: a retried completion applies once.
        self._seq = time.time_ns() // 1000

    # Life cycle.

    async def prepare(self) -> None:
        """Makes the checkpoint directory (ConfigError for one that is not a directory, or
        an `executor.python` that is not there to run); with `executor.job_user`,
        ConfigError when jobs could not run as that user (`node.executor.job_user`). The
        node calls it before it starts anything else, so such a node does not join the
        cluster. With `executor.tenant_users`, the same for each tenant's user, over its
        area of the checkpoint store, which it makes that user's alone."""
        check_paths(self.config)
        if self.tenant_users:
            require_root("executor.tenant_users")
        if self.job_user is not None:
            require_root("executor.job_user")
        if self.settings.private_tmp and (self.job_user is not None or self.tenant_users):
            self.kept = kept_paths(
                self.python, worker_environment(None), self.config.checkpoint_dir
            )
            self._sandbox_root = await asyncio.to_thread(SandboxRoot, f"xr-{self.region}-jobs-")
            self.sandboxes = self._sandbox_root.path
        try:
            await self._prepare_users()
        except BaseException:
            # The node does not start: nothing is left behind.
            await self._remove_sandboxes()
            raise

    async def _remove_sandboxes(self) -> None:
        if self._sandbox_root is not None:
            await asyncio.to_thread(self._sandbox_root.close)
            self._sandbox_root = self.sandboxes = None

    async def _prepare_users(self) -> None:
        if self.job_user is None:
            made = not self.config.checkpoint_dir.is_dir()
            self.config.checkpoint_dir.mkdir(parents=True, exist_ok=True)
            if made and self.tenant_users:
                # Tenants' users pass through it to their areas, whatever the node's umask.
                self.config.checkpoint_dir.chmod(0o711)
        else:
            await asyncio.to_thread(
                check,
                self.job_user,
                python=self.python,
                environment=worker_environment(self.job_user),
                checkpoint_dir=self.config.checkpoint_dir,
                make_directory=True,
                sandboxes=self.sandboxes,
                network=self.settings.private_network,
            )
        checks = []
        for tenant, user in self.tenant_users.items():
            area = self.config.checkpoint_dir / tenant_area(tenant)
            await asyncio.to_thread(prepare_area, area, user, own=True)
            checks.append(Check(user, "executor.tenant_users", area))
        await asyncio.to_thread(
            check_all,
            checks,
            python=self.python,
            environment_of=worker_environment,
            sandboxes=self.sandboxes,
            network=self.settings.private_network,
        )

    def _user_of(self, tenant: str) -> tuple[JobUser | None, bool]:
        """The OS user a tenant's jobs run as (None: the node's), and whether it is the
        tenant's own."""
        own = self.tenant_users.get(tenant)
        return (self.job_user, False) if own is None else (own, True)

    async def start(self) -> None:
        self._loop_task = asyncio.create_task(self._claim_loop())

    async def stop(self) -> None:
        """Stops claiming and stops every worker (they may checkpoint); their leases expire and
        the tasks run again elsewhere."""
        self._stopping = True
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
        await asyncio.gather(
            *(self._stop_worker(attempt, "shutdown") for attempt in list(self.attempts.values())),
            return_exceptions=True,
        )
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._remove_sandboxes()

    # Claiming.

    async def _claim_loop(self) -> None:
        while not self._stopping:
            try:
                await self._claim_assigned()
            except Exception:  # pragma: no cover - keep the executor alive; the log says why
                log.exception("claiming tasks failed")
            await asyncio.sleep(self.settings.poll_interval_s)

    def _assigned_here(self) -> list[tuple[str, int, JobSpec, int]]:
        """(job_id, task_index, spec, wall_time_limit_s) of tasks assigned to this region."""

        def query(machine: Any) -> list[tuple[str, int, JobSpec, int]]:
            found = []
            for job in machine.jobs.values():
                for task in job.tasks:
                    if task.state is TaskState.ASSIGNED and task.region == self.region:
                        found.append((job.job_id, task.index, job.spec, job.spec.wall_time_limit_s))
            return found

        result: list[tuple[str, int, JobSpec, int]] = self.store.replica.read(query)
        return result

    async def _claim_assigned(self) -> None:
        for job_id, task_index, spec, wall_time_limit_s in self._assigned_here():
            if (job_id, task_index) in self.attempts or self._stopping:
                continue
            grant = self._reserve(spec)
            if grant is None:
                continue
            attempt: _Attempt | None = None
            try:
                claimed = await self._propose(
                    TaskClaim(
                        job_id=job_id,
                        task_index=task_index,
                        region=self.region,
                        executor_id=self.executor_id,
                        lease_ttl_ms=int(self.settings.lease_ttl_s * 1000),
                    )
                )
                attempt = _Attempt(
                    job_id=job_id,
                    task_index=task_index,
                    token=claimed["token"],
                    attempt=claimed["attempt"],
                    grant=grant,
                    wall_time_limit_s=wall_time_limit_s,
                )
            except XrError as error:
                log.debug("claim of %s[%d] refused: %s", job_id, task_index, error)
                continue
            finally:
                # Until an attempt holds it, the grant is this pass's: a refusal, an error or
                # the executor stopping gives it back.
                if attempt is None:
                    self._release(grant)
            self.attempts[attempt.key] = attempt
            supervision = self._spawn(self._supervise(attempt, claimed.get("checkpoint")))
            # `_supervise` lets go of the attempt when it ends; this also covers a supervision
            # cancelled before it began (the executor stopping), whose code never runs.
            supervision.add_done_callback(functools.partial(self._forget_when_done, attempt))

    def _reserve(self, spec: JobSpec) -> Grant | None:
        """Whole devices or a memory share of one (`xrcore.devices`) for a task that uses GPUs
        on a region with GPUs; otherwise one CPU slot (CPU mode runs GPU tasks on NumPy), as
        `xrcore.placement` counts them. None when it does not fit now."""
        if self.ledger.memory_mb and (spec.gpus > 0 or spec.gpu_memory_mb > 0):
            return self.ledger.reserve(
                gpus=spec.gpus, memory_mb=spec.gpu_memory_mb, model=spec.gpu_model
            )
        if self.free_slots < 1:
            return None
        self.free_slots -= 1
        return Grant(devices=())

    def _release(self, grant: Grant) -> None:
        if grant.devices:
            self.ledger.release(grant)
        else:
            self.free_slots += 1

    def _forget(self, attempt: _Attempt) -> None:
        """Lets go of an attempt: out of `attempts`, its devices or slot free again. An attempt
        holds its grant exactly while it is in `attempts`, so a second call does nothing (nor
        one for an attempt a newer one of the same task has replaced)."""
        if self.attempts.get(attempt.key) is attempt:
            del self.attempts[attempt.key]
            self._release(attempt.grant)

    def _forget_when_done(self, attempt: _Attempt, _supervision: asyncio.Task[None]) -> None:
        self._forget(attempt)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._reap)
        return task

    def _reap(self, task: asyncio.Task[None]) -> None:
        """Forgets a finished task and logs what it raised, which would otherwise surface only
        as asyncio's "Task exception was never retrieved" when the task is garbage-collected."""
        self._tasks.discard(task)
        if not task.cancelled() and (error := task.exception()) is not None:
            log.error("executor task %s failed", task.get_coro(), exc_info=error)

    # Proposals.

    async def _propose(self, command: Command) -> dict[str, Any]:
        """Claims, heartbeats and checkpoints: not retried here (the next heartbeat or claim
        pass is the retry), so they carry no idempotency key."""
        applied = await self.store.propose(command)
        value: dict[str, Any] = applied.result.unwrap()
        return value

    async def _propose_final(self, command: Command) -> None:
        """Retries one idempotent update until the log answers (applied or refused)."""
        self._seq += 1
        seq = self._seq
        deadline_s = time.monotonic() + FINAL_UPDATE_RETRY_S
        while True:
            try:
                applied = await self.store.propose(command, client_id=self.executor_id, seq=seq)
                applied.result.unwrap()
                return
            except XrError as error:
                if error.definite and error.code != "cluster.unavailable":
                    log.info("update %s refused: %s", type(command).__name__, error)
                    return
                if time.monotonic() > deadline_s:
                    log.warning(
                        "giving up on %s after %.0f s", type(command).__name__, FINAL_UPDATE_RETRY_S
                    )
                    return
            await asyncio.sleep(0.5)

    # One attempt.

    def _environment(
        self,
        attempt: _Attempt,
        spec: JobSpec,
        user: JobUser | None,
        checkpoint: dict[str, Any] | None,
        child_fd: int,
        *,
        private_tmp: bool,
    ) -> dict[str, str]:
        description = protocol.TaskDescription(
            job_id=attempt.job_id,
            task_index=attempt.task_index,
            array_size=spec.array_size,
            attempt=attempt.attempt,
            token=attempt.token,
            entrypoint=spec.entrypoint,
            workload=spec.workload,
            args=json.loads(spec.args),
            checkpoint=None
            if checkpoint is None
            else protocol.CheckpointRef(
                uri=checkpoint["uri"], checksum=checkpoint["checksum"], step=checkpoint["step"]
            ),
            checkpoint_dir=str(self.config.checkpoint_dir),
            checkpoint_area=tenant_area(spec.tenant),
            device="cpu" if not attempt.grant.devices else "cuda:0",
            # A shared device caps the worker's memory pool at its share.
            gpu_memory_mb=attempt.grant.shared_memory_mb or spec.gpu_memory_mb,
            private_tmp=private_tmp,
            kill_grace_s=self.settings.kill_grace_s,
            checkpoint_interval_s=spec.checkpoint_interval_s,
        )
        environment = worker_environment(user)
        environment.update(
            {
                protocol.TASK_ENV: protocol.encode_task(description),
                protocol.CONTROL_FD_ENV: str(child_fd),
                "CUDA_VISIBLE_DEVICES": ",".join(str(device) for device in attempt.grant.devices),
                "PYTHONUNBUFFERED": "1",
            }
        )
        return environment

    async def _supervise(self, attempt: _Attempt, checkpoint: dict[str, Any] | None) -> None:
        """Runs a claimed attempt to its end, and lets go of it (`_forget`) however it ends: its
        worker's exit, a worker that could not start, or an error of the executor's own, which
        fails the attempt at once (the task is then retried or failed by the usual rules)
        instead of holding its grant until the lease expires."""
        private = None
        try:
            spec = self.store.replica.read(lambda machine: machine.jobs[attempt.job_id].spec)
            user, own = self._user_of(spec.tenant)
            if user is not None and self.sandboxes is not None:
                private = self.sandboxes / f"attempt-{attempt.token}"
            await self._run_worker(attempt, checkpoint, spec, user, own, private)
        except Exception as error:
            log.exception(
                "%s[%d] attempt %d: supervising it failed; failing it",
                attempt.job_id,
                attempt.task_index,
                attempt.attempt,
            )
            if not attempt.ended:
                failure = f"executor error: {type(error).__name__}: {error}"
                await self._end(attempt, exit_code=None, failure=(failure, True))
        finally:
            self._forget(attempt)
            if private is not None:
                # What the job left in its /tmp and /var/tmp goes with the attempt.
                await asyncio.to_thread(shutil.rmtree, private, ignore_errors=True)

    async def _run_worker(
        self,
        attempt: _Attempt,
        checkpoint: dict[str, Any] | None,
        spec: JobSpec,
        user: JobUser | None,
        own: bool,
        private: Path | None,
    ) -> None:
        """Runs one attempt's worker to its end: as `user` (None: the node's), with its own
        /tmp, /var/tmp and /dev/shm over the directory `private` when given."""
        log_file = logs_path(
            self.config.data_dir, attempt.job_id, attempt.task_index, attempt.attempt
        )
        try:
            parent, sink = await self._start_worker(
                attempt, checkpoint, spec, user, own, private, log_file
            )
        except Exception as error:
            await self._fail_start(attempt, error)
            return
        log.info(
            "running %s[%d] attempt %d (token %d) on %s",
            attempt.job_id,
            attempt.task_index,
            attempt.attempt,
            attempt.token,
            ",".join(map(str, attempt.grant.devices)) or "cpu",
        )
        exit_code = await self._serve_worker(attempt, parent, sink, private)
        await self._end(attempt, exit_code=exit_code, log_file=log_file)

    async def _start_worker(
        self,
        attempt: _Attempt,
        checkpoint: dict[str, Any] | None,
        spec: JobSpec,
        user: JobUser | None,
        own: bool,
        private: Path | None,
        log_file: Path,
    ) -> tuple[socket.socket, BinaryIO]:
        """Starts the attempt's worker (`attempt.process`); returns the executor's end of its
        control channel and its log file, open. Raises what stopped it, leaving nothing open."""
        with contextlib.ExitStack() as undo:
            parent, child = socket.socketpair()
            undo.callback(parent.close)
            # The worker's end is the worker's once it runs: closed here in any case.
            with child:
                sink = undo.enter_context(_open_log(log_file))
                command = protocol.worker_command(self.python)
                # As another user, the worker's files are that user's alone, whatever the
                # node's umask (as the node's user, a job can read what the node can anyway).
                options = {} if user is None else {**user.spawn_options(), "umask": sandbox.UMASK}
                environment = self._environment(
                    attempt,
                    spec,
                    user,
                    checkpoint,
                    child.fileno(),
                    # Made only for a worker as another user (`_supervise`).
                    private_tmp=private is not None,
                )
                # Off the loop: the checkpoint directory is often a network mount.
                await asyncio.to_thread(
                    prepare_area,
                    self.config.checkpoint_dir / tenant_area(spec.tenant),
                    user,
                    own=own,
                )
                if private is not None and user is not None:
                    await asyncio.to_thread(sandbox.make_directories, private)
                    # The sandbox switches to the user after its mounts, and sets the umask.
                    command = user.sandboxed(
                        private,
                        command,
                        self.kept,
                        self.settings.shm_bytes_max,
                        self.settings.private_network,
                    )
                    options = {}
                    environment["TMPDIR"] = "/tmp"
                attempt.process = await asyncio.create_subprocess_exec(
                    *command,
                    env=environment,
                    pass_fds=(child.fileno(),),
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.STDOUT,
                    start_new_session=True,
                    **options,
                )
            undo.pop_all()
        return parent, sink

    async def _fail_start(self, attempt: _Attempt, error: Exception) -> None:
        """Fails at once an attempt whose worker could not be started, saying why: an
        operating-system error names the path and the error ("[Errno 28] No space left on
        device: '<data_dir>/logs/job-7'")."""
        # A description the worker would refuse (bad arguments) fails for good; anything else
        # (a full disk, no processes, no memory, a checkpoint area this region's settings cannot
        # use, a fault of the executor's own) may pass, elsewhere or after a repair.
        retryable = not isinstance(error, protocol.ProtocolError)
        foreseen = isinstance(error, (OSError, ConfigError, protocol.ProtocolError))
        reason = str(error) if foreseen else f"{type(error).__name__}: {error}"
        message = f"cannot start worker: {reason}"
        log.error(
            "%s[%d] attempt %d: %s",
            attempt.job_id,
            attempt.task_index,
            attempt.attempt,
            message,
            # A fault of the executor's own: where it happened matters.
            exc_info=None if foreseen else error,
        )
        await self._end(attempt, exit_code=None, failure=(message, retryable))

    async def _serve_worker(
        self, attempt: _Attempt, parent: socket.socket, sink: BinaryIO, private: Path | None
    ) -> int | None:
        """Serves a started worker until it exits (its output to `sink`, its messages, its
        lease); its exit code. Then, or when this fails or is cancelled, the worker's process
        group is killed and its channel and log file are closed."""
        process = attempt.process
        assert process is not None
        pumps: list[asyncio.Task[None]] = []
        watches: list[asyncio.Task[None]] = []
        try:
            reader, attempt.writer = await asyncio.open_unix_connection(
                sock=parent, limit=protocol.LINE_BYTES_MAX
            )
            pumps = [
                asyncio.create_task(self._pump_logs(attempt, sink)),
                asyncio.create_task(self._read_messages(attempt, reader)),
            ]
            watches = [asyncio.create_task(self._keep_alive(attempt))]
            if private is not None and self.settings.tmp_bytes_max is not None:
                watches.append(asyncio.create_task(self._watch_tmp(attempt, private)))
            exit_code = await _exited(process)
            # What the job started and left running (a child process, a daemon) goes with it;
            # it would also keep the log's pipe open.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            for pump in pumps:
                # A pump's own error is logged below; the attempt ends as its worker says.
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await asyncio.wait_for(pump, 5.0)
            return exit_code
        finally:
            if process.returncode is None:
                # Serving it failed or was cancelled: the worker does not outlive its attempt.
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGKILL)
            for task in (*pumps, *watches):
                task.cancel()
            outcomes = await asyncio.gather(*pumps, *watches, return_exceptions=True)
            for outcome in outcomes:
                if isinstance(outcome, Exception):
                    log.error(
                        "%s[%d] attempt %d: serving it failed",
                        attempt.job_id,
                        attempt.task_index,
                        attempt.attempt,
                        exc_info=outcome,
                    )
            if attempt.writer is not None:
                attempt.writer.close()
            else:
                parent.close()
            with contextlib.suppress(OSError):
                sink.close()

    async def _end(
        self,
        attempt: _Attempt,
        *,
        exit_code: int | None,
        failure: tuple[str, bool] | None = None,
        log_file: Path | None = None,
    ) -> None:
        attempt.ended = True
        try:
            reason = attempt.stop_reason
            if failure is not None:
                attempt.failure = failure
            if reason == "wall_time":
                limit_s = attempt.wall_time_limit_s
                await self._propose_final(
                    attempt.fail(f"wall time limit of {limit_s} s reached", retryable=False)
                )
            elif reason == "tmp_limit":
                await self._propose_final(
                    attempt.fail(
                        f"stopped: its /tmp and /var/tmp held {attempt.tmp_bytes:,} bytes, more "
                        f"than executor.tmp_bytes_max ({self.settings.tmp_bytes_max:,}); write "
                        "large files to the checkpoint directory or another path outside them",
                        retryable=False,
                    )
                )
            elif reason == "preempted":
                await self._propose_final(
                    TaskYield(
                        job_id=attempt.job_id, task_index=attempt.task_index, token=attempt.token
                    )
                )
            elif reason is not None:
                # Cancelled, superseded, lease lost or shutting down: the log already says what
                # happens next (or the lease will expire); nothing to report.
                pass
            elif attempt.result is not None and exit_code == 0:
                result = json.dumps(attempt.result, separators=(",", ":"))
                # The progress since the last heartbeat (a task ends between two), so that the
                # finished task shows where it ended, not where it was a heartbeat earlier.
                with contextlib.suppress(XrError):
                    await self._propose(attempt.heartbeat())
                await self._propose_final(
                    TaskComplete(
                        job_id=attempt.job_id,
                        task_index=attempt.task_index,
                        token=attempt.token,
                        result=result,
                    )
                )
            else:
                error, retryable = attempt.failure or (
                    f"worker {_exit_description(exit_code)} without a result: {_tail(log_file)}",
                    True,
                )
                await self._propose_final(attempt.fail(error, retryable=retryable))
        finally:
            self._forget(attempt)
            log.info(
                "%s[%d] attempt %d ended (exit %s, %s)",
                attempt.job_id,
                attempt.task_index,
                attempt.attempt,
                exit_code,
                attempt.stop_reason or ("result" if attempt.result else "failure"),
            )

    async def _pump_logs(self, attempt: _Attempt, sink: BinaryIO) -> None:
        """Copies the worker's output to its log file, never letting the file pass
        `executor.log_bytes_max`: past it, the newest half is kept (the end of a log says why a
        task failed), whatever the size of the chunk that crossed the limit. Once the file
        cannot be written (a full disk), the rest is read and dropped: a worker whose output is
        not read blocks on its pipe, and its attempt would hold its grant until its wall time."""
        assert attempt.process is not None and attempt.process.stdout is not None
        limit = self.settings.log_bytes_max
        writable = True
        size = sink.seek(0, os.SEEK_END)
        while chunk := await attempt.process.stdout.read(65536):
            if not writable:
                continue
            try:
                size = _append_bounded(sink, chunk, size, limit)
            except OSError as error:
                writable = False
                log.error(
                    "%s[%d] attempt %d: cannot write its log %s: %s; dropping the rest of its "
                    "output",
                    attempt.job_id,
                    attempt.task_index,
                    attempt.attempt,
                    sink.name,
                    error,
                )

    async def _read_messages(self, attempt: _Attempt, reader: asyncio.StreamReader) -> None:
        while True:
            try:
                line = await reader.readline()
            except (ValueError, asyncio.LimitOverrunError):
                log.warning(
                    "%s[%d]: control message too long; closing its channel",
                    attempt.job_id,
                    attempt.task_index,
                )
                return
            except ConnectionError as error:
                # The worker died mid-message (killed, crashed): its exit code tells the rest,
                # and the attempt must still be ended and its devices released.
                log.info(
                    "%s[%d]: control channel closed: %s", attempt.job_id, attempt.task_index, error
                )
                return
            if not line:
                return
            try:
                message = protocol.decode(line)
            except protocol.ProtocolError as error:
                log.warning(
                    "%s[%d]: bad control message: %s", attempt.job_id, attempt.task_index, error
                )
                continue
            await self._handle(attempt, message)

    async def _handle(self, attempt: _Attempt, message: protocol.Message) -> None:
        if isinstance(message, protocol.Progress):
            attempt.done, attempt.total = message.done, message.total
            attempt.first_progress.set()
            attempt.metrics = dict(list(message.metrics.items())[:METRICS_PER_UPDATE_MAX])
        elif isinstance(message, protocol.CheckpointSaved):
            await self._send(attempt, await self._commit_checkpoint(attempt, message))
        elif isinstance(message, protocol.Result):
            attempt.result = message.result
        elif isinstance(message, protocol.Failed):
            attempt.failure = (message.error, message.retryable)

    async def _commit_checkpoint(
        self, attempt: _Attempt, message: protocol.CheckpointSaved
    ) -> protocol.CheckpointAck:
        try:
            await self._propose(
                TaskCheckpoint(
                    job_id=attempt.job_id,
                    task_index=attempt.task_index,
                    token=attempt.token,
                    step=message.step,
                    uri=message.uri,
                    checksum=message.checksum,
                    size_bytes=message.size_bytes,
                )
            )
        except XrError as error:
            # A refused token means another attempt owns the task now: stop this one. Anything
            # else (no quorum, a step not newer) only means this checkpoint was not committed.
            superseded = error.code in ("fencing.stale_token", "job.invalid_transition")
            if superseded:
                self._spawn(self._stop_worker(attempt, "superseded"))
            return protocol.CheckpointAck(
                ok=False,
                error=f"{error.code}: {error.message}",
                superseded=superseded,
                step=message.step,
            )
        attempt.last_contact_s = time.monotonic()
        return protocol.CheckpointAck(ok=True, superseded=False, step=message.step)

    async def _send(self, attempt: _Attempt, message: protocol.ExecutorMessage) -> None:
        if attempt.writer is None or attempt.writer.is_closing():
            return
        with contextlib.suppress(ConnectionError):
            attempt.writer.write(protocol.encode(message))
            await attempt.writer.drain()

    async def _keep_alive(self, attempt: _Attempt) -> None:
        """Renews the attempt's lease every third of its TTL, and stops the worker when it is
        cancelled, past its wall time, preempted, superseded or out of contact. While a worker
        stops for a reason its task's end reports (`_KEPT_WHILE_STOPPING`: a job that does not
        heed SIGTERM takes `kill_grace_s`, as long as a lease), the lease is still renewed, so
        the task ends as that reason says, not as a lease that expired and an attempt elsewhere."""
        interval_s = self.settings.lease_ttl_s / 3
        reported_first = False
        while attempt.stop_reason is None or attempt.stop_reason in _KEPT_WHILE_STOPPING:
            if reported_first:
                await asyncio.sleep(interval_s)
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(attempt.first_progress.wait(), interval_s)
                reported_first = attempt.first_progress.is_set()
            running = attempt.stop_reason is None
            if running and self._cancelled(attempt):
                self._spawn(self._stop_worker(attempt, "cancelled"))
                return
            if running and (
                attempt.wall_time_limit_s
                and time.monotonic() - attempt.started_s > attempt.wall_time_limit_s
            ):
                self._spawn(self._stop_worker(attempt, "wall_time"))
            try:
                renewed = await self._propose(attempt.heartbeat())
                attempt.last_contact_s = time.monotonic()
                if renewed.get("preempt") and attempt.stop_reason is None:
                    # A higher-priority task needs the room: the job checkpoints and stops, and
                    # `_end` yields the task (requeued without counting a failure).
                    log.info(
                        "%s[%d] attempt %d preempted: stopping it to yield",
                        attempt.job_id,
                        attempt.task_index,
                        attempt.attempt,
                    )
                    self._spawn(self._stop_worker(attempt, "preempted"))
            except XrError as error:
                if error.definite and error.code != "cluster.unavailable":
                    reason = "cancelled" if self._cancelled(attempt) else "superseded"
                    log.info(
                        "%s[%d] attempt %d %s: %s",
                        attempt.job_id,
                        attempt.task_index,
                        attempt.attempt,
                        reason,
                        error,
                    )
                    self._spawn(self._stop_worker(attempt, reason))
                    return
                silent_s = time.monotonic() - attempt.last_contact_s
                if silent_s > self.settings.contact_lost_limit_s:
                    log.warning(
                        "%s[%d]: no contact with the cluster for %.0f s; stopping it",
                        attempt.job_id,
                        attempt.task_index,
                        silent_s,
                    )
                    self._spawn(self._stop_worker(attempt, "lease_lost"))
                    return

    async def _watch_tmp(self, attempt: _Attempt, private: Path) -> None:
        """Stops the worker once its /tmp and /var/tmp (under `private`) hold more than
        `executor.tmp_bytes_max`, counted every `executor.tmp_check_interval_s`."""
        limit = self.settings.tmp_bytes_max
        assert limit is not None
        directories = [private / name for name, _ in sandbox.BINDS]
        while attempt.stop_reason is None:
            await asyncio.sleep(self.settings.tmp_check_interval_s)
            # Off the loop: a job may hold many files.
            used = await asyncio.to_thread(used_bytes, directories, limit)
            if used > limit and attempt.stop_reason is None:
                attempt.tmp_bytes = used
                log.warning(
                    "%s[%d] attempt %d: /tmp and /var/tmp hold %d bytes, more than "
                    "executor.tmp_bytes_max (%d); stopping it",
                    attempt.job_id,
                    attempt.task_index,
                    attempt.attempt,
                    used,
                    limit,
                )
                self._spawn(self._stop_worker(attempt, "tmp_limit"))
                return

    def _cancelled(self, attempt: _Attempt) -> bool:
        def query(machine: Any) -> bool:
            job = machine.jobs.get(attempt.job_id)
            return job is None or job.tasks[attempt.task_index].state is TaskState.CANCELLED

        cancelled: bool = self.store.replica.read(query)
        return cancelled

    async def _stop_worker(self, attempt: _Attempt, reason: str) -> None:
        if attempt.stop_reason is None:
            attempt.stop_reason = reason
        process = attempt.process
        if process is None or process.returncode is not None:
            return
        grace_s = self.settings.kill_grace_s
        await self._send(attempt, protocol.Stop(reason=reason))
        # The message first: the job's stop reason is the first one it gets.
        message_wait_s = min(STOP_MESSAGE_WAIT_S, grace_s / 2)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(_exited(process), message_wait_s)
        if process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(_exited(process), grace_s - message_wait_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)


async def _exited(process: asyncio.subprocess.Process) -> int:
    """The worker's exit code, once it has exited. Not `process.wait()`: on Python 3.11 that
    also waits for the worker's output pipe to close, which a process the job started and left
    running holds open (the attempt then ended only with that process)."""
    while process.returncode is None:
        await asyncio.sleep(EXIT_POLL_S)
    return process.returncode


def _exit_description(exit_code: int | None) -> str:
    """How a worker ended, as its failure says: "exited with code 7", "killed by SIGKILL"."""
    if exit_code is not None and exit_code < 0:
        try:
            return f"killed by {signal.Signals(-exit_code).name}"
        except ValueError:
            return f"killed by signal {-exit_code}"
    return f"exited with code {exit_code}"


def _open_log(path: Path) -> BinaryIO:
    """An attempt's log file, open for writing at its end. Jobs' output is their tenants' own:
    the directory of logs is the node's alone (0700 when made here, whatever the umask); the node
    serves them through the API."""
    path.parent.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.parent.mkdir(exist_ok=True)
    return path.open("r+b" if path.exists() else "w+b")


_LOG_DROPPED_MARKER = b"[xr: earlier output dropped, log limit reached]\n"


def _append_bounded(sink: BinaryIO, chunk: bytes, size: int, limit: int) -> int:
    """Appends `chunk` to a log of `size` bytes, keeping it within `limit` bytes (past it, the
    newest half with a marker); the log's new size."""
    if size + len(chunk) <= limit:
        sink.write(chunk)
        size += len(chunk)
    else:
        sink.seek(0)
        kept = (sink.read() + chunk)[-max(limit // 2 - len(_LOG_DROPPED_MARKER), 0) :]
        sink.seek(0)
        sink.truncate()
        sink.write(_LOG_DROPPED_MARKER + kept)
        size = sink.tell()
    sink.flush()
    return size


def _tail(path: Path | None, characters: int = 1500) -> str:
    if path is None:
        return ""
    try:
        return path.read_text(errors="replace")[-characters:]
    except OSError:
        return ""
