"""One job on the coordinator: assignment, then the round loop.

Round t: ``policy.begin_round`` says whom to contact; θ_t is serialized once
and the same bytes are queued for each of those workers; every arriving result
is checked (round, shape, dtype) and offered to the policy until it can decode
(for a policy that sums every payload, ``Policy.arrival_sum``, each chunk is
added into that sum as it arrives instead of being assembled first);
the workers still busy get Cancel{t}; the estimate is decoded (in a thread for
large ℓ), the optimizer steps, and a :class:`RoundRecord` is published.

A result of an earlier round is counted and dropped, never mixed in. A worker
that sends a malformed result is disconnected and treated as lost. A worker that
connects while the job has lost workers takes the place of one (its assignment
and data, then θ of the round in progress if that round still needs it). When a
lost worker makes the round undecodable (``policy.feasible``), the round waits
``job.replace_timeout`` seconds for such a replacement, then the job fails with
an error naming the worker: the coordinator keeps serving other jobs. A worker
lost part-way through a result that was being added into the sum leaves those
bytes in it; its replacement computes the same values (same place, same θ_t) and
adds only the rest.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from prometheus_client import Histogram

from codedgd.services.coordinator.metrics import CoordinatorMetrics
from codedgd.services.coordinator.sessions import Sessions, WorkerSession
from codedgd.services.data import check_owner_partitions, is_generated
from codedgd.services.data.dataset import (
    FINGERPRINT_PREFIX,
    Dataset,
    Matrix,
    fingerprint,
    partition_rows,
    take_rows,
)
from codedgd.services.errors import CodedGDError, ConfigError, DecodeError, JobFailed, WireError
from codedgd.services.job import JobConfig
from codedgd.services.models.base import Model
from codedgd.services.policies.base import Estimate, JobContext, Plan, Policy
from codedgd.services.proto import codedgd_pb2 as pb
from codedgd.services.reports import RoundRecord
from codedgd.services.wire import (
    DEFAULT_CHUNK_BYTES,
    PARTITION_DATA,
    THETA_DATA,
    Assembler,
    BufferPool,
    chunks,
    framed,
    tensor_chunks,
)

log = logging.getLogger("codedgd.coordinator")
# A job's outcome, for an operator's log; `codedgd run` reports it itself and mutes this.
outcome_log = logging.getLogger("codedgd.coordinator.outcome")

# A decode that took less than this last round runs on the event loop (the thread
# hand-off would cost more); longer ones run in a thread so the loop stays free.
INLINE_DECODE_SECONDS = 0.002
# How long a job's end waits for its replacer task to let go of a joining newcomer
# (it only has to send JobEnd; the bound keeps a bug there from hanging the job).
REPLACER_EXIT_SECONDS = 5.0


@dataclass
class _Arrival:
    worker: int
    result: pb.Result
    payload: np.ndarray | None  # assembled payload (None: skipped, or summed on arrival)
    received: float
    summed: bool = False  # the payload was added into the policy's arrival_sum()


@dataclass
class _Lost:
    worker: int
    reason: str
    session: WorkerSession  # who held the index then (a later holder is not lost)


@dataclass
class _Replaced:
    worker: int  # the index a newly connected worker now holds
    session: WorkerSession


@dataclass
class Prepared:
    """What a job needs before its first round (built off the event loop)."""

    dataset: Dataset
    model: Model
    policy: Policy
    plan: Plan
    blocks: list[np.ndarray]
    lr: float


@dataclass(frozen=True)
class _Outcome:
    """What one round produced, before the step."""

    estimate: Estimate
    wait_seconds: float
    decode_seconds: float
    compute_max: float
    bytes_up: int
    bytes_down: int
    uploads: int
    computations: int
    cancelled: int
    late: int
    responses: dict[int, float]  # worker → seconds from θ_t sent to its result received
    computes: dict[int, float]  # worker → its reported compute seconds


@dataclass
class _Partial:
    round: int
    assembler: Assembler | None  # None: the round takes no more of this result; drop it
    first: pb.Result
    summing: bool = False  # chunks are added into the policy's arrival_sum()


@dataclass
class JobRun:
    """A submitted job and its state, watched by clients."""

    id: str
    config: JobConfig
    sessions: Sessions
    metrics: CoordinatorMetrics
    data_dir: str | None = None
    assign_timeout: float = 120.0
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    state: str = "queued"
    error: str = ""
    round: int = 0
    records: list[RoundRecord] = field(default_factory=list)
    theta: np.ndarray | None = None
    on_record: Callable[[RoundRecord], None] | None = None
    _workers: list[WorkerSession] = field(default_factory=list)
    _events: asyncio.Queue[_Arrival | _Lost | _Replaced] = field(default_factory=asyncio.Queue)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    _partials: dict[int, _Partial] = field(default_factory=dict)
    _payload_len: list[int] = field(default_factory=list)
    _lost: set[int] = field(default_factory=set)
    _current_round: int = -1
    _summing: np.ndarray | None = None  # policy.arrival_sum() of the current round
    _expecting: set[int] = field(default_factory=set)  # results the sum still takes
    # place → leading bytes of its result in the sum already, from a holder lost part-way
    _summed_prefix: dict[int, int] = field(default_factory=dict)
    _late: int = 0
    _bytes_up: int = 0
    _acks: dict[int, asyncio.Future[str]] = field(default_factory=dict)
    _last_decode: float = math.inf  # seconds policy.decode itself took last round
    _pool: BufferPool = field(default_factory=lambda: BufferPool(0))
    _retired: set[int] = field(default_factory=set)  # ids of sessions this job lost
    _candidates: dict[int, WorkerSession] = field(default_factory=dict)  # index → joining
    _histograms: dict[int, tuple[Histogram, Histogram]] = field(default_factory=dict)
    _vacant: set[int] = field(default_factory=set)  # lost places the running round wants
    _vacancy: asyncio.Event = field(default_factory=asyncio.Event)  # set while any is lost

    # ------------------------------------------------------------ events from sessions

    def deliver(
        self,
        session: WorkerSession,
        result: pb.Result,
        nbytes: int,
        data: memoryview | None = None,
    ) -> None:
        """A Result message from a worker of this job (called by the stream reader).

        ``data`` is the payload chunk's bytes when they were kept out of ``result``
        (:func:`codedgd.services.framing.parse`).
        """
        worker = session.index
        if not 0 <= worker < len(self._workers) or self._workers[worker] is not session:
            return  # not (or no longer) this job's worker at that index
        if worker in self._lost:
            return  # lost (it reported an error, say) while its stream stays open: unused
        self._bytes_up += nbytes
        self.metrics.bytes_up.inc(nbytes)
        if result.round < self._current_round:
            self._partials.pop(worker, None)
            self._late += 1
            self.metrics.stragglers.labels("late_dropped").inc()
            return
        if result.round > self._current_round:
            raise WireError(
                f"result for round {result.round} but round {self._current_round} is running"
            )
        if result.skipped:
            self._events.put_nowait(_Arrival(worker, result, None, time.perf_counter()))
            return
        partial = self._partials.get(worker)
        if partial is None or partial.round != result.round or result.payload.index == 0:
            if partial is not None and partial.round == result.round and partial.summing:
                raise WireError(
                    f"result for round {result.round} started over after part of it was summed"
                )
            partial = self._new_partial(worker, result)
            self._partials[worker] = partial
        if partial.assembler is None or (partial.summing and worker not in self._expecting):
            # A second result this round, or one the round decoded without: dropped.
            if result.payload.index + 1 >= result.payload.count:
                del self._partials[worker]
            return
        payload = partial.assembler.add(result.payload, data)  # WireError on a bad message
        if payload is not None:
            del self._partials[worker]
            now = time.perf_counter()
            if partial.summing:
                self._expecting.discard(worker)
                self._events.put_nowait(_Arrival(worker, partial.first, None, now, summed=True))
            else:
                self._events.put_nowait(_Arrival(worker, partial.first, payload, now))

    def _new_partial(self, worker: int, result: pb.Result) -> _Partial:
        """Where a result's chunks go: the policy's running sum, a pooled buffer, or nowhere."""
        shape = (self._payload_len[worker],)
        if self._summing is None:
            pooled = Assembler("gradient", dtype="<f8", shape=shape, pool=self._pool)
            return _Partial(int(result.round), pooled, result)
        if worker not in self._expecting:
            return _Partial(int(result.round), None, result, summing=True)
        adding = Assembler(
            "gradient",
            dtype="<f8",
            shape=shape,
            add_into=self._summing,
            skip_bytes=self._summed_prefix.get(worker, 0),
        )
        return _Partial(int(result.round), adding, result, summing=True)

    def ack(self, session: WorkerSession, ack: pb.AssignmentAck) -> None:
        index = session.index
        holder = self._workers[index] if 0 <= index < len(self._workers) else None
        joining = self._candidates.get(index)
        if session is not (joining if joining is not None else holder):
            return  # while a newcomer joins at the index, only its ack counts
        future = self._acks.get(index)
        if future is not None and not future.done() and ack.job_id == self.id:
            future.set_result(ack.error)

    def lose(self, session: WorkerSession, reason: str) -> None:
        """A worker of this job disconnected, failed, or was thrown out."""
        index = session.index
        future = self._acks.get(index)
        if self._candidates.get(index) is session:
            # A replacement lost before it acknowledged: its place stays vacant.
            if future is not None and not future.done():
                future.set_result(f"disconnected: {reason}")
            return
        if index < 0 or index in self._lost or self._workers[index] is not session:
            return  # not (or no longer) one of this job's workers
        self._lost.add(index)
        self._retired.add(session.id)
        partial = self._partials.pop(index, None)
        if (
            partial is not None
            and partial.round == self._current_round
            and partial.summing
            and partial.assembler is not None
        ):
            # Part of its result is in the sum: whoever takes the place adds the rest.
            self._summed_prefix[index] = partial.assembler.added_bytes
        self._vacancy.set()
        self.metrics.stragglers.labels("lost").inc()
        if future is not None and not future.done():
            future.set_result(f"disconnected: {reason}")
        self._events.put_nowait(_Lost(index, reason, session))

    # ------------------------------------------------------------ watchers

    def wait_change(self) -> Coroutine[Any, Any, bool]:
        """Wait for the next change (a round, a state) published after this call.

        The event is taken now, not when the awaiting task first runs: a watcher that
        wraps this in a task (``ensure_future``, ``wait_for``) cannot miss a change
        published in between, such as the job's end.
        """
        return self._changed.wait()

    def _publish(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    @property
    def finished(self) -> bool:
        return self.state in ("done", "failed", "cancelled")

    # ------------------------------------------------------------ the job

    async def run(self) -> None:
        try:
            self.state = "assigning"
            self._publish()
            prepared = await asyncio.to_thread(prepare, self.config, self.data_dir)
            await self._assign(prepared)
            self.state = "running"
            self._publish()
            replacer = asyncio.create_task(self._replace_lost(prepared))
            replacer.add_done_callback(_log_crash)
            try:
                await self._rounds(prepared)
            finally:
                cancelled_meanwhile = await _stop_replacer(replacer)
            if cancelled_meanwhile:  # a client's cancel landed as the last round ended
                raise asyncio.CancelledError
            self.state = "done"
        except asyncio.CancelledError:
            self.state = "cancelled"
            self.error = self.error or "cancelled by a client"
        except CodedGDError as exc:
            self.state = "failed"
            self.error = str(exc)
            outcome_log.error("job %s failed: %s", self.id, exc)
        except Exception as exc:  # a bug: report it instead of hanging watchers
            self.state = "failed"
            self.error = f"internal error: {type(exc).__name__}: {exc}"
            log.exception("job %s crashed", self.id)
        finally:
            self._release()
            self.metrics.jobs.labels(self.state).inc()
            self._publish()

    def _release(self) -> None:
        for s in self._workers:
            self._detach(s, self.state)

    def _detach(self, session: WorkerSession, reason: str) -> None:
        """Tell a worker this job is over for it (JobEnd) and free its session."""
        session.send(pb.CoordinatorMessage(job_end=pb.JobEnd(job_id=self.id, reason=reason)))
        session.job_id, session.index = None, -1

    async def _assign(self, prepared: Prepared) -> None:
        n = self.config.workers
        try:
            self._workers = await self.sessions.wait_idle(n, self.assign_timeout)
        except TimeoutError:
            raise JobFailed(
                f"the job needs {n} workers but only {len(self.sessions.idle())} idle worker(s) "
                f"connected within {self.assign_timeout:.0f} s: start more workers "
                f"(codedgd worker --coordinator ...) or lower job.workers"
            ) from None
        plan = prepared.plan
        dim = prepared.dataset.dim
        self._payload_len = [plan.payload_length(i, dim) for i in range(n)]
        # One round's results, plus as many held by the policy (lazy rules keep n).
        self._pool = BufferPool(2 * n + 2)
        job_json = self.config.to_json()
        loop = asyncio.get_running_loop()
        for index, session in enumerate(self._workers):
            session.job_id = self.id
            session.index = index
            self._acks[index] = loop.create_future()
        for index, session in enumerate(self._workers):
            await self._send_assignment(index, session, prepared, job_json)
        for index, future in self._acks.items():
            try:
                error = await asyncio.wait_for(future, timeout=self.assign_timeout)
            except TimeoutError:
                error = f"no acknowledgement within {self.assign_timeout:.0f} s"
            if error:
                raise JobFailed(f"{self._workers[index].label} cannot take its assignment: {error}")

    async def _send_assignment(
        self,
        index: int,
        session: WorkerSession,
        prepared: Prepared,
        job_json: str,
        *,
        replacement: bool = False,
    ) -> None:
        """Queue worker ``index``'s Assignment, its partitions' rows and AssignmentEnd."""
        plan, ds = prepared.plan, prepared.dataset
        n, dim = self.config.workers, ds.dim
        wp = plan.workers[index]
        coeff = next(tensor_chunks("coefficients", wp.coefficients.astype(np.float64)))
        # A worker started with --data-dir loads real datasets itself (no data on the
        # wire); the fingerprints let it prove it holds the rows planned here.
        from_disk = session.has_data_dir and not is_generated(self.config.data.name)
        options = dict(wp.options)
        parts = {p: take_rows(ds.X_train, prepared.blocks[p]) for p in wp.partitions}
        if from_disk:
            for p in wp.partitions:
                key = f"{FINGERPRINT_PREFIX}{p}"
                options[key] = fingerprint(parts[p], ds.y_train[prepared.blocks[p]])
        assignment = pb.CoordinatorMessage(
            assignment=pb.Assignment(
                job_id=self.id,
                worker_index=index,
                n_workers=n,
                job_json=job_json,
                partitions=list(wp.partitions),
                coefficients=coeff,
                chunks=wp.chunks,
                dim=dim,
                inline_data=not from_disk,
                options=options,
                n_partitions=plan.n_partitions,
                replacement=replacement,
            )
        )
        session.send(assignment)
        self.metrics.assignment_bytes.inc(assignment.ByteSize())
        for p in wp.partitions if not from_disk else ():
            messages = _partition_messages(
                self.id, p, parts[p], ds.y_train[prepared.blocks[p]], self.chunk_bytes
            )
            for message in messages:
                session.send(message)
                self.metrics.assignment_bytes.inc(len(message))
                await asyncio.sleep(0)
        session.send(pb.CoordinatorMessage(assignment_end=pb.AssignmentEnd(job_id=self.id)))

    async def _replace_lost(self, prepared: Prepared) -> None:
        """Give each lost worker's place to a worker that connects during the job.

        Runs beside the rounds. Each idle worker that connects takes a lost index no one
        is joining at yet (one the running round waits for first, else the lowest), so
        several places fill at once and a newcomer that never acknowledges holds up only
        its own. The newcomer gets the lost worker's assignment and data; once it
        acknowledges, it holds that index and the round loop hears of it (``_Replaced``).
        A worker this job already lost (or one that failed to join) is never taken back.
        """
        job_json = self.config.to_json()
        joining: set[asyncio.Task[None]] = set()
        try:
            while True:
                await self._vacancy.wait()
                if not self._lost - self._candidates.keys():
                    self._vacancy.clear()  # set again by a loss or a failed newcomer
                    continue
                session = await self.sessions.next_idle(lambda s: s.id not in self._retired)
                open_places = self._lost - self._candidates.keys()
                if not open_places:
                    continue
                index = self._next_place(open_places)
                session.job_id, session.index = self.id, index  # no longer idle
                self._candidates[index] = session
                # With the candidate, so lose() can answer it before the task first runs.
                self._acks[index] = asyncio.get_running_loop().create_future()
                task = asyncio.create_task(self._take_place(index, session, prepared, job_json))
                task.add_done_callback(_log_crash)
                joining.add(task)
                task.add_done_callback(joining.discard)
        finally:
            for task in joining:
                task.cancel()
            if joining:
                await asyncio.wait(joining)
            for session in list(self._candidates.values()):  # a task cancelled unstarted
                self._detach(session, "not needed")
            self._candidates.clear()

    def _next_place(self, open_places: set[int]) -> int:
        """The place a newcomer takes: one the running round waits for, else the lowest."""
        return min(open_places & self._vacant or open_places)

    async def _take_place(
        self, index: int, session: WorkerSession, prepared: Prepared, job_json: str
    ) -> None:
        """Assign lost worker ``index``'s part to newcomer ``session``; on its ack, swap it in."""
        try:
            await self._send_assignment(index, session, prepared, job_json, replacement=True)
            try:
                error = await asyncio.wait_for(self._acks[index], self.assign_timeout)
            except TimeoutError:
                error = f"no acknowledgement within {self.assign_timeout:.0f} s"
        except BaseException:  # the job ended (or a bug) while the newcomer joined
            self._detach(session, "not needed")
            raise
        finally:
            self._candidates.pop(index, None)
        if error or session.closed:
            log.warning(
                "job %s: %s cannot take the place of worker %d: %s",
                self.id,
                session.label,
                index,
                error or "disconnected",
            )
            self._retired.add(session.id)
            self._detach(session, "not taken")
            self._vacancy.set()  # the place is open again
            return
        self._detach(self._workers[index], "lost")  # if still connected, it lets go
        self._partials.pop(index, None)  # nothing of the old holder's carries over
        self._workers[index] = session
        self._lost.discard(index)
        self.metrics.replacements.inc()
        log.info("job %s: %s took the place of lost worker %d", self.id, session.label, index)
        self._events.put_nowait(_Replaced(index, session))

    async def _rounds(self, prepared: Prepared) -> None:
        from codedgd.services.models import objective
        from codedgd.services.optim import check_converging, create_optimizer, objective_gradient

        cfg = self.config
        ds, model, policy = prepared.dataset, prepared.model, prepared.policy
        opt_options = dict(cfg.optimizer)
        opt_options["lr"] = prepared.lr
        optimizer = create_optimizer(opt_options, np.zeros(ds.dim))
        n_rows = ds.n_train
        # The children every round updates, looked up once (labels() takes a lock).
        round_hist = self.metrics.round_duration.labels(policy.name)
        wait_hist = self.metrics.wait_duration.labels(policy.name)
        decode_hist = self.metrics.decode_duration.labels(policy.name)
        rounds_done = self.metrics.rounds.labels(policy.name)
        wall = 0.0
        self.metrics.job_info.info(
            {
                "policy": policy.name,
                "model": cfg.model.name,
                "dataset": cfg.data.name,
                "workers": str(cfg.workers),
            }
        )
        for t in range(cfg.rounds):
            self.round = t
            self.metrics.round.set(t)
            point = optimizer.point()
            round_start = time.perf_counter()
            out = await self._one_round(t, point, policy)
            estimate = out.estimate
            optimizer.update(objective_gradient(estimate.gradient, n_rows, model.l2, point))
            round_s = time.perf_counter() - round_start
            wall += round_s
            self.theta = optimizer.theta
            loss = metric = math.nan
            if t % cfg.eval_every == 0 or t == cfg.rounds - 1:
                theta = optimizer.theta
                loss, metric = await asyncio.to_thread(_evaluate, model, theta, ds, objective)
                check_converging(t, loss, prepared.lr, policy.divergence_hint())
                self.metrics.loss.set(loss)
                self.metrics.metric.labels(model.metric_name).set(metric)
            record = RoundRecord(
                round=t,
                wall_seconds=wall,
                round_seconds=round_s,
                wait_seconds=out.wait_seconds,
                decode_seconds=out.decode_seconds,
                compute_seconds_max=out.compute_max,
                loss=loss,
                metric=metric,
                metric_name=model.metric_name,
                workers_used=tuple(sorted(estimate.workers_used)),
                exact=estimate.exact,
                decode_residual=estimate.residual,
                bytes_up=out.bytes_up,
                bytes_down=out.bytes_down,
                uploads=out.uploads,
                computations=out.computations,
                cancelled=out.cancelled,
                late_dropped=out.late,
                response_seconds=out.responses,
                worker_compute_seconds=out.computes,
            )
            round_hist.observe(round_s)
            wait_hist.observe(out.wait_seconds)
            decode_hist.observe(out.decode_seconds)
            rounds_done.inc()
            self.records.append(record)
            if self.on_record is not None:
                self.on_record(record)
            self._publish()
            if cfg.target_loss is not None and not math.isnan(loss) and loss <= cfg.target_loss:
                log.info("job %s reached target loss %.6g at round %d", self.id, loss, t)
                break

    async def _one_round(self, t: int, point: np.ndarray, policy: Policy) -> _Outcome:
        spec = policy.begin_round(t, point)
        self._current_round = t
        self._late = 0
        self._bytes_up = 0
        contacted = [w for w in spec.workers if w not in self._lost]
        # Results are added into the policy's sum chunk by chunk as they arrive, when
        # the policy sums every payload (Policy.arrival_sum); else assembled and offered.
        self._summing = policy.arrival_sum()
        self._expecting = set(contacted)
        self._summed_prefix = {}
        outstanding = set(contacted)
        vacant = {w for w in spec.workers if w in self._lost}  # wanted, lost, not replaced
        self._vacant = vacant  # the replacer fills these places first
        loop = asyncio.get_running_loop()
        deadline_at = loop.time() + self.config.round_timeout
        replace_by: float | None = None  # waiting for a replacement until then
        if not policy.feasible(frozenset(outstanding)):
            replace_by = self._await_replacement(t, policy, loop.time())
        # Serialize θ_t once; the same bytes go to every contacted worker.
        frames = []
        for c in chunks("theta", point, self.chunk_bytes):
            message = pb.CoordinatorMessage()
            start = message.round
            start.job_id = self.id
            start.round = t
            if c.index == 0:
                start.params.update(spec.params)
            c.fill(start.theta, with_data=False)
            frames.append(framed(message, THETA_DATA, c.data))
        frame_bytes = sum(len(f) for f in frames)
        sent_at = time.perf_counter()
        for w in contacted:
            for frame in frames:
                self._workers[w].send(frame)
        bytes_down = frame_bytes * len(contacted)
        self.metrics.bytes_down.inc(bytes_down)
        self.metrics.computations.inc(len(contacted))
        compute_max = 0.0
        uploads = 0
        cancelled_early = 0
        responses: dict[int, float] = {}
        computes: dict[int, float] = {}
        # Decodable before any arrival: no one contacted, or (lazy policies) enough stale
        # messages count already.
        decodable = policy.feasible(frozenset())
        while not decodable:
            # While the round cannot decode without a replacement, replace_timeout rules
            # (it may be longer than round_timeout); else round_timeout.
            try:
                # Results often arrive together: take one already queued without arming
                # a timer (a deadline already past still fails at the next wait).
                event = self._events.get_nowait()
            except asyncio.QueueEmpty:
                event = None
            try:
                if event is None:
                    async with asyncio.timeout_at(
                        replace_by if replace_by is not None else deadline_at
                    ):
                        event = await self._events.get()
            except TimeoutError:
                if replace_by is not None:  # no replacement in time
                    raise JobFailed(
                        no_replacement_message(t, sorted(vacant), self.config.replace_timeout)
                        + self._infeasible_message(t, policy)
                    ) from None
                raise JobFailed(
                    f"round {t} was not decodable within job.round_timeout="
                    f"{self.config.round_timeout:g} s; still waiting for workers "
                    f"{sorted(outstanding | vacant)}"
                ) from None
            if isinstance(event, _Replaced):
                w = event.worker
                if self._workers[w] is not event.session or w in self._lost:
                    continue  # stale: that newcomer was lost again since
                if w in vacant and w not in policy.superseded():
                    # The round still wants this worker: send it θ_t, with a round's time.
                    vacant.discard(w)
                    deadline_at = max(deadline_at, loop.time() + self.config.round_timeout)
                    for frame in frames:
                        self._workers[w].send(frame)
                    bytes_down += frame_bytes
                    self.metrics.bytes_down.inc(frame_bytes)
                    self.metrics.computations.inc()
                    contacted.append(w)
                    outstanding.add(w)
                    if self._summing is not None:
                        self._expecting.add(w)
                    if policy.feasible(frozenset(outstanding)):
                        replace_by = None
                continue
            if isinstance(event, _Lost):
                if self._workers[event.worker] is not event.session:
                    continue  # stale: the index has a new holder since
                if event.worker in outstanding and event.worker in spec.workers:
                    vacant.add(event.worker)
                outstanding.discard(event.worker)
                self._expecting.discard(event.worker)
                if replace_by is None and not policy.feasible(frozenset(outstanding)):
                    why = f"worker {event.worker} was lost in round {t} ({event.reason}); "
                    replace_by = self._await_replacement(t, policy, loop.time(), why)
                continue
            if event.result.round != t:
                self._late += 1  # completed after its round had decoded: dropped
                self.metrics.stragglers.labels("late_dropped").inc()
                continue
            if event.worker not in outstanding:
                continue
            outstanding.discard(event.worker)
            if event.payload is not None or event.summed:
                uploads += 1
                self.metrics.uploads.inc()
            else:
                self.metrics.uploads_skipped.inc()
            compute_hist, response_hist = self._worker_histograms(event.worker)
            compute_hist.observe(event.result.compute_seconds)
            response_hist.observe(event.received - sent_at)
            compute_max = max(compute_max, event.result.compute_seconds)
            responses[event.worker] = event.received - sent_at
            computes[event.worker] = event.result.compute_seconds
            if event.summed:
                decodable = policy.offer_summed(event.worker)
            else:
                decodable = policy.offer(event.worker, event.payload)
            if not decodable:
                superseded = policy.superseded() & outstanding
                if superseded:
                    self._cancel(t, superseded)
                    outstanding -= superseded
                    cancelled_early += len(superseded)
                # With a wanted worker missing, an arrival can make the round need more
                # than it did at the loss (cyclic, polynomial and lagc wait past n-s for a
                # near-singular set): fail or wait for a replacement now, not at
                # round_timeout. With no one missing, every arrival keeps it feasible.
                if vacant and replace_by is None and not policy.feasible(frozenset(outstanding)):
                    why = (
                        f"round {t}: the results so far decode above the policy's tol (a "
                        "near-singular set; see its tol and code options) and the workers "
                        "left cannot fix that; "
                    )
                    replace_by = self._await_replacement(t, policy, loop.time(), why)
        decodable_at = time.perf_counter()
        self._expecting.clear()  # the sum is final: later chunks of this round are dropped
        unfinished = set(self._summed_prefix) - responses.keys()
        if unfinished:  # no policy decodes so today (uncoded waits for every place)
            raise JobFailed(
                f"round {t} decoded without place(s) {sorted(unfinished)}, part of whose "
                "result is in the sum: the estimate would be wrong"
            )
        self._cancel(t, outstanding)
        try:
            if self._last_decode < INLINE_DECODE_SECONDS:
                estimate, self._last_decode = _timed(policy.decode)
            else:
                estimate, self._last_decode = await asyncio.to_thread(_timed, policy.decode)
        except DecodeError as exc:
            self.metrics.decode_errors.inc()
            raise JobFailed(f"round {t}: decoding failed: {exc}") from None
        decode_s = time.perf_counter() - decodable_at
        return _Outcome(
            estimate=estimate,
            wait_seconds=decodable_at - sent_at,
            decode_seconds=decode_s,
            compute_max=compute_max,
            bytes_up=self._bytes_up,
            bytes_down=bytes_down,
            uploads=uploads,
            computations=len(contacted),
            cancelled=len(outstanding) + cancelled_early,
            late=self._late,
            responses=responses,
            computes=computes,
        )

    def _worker_histograms(self, worker: int) -> tuple[Histogram, Histogram]:
        """Worker ``worker``'s compute and response histograms (labels() once per job)."""
        pair = self._histograms.get(worker)
        if pair is None:
            label = str(worker)
            pair = (
                self.metrics.worker_compute.labels(label),
                self.metrics.worker_response.labels(label),
            )
            self._histograms[worker] = pair
        return pair

    def _cancel(self, t: int, workers: set[int] | frozenset[int]) -> None:
        """Send Cancel{t} to these workers: their result for round t is not needed."""
        if not workers:
            return
        cancel = pb.CoordinatorMessage(
            cancel=pb.Cancel(job_id=self.id, round=t)
        ).SerializeToString()
        for w in workers:
            self._workers[w].send(cancel)
        self.metrics.stragglers.labels("cancelled").inc(len(workers))

    def _await_replacement(self, t: int, policy: Policy, now: float, why: str = "") -> float:
        """The time until which round t waits for lost workers' replacements, or fail."""
        wait = self.config.replace_timeout
        if wait <= 0:
            raise JobFailed(why + self._infeasible_message(t, policy))
        log.warning(
            "job %s: round %d cannot decode without lost worker(s) %s; waiting up to %g s "
            "for new workers to take their place",
            self.id,
            t,
            sorted(self._lost),
            wait,
        )
        return now + wait

    def _infeasible_message(self, t: int, policy: Policy) -> str:
        lost = [self._workers[w].label for w in sorted(self._lost)]
        return infeasible_message(policy.name, t, lost)


