"""The coordinator's gRPC service: worker streams and the client RPCs.

Jobs run one at a time in submission order; each takes the first n idle
workers. A job that fails (bad data, a lost worker its policy cannot tolerate,
a round timeout) fails alone: the coordinator keeps serving.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any

import grpc
import numpy as np
from grpc import aio

from codedgd.services.coordinator.dataplane import check_topology
from codedgd.services.coordinator.job_run import DEFAULT_CHECKPOINT_EVERY, JobRun
from codedgd.services.coordinator.metrics import CoordinatorMetrics
from codedgd.services.coordinator.sessions import Sessions, WorkerSession, reject
from codedgd.services.coordinator.state import UNFINISHED, JobStore, SpillDir, StateDir
from codedgd.services.errors import CodedGDError, ConfigError, NonFiniteError, WireError
from codedgd.services.framing import Frame
from codedgd.services.job import JobConfig
from codedgd.services.job.prepare import check_guard
from codedgd.services.job.trained import trained_model
from codedgd.services.machine import check_machine
from codedgd.services.messages import (
    check_peer_address,
    check_worker_name,
    machine_from_pb,
    model_messages,
    printable,
    record_to_pb,
)
from codedgd.services.models.saved import load_model
from codedgd.services.optim import create_optimizer, lr_times_inverse_l
from codedgd.services.proto import codedgd_pb2 as pb
from codedgd.services.records import DEFAULT_RECORDS_IN_MEMORY, RecordLog, RoundRecord

log = logging.getLogger("codedgd.coordinator")
PROTOCOL = "codedgd.v1"
VERSION = "0.1.0"
HELLO_TIMEOUT = 10.0
MAX_KEPT_JOBS = 50
# A worker unheard for this long is dropped; it is asked to heartbeat 3 times as often.
DEFAULT_WORKER_TIMEOUT = 15.0
HEARTBEATS_PER_TIMEOUT = 3
# WatchJob reads records older than a job's in-memory window from its file this many at a
# time, in a thread.
REPLAY_CHUNK = 256
Incoming = Frame[pb.WorkerMessage] | WireError  # see server._worker_frame


class CoordinatorService:
    """Implements codedgd.v1.Coordinator."""

    def __init__(
        self,
        *,
        metrics: CoordinatorMetrics | None = None,
        data_dir: str | None = None,
        assign_timeout: float = 120.0,
        chunk_bytes: int | None = None,
        state_dir: StateDir | None = None,
        checkpoint_every: int = DEFAULT_CHECKPOINT_EVERY,
        worker_timeout: float = DEFAULT_WORKER_TIMEOUT,
        records_in_memory: int = DEFAULT_RECORDS_IN_MEMORY,
    ) -> None:
        self.metrics = metrics or CoordinatorMetrics()
        self.worker_timeout = worker_timeout
        self.state_dir = state_dir
        # Without a state directory, jobs' records past the in-memory window go here.
        self.spill = SpillDir(records_in_memory)
        self.checkpoint_every = checkpoint_every
        self._order = state_dir.next_order() if state_dir is not None else 0
        self.data_dir = data_dir
        self.assign_timeout = assign_timeout
        self.chunk_bytes = chunk_bytes
        self.sessions = Sessions(on_change=self.metrics.workers_connected.set)
        self.jobs: OrderedDict[str, JobRun] = OrderedDict()
        self._queue: asyncio.Queue[JobRun] = asyncio.Queue()
        self._current: JobRun | None = None
        self._current_task: asyncio.Task[None] | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._watchdog_task: asyncio.Task[None] | None = None
        self._stopping = False

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        if self._loop_task is None:
            self._restore()
            self._loop_task = asyncio.create_task(self._job_loop())
            self._watchdog_task = asyncio.create_task(self._watchdog())

    def _restore(self) -> None:
        """Read the state directory's jobs back; queue the unfinished ones again."""
        if self.state_dir is None:
            return
        for stored in self.state_dir.load()[-MAX_KEPT_JOBS:]:
            job = self._job(stored.id, stored.config, stored.order, stored.store)
            job.round = len(job.records)
            if stored.state in UNFINISHED:
                job.resume = stored.checkpoint
                self._queue.put_nowait(job)
                at = stored.checkpoint.round + 1 if stored.checkpoint is not None else 0
                log.info("job %s (%s) will resume at round %d", job.id, stored.state, at)
            else:
                job.state, job.error = stored.state, stored.error
                if job.store is not None and job.store.model_path.exists():
                    try:
                        job.stored_theta = load_model(job.store.model_path).theta
                    except CodedGDError as exc:
                        log.warning("job %s: its model cannot be read back: %s", job.id, exc)
            self.jobs[job.id] = job

    async def stop(self, reason: str = "coordinator shutting down") -> None:
        """Cancel the running job and tell every worker to leave."""
        self._stopping = True
        if self._loop_task is not None:
            self._loop_task.cancel()
        if self._watchdog_task is not None:
            self._watchdog_task.cancel()
        if self._current_task is not None and not self._current_task.done():
            if self._current is not None:  # watchers learn why, not "cancelled by a client"
                self._current.error = self._current.error or f"cancelled: {reason}"
                # With a state directory the job is not over: it checkpoints and resumes.
                self._current.interrupted = self.state_dir is not None
            self._current_task.cancel()
            await asyncio.gather(self._current_task, return_exceptions=True)
        restarting = self.state_dir is not None
        bye = pb.CoordinatorMessage(shutdown=pb.Shutdown(reason=reason, restarting=restarting))
        for s in self.sessions.all():
            s.send(bye)
            s.close()
        self.spill.remove()  # its jobs' records beyond their windows: gone with them

    async def _watchdog(self) -> None:
        """Drop workers that went silent (a hung or SIGSTOPped process, a cut link whose
        TCP connection has not failed yet): no message, not even a Heartbeat, for
        ``worker_timeout`` seconds. A job loses them like a disconnected worker, so a
        live newcomer or spare takes the place; an idle one is never handed a place."""
        period = self.worker_timeout / HEARTBEATS_PER_TIMEOUT
        tick = time.monotonic()
        while True:
            await asyncio.sleep(period)
            now, late = time.monotonic(), time.monotonic() - tick - period
            tick = now
            if late > period:
                # This process stalled (swap, a pause): the workers' messages of that
                # time are still unread, so silence is ours, not theirs. Judge next tick.
                continue
            for session in self.sessions.all():
                silent = now - session.last_seen
                if session.closed or silent <= self.worker_timeout:
                    continue
                reason = (
                    f"silent for {silent:.1f} s (no heartbeat within --worker-timeout "
                    f"{self.worker_timeout:g})"
                )
                log.warning("dropping %s: %s", session.label, reason)
                self.metrics.stragglers.labels("silent").inc()
                job = self._job_of(session)
                if job is not None:
                    job.lose(session, reason)
                self.sessions.remove(session)
                session.close()

    async def _job_loop(self) -> None:
        while True:
            job = await self._queue.get()
            if job.finished:  # cancelled while queued
                continue
            self._current = job
            self._current_task = asyncio.create_task(job.run())
            await asyncio.gather(self._current_task, return_exceptions=True)
            self._current = None

    def submit(self, config: JobConfig, *, checked: bool = False) -> JobRun:
        """Validate (unless ``checked`` already) and queue a job (also the in-process
        entry point of `codedgd run`)."""
        if not checked:
            _validate(config, self.data_dir)
        job = self._job(uuid.uuid4().hex[:12], config, self._order)
        self._order += 1
        if job.store is not None:
            try:
                job.store.save_job(job.order, config, "queued")
            except OSError as exc:
                raise ConfigError(
                    f"cannot keep the job in the state directory "
                    f"{self.state_dir.path if self.state_dir else ''}: {exc.strerror or exc}"
                ) from None
        self.jobs[job.id] = job
        while len(self.jobs) > MAX_KEPT_JOBS:
            oldest = next(iter(self.jobs))
            if not self.jobs[oldest].finished:
                break
            del self.jobs[oldest]
            if self.state_dir is not None:
                self.state_dir.forget(oldest)
            else:
                self.spill.forget(oldest)
        self._queue.put_nowait(job)
        job_id = job.id
        log.info(
            "job %s queued: policy %s, %d workers, %d rounds",
            job_id,
            config.policy.name,
            config.workers,
            config.rounds,
        )
        return job

    def _job(
        self, job_id: str, config: JobConfig, order: int, store: JobStore | None = None
    ) -> JobRun:
        """A job; its records in its state directory's files (``store``, or new ones), or
        without a state directory in the spill directory."""
        kwargs: dict[str, Any] = {}
        if self.chunk_bytes:
            kwargs["chunk_bytes"] = self.chunk_bytes
        if store is None and self.state_dir is not None:
            store = self.state_dir.job(job_id)
        if store is None:
            kwargs["records"] = self.spill.records(job_id)
        return JobRun(
            job_id,
            config,
            self.sessions,
            self.metrics,
            data_dir=self.data_dir,
            assign_timeout=self.assign_timeout,
            heartbeat_seconds=self.worker_timeout / HEARTBEATS_PER_TIMEOUT,
            store=store,
            order=order,
            checkpoint_every=self.checkpoint_every,
            **kwargs,
        )

    def cancel(self, job_id: str) -> bool:
        job = self.jobs.get(job_id)
        if job is None or job.finished:
            return False
        if job is self._current and self._current_task is not None:
            job.error = job.error or "cancelled by a client"
            self._current_task.cancel()
        else:
            job.state = "cancelled"
            job.error = "cancelled by a client before it started"
            job._publish()
        return True

    # ------------------------------------------------------------ workers

    async def Connect(
        self, requests: AsyncIterator[Incoming], context: aio.ServicerContext
    ) -> AsyncIterator[pb.CoordinatorMessage | bytes]:
        """A worker's stream; requests arrive as parsed frames (message, tensor bytes, size)."""
        try:
            frame = await asyncio.wait_for(anext(requests), timeout=HELLO_TIMEOUT)
        except (StopAsyncIteration, TimeoutError):
            return
        if isinstance(frame, WireError):
            yield reject(f"bad message: {frame}", retry=True)
            return
        first = frame.message
        if first.WhichOneof("kind") != "hello" or first.hello.protocol != PROTOCOL:
            got = first.hello.protocol if first.HasField("hello") else first.WhichOneof("kind")
            yield reject(
                f"expected Hello with protocol {PROTOCOL!r}, got {got!r}: "
                "upgrade the worker to the coordinator's version",
                retry=False,
            )
            return
        if self._stopping:
            yield reject("coordinator is shutting down", retry=True)
            return
        hello = first.hello
        machine = machine_from_pb(hello.machine)
        refused = (
            check_worker_name(hello.name)
            or check_peer_address(hello.peer_address)
            or check_machine(machine)
        )
        if refused is not None:
            log.warning("refusing a worker from %s: %s", context.peer(), refused)
            yield reject(refused, retry=False)
            return
        session = self.sessions.new(
            hello.name or context.peer(),
            context.peer(),
            hello.has_data_dir,
            hello.peer_address,
            machine,
        )
        log.info(
            "worker %s connected from %s (%d connected)",
            session.name,
            session.peer,
            len(self.sessions),
        )
        reader = asyncio.create_task(self._read(session, requests))
        try:
            yield pb.CoordinatorMessage(
                welcome=pb.Welcome(
                    worker_name=session.name,
                    coordinator_version=VERSION,
                    heartbeat_seconds=self.worker_timeout / HEARTBEATS_PER_TIMEOUT,
                )
            )
            while True:
                message = await session.outbox.get()
                if message is None:
                    break
                yield message
        finally:
            reader.cancel()
            session.closed = True
            self.sessions.remove(session)
            job = self._job_of(session)
            if job is not None:
                job.lose(session, "disconnected")
            log.info("worker %s disconnected (%d connected)", session.name, len(self.sessions))

    async def _read(self, session: WorkerSession, requests: AsyncIterator[Incoming]) -> None:
        try:
            async for frame in requests:
                if isinstance(frame, WireError):
                    raise frame
                session.last_seen = time.monotonic()
                message = frame.message
                kind = message.WhichOneof("kind")
                job = self._job_of(session)
                if kind == "result":
                    if job is None or message.result.job_id != job.id:
                        continue  # a result of a finished job: nothing to do with it
                    job.deliver(session, message.result, frame.size, frame.data)
                elif kind == "ack" and job is not None:
                    job.ack(session, message.ack)
                elif kind == "error" and job is not None:
                    error = printable(message.error.message)
                    log.warning("%s reports: %s", session.label, error)
                    job.give_up(session, error)
                elif kind == "peer_failure" and job is not None:
                    job.peer_failure(session, message.peer_failure)
                elif kind == "heartbeat" and message.heartbeat.job_id:
                    beat = message.heartbeat
                    session.progress = (beat.job_id, int(beat.round), int(beat.attempt))
                    session.progress_at = asyncio.get_running_loop().time()
        except WireError as exc:
            log.warning("rejecting %s: %s", session.label, exc)
            reason = "non_finite" if isinstance(exc, NonFiniteError) else "rejected"
            self.metrics.stragglers.labels(reason).inc()
            session.send(reject(f"bad message: {exc}", retry=True))
            job = self._job_of(session)
            if job is not None:
                job.lose(session, f"sent a bad message: {exc}")
            session.close()
        except (asyncio.CancelledError, aio.AioRpcError):
            pass
        finally:
            # The worker closed its side: end our side too.
            session.close()

    def _job_of(self, session: WorkerSession) -> JobRun | None:
        job = self._current
        if job is not None and session.job_id == job.id:
            return job
        return None

    # ------------------------------------------------------------ clients

    async def SubmitJob(
        self, request: pb.SubmitJobRequest, context: aio.ServicerContext
    ) -> pb.SubmitJobResponse:
        try:
            config = JobConfig.from_json(request.job_json)
            # Planning a large code (n^2 for cyclic) must not stall the other jobs'
            # rounds: checked in a thread, then queued.
            await asyncio.to_thread(_validate, config, self.data_dir)
            job = self.submit(config, checked=True)
        except CodedGDError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except Exception as exc:  # a bug: say so instead of an opaque UNKNOWN
            log.exception("cannot validate a submitted job")
            await context.abort(grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}")
        return pb.SubmitJobResponse(job_id=job.id)

    async def WatchJob(
        self, request: pb.JobRef, context: aio.ServicerContext
    ) -> AsyncIterator[pb.RoundReport]:
        job = self.jobs.get(request.job_id)
        if job is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, _no_job(request.job_id))
            return
        sent = 0
        while True:
            change = asyncio.ensure_future(job.wait_change())
            while sent < len(job.records):
                try:
                    records = await _records_from(job.records, sent)
                except (OSError, CodedGDError) as exc:  # its file removed or damaged
                    change.cancel()
                    await context.abort(
                        grpc.StatusCode.UNAVAILABLE,
                        f"job {job.id}'s records from round {sent} cannot be read: {exc}",
                    )
                    return
                for record in records:
                    yield record_to_pb(record, job.id)
                    sent += 1
            if job.finished:
                change.cancel()
                break
            await change
        if job.state in ("failed", "diverged"):
            await context.abort(grpc.StatusCode.ABORTED, job.error)
        elif job.state == "cancelled":
            await context.abort(grpc.StatusCode.CANCELLED, job.error)
        elif job.state == "interrupted":
            await context.abort(grpc.StatusCode.UNAVAILABLE, job.error)

    async def GetStatus(
        self, request: pb.StatusRequest, context: aio.ServicerContext
    ) -> pb.StatusResponse:
        jobs = (
            [self.jobs[request.job_id]]
            if request.job_id in self.jobs
            else ([] if request.job_id else list(self.jobs.values()))
        )
        if request.job_id and not jobs:
            await context.abort(grpc.StatusCode.NOT_FOUND, _no_job(request.job_id))
        return pb.StatusResponse(
            jobs=[_status(j, self._current) for j in jobs],
            workers_connected=len(self.sessions),
            workers=[s.name for s in self.sessions.all()],
        )

    async def CancelJob(
        self, request: pb.JobRef, context: aio.ServicerContext
    ) -> pb.CancelJobResponse:
        if request.job_id not in self.jobs:
            await context.abort(grpc.StatusCode.NOT_FOUND, _no_job(request.job_id))
        return pb.CancelJobResponse(cancelled=self.cancel(request.job_id))

    async def GetModel(
        self, request: pb.JobRef, context: aio.ServicerContext
    ) -> AsyncIterator[pb.ModelChunk]:
        job = self.jobs.get(request.job_id)
        if job is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, _no_job(request.job_id))
            return
        theta = job.theta
        if theta is None:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"job {job.id} has no model yet: it has not completed a round ({job.state})",
            )
            return
        saved = trained_model(job.config, theta, job.records, job.features)
        for message in model_messages(saved):
            yield message


