"""One job on the coordinator, from submission to its end.

A :class:`JobRun` prepares the job in a thread (:mod:`codedgd.services.job.prepare`),
ships it to n idle workers (:mod:`.assignment`), then runs its rounds
(:mod:`.rounds`) while a :class:`~.replacement.Replacer` fills the places of workers
lost on the way. The pieces share the job's :class:`~.places.Places` (who holds each
index) and :class:`~.inbox.Inbox` (results in, as events). The stream readers of
worker sessions call :meth:`JobRun.deliver`, :meth:`JobRun.ack` and :meth:`JobRun.lose`;
watchers (WatchJob, ``codedgd run``) follow :attr:`JobRun.records` and
:meth:`JobRun.wait_change`. The records are a :class:`~codedgd.services.records.RecordLog`:
with a state directory the job's records.jsonl, else a file the coordinator's
:class:`~.state.SpillDir` holds; only the most recent are kept in memory.

A job fails alone, with an error naming the cause (bad data, a lost worker its policy
cannot do without, a round timeout): the coordinator keeps serving other jobs.
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from codedgd.services.coordinator.assignment import Assigner, Moved
from codedgd.services.coordinator.dataplane import DataPlane, data_plane
from codedgd.services.coordinator.inbox import Inbox, Lost
from codedgd.services.coordinator.metrics import CoordinatorMetrics
from codedgd.services.coordinator.places import Places
from codedgd.services.coordinator.replacement import Replacer, log_crash, stop_replacer
from codedgd.services.coordinator.rounds import RoundLoop
from codedgd.services.coordinator.sessions import Sessions, WorkerSession, reject
from codedgd.services.coordinator.state import JobStore
from codedgd.services.errors import CodedGDError, Diverged
from codedgd.services.job import JobConfig
from codedgd.services.job.checkpoint import Checkpoint
from codedgd.services.job.descent import Descent
from codedgd.services.job.prepare import Prepared, prepare
from codedgd.services.job.trained import trained_model
from codedgd.services.messages import printable
from codedgd.services.models.neural import export_network
from codedgd.services.models.saved import save_model
from codedgd.services.policies.auto import Auto
from codedgd.services.policies.base import Plan
from codedgd.services.proto import codedgd_pb2 as pb
from codedgd.services.records import RecordLog, RoundRecord
from codedgd.services.sim.lookahead import Lookahead
from codedgd.services.wire import DEFAULT_CHUNK_BYTES, BufferPool

log = logging.getLogger("codedgd.coordinator")
# How a job can end: "diverged" is a failure of the descent itself (see Descent);
# "interrupted" by this coordinator's shutdown, which a coordinator started on the same
# state directory resumes.
FINAL_STATES = ("done", "failed", "diverged", "cancelled", "interrupted")
DEFAULT_CHECKPOINT_EVERY = 10
# A job's outcome, for an operator's log; `codedgd run` reports it itself and mutes this.
outcome_log = logging.getLogger("codedgd.coordinator.outcome")
# A running job's progress goes to the log every tenth of its rounds, and at least this
# often (seconds) when rounds are slow.
PROGRESS_LOG_SECONDS = 30.0
PROGRESS_LOG_PARTS = 10


def waiting_text(missing: int, connected: int, idle: int, needed: int) -> str:
    """What a job waiting for workers tells its watchers and the log."""
    busy = connected - idle
    return (
        f"waiting for {missing} more worker{'s' if missing != 1 else ''} ({connected} "
        f"connected{f', {busy} busy' if busy > 0 else ''}, job needs {needed})"
    )


@dataclass
class JobRun:
    """A submitted job and its state, watched by clients."""

    id: str
    config: JobConfig
    sessions: Sessions
    metrics: CoordinatorMetrics
    data_dir: str | None = None
    assign_timeout: float = 120.0
    heartbeat_seconds: float = 5.0  # how often its workers heartbeat (and report progress)
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    state: str = "queued"
    error: str = ""
    round: int = 0
    # Every round's record, in order. With a store, its records file (whatever is given
    # here is replaced); without, all in memory unless a file-backed log is given.
    records: RecordLog = field(default_factory=RecordLog)
    on_record: Callable[[RoundRecord], None] | None = None
    # The state directory's files of this job (None: nothing is kept there), the job's
    # place in submission order, how often it checkpoints, and where it resumes from.
    store: JobStore | None = None
    order: int = 0
    checkpoint_every: int = DEFAULT_CHECKPOINT_EVERY
    resume: Checkpoint | None = None
    interrupted: bool = False  # set by the coordinator's shutdown: resume later
    stored_theta: np.ndarray | None = None  # a finished job read back: its model's θ
    places: Places = field(init=False)
    inbox: Inbox = field(init=False)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    _descent: Descent | None = None
    _plane: DataPlane | None = None  # how the running job's rounds travel
    _loop: RoundLoop | None = None  # the running job's rounds
    # Seconds per row the job's last shipping of rows took (auto's cost of moving data),
    # and the partitions' rows.
    _ship_rate: float = 0.0
    _blocks: list[np.ndarray] = field(default_factory=list)
    # What the job waits for, in words ("": nothing), and while it waits for idle
    # workers to start, how many more it needs (see JobStatus in the .proto).
    detail: str = ""
    workers_missing: int = 0
    # Results received and gradient computations asked over the job's rounds.
    uploads: int = 0
    computations: int = 0

    def __post_init__(self) -> None:
        if self.store is not None:
            self.records = self.store.records  # records.jsonl: the only copy on disk
        for record in self.records:  # a job read back from its state directory
            self.uploads += record.uploads
            self.computations += record.computations
        self.places = Places(self.id)
        self.inbox = Inbox(self.places, self.metrics)
        # Workers of a ring or tree job present it to each other (never to anyone else).
        self.peer_credential = secrets.token_urlsafe(32)

    # ------------------------------------------------------------ events from sessions

    def deliver(
        self,
        session: WorkerSession,
        result: pb.Result,
        nbytes: int,
        data: memoryview | None = None,
    ) -> None:
        """A Result message from a worker of this job (see :meth:`.inbox.Inbox.deliver`)."""
        self.inbox.deliver(session, result, nbytes, data)

    def ack(self, session: WorkerSession, ack: pb.AssignmentAck) -> None:
        self.places.ack(session, ack.job_id, ack.error)

    def lose(self, session: WorkerSession, reason: str) -> None:
        """A worker of this job disconnected, failed, or was thrown out."""
        index = session.index
        joining = self.places.candidates.get(index) is session
        lost = self.places.mark_lost(session)
        if joining or lost:  # a newcomer lost before it acknowledged: its place stays vacant
            self.places.answer_ack(index, f"disconnected: {reason}")
        if not lost:
            return
        # Part of its result may be in the sum: whoever takes the place adds the rest.
        self.inbox.drop_partial(index)
        self.metrics.stragglers.labels("lost").inc()
        self.inbox.put(Lost(index, reason, session))

    def give_up(self, session: WorkerSession, error: str) -> None:
        """A worker of this job reported it cannot go on (WorkerError): it loses its place,
        which a newcomer can take, and is released at once (JobEnd) to wait idle for
        the next job; this job does not take it back."""
        if session.job_id != self.id:
            return
        self.lose(session, error)
        self.places.detach(session, f"lost: {error}")

    def throw_out(self, index: int, reason: str) -> None:
        """The holder of place ``index`` sent something it should not have: disconnect
        it (Reject names ``reason``) and lose it, so a newcomer can take the place."""
        session = self.places[index]
        log.warning("job %s: throwing out %s: %s", self.id, session.label, reason)
        self.metrics.stragglers.labels("rejected").inc()
        session.send(reject(f"bad message: {reason}", retry=True))
        self.lose(session, f"sent a result it could not use: {reason}")
        session.close()

    def release_silent(self, index: int, reason: str) -> None:
        """The holder of place ``index`` is a silent peer (:mod:`.silence`): it loses its
        place, which a newcomer can take, and is released (JobEnd); this job does not
        take it back."""
        session = self.places[index]
        log.warning("job %s: releasing %s: %s", self.id, session.label, reason)
        self.lose(session, reason)
        self.places.detach(session, f"lost: {reason}")

    def peer_failure(self, session: WorkerSession, failure: pb.PeerFailure) -> None:
        """A worker of this job could not reach (or hear) one of its peers: that peer is
        lost to the job (a replacement takes its place, or the round fails naming it)."""
        if failure.job_id != self.id or not self.places.holds(session.index, session):
            return
        peer = int(failure.peer)
        if not 0 <= peer < len(self.places) or peer == session.index:
            return
        if self._plane is None or peer not in self._plane.peers(session.index):
            # A star job's workers have no peers; a ring's or tree's talk to their
            # neighbours only: a report about anyone else cannot be true.
            log.warning(
                "job %s: %s reports worker %d unreachable, but it exchanges nothing with it: "
                "ignored",
                self.id,
                session.label,
                peer,
            )
            return
        target = self.places[peer]
        reason = printable(failure.reason)
        if failure.address and failure.address != target.peer_address:
            # The link that failed went to a former holder of the place (the report
            # crossed the PeerUpdate that named the newcomer): the newcomer is not at fault.
            log.info(
                "job %s: %s reports a link to worker %d at %s failed, but %s holds the "
                "place now, at %s: ignored (%s)",
                self.id,
                session.label,
                peer,
                printable(failure.address),
                target.label,
                target.peer_address or "(no address)",
                reason,
            )
            return
        if failure.silent:  # the round loop weighs who waits for whom
            log.info(
                "job %s: %s has waited %.1f s for %s (round %d, attempt %d): %s",
                self.id,
                session.label,
                failure.waited_seconds,
                target.label,
                failure.round,
                failure.attempt,
                reason,
            )
            if self._loop is not None and math.isfinite(failure.waited_seconds):
                self._loop.stalled(
                    session.index,
                    int(failure.round),
                    int(failure.attempt),
                    peer,
                    float(failure.waited_seconds),
                    int(failure.received),
                )
            return
        log.warning(
            "job %s: %s reports %s unreachable at %s: %s",
            self.id,
            session.label,
            target.label,
            target.peer_address or "(no address)",
            reason,
        )
        self.metrics.stragglers.labels("peer_unreachable").inc()
        self.lose(
            target,
            f"unreachable from {session.label} at its peer address "
            f"{target.peer_address or '(none)'}: {reason}",
        )

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
    def theta(self) -> np.ndarray | None:
        """θ after the last round stepped (None before the first)."""
        descent = self._descent
        if descent is not None and descent.steps:
            return descent.theta
        return self.stored_theta

    @property
    def features(self) -> int | None:
        """The data's columns, once the job is prepared (a network's θ does not tell)."""
        descent = self._descent
        return descent.prepared.dataset.dim if descent is not None else None

    @property
    def finished(self) -> bool:
        return self.state in FINAL_STATES

    # ------------------------------------------------------------ the job

    def _set_state(self, state: str) -> None:
        self.state = state
        if self.store is not None:
            try:
                self.store.save_job(self.order, self.config, state, self.error)
            except OSError as exc:
                log.error("job %s: cannot write its state (%s): %s", self.id, state, exc)
        self._publish()

    async def run(self) -> None:
        try:
            self._set_state("assigning")
            prepared = await asyncio.to_thread(prepare, self.config, self.data_dir)
            if self.resume is not None:
                # What workers must remember (Policy.worker_memory) goes out with their
                # assignments: the policy's memory first (the descent loads it again).
                prepared.policy.load_state(self.resume.state["policy"])
                plan = prepared.policy.replan()
                if plan is not None:  # it had moved to another plan: assign that one
                    prepared.plan = plan
            assigner = await self._assign(prepared)
            self._set_state("running")
            replacer = Replacer(self.sessions, self.places, self.inbox, assigner, self.metrics)
            replacing = asyncio.create_task(replacer.run())
            replacing.add_done_callback(log_crash)
            try:
                await self._rounds(prepared, assigner)
            finally:
                cancelled_meanwhile = await stop_replacer(replacing)
            if cancelled_meanwhile:  # a client's cancel landed as the last round ended
                raise asyncio.CancelledError
            self.state = "done"
            outcome_log.info("job %s done: %s", self.id, self._progress())
        except asyncio.CancelledError:
            if self.interrupted:
                self.state = "interrupted"
                self.error = self._interrupt()
                outcome_log.warning("job %s %s", self.id, self.error)
            else:
                self.state = "cancelled"
                self.error = self.error or "cancelled by a client"
                outcome_log.info("job %s %s after %s", self.id, self.error, self._progress())
        except Diverged as exc:
            self.state = "diverged"
            self.error = str(exc)
            outcome_log.error("job %s diverged: %s", self.id, exc)
        except CodedGDError as exc:
            self.state = "failed"
            self.error = str(exc)
            outcome_log.error("job %s failed: %s", self.id, exc)
        except Exception as exc:  # a bug: report it instead of hanging watchers
            self.state = "failed"
            self.error = f"internal error: {type(exc).__name__}: {exc}"
            log.exception("job %s crashed", self.id)
        finally:
            self.detail, self.workers_missing = "", 0
            self.places.release(self.state)
            self.metrics.jobs.labels(self.state).inc()
            self.records.close()
            self._keep_outcome()
            self._publish()

    def _interrupt(self) -> str:
        """The coordinator is shutting down mid-job: checkpoint where the rounds stand."""
        descent, store = self._descent, self.store
        if store is None:
            return "interrupted: the coordinator shut down (without --state-dir, for good)"
        where = "from its last checkpoint"
        # Consistent only between rounds: every step taken has its record.
        if descent is not None and descent.steps and descent.steps == len(self.records):
            t = len(self.records) - 1
            try:
                store.checkpoint(Checkpoint(self.id, t, descent.state()))
                where = f"at round {t + 1}"
            except OSError as exc:
                log.error("job %s: cannot write its checkpoint: %s", self.id, exc)
        return (
            "interrupted: the coordinator shut down; a coordinator started on the same "
            f"--state-dir resumes it {where}"
        )

    def _keep_outcome(self) -> None:
        """Write how the job ended, and its model, to the state directory."""
        store = self.store
        if store is None:
            return
        store.close()
        try:
            store.save_job(self.order, self.config, self.state, self.error)
            theta = self.theta
            if theta is not None and self.state != "interrupted":
                saved = trained_model(self.config, theta, self.records, self.features)
                save_model(store.model_path, saved)
                export_network(store.model_path.with_suffix(".pt"), saved)
        except OSError as exc:
            log.error("job %s: cannot write its outcome to the state directory: %s", self.id, exc)

    async def _assign(self, prepared: Prepared) -> Assigner:
        """Ship the job to n idle workers; the Assigner then serves replacements too."""
        plan, data = prepared.plan, prepared.dataset
        log.info(
            "job %s planned: policy %s, n=%d workers, k=%d partitions, topology %s, "
            "data %s (%d rows, dim %d)",
            self.id,
            prepared.policy.name,
            plan.n_workers,
            plan.n_partitions,
            plan.topology.kind,
            self.config.data.name,
            data.X_train.shape[0],
            data.dim,
        )
        n = self.config.workers
        dim = prepared.dim
        self.inbox.payload_len = [prepared.plan.payload_length(i, dim) for i in range(n)]
        # One round's results, plus as many held by the policy (lazy rules keep n).
        self.inbox.pool = BufferPool(2 * n + 2)
        assigner = Assigner(
            self.id,
            self.config,
            prepared,
            self.metrics,
            self.chunk_bytes,
            self.assign_timeout,
            self.places,
            self.peer_credential,
        )
        try:
            await assigner.assign(self.sessions, self.places, self._idle_workers)
        finally:
            self.detail, self.workers_missing = "", 0
            self.metrics.workers_missing.set(0)
        # The cost of moving rows, measured: the assignment's seconds per row shipped.
        self._blocks = prepared.blocks
        rows = sum(int(prepared.blocks[p].shape[0]) for wp in plan.workers for p in wp.partitions)
        self._ship_rate = assigner.assign_seconds / max(rows, 1)
        log.info(
            "job %s assigned to %s",
            self.id,
            ", ".join(f"{i}={s.name}" for i, s in enumerate(self.places.holders)),
        )
        prepared.policy.assigned([s.name for s in self.places.holders])
        return assigner

    def _shipping(self, old: Plan, new: Plan) -> float:
        """Predicted seconds to move the places from plan ``old`` to ``new``: the rows
        each worker lacks, at the seconds per row this job's last shipping took (its
        assignment, then its latest move)."""
        rows = sum(int(self._blocks[p].shape[0]) for parts in old.lacking(new) for p in parts)
        return self._ship_rate * rows

    def _idle_workers(self, idle: int) -> None:
        """While the job waits for workers: say how many it still needs, once per count."""
        needed = self.config.workers
        missing = max(0, needed - idle)
        detail = (
            waiting_text(missing, len(self.sessions), idle, needed)
            if missing
            else f"assigning to {needed} workers"
        )
        if detail == self.detail:
            return
        if missing:
            log.info("job %s: %s", self.id, detail)
        self.detail, self.workers_missing = detail, missing
        self.metrics.workers_missing.set(missing)
        self._publish()

    def _progress(self) -> str:
        """Where the job stands: rounds done of its rounds, time, last loss (for the log)."""
        records = self.records
        text = f"{len(records)}/{self.config.rounds} rounds"
        if records:
            last = records[-1]
            text += f" in {last.wall_seconds:.2f} s"
            loss = next(
                (
                    r.loss
                    for r in reversed(records.read(records.first_in_memory, len(records)))
                    if not math.isnan(r.loss)
                ),
                math.nan,
            )
            if not math.isnan(loss):
                text += f", loss {loss:.6g}"
            if not math.isnan(last.metric):
                text += f", {last.metric_name} {last.metric:.4g}"
        return text

    async def _rounds(self, prepared: Prepared, assigner: Assigner) -> None:
        if isinstance(prepared.policy, Auto):
            # auto looks ahead on the simulator, with a cost model fitted to the rounds
            # and the cost of moving data measured on this job's own shipping.
            prepared.policy.attach(Lookahead(self.config, prepared, shipping=self._shipping))
            await asyncio.to_thread(Lookahead.warm)  # its imports: before the rounds, once
        plane = self._plane = data_plane(prepared.plan, self.id, self.places, self.chunk_bytes)

        async def move(plan: Plan) -> Moved:
            moved = await assigner.reassign(plan)
            for index, error in moved.refused.items():
                self.give_up(self.places[index], f"could not take its new assignment: {error}")
            dim = prepared.dim
            self.inbox.payload_len = [plan.payload_length(i, dim) for i in range(len(self.places))]
            if moved.rows:
                self._ship_rate = moved.seconds / moved.rows
            return moved

        loop = self._loop = RoundLoop(
            self.id,
            self.config,
            self.places,
            self.inbox,
            plane,
            self.metrics,
            self.throw_out,
            self.release_silent,
            self.heartbeat_seconds,
            move,
        )
        descent = self._descent = Descent(self.config, prepared)
        store, start, wall = self.store, 0, 0.0
        if self.resume is not None:
            descent.load_state(self.resume.state)
            start = self.resume.round + 1
            wall = self.records[-1].wall_seconds if self.records else 0.0
            log.info("job %s resumes at round %d from its checkpoint", self.id, start)
        if self.records.path is not None:
            self.records.open()  # the file cut to exactly the rounds kept

        def on_round(t: int) -> None:
            self.round = t

        failing = False  # the records file cannot be written (a full disk)
        every = max(1, self.config.rounds // PROGRESS_LOG_PARTS)
        logged = time.monotonic()

        def on_record(record: RoundRecord) -> None:
            nonlocal failing, logged
            self.records.append(record)
            self.uploads += record.uploads
            self.computations += record.computations
            now, done = time.monotonic(), record.round + 1
            if done < self.config.rounds and (
                done % every == 0 or now - logged >= PROGRESS_LOG_SECONDS
            ):
                log.info("job %s: %s", self.id, self._progress())
                logged = now
            error = self.records.write_error
            if error is not None and not failing:
                log.error(
                    "job %s: cannot write round records to %s (%s): keeping them in memory "
                    "until it can, and no checkpoint is taken meanwhile; free space there",
                    self.id,
                    self.records.path,
                    error,
                )
            elif error is None and failing:
                log.warning(
                    "job %s: round records are written to %s again", self.id, self.records.path
                )
            failing = error is not None
            if self.on_record is not None:
                self.on_record(record)
            self._publish()

        async def after_round(t: int) -> None:
            if (
                store is not None
                and (t + 1) % self.checkpoint_every == 0
                and t + 1 < self.config.rounds
            ):
                if self.records.unwritten:
                    return  # a checkpoint past the records on disk could not be resumed
                checkpoint = Checkpoint(self.id, t, descent.state())
                try:
                    await asyncio.to_thread(store.checkpoint, checkpoint)
                except OSError as exc:  # the last checkpoint written stays the one to resume
                    log.error(
                        "job %s: cannot write the checkpoint of round %d to %s: %s; the job "
                        "goes on",
                        self.id,
                        t,
                        store.path,
                        exc.strerror or exc,
                    )

        await loop.run(
            descent, on_round, on_record, start=start, wall=wall, after_round=after_round
        )