def no_replacement_message(t: int, vacant: list[int], replace_timeout: float) -> str:
    """The start of the error of a round whose replacement did not come (real or simulated)."""
    return (
        f"round {t}: no worker took the place of lost worker(s) {vacant} within "
        f"job.replace_timeout={replace_timeout:g} s; "
    )


def infeasible_message(policy: str, t: int, lost: list[str]) -> str:
    """Why round t cannot decode without the lost workers, and the fixes (real or simulated)."""
    return (
        f"policy {policy!r} cannot decode round {t} without the lost worker(s) "
        f"[{', '.join(lost) or 'none'}]. Set job.replace_timeout (--replace-timeout) so a new "
        "worker can take its place, use a policy that tolerates more stragglers (e.g. "
        "ignore-stragglers, frc or cyclic with a larger s), or restart the job with all "
        "workers up."
    )


def _timed(decode: Callable[[], Estimate]) -> tuple[Estimate, float]:
    """The estimate and the seconds ``decode`` itself took (not a thread's handoff: under
    load that alone can pass INLINE_DECODE_SECONDS and keep a fast decode off the loop)."""
    start = time.perf_counter()
    estimate = decode()
    return estimate, time.perf_counter() - start


async def _stop_replacer(replacer: asyncio.Task[None]) -> bool:
    """Cancel the replacer and let it release newcomers caught joining (JobEnd).

    Awaited, so that happens before the job's end is published, not by chance of the
    loop's order after it. A cancel of the job landing meanwhile does not cut that
    short; it is reported (True) so a job that was ending well ends cancelled, as the
    client was told, while one already failing keeps its error.
    """
    replacer.cancel()
    try:
        await asyncio.wait([replacer], timeout=REPLACER_EXIT_SECONDS)
    except asyncio.CancelledError:
        await asyncio.wait([replacer], timeout=REPLACER_EXIT_SECONDS)
        return True
    return False