async def _records_from(records: RecordLog, start: int) -> list[RoundRecord]:
    """The records from index ``start`` on that come next: a chunk read from the file in a
    thread while ``start`` is before the in-memory window, else the window's rest.

    Indices are absolute and the file holds every record counted, so however the window
    moves meanwhile (rounds keep arriving), consecutive calls neither skip nor repeat one.
    """
    first = records.first_in_memory
    if start < first:
        return await asyncio.to_thread(records.read_file, start, min(first, start + REPLAY_CHUNK))
    return records.read(start, len(records))


def _status(job: JobRun, current: JobRun | None = None) -> pb.JobStatus:
    last = job.records[-1] if job.records else None
    detail = job.detail
    if job.state == "queued" and current is not None and current is not job:
        detail = f"queued behind job {current.id} (jobs run one at a time)"
    return pb.JobStatus(
        job_id=job.id,
        state=job.state,
        round=job.round,
        rounds=job.config.rounds,
        error=job.error,
        loss=last.loss if last else float("nan"),
        metric=last.metric if last else float("nan"),
        metric_name=last.metric_name if last else "",
        detail=detail,
        workers_missing=job.workers_missing,
        workers_needed=job.config.workers,
        uploads=job.uploads,
        computations=job.computations,
    )


def _no_job(job_id: str) -> str:
    """NOT_FOUND's text: the id as asked, cut (a long one would push the status past
    gRPC's 16 KiB metadata limit and the caller would see RESOURCE_EXHAUSTED instead)."""
    return f"no job {printable(job_id, limit=64)!r}"


