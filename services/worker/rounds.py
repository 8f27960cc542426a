"""A worker's job and its rounds: θ in, the encoded gradient computed, delayed and sent.

For each round the coordinator sends θ_t in ``RoundStart`` chunks. Once θ_t is whole,
the worker computes its message (per-partition gradient sums, encoded with its
coefficients; :class:`~codedgd.services.compute.gradient.Computer`) in a thread so a
Cancel is handled at once (the thread stops at the next partition boundary), sleeps the
job's seeded straggler delay (a cancellable ``asyncio.sleep``), and queues its ``Result``,
or, when LAG-WK's trigger says the gradient barely moved, a ``Result`` marked ``skipped``.
A computation measured short last round runs on the event loop instead (the thread
hand-off would cost more). θ of a newer round, or Cancel, ends the round in progress.

A round that fails (the computation, the straggler model, the trigger) is reported to the
coordinator as a ``WorkerError``, which decides; the worker lives on.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from codedgd.services.codes.cyclic import CyclicCode
from codedgd.services.compute.gradient import CancelFlag, Cancelled, Computer, ComputeResult
from codedgd.services.compute.lazy import LAST_UPLOAD_KEY, LazyUploader
from codedgd.services.errors import CodedGDError, NotInJob, WireError
from codedgd.services.job import JobConfig
from codedgd.services.proto import codedgd_pb2 as pb
from codedgd.services.stragglers import crash_restart
from codedgd.services.stragglers.base import StragglerModel
from codedgd.services.wire import Assembler, BufferPool, to_array
from codedgd.services.worker.assignment import PartitionIntake, build
from codedgd.services.worker.corrupt import Corruption
from codedgd.services.worker.peer_faults import PeerFault
from codedgd.services.worker.peers import OnFailure, OnRefused, PeerLinks
from codedgd.services.worker.ring import RingRounds
from codedgd.services.worker.topology import TopologyContext
from codedgd.services.worker.tree import TreeRounds
from codedgd.services.worker.uploads import Outgoing, Upload, WorkerStats

log = logging.getLogger("codedgd.worker")

# A computation that took less than this last round runs on the event loop: the
# thread hand-off would cost more than it saves, and it is too short to delay a Cancel.
INLINE_COMPUTE_SECONDS = 0.002


@dataclass
class Job:
    """The job this worker holds a place in, and its round in progress."""

    job_id: str
    assignment: pb.Assignment
    config: JobConfig
    intake: PartitionIntake = field(default_factory=PartitionIntake)
    computer: Computer | None = None
    straggler: StragglerModel | None = None
    theta: Assembler | None = None
    theta_round: int = -1
    # (round, perf_counter) when a star round's θ was complete here: its own times'
    # start (the WorkerTiming sent with the result).
    theta_done: tuple[int, float] = (-1, 0.0)
    theta_params: dict[str, float] = field(default_factory=dict)
    task: asyncio.Task[None] | None = None
    task_round: int = -1
    cancel_event: CancelFlag = field(default_factory=CancelFlag)
    lazy: LazyUploader = field(default_factory=LazyUploader)
    # θ of this round, of a cancelled round still being computed, one spare.
    theta_pool: BufferPool = field(default_factory=lambda: BufferPool(3))
    # A ring's or a tree's rounds (None: the star, handled here).
    peers: PeerRounds | None = None


# Links to a job's peers: (peer addresses by index, the job's credential, on a link's
# failure, on a peer's refusal of this worker's pushes).
LinksFactory = Callable[[Mapping[int, str], str, OnFailure, OnRefused], PeerLinks]

PeerRounds = RingRounds | TreeRounds


class Rounds:
    """One worker's job (at most one at a time) and the rounds it computes for it.

    A star job's rounds run here. A ring's or a tree's run in :mod:`.ring` or
    :mod:`.tree` over links to the job's peers that ``links`` makes (the gRPC ones by
    default; tests pass in-process ones).
    """

    def __init__(
        self,
        send: Callable[[Outgoing], None],
        *,
        data_dir: Path | None,
        chunk_bytes: int,
        stats: WorkerStats,
        links: LinksFactory | None = None,
        corrupt: Corruption | None = None,
        peer_fault: PeerFault | None = None,
        extra_delay: float = 0.0,
    ) -> None:
        self._send = send
        # A test instrument: seconds more this worker waits every round, on top of the
        # job's straggler delay, whichever place it holds (a slower machine's).
        self.extra_delay = extra_delay
        self.corrupt = corrupt  # a test instrument: every star result is a lie
        self.peer_fault = peer_fault  # a test instrument: misbehave towards peers
        self.data_dir = data_dir
        self.chunk_bytes = chunk_bytes
        self.stats = stats
        self.links = links
        self.job: Job | None = None
        self.last_compute = float("inf")  # seconds the last computation took
        self._closing: set[asyncio.Task[None]] = set()

    @property
    def worker_index(self) -> int | None:
        """This worker's place in the running job's plan, if it holds one."""
        return int(self.job.assignment.worker_index) if self.job is not None else None

    # ------------------------------------------------------------ assignment

    def start_job(self, assignment: pb.Assignment) -> None:
        old = self.job
        kept: dict[tuple[int, str], np.ndarray] = {}
        if assignment.reassignment and old is not None and old.job_id == assignment.job_id:
            # The same job with a new plan: the rows of partitions still listed stay.
            listed = {int(p) for p in assignment.partitions}
            kept = {
                key: array
                for key, array in old.intake.arrays.items()
                if key[0] in listed and key[1] != LAST_UPLOAD_KEY
            }
        self.drop_job()
        config = JobConfig.from_json(assignment.job_json)
        self.job = Job(assignment.job_id, assignment, config)
        self.job.intake.arrays.update(kept)

    def add_data(self, data: pb.PartitionData, raw: memoryview | None) -> None:
        job = self.job
        if job is None or data.job_id != job.job_id:
            return
        try:
            job.intake.add(data, raw)
        except WireError as exc:
            self._error(job.job_id, 0, f"bad partition data: {exc}")

    async def finish_assignment(self, job_id: str) -> None:
        """AssignmentEnd: build the job's computation off the loop, then acknowledge."""
        job = self.job
        if job is None or job.job_id != job_id:
            return
        a = job.assignment
        if not 0 <= a.worker_index < a.n_workers:
            self._ack(
                job_id, f"worker_index {a.worker_index} is not a place of n_workers = {a.n_workers}"
            )
            return
        try:
            job.computer, job.straggler = await asyncio.to_thread(
                build, job.assignment, job.config, job.intake.arrays, self.data_dir
            )
            # A place taken over (a resumed job, a newcomer): its last upload, so the
            # lazy trigger decides as the worker before it would have.
            last = job.intake.arrays.get((0, LAST_UPLOAD_KEY))
            if last is not None:
                job.lazy.uploaded(last)
        except CodedGDError as exc:
            self._ack(job_id, str(exc))
            return
        except Exception as exc:  # a bug or bad data: report it, do not die
            log.exception("cannot take assignment %s", job_id)
            self._ack(job_id, f"{type(exc).__name__}: {exc}")
            return
        try:
            job.peers = self._peer_rounds(job)
        except CodedGDError as exc:
            self._ack(job_id, str(exc))
            return
        except Exception as exc:  # a topology it cannot build (a code of the wrong shape)
            log.exception("cannot take the topology of assignment %s", job_id)
            self._ack(job_id, f"bad topology: {type(exc).__name__}: {exc}")
            return
        self._ack(job_id, "")

    def _peer_rounds(self, job: Job) -> PeerRounds | None:
        """The ring's or tree's rounds of a job that has one (None: a star job)."""
        topology = job.assignment.topology
        if topology.kind in ("", "star"):
            return None
        if self.links is None:
            raise WireError(
                f"the job sends gradients over a {topology.kind} of workers but this worker "
                "serves no Peer service: start it with --peer-listen HOST:PORT"
            )
        a = job.assignment
        assert job.computer is not None
        addresses = {int(p.index): p.address for p in topology.peers}

        def failed(peer: int, address: str, reason: str) -> None:
            self._send(
                pb.WorkerMessage(
                    peer_failure=pb.PeerFailure(
                        job_id=job.job_id,
                        round=max(job.theta_round, 0),
                        peer=peer,
                        reason=reason,
                        address=address,
                    )
                )
            )

        def refused(peer: int, reason: str) -> None:
            # What this worker pushed was refused: its own fault, not the link's. It
            # gives up its place (WorkerError), so a newcomer may take it.
            self._error(job.job_id, max(job.theta_round, 0), reason)

        def silent(
            round_: int, attempt: int, peer: int, waited: float, what: str, received: int
        ) -> None:
            self._send(
                pb.WorkerMessage(
                    peer_failure=pb.PeerFailure(
                        job_id=job.job_id,
                        round=round_,
                        attempt=attempt,
                        peer=peer,
                        silent=True,
                        waited_seconds=waited,
                        received=received,
                        reason=f"sent nothing for {waited:.1f} s while worker "
                        f"{a.worker_index} waited for its {what}",
                    )
                )
            )

        ctx = TopologyContext(
            job_id=job.job_id,
            index=int(a.worker_index),
            dim=int(a.dim),
            computer=job.computer,
            straggler=job.straggler,
            load=len(a.partitions) / max(1, a.n_partitions),
            stats=self.stats,
            links=self.links(addresses, topology.credential, failed, refused),
            send=self._send,
            chunk_bytes=self.chunk_bytes,
            extra_delay=self.extra_delay,
            role="ring" if topology.kind == "ring" else f"tree level {topology.level}",
            silent=silent,
            fault=self.peer_fault,
        )

        def error(round_: int, message: str) -> None:
            self._error(job.job_id, round_, message)

        if topology.kind == "ring":
            return RingRounds(ctx, int(a.n_workers), error)
        if topology.kind == "tree":
            code = None
            if topology.children:
                B = to_array(topology.code).astype(np.float64)
                code = CyclicCode.from_matrix(B, int(topology.s))
            return TreeRounds(
                ctx, int(topology.parent), tuple(topology.children), code, topology.tol, error
            )
        raise WireError(f"unknown topology {topology.kind!r}: upgrade this worker")

    def progress(self) -> tuple[str, int, int] | None:
        """(job, round, attempt): the latest round of the running ring or tree job whose
        θ began to arrive here (None: no such job, or no round yet)."""
        job = self.job
        if job is None or job.peers is None:
            return None
        progress = job.peers.progress
        return (job.job_id, *progress) if progress is not None else None

    def credentials(self) -> tuple[str, ...]:
        """The peer credentials accepted now: the running job's."""
        job = self.job
        if job is None or job.peers is None:
            return ()
        return (job.assignment.topology.credential,)

    def peer_data(self, message: pb.PeerData, data: memoryview | None) -> None:
        """A push from a peer (the peer server's callback); WireError refuses it."""
        job = self.job
        if job is None or job.peers is None or message.job_id != job.job_id:
            raise NotInJob(f"no job {message.job_id!r} with peers is running on this worker")
        job.peers.receive(message, data)

    def update_peers(self, update: pb.PeerUpdate) -> None:
        """Peers of the job reached at new addresses (a replacement joined)."""
        job = self.job
        if job is not None and job.peers is not None and update.job_id == job.job_id:
            job.peers.ctx.links.update({int(p.index): p.address for p in update.peers})

    def end_job(self, job_id: str) -> None:
        """JobEnd: the job is over for this worker."""
        if self.job is not None and self.job.job_id == job_id:
            self.drop_job()

    def drop_job(self) -> None:
        if self.job is not None:
            self._cancel_task(self.job)
            if self.job.peers is not None:
                closing = asyncio.ensure_future(self.job.peers.close())
                self._closing.add(closing)
                closing.add_done_callback(self._closing.discard)
        self.job = None

    def _ack(self, job_id: str, error: str) -> None:
        self._send(pb.WorkerMessage(ack=pb.AssignmentAck(job_id=job_id, ok=not error, error=error)))

    def _error(self, job_id: str, round_: int, message: str) -> None:
        self._send(
            pb.WorkerMessage(error=pb.WorkerError(job_id=job_id, round=round_, message=message))
        )

    # ------------------------------------------------------------ rounds

    def crash_restart(self, start: pb.RoundStart) -> float | None:
        """The job's straggler model ``crash``: None, or the seconds until this worker,
        taken down by θ of this round, comes back (inf: never)."""
        job = self.job
        if job is None or job.straggler is None or start.theta.index != 0:
            return None
        if start.job_id != job.job_id:
            return None
        a = job.assignment
        restart = crash_restart(
            job.straggler, int(a.worker_index), int(start.round), replacement=a.replacement
        )
        if restart is None:
            return None
        log.warning(
            "crashing on θ of round %d, as the job's straggler model says (%s)",
            start.round,
            "it never comes back" if math.isinf(restart) else f"back in {restart:g} s",
        )
        self.stats.crashes += 1
        return restart

    def round_chunk(self, start: pb.RoundStart, data: memoryview | None) -> None:
        """A chunk of θ_t; the last one starts round t (and ends any older one)."""
        job = self.job
        if job is None or start.job_id != job.job_id or job.computer is None:
            return
        if job.peers is not None:
            if start.theta.index == 0:
                job.theta_round = int(start.round)
            try:
                job.peers.theta_chunk(start, data)
            except WireError as exc:
                self._error(job.job_id, int(start.round), str(exc))
            return
        if start.theta.index == 0:
            job.theta = Assembler("theta", dtype="<f8", pool=job.theta_pool)
            job.theta_round = int(start.round)
            job.theta_params = dict(start.params)
        if job.theta is None or job.theta_round != start.round:
            return  # a stray chunk of an abandoned round
        try:
            theta = job.theta.add(start.theta, data)
        except WireError as exc:
            self._error(job.job_id, int(start.round), str(exc))
            job.theta = None
            return
        if theta is None:
            return
        job.theta = None
        job.theta_done = (int(start.round), time.perf_counter())
        self._cancel_task(job)
        cancel = job.cancel_event = CancelFlag()
        job.task_round = int(start.round)
        round_, params = int(start.round), job.theta_params
        if self.last_compute >= INLINE_COMPUTE_SECONDS:
            job.task = asyncio.create_task(self._do_round(job, round_, theta, params, cancel))
            return
        # Short: computed here, and unless the straggler model delays it, sent now (no
        # task, no extra turn of the event loop: at small ℓ most of a round's cost is
        # such per-round overhead).
        computer = job.computer
        try:
            result = computer.compute(theta, cancel, round_)
        except Cancelled:
            return
        except Exception as exc:
            self._round_failed(job, round_, "gradient computation", exc)
            return
        delay = self._send_or_delay(job, round_, result, params, cancel)
        if delay is not None:
            job.task = asyncio.create_task(
                self._finish_round(job, round_, result, delay, params, cancel)
            )

    def cancel(self, job_id: str, round_: int) -> None:
        """Cancel{t}: round t's result is no longer wanted."""
        job = self.job
        if job is not None and job.job_id == job_id and job.peers is not None:
            job.peers.cancel(round_)
        elif job is not None and job.job_id == job_id and job.task_round == round_:
            self._cancel_task(job)

    async def _do_round(
        self,
        job: Job,
        round_: int,
        theta: np.ndarray,
        params: dict[str, float],
        cancel: CancelFlag,
    ) -> None:
        """Compute in a thread (the event loop stays free for a Cancel), then finish here."""
        computer = job.computer
        assert computer is not None
        try:
            result = await asyncio.to_thread(computer.compute, theta, cancel, round_)
        except Cancelled:
            return
        except Exception as exc:
            self._round_failed(job, round_, "gradient computation", exc)
            return
        if cancel.is_set():
            return
        delay = self._send_or_delay(job, round_, result, params, cancel)
        if delay is not None:
            await self._finish_round(job, round_, result, delay, params, cancel)

    def _send_or_delay(
        self,
        job: Job,
        round_: int,
        result: ComputeResult,
        params: dict[str, float],
        cancel: CancelFlag,
    ) -> float | None:
        """Count the computation; send its result now, or return the delay to wait first."""
        delay = self._computed(job, round_, result)
        if delay is None or delay > 0:
            return delay
        self._send_result(job, round_, result, delay, params, cancel)
        return None

    def _computed(self, job: Job, round_: int, result: ComputeResult) -> float | None:
        """Count a finished computation; its straggler delay, or None if the model failed."""
        self.last_compute = result.seconds
        self.stats.rounds_computed += 1
        self.stats.compute_seconds_total += result.seconds
        straggler = job.straggler
        if straggler is None:
            return self.extra_delay
        a = job.assignment
        load = len(a.partitions) / max(1, a.n_partitions)
        try:
            drawn = straggler.delay(int(a.worker_index), round_, result.seconds, load)
            return self.extra_delay + float(drawn)
        except Exception as exc:  # e.g. a delay trace shorter than the job
            self._round_failed(job, round_, "straggler model", exc)
            return None

    def _round_failed(self, job: Job, round_: int, what: str, exc: Exception) -> None:
        """Report a round's failure to the coordinator (which decides); the worker lives on."""
        if isinstance(exc, CodedGDError):
            log.error("round %d: %s failed: %s", round_, what, exc)
        else:
            log.exception("round %d: %s failed", round_, what)
        self._error(job.job_id, round_, f"{what} failed: {type(exc).__name__}: {exc}")

    async def _finish_round(
        self,
        job: Job,
        round_: int,
        result: ComputeResult,
        delay: float,
        params: dict[str, float],
        cancel: CancelFlag,
    ) -> None:
        """Wait the straggler delay (a Cancel ends it at once), then send."""
        if math.isfinite(delay):
            self.stats.delay_seconds_total += delay
        # An infinite delay (fail-stop) never ends otherwise: this worker's result for
        # the round never leaves.
        await asyncio.sleep(delay)
        self._send_result(job, round_, result, delay, params, cancel)

    def _send_result(
        self,
        job: Job,
        round_: int,
        result: ComputeResult,
        delay: float,
        params: dict[str, float],
        cancel: CancelFlag,
    ) -> None:
        """Queue the result, or (lazy aggregation's trigger) a 'skipped' note instead."""
        try:
            upload = job.lazy.should_upload(result.payload, params)
        except Exception as exc:  # a payload the trigger cannot compare: say so, live on
            self._round_failed(job, round_, "lazy aggregation's trigger", exc)
            return
        timing = self._own_timing(job, round_, result)
        if not upload:
            self.stats.uploads_skipped += 1
            message = pb.WorkerMessage()
            skipped = message.result
            skipped.job_id = job.job_id
            skipped.round = round_
            skipped.skipped = True
            skipped.compute_seconds = result.seconds
            skipped.delay_seconds = delay
            skipped.timings.append(timing)
            self._send(message)
            return
        if job.lazy.active(params):
            job.lazy.uploaded(result.payload)
        payload = result.payload
        if self.corrupt is not None:
            payload = self.corrupt.apply(payload, int(job.assignment.worker_index), round_)
        self._send(
            Upload(
                job.job_id,
                round_,
                payload,
                result.seconds,
                delay,
                cancel,
                self.chunk_bytes,
                self._count_sent,
                timings=(timing,),
            )
        )

    def _own_timing(self, job: Job, round_: int, result: ComputeResult) -> pb.WorkerTiming:
        """This worker's own times of a star round, sent with its result: from θ_t complete
        here to the result ready (compute, then the straggler delay), no network."""
        done_round, done_at = job.theta_done
        ready = time.perf_counter() - done_at if done_round == round_ else result.seconds
        return pb.WorkerTiming(
            worker=int(job.assignment.worker_index),
            compute_seconds=result.seconds,
            ready_seconds=max(ready, result.seconds),
        )

    def _count_sent(self, nbytes: int) -> None:
        self.stats.bytes_sent_total += nbytes

    def _cancel_task(self, job: Job) -> None:
        job.cancel_event.set()
        if job.task is not None and not job.task.done():
            job.task.cancel()
            self.stats.rounds_cancelled += 1
        job.task = None
