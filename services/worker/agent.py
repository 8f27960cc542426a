"""The worker service: dials the coordinator, takes assignments, computes rounds.

A worker dials out (so it works behind NAT and in scaled containers) and keeps
one bidirectional stream: Hello, then for each job an Assignment with its data,
then rounds. Gradient work runs in a thread so a Cancel is handled at once: the
thread stops at the next partition boundary and the injected straggler delay
(an ``asyncio.sleep``) is cancelled immediately.

The connection is retried with exponential backoff (capped, with jitter) until
the coordinator says Shutdown or the process is stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import random
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np
import scipy.sparse as sp

from codedgd.services.compute.gradient import (
    CancelFlag,
    Cancelled,
    Computer,
    ComputeResult,
    PartitionRows,
)
from codedgd.services.compute.lazy import LazyUploader
from codedgd.services.errors import CodedGDError, DataError, WireError
from codedgd.services.framing import frame_reader, to_wire
from codedgd.services.job import JobConfig
from codedgd.services.proto import codedgd_pb2 as pb
from codedgd.services.security import Security
from codedgd.services.stragglers import crash_restart
from codedgd.services.stragglers.base import StragglerModel
from codedgd.services.wire import (
    COORDINATOR_TENSOR_PATHS,
    GRPC_OPTIONS,
    RESULT_DATA,
    Assembler,
    BufferPool,
    chunks,
    framed,
    to_array,
)

log = logging.getLogger("codedgd.worker")
PROTOCOL = "codedgd.v1"
CONNECT_METHOD = "/codedgd.v1.Coordinator/Connect"
# A computation that took less than this last round runs on the event loop: the
# thread hand-off would cost more than it saves, and it is too short to delay a Cancel.
INLINE_COMPUTE_SECONDS = 0.002
# Without reconnect: how often a stream that failed before any answer is tried.
FIRST_CONNECT_TRIES = 3


# θ and partition bytes stay views of the received frame (codedgd.services.framing).
_coordinator_frame = frame_reader(pb.CoordinatorMessage, COORDINATOR_TENSOR_PATHS)


class Rejected(CodedGDError):
    """The coordinator refused this worker; retrying would not help."""


class CoordinatorLost(CodedGDError):
    """The stream to the coordinator failed and reconnecting is off."""


@dataclass
class WorkerOptions:
    coordinator: str = "127.0.0.1:50051"
    name: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")
    security: Security = field(default_factory=Security)
    data_dir: Path | None = None
    reconnect: bool = True
    initial_backoff: float = 0.2
    max_backoff: float = 10.0
    heartbeat_seconds: float = 5.0
    chunk_bytes: int = 4 * 1024 * 1024


@dataclass
class _Job:
    job_id: str
    assignment: pb.Assignment
    config: JobConfig
    pieces: dict[tuple[int, str], Assembler] = field(default_factory=dict)
    arrays: dict[tuple[int, str], np.ndarray] = field(default_factory=dict)
    computer: Computer | None = None
    straggler: StragglerModel | None = None
    theta: Assembler | None = None
    theta_round: int = -1
    theta_params: dict[str, float] = field(default_factory=dict)
    task: asyncio.Task[None] | None = None
    task_round: int = -1
    cancel_event: CancelFlag = field(default_factory=CancelFlag)
    lazy: LazyUploader = field(default_factory=LazyUploader)
    # θ of this round, of a cancelled round still being computed, one spare.
    theta_pool: BufferPool = field(default_factory=lambda: BufferPool(3))


@dataclass(frozen=True)
class _Upload:
    """A result's frames, made one at a time as the stream takes them.

    Once the round is cancelled (a Cancel, or θ of a newer round), the chunks not
    yet taken are never framed or sent: the coordinator no longer wants them and
    drops a partial result with its round. A slow worker's upload thus stops
    costing bandwidth the moment the round decodes without it. (Framing late was
    also meant to keep the bytes in cache for gRPC's copy; repeated A/B runs show
    no CPU difference, see docs/benchmarks.md.)
    """

    job_id: str
    round: int
    payload: np.ndarray
    compute_seconds: float
    delay_seconds: float
    cancel: CancelFlag
    chunk_bytes: int
    on_sent: Callable[[int], None]

    def __iter__(self) -> Iterator[bytes]:
        for c in chunks("gradient", self.payload, self.chunk_bytes):
            if self.cancel.is_set():
                return
            message = pb.WorkerMessage()
            out = message.result
            out.job_id = self.job_id
            out.round = self.round
            if c.index == 0:
                out.compute_seconds = self.compute_seconds
                out.delay_seconds = self.delay_seconds
            c.fill(out.payload, with_data=False)
            self.on_sent(len(c.data))
            yield framed(message, RESULT_DATA, c.data)  # the one copy of the payload


Outgoing = pb.WorkerMessage | bytes | _Upload | None


class WorkerAgent:
    """One worker process's connection to a coordinator."""

    def __init__(self, options: WorkerOptions) -> None:
        self.options = options
        self._stop = asyncio.Event()
        self._job: _Job | None = None
        self._out: asyncio.Queue[Outgoing] = asyncio.Queue()
        self.rounds_computed = 0
        self.rounds_cancelled = 0
        self.compute_seconds_total = 0.0
        self.delay_seconds_total = 0.0
        self.bytes_sent_total = 0
        self.uploads_skipped = 0
        self.connected = False
        self._heard = False  # this session has received a message
        self._ever_heard = False  # any session has
        self.crashes = 0
        self._last_compute = float("inf")
        self._restart_after: float | None = None  # set by a crash (straggler model "crash")

    def stop(self) -> None:
        """Ask the worker to leave (SIGTERM handler): ends the stream and returns from run()."""
        self._stop.set()
        self._out.put_nowait(None)

    async def run(self) -> None:
        """Connect and serve until Shutdown, stop(), or (without reconnect) a disconnect.

        A crash of the job's straggler model ``crash`` drops the connection; the worker
        connects again after the model's restart seconds (even without reconnect), or
        returns if the model says it never comes back. Without reconnect, a stream that
        fails before the coordinator said anything is tried again a few times: under
        load gRPC can end a refused stream with INTERNAL before its UNAUTHENTICATED
        status arrives, and the next try gets the real answer.
        """
        backoff = self.options.initial_backoff
        first_tries = FIRST_CONNECT_TRIES
        while not self._stop.is_set():
            started = time.monotonic()
            self._heard = False
            try:
                await self._session()
            except Rejected:
                raise
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
                    raise Rejected(exc.details() or "unauthenticated") from None
                if self._restart_after is None:
                    if not self.options.reconnect:
                        if self._stop.is_set():
                            return
                        first_tries -= 1
                        if not self._heard and first_tries > 0:
                            log.info(
                                "stream to %s failed before any answer (%s); trying again",
                                self.options.coordinator,
                                exc.code().name,
                            )
                            await asyncio.sleep(backoff * (0.5 + random.random()))
                            continue
                        if not self._ever_heard:
                            raise CoordinatorLost(
                                f"could not reach the coordinator at {self.options.coordinator}"
                                f" ({exc.code().name}: {exc.details()}): is it running there, "
                                "and do --tls-ca and the token match how it serves?"
                            ) from None
                        raise CoordinatorLost(
                            f"lost the coordinator at {self.options.coordinator} "
                            f"({exc.code().name}: {exc.details()})"
                        ) from None
                    log.info(
                        "coordinator %s unavailable (%s); retrying",
                        self.options.coordinator,
                        exc.code().name,
                    )
            else:
                if self._restart_after is None and (
                    not self.options.reconnect or self._stop.is_set()
                ):
                    return
            if self._restart_after is not None:
                if not await self._restart():
                    return
                backoff = self.options.initial_backoff
                continue
            if time.monotonic() - started > 5.0:
                backoff = self.options.initial_backoff  # it had been up: start over
            delay = backoff * (0.5 + random.random())
            backoff = min(backoff * 2, self.options.max_backoff)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stop.wait(), timeout=delay)

    async def _restart(self) -> bool:
        """After a crash: wait the model's restart seconds; False if it never comes back."""
        restart, self._restart_after = self._restart_after, None
        assert restart is not None
        if math.isinf(restart) or self._stop.is_set():
            return False
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._stop.wait(), timeout=restart)
        return not self._stop.is_set()

    async def _session(self) -> None:
        self._out = asyncio.Queue()
        self._out.put_nowait(
            pb.WorkerMessage(
                hello=pb.Hello(
                    name=self.options.name,
                    protocol=PROTOCOL,
                    has_data_dir=self.options.data_dir is not None,
                )
            )
        )
        channel = self.options.security.channel(self.options.coordinator, options=GRPC_OPTIONS)
        heartbeat = asyncio.create_task(self._heartbeat())
        try:
            connect = channel.stream_stream(
                CONNECT_METHOD,
                request_serializer=to_wire,
                response_deserializer=_coordinator_frame,
            )
            call = connect(self._requests(), metadata=self.options.security.metadata())
            async for frame in call:
                if isinstance(frame, WireError):
                    log.error("dropping the connection: the coordinator sent %s", frame)
                    break
                self.connected = self._heard = self._ever_heard = True
                if not await self._handle(frame.message, frame.data):
                    break
        finally:
            self.connected = False
            heartbeat.cancel()
            self._drop_job()
            await channel.close(grace=None)

    async def _requests(self) -> AsyncIterator[pb.WorkerMessage | bytes]:
        while True:
            message = await self._out.get()
            if message is None:
                return
            if isinstance(message, _Upload):
                for frame in message:  # framed one by one, as gRPC takes them
                    yield frame
            else:
                yield message

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self.options.heartbeat_seconds)
            self._out.put_nowait(pb.WorkerMessage(heartbeat=pb.Heartbeat(unix_time=time.time())))

    # ------------------------------------------------------------ messages

    async def _handle(self, message: pb.CoordinatorMessage, data: memoryview | None) -> bool:
        """React to one message; ``data`` is its tensor chunk's bytes (services/framing.py)."""
        kind = message.WhichOneof("kind")
        if kind == "welcome":
            log.info("connected to %s as %s", self.options.coordinator, message.welcome.worker_name)
        elif kind == "reject":
            raise Rejected(message.reject.reason)
        elif kind == "assignment":
            self._start_job(message.assignment)
        elif kind == "data":
            self._add_data(message.data, data)
        elif kind == "assignment_end":
            await self._finish_assignment(message.assignment_end.job_id)
        elif kind == "round":
            if self._crashes(message.round):
                return False  # the connection drops with everything this worker held
            self._round_chunk(message.round, data)
        elif kind == "cancel":
            self._cancel(message.cancel.job_id, message.cancel.round)
        elif kind == "job_end":
            if self._job is not None and self._job.job_id == message.job_end.job_id:
                self._drop_job()
        elif kind == "shutdown":
            log.info("coordinator asked to shut down: %s", message.shutdown.reason)
            self._stop.set()
            self._out.put_nowait(None)
            return False
        return True

    def _start_job(self, assignment: pb.Assignment) -> None:
        self._drop_job()
        config = JobConfig.from_json(assignment.job_json)
        self._job = _Job(assignment.job_id, assignment, config)

    def _add_data(self, data: pb.PartitionData, raw: memoryview | None) -> None:
        job = self._job
        if job is None or data.job_id != job.job_id:
            return
        key = (data.partition, data.chunk.key)
        asm = job.pieces.setdefault(key, Assembler(data.chunk.key))
        try:
            array = asm.add(data.chunk, raw)
        except WireError as exc:
            self._error(job.job_id, 0, f"bad partition data: {exc}")
            return
        if array is not None:
            job.arrays[key] = array
            del job.pieces[key]

    async def _finish_assignment(self, job_id: str) -> None:
        job = self._job
        if job is None or job.job_id != job_id:
            return
        try:
            job.computer, job.straggler = await asyncio.to_thread(self._build, job)
        except CodedGDError as exc:
            self._ack(job_id, str(exc))
            return
        except Exception as exc:  # a bug or bad data: report it, do not die
            log.exception("cannot take assignment %s", job_id)
            self._ack(job_id, f"{type(exc).__name__}: {exc}")
            return
        self._ack(job_id, "")

    def _build(self, job: _Job) -> tuple[Computer, StragglerModel]:
        from codedgd.services.models import create_model
        from codedgd.services.stragglers import create_straggler_model

        a = job.assignment
        config = job.config
        model = create_model(config.model.name, config.model.options)
        if a.inline_data:
            parts = [self._partition_from_arrays(job, int(p)) for p in a.partitions]
        else:
            parts = self._partitions_from_disk(
                config, [int(p) for p in a.partitions], a.n_partitions, dict(a.options)
            )
        coefficients = to_array(a.coefficients).astype(np.float64)
        straggler = create_straggler_model(
            config.stragglers.name,
            config.stragglers.options,
            seed=config.seed,
            n_workers=int(a.n_workers),
        )
        return Computer(model, parts, coefficients, dict(a.options)), straggler

    def _partition_from_arrays(self, job: _Job, p: int) -> PartitionRows:
        arrays = job.arrays
        if (p, "y") not in arrays:
            raise WireError(f"partition {p} was assigned but its data never arrived")
        y = np.asarray(arrays[(p, "y")], dtype=np.float64)
        if (p, "X") in arrays:
            X: np.ndarray | sp.csr_matrix = np.asarray(arrays[(p, "X")], dtype=np.float64)
        else:
            try:
                shape = tuple(int(v) for v in arrays[(p, "X.shape")])
                X = sp.csr_matrix(
                    (arrays[(p, "X.data")], arrays[(p, "X.indices")], arrays[(p, "X.indptr")]),
                    shape=shape,
                )
                X.check_format(full_check=False)
            except (KeyError, ValueError) as exc:
                raise WireError(f"partition {p}: malformed sparse matrix ({exc})") from None
        if X.shape[0] != y.shape[0]:
            raise WireError(f"partition {p}: {X.shape[0]} rows but {y.shape[0]} labels")
        return PartitionRows(p, X, y)

    def _partitions_from_disk(
        self, config: JobConfig, partitions: list[int], k: int, options: dict[str, str]
    ) -> list[PartitionRows]:
        from codedgd.services.data import load_dataset
        from codedgd.services.data.dataset import (
            FINGERPRINT_PREFIX,
            fingerprint,
            partition_rows,
            take_rows,
        )

        if self.options.data_dir is None:
            raise WireError("the job loads data on workers but this worker has no --data-dir")
        ds = load_dataset(
            config.data.name, config.data.options, seed=config.seed, data_dir=self.options.data_dir
        )
        blocks = partition_rows(ds.n_train, k, config.seed)
        parts = [
            PartitionRows(p, take_rows(ds.X_train, blocks[p]), ds.y_train[blocks[p]])
            for p in partitions
        ]
        for part in parts:
            expected = options.get(f"{FINGERPRINT_PREFIX}{part.index}")
            if expected is not None and fingerprint(part.X, part.y) != expected:
                raise DataError(
                    f"partition {part.index} of {config.data.name!r} read from "
                    f"{self.options.data_dir} differs from the coordinator's copy: give the "
                    "worker the same dataset files, or start it without --data-dir so the "
                    "coordinator sends the rows"
                )
        return parts

    def _ack(self, job_id: str, error: str) -> None:
        self._out.put_nowait(
            pb.WorkerMessage(ack=pb.AssignmentAck(job_id=job_id, ok=not error, error=error))
        )

    def _error(self, job_id: str, round_: int, message: str) -> None:
        self._out.put_nowait(
            pb.WorkerMessage(error=pb.WorkerError(job_id=job_id, round=round_, message=message))
        )

    # ------------------------------------------------------------ rounds

    def _crashes(self, start: pb.RoundStart) -> bool:
        """Does the job's straggler model (``crash``) crash this worker on θ of this round?"""
        job = self._job
        if job is None or job.straggler is None or start.theta.index != 0:
            return False
        if start.job_id != job.job_id:
            return False
        a = job.assignment
        restart = crash_restart(
            job.straggler, int(a.worker_index), int(start.round), replacement=a.replacement
        )
        if restart is None:
            return False
        log.warning(
            "crashing on θ of round %d, as the job's straggler model says (%s)",
            start.round,
            "it never comes back" if math.isinf(restart) else f"back in {restart:g} s",
        )
        self.crashes += 1
        self._restart_after = restart
        return True

    def _round_chunk(self, start: pb.RoundStart, data: memoryview | None) -> None:
        job = self._job
        if job is None or start.job_id != job.job_id or job.computer is None:
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
        self._cancel_task(job)
        cancel = job.cancel_event = CancelFlag()
        job.task_round = int(start.round)
        round_, params = int(start.round), job.theta_params
        if self._last_compute >= INLINE_COMPUTE_SECONDS:
            job.task = asyncio.create_task(self._do_round(job, round_, theta, params, cancel))
            return
        # Short: computed here, and unless the straggler model delays it, sent now (no
        # task, no extra turn of the event loop: at small ℓ most of a round's cost is
        # such per-round overhead).
        computer = job.computer
        try:
            result = computer.compute(theta, cancel)
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

    async def _do_round(
        self,
        job: _Job,
        round_: int,
        theta: np.ndarray,
        params: dict[str, float],
        cancel: CancelFlag,
    ) -> None:
        """Compute in a thread (the event loop stays free for a Cancel), then finish here."""
        computer = job.computer
        assert computer is not None
        try:
            result = await asyncio.to_thread(computer.compute, theta, cancel)
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
        job: _Job,
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

    def _computed(self, job: _Job, round_: int, result: ComputeResult) -> float | None:
        """Count a finished computation; its straggler delay, or None if the model failed."""
        self._last_compute = result.seconds
        self.rounds_computed += 1
        self.compute_seconds_total += result.seconds
        straggler = job.straggler
        if straggler is None:
            return 0.0
        a = job.assignment
        load = len(a.partitions) / max(1, a.n_partitions)
        try:
            return float(straggler.delay(int(a.worker_index), round_, result.seconds, load))
        except Exception as exc:  # e.g. a delay trace shorter than the job
            self._round_failed(job, round_, "straggler model", exc)
            return None

    def _round_failed(self, job: _Job, round_: int, what: str, exc: Exception) -> None:
        """Report a round's failure to the coordinator (which decides); the worker lives on."""
        if isinstance(exc, CodedGDError):
            log.error("round %d: %s failed: %s", round_, what, exc)
        else:
            log.exception("round %d: %s failed", round_, what)
        self._error(job.job_id, round_, f"{what} failed: {type(exc).__name__}: {exc}")

    async def _finish_round(
        self,
        job: _Job,
        round_: int,
        result: ComputeResult,
        delay: float,
        params: dict[str, float],
        cancel: CancelFlag,
    ) -> None:
        """Wait the straggler delay (a Cancel ends it at once), then send."""
        if math.isfinite(delay):
            self.delay_seconds_total += delay
        # An infinite delay (fail-stop) never ends otherwise: this worker's result for
        # the round never leaves.
        await asyncio.sleep(delay)
        self._send_result(job, round_, result, delay, params, cancel)

    def _send_result(
        self,
        job: _Job,
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
        if not upload:
            self.uploads_skipped += 1
            message = pb.WorkerMessage()
            skipped = message.result
            skipped.job_id = job.job_id
            skipped.round = round_
            skipped.skipped = True
            skipped.compute_seconds = result.seconds
            skipped.delay_seconds = delay
            self._out.put_nowait(message)
            return
        if job.lazy.active(params):
            job.lazy.uploaded(result.payload)
        self._out.put_nowait(
            _Upload(
                job.job_id,
                round_,
                result.payload,
                result.seconds,
                delay,
                cancel,
                self.options.chunk_bytes,
                self._count_sent,
            )
        )

    def _count_sent(self, nbytes: int) -> None:
        self.bytes_sent_total += nbytes

    def _cancel(self, job_id: str, round_: int) -> None:
        job = self._job
        if job is not None and job.job_id == job_id and job.task_round == round_:
            self._cancel_task(job)

    def _cancel_task(self, job: _Job) -> None:
        job.cancel_event.set()
        if job.task is not None and not job.task.done():
            job.task.cancel()
            self.rounds_cancelled += 1
        job.task = None

    def _drop_job(self) -> None:
        if self._job is not None:
            self._cancel_task(self._job)
        self._job = None