def _validate(config: JobConfig, data_dir: str | None) -> None:
    """Checks that need no data: names, parameters, the plan for n (fast; raises ConfigError)."""
    from codedgd.services.models import check_target_loss, create_model
    from codedgd.services.policies import create
    from codedgd.services.stragglers import create_straggler_model

    policy = create(config.policy.name, config.policy.options, seed=config.seed)
    k = config.partitions or policy.default_partitions(config.workers)
    plan = policy.plan(config.workers, k)
    check_topology(plan.topology.kind, policy.name)
    check_guard(config, plan)
    create_straggler_model(
        config.stragglers.name,
        config.stragglers.options,
        seed=config.seed,
        n_workers=config.workers,
    )
    if config.init_from is not None:  # the file, its integrity and its model; dim at start
        from codedgd.services.job.prepare import initial_theta

        initial_theta(config)
    from codedgd.services.data import (
        check_dataset_options,
        check_owner_partitions,
        data_owners,
        dataset_task,
    )

    check_dataset_options(config.data.name, config.data.options, data_dir)
    owners = data_owners(config.data.name, config.data.options)
    if owners is not None:
        check_owner_partitions(config.data.name, owners, k)
    model = create_model(config.model.name, config.model.options)
    if config.target_loss is not None:
        check_target_loss(config.model.name, config.target_loss, "job.target_loss")
    task = dataset_task(config.data.name, config.data.options)
    if model.metric_name == "auc" and task == "regression":
        raise ConfigError(
            f"dataset {config.data.name!r} is a regression task (real-valued targets) and "
            f"model {config.model.name!r} needs 0/1 labels: use --model least-squares "
            '([model] name = "least-squares")'
        )
    if task == "multiclass" and model.metric_name in ("auc", "mse"):
        raise ConfigError(
            f"dataset {config.data.name!r} has class labels 0..C-1 and model "
            f"{config.model.name!r} is linear (0/1 labels or real targets): use --model mlp "
            "or --model cnn (pip install 'codedgd[torch]')"
        )
    if model.metric_name == "accuracy" and task == "regression":
        raise ConfigError(
            f"dataset {config.data.name!r} is a regression task and model "
            f"{config.model.name!r} classifies: use --model least-squares"
        )
    if lr_times_inverse_l(config.optimizer.get("lr", "auto")) is not None:
        try:  # a network (or a plugin) without one is refused now, naming --lr
            model.smoothness(np.zeros((1, 1)))
        except ConfigError:
            raise
        except Exception:  # a model that needs its real data to answer: checked at start
            pass
    # The step size, schedule and the rest, checked now rather than when the job starts
    # (L = 1 stands in for the data's smoothness: lr = "auto" is always valid here).
    create_optimizer(config.optimizer, np.zeros(1), smoothness=1.0)