def _log_crash(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("replacing lost workers stopped", exc_info=task.exception())


def prepare(config: JobConfig, data_dir: str | None) -> Prepared:
    """Load data, build model and policy, plan, and choose the step size (blocking)."""
    from codedgd.services.data import load_dataset
    from codedgd.services.models import create_model
    from codedgd.services.policies import create

    policy = create(config.policy.name, config.policy.options, seed=config.seed)
    model = create_model(config.model.name, config.model.options)
    n = config.workers
    k = config.partitions or policy.default_partitions(n)
    plan = policy.plan(n, k)  # before loading data: a wrong n fails fast
    dataset = load_dataset(
        config.data.name, config.data.options, seed=config.seed, data_dir=data_dir
    )
    if k > dataset.n_train:
        raise ConfigError(f"{k} partitions but only {dataset.n_train} training rows")
    if dataset.blocks is not None:
        check_owner_partitions(dataset.name, len(dataset.blocks), k)
        blocks = [np.asarray(b, dtype=np.int64) for b in dataset.blocks]
    else:
        blocks = partition_rows(dataset.n_train, k, config.seed)
    lr = choose_lr(config, model, dataset.X_train)
    policy.bind(_context(config, model, dataset, blocks, lr))
    return Prepared(dataset, model, policy, plan, blocks, lr)


def _context(
    config: JobConfig, model: Model, dataset: Dataset, blocks: list[np.ndarray], lr: float
) -> JobContext:
    """The policy's view of the loaded job (smoothness computed only when asked)."""
    from codedgd.services.optim import create_optimizer

    n_rows = dataset.n_train

    def smoothness(partitions: Sequence[int]) -> float:
        rows = np.sort(np.concatenate([blocks[p] for p in partitions]))
        return float(model.smoothness(take_rows(dataset.X_train, rows))) / n_rows

    # The same schedule the job's optimizer follows (its step sizes depend on the options only).
    schedule = create_optimizer({**config.optimizer, "lr": lr}, np.zeros(1)).step_size
    return JobContext(n_rows=n_rows, step_size=lr, smoothness=smoothness, step_size_at=schedule)


def choose_lr(config: JobConfig, model: Model, X: Matrix) -> float:
    """The step size: a number, or "auto" = 1/L for the objective (1/N)Σℓ + (λ/2)‖θ‖²."""
    lr = config.optimizer.get("lr", "auto")
    if lr == "auto":
        smooth = float(model.smoothness(X)) / int(X.shape[0]) + float(model.l2)
        return 1.0 / smooth
    if isinstance(lr, bool) or not isinstance(lr, int | float) or lr <= 0:
        raise ConfigError(f'optimizer.lr must be a positive number or "auto", got {lr!r}')
    return float(lr)


def _evaluate(
    model: Model, theta: np.ndarray, ds: Dataset, objective: Callable[..., float]
) -> tuple[float, float]:
    # A diverging θ overflows: the loss comes out inf or NaN and check_converging says so,
    # in place of numpy's overflow warnings.
    with np.errstate(over="ignore", invalid="ignore"):
        loss = float(objective(model, theta, ds.X_train, ds.y_train))
        metric = float(model.metric(theta, ds.X_test, ds.y_test))
    return loss, metric


def _partition_messages(
    job_id: str, partition: int, X: Matrix, y: np.ndarray, chunk_bytes: int
) -> list[bytes]:
    """A partition's rows as serialized PartitionData frames."""
    import scipy.sparse as sp

    tensors: list[tuple[str, np.ndarray]] = [("y", np.asarray(y, dtype=np.float64))]
    if sp.issparse(X):
        csr = sp.csr_matrix(X)
        tensors += [
            ("X.data", csr.data.astype(np.float64)),
            ("X.indices", csr.indices.astype(np.int32)),
            ("X.indptr", csr.indptr.astype(np.int64)),
            ("X.shape", np.asarray(csr.shape, dtype=np.int64)),
        ]
    else:
        tensors.append(("X", np.asarray(X, dtype=np.float64)))
    messages = []
    for key, array in tensors:
        for c in chunks(key, array, chunk_bytes):
            message = pb.CoordinatorMessage()
            message.data.job_id = job_id
            message.data.partition = partition
            c.fill(message.data.chunk, with_data=False)
            messages.append(framed(message, PARTITION_DATA, c.data))
    return messages
