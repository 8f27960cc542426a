"""What a worker's ring and tree rounds share: their context, their mailbox, their frames.

A round of a ring or a tree is a conversation: a worker waits for θ_t's pieces and for
partial sums from given peers at given steps. :class:`Mailbox` keeps what arrives, by
(round, attempt, stage, step), assembled and checked, until the round asks for it; data
can arrive before the round has started here (a faster neighbour) and is kept, data of
an older round or attempt is dropped (and counted). :class:`TopologyContext` is what the
round code needs from the worker: its computation, its straggler delay, and the two ways
out (to the coordinator, to peers). A wait for peers' data may be *watched*
(:class:`Watch`): past the round's deadline (RoundStart.peer_deadline_seconds) the peers
it still waits for are reported silent to the coordinator, once each, and the wait goes
on (the coordinator decides who is to blame: :mod:`codedgd.services.coordinator.silence`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from codedgd.services.compute.gradient import CancelFlag, Computer, ComputeResult
from codedgd.services.errors import WireError
from codedgd.services.proto import codedgd_pb2 as pb
from codedgd.services.stragglers.base import StragglerModel
from codedgd.services.wire import PEER_DATA, Assembler, check_timings, chunks, framed
from codedgd.services.worker.peer_faults import PeerFault
from codedgd.services.worker.peers import PeerLinks
from codedgd.services.worker.uploads import Outgoing, PeerTotals, Upload, WorkerStats

log = logging.getLogger("codedgd.worker")

T = TypeVar("T")
Key = tuple[int, int, str, int]  # round, attempt, stage, step
# A peer may be ahead of this worker (a faster ring neighbour, a newcomer that has not
# begun): data for at most this many (round, attempt)s beyond its own is kept.
AHEAD = 2
# A round that failed here: (round, what happened), reported to the coordinator.
RoundError = Callable[[int, str], None]
# A peer silent past the deadline: (round, attempt, peer, seconds waited, what for,
# messages of the round received from the peer before the wait).
SilentPeer = Callable[[int, int, int, float, str, int], None]


@dataclass(frozen=True)
class Watch:
    """A wait for peers' data, reported past ``deadline`` seconds (0: not watched):
    ``peers()`` names the ones still waited for then; ``received`` is how many messages
    of the round each had sent this worker before the wait (PeerFailure.received)."""

    round: int
    attempt: int
    deadline: float
    peers: Callable[[], Iterable[int]]
    what: str
    received: int = 0


@dataclass
class TopologyContext:
    """One worker's job, as its ring or tree rounds see it."""

    job_id: str
    index: int  # this worker's place in the plan
    dim: int
    computer: Computer
    straggler: StragglerModel | None
    load: float  # partitions held / k (the straggler model's load)
    stats: WorkerStats
    links: PeerLinks
    send: Callable[[Outgoing], None]  # to the coordinator
    chunk_bytes: int
    role: str = "ring"  # names this worker's peer totals ("ring", "tree level 2", ...)
    silent: SilentPeer | None = None  # how a silent peer is reported to the coordinator
    fault: PeerFault | None = None  # a test instrument: misbehave towards peers on purpose
    extra_delay: float = 0.0  # a test instrument: this machine's own seconds more a round
    _reported: set[tuple[int, int, int]] = field(default_factory=set)  # (round, attempt, peer)

    @property
    def totals(self) -> PeerTotals:
        return self.stats.role(self.role)

    def _send_peer(self, peer: int, frames: list[bytes], round_: int) -> None:
        if self.fault is not None and self.fault.silences(round_):
            return  # the test instrument: nothing reaches the peers
        self.totals.bytes_sent += sum(len(f) for f in frames)
        self.links.send(peer, frames)

    async def waited(self, awaitable: Awaitable[T], watch: Watch | None = None) -> T:
        """Await peers' data, counting the time blocked on it (and watching it)."""
        start = time.perf_counter()
        try:
            with self.watching(watch):
                return await awaitable
        finally:
            self.totals.wait_seconds += time.perf_counter() - start

    @contextlib.contextmanager
    def watching(self, watch: Watch | None) -> Iterator[None]:
        """While inside, the peers ``watch`` waits for are reported silent once its
        deadline has passed (once per peer, round and attempt)."""
        if watch is None or watch.deadline <= 0 or self.silent is None:
            yield
            return
        start = time.perf_counter()
        timer = asyncio.get_running_loop().call_later(
            watch.deadline, self._report_silent, watch, start
        )
        try:
            yield
        finally:
            timer.cancel()

    def _report_silent(self, watch: Watch, start: float) -> None:
        assert self.silent is not None
        waited = time.perf_counter() - start
        for peer in watch.peers():
            key = (watch.round, watch.attempt, peer)
            if key in self._reported:
                continue
            self._reported.add(key)
            log.warning(
                "round %d: worker %d has sent nothing for %.1f s (the round's peer deadline "
                "is %.2f s) while this worker waits for its %s",
                watch.round,
                peer,
                waited,
                watch.deadline,
                watch.what,
            )
            self.silent(watch.round, watch.attempt, peer, waited, watch.what, watch.received)

    async def compute(
        self, round_: int, theta: np.ndarray, cancel: CancelFlag
    ) -> tuple[ComputeResult, pb.WorkerTiming]:
        """This worker's own message at θ (in a thread), then its straggler delay; with
        its times (sent up with the message: the coordinator records them)."""
        start = time.perf_counter()
        result = await asyncio.to_thread(self.computer.compute, theta, cancel, round_)
        self.stats.rounds_computed += 1
        self.stats.compute_seconds_total += result.seconds
        delay = self.extra_delay
        if self.straggler is not None:
            delay += float(self.straggler.delay(self.index, round_, result.seconds, self.load))
        if delay > 0:
            self.stats.delay_seconds_total += delay if np.isfinite(delay) else 0.0
            await asyncio.sleep(delay)
        ready = max(time.perf_counter() - start, result.seconds)
        return result, pb.WorkerTiming(
            worker=self.index, compute_seconds=result.seconds, ready_seconds=ready
        )

    def upload(
        self,
        round_: int,
        attempt: int,
        payload: np.ndarray,
        seconds: float,
        cancel: CancelFlag,
        *,
        segment: int = 0,
        contributors: Sequence[int] = (),
        timings: Sequence[pb.WorkerTiming] = (),
    ) -> None:
        """The round's result, to the coordinator."""
        self.send(
            Upload(
                self.job_id,
                round_,
                payload,
                seconds,
                0.0,
                cancel,
                self.chunk_bytes,
                self._count_sent,
                attempt=attempt,
                segment=segment,
                contributors=tuple(contributors),
                timings=tuple(timings),
            )
        )

    def _count_sent(self, nbytes: int) -> None:
        self.stats.bytes_sent_total += nbytes

    def push(
        self,
        peer: int,
        round_: int,
        attempt: int,
        stage: str,
        key: str,
        array: np.ndarray,
        *,
        step: int = 0,
        segment: int = 0,
        contributors: Sequence[int] = (),
        timings: Sequence[pb.WorkerTiming] = (),
    ) -> None:
        """A tensor to ``peer`` (framed now: the array may change after this returns)."""
        if self.fault is not None:
            array = self.fault.reshaped(round_, array)
        frames = list(
            peer_frames(
                self.job_id,
                round_,
                attempt,
                self.index,
                stage,
                key,
                array,
                self.chunk_bytes,
                step=step,
                segment=segment,
                contributors=contributors,
                timings=timings,
            )
        )
        self._send_peer(peer, frames, round_)

    def push_chunk(
        self,
        peer: int,
        round_: int,
        attempt: int,
        stage: str,
        chunk: pb.TensorChunk,
        data: memoryview | None,
        deadline: float = 0.0,
    ) -> None:
        """Pass one received chunk on as it is (a tree's θ going down, with the round's
        peer ``deadline`` on the first chunk)."""
        message = pb.PeerData()
        message.job_id = self.job_id
        message.round = round_
        message.attempt = attempt
        message.sender = self.index
        message.stage = stage
        if chunk.index == 0:
            message.peer_deadline_seconds = deadline
        out = message.tensor
        out.key, out.index, out.count, out.dtype = chunk.key, chunk.index, chunk.count, chunk.dtype
        out.shape.extend(chunk.shape)
        payload = data if data is not None else chunk.data
        self._send_peer(peer, [framed(message, PEER_DATA, payload)], round_)

    def stop(self, peer: int, round_: int, attempt: int) -> None:
        """Tell ``peer`` the round is over for it (stage "cancel")."""
        message = pb.PeerData(
            job_id=self.job_id, round=round_, attempt=attempt, sender=self.index, stage="cancel"
        )
        self._send_peer(peer, [message.SerializeToString()], round_)


def peer_frames(
    job_id: str,
    round_: int,
    attempt: int,
    sender: int,
    stage: str,
    key: str,
    array: np.ndarray,
    chunk_bytes: int,
    *,
    step: int = 0,
    segment: int = 0,
    contributors: Sequence[int] = (),
    timings: Sequence[pb.WorkerTiming] = (),
) -> Iterator[bytes]:
    """A tensor as PeerData frames (``contributors`` and ``timings`` in the first)."""
    for c in chunks(key, array, chunk_bytes):
        message = pb.PeerData()
        message.job_id = job_id
        message.round = round_
        message.attempt = attempt
        message.sender = sender
        message.stage = stage
        message.step = step
        message.segment = segment
        if c.index == 0:
            message.contributors.extend(contributors)
            message.timings.extend(timings)
        c.fill(message.tensor, with_data=False)
        yield framed(message, PEER_DATA, c.data)


@dataclass
class Delivery:
    """A tensor assembled from one peer: what it is and from whom."""

    sender: int
    segment: int
    contributors: tuple[int, ...]
    array: np.ndarray
    timings: tuple[pb.WorkerTiming, ...] = ()


@dataclass
class _Slot:
    assembler: Assembler | None = None
    first: pb.PeerData | None = None
    future: asyncio.Future[Delivery] | None = None
    done: Delivery | None = None


@dataclass
class Mailbox:
    """Tensors from peers, by (round, attempt, stage, step), kept until asked for.

    ``expect(stage, step, senders, shape)`` says, once per job, who may send what at a
    stage and step of any round: a tensor from anyone else, of another shape, of a
    stage or step not expected, or for a round more than ``AHEAD`` (round, attempt)s
    ahead of this worker's, is refused on arrival (WireError: the peer server ends that
    call with INVALID_ARGUMENT, and the sender reports its own fault), so a stray or
    hostile push never enters a sum nor harms the round in progress here. Data for a
    later round is kept; data for an older one is dropped (counted "stale").
    """

    stats: WorkerStats | None = None  # where stale chunks are counted
    current: tuple[int, int] = (-1, -1)  # the (round, attempt) in progress here
    dropped: int = 0
    _slots: dict[tuple[int, int, str, int, int], _Slot] = field(default_factory=dict)
    _senders: dict[tuple[str, int], tuple[frozenset[int], tuple[int, ...]]] = field(
        default_factory=dict
    )
    _arrivals: dict[Key, asyncio.Queue[Delivery]] = field(default_factory=dict)

    def begin(self, round_: int, attempt: int) -> None:
        """A (round, attempt) starts: everything older is forgotten."""
        self.current = (round_, attempt)
        for slot_key in [k for k in self._slots if (k[0], k[1]) < self.current]:
            slot = self._slots.pop(slot_key)
            if slot.future is not None and not slot.future.done():
                slot.future.cancel()
        for key in [k for k in self._arrivals if (k[0], k[1]) < self.current]:
            del self._arrivals[key]

    def expect(self, stage: str, step: int, senders: Sequence[int], shape: tuple[int, ...]) -> None:
        """Only ``senders`` may send (``stage``, ``step``) of a round: a float64 tensor of
        ``shape``."""
        self._senders[(stage, step)] = (frozenset(senders), shape)

    def put(self, message: pb.PeerData, data: memoryview | None) -> None:
        """One chunk from a peer (the peer server's callback; WireError refuses it)."""
        key: Key = (int(message.round), int(message.attempt), message.stage, int(message.step))
        if (key[0], key[1]) < self.current:
            self.dropped += 1
            if self.stats is not None:
                self.stats.peer_chunks_stale += 1
            return
        allowed = self._senders.get((key[2], key[3]))
        if allowed is None:
            raise WireError(
                f"no {message.stage!r} tensor at step {message.step} is expected from a peer"
            )
        if message.sender not in allowed[0]:
            raise WireError(
                f"{message.stage} step {message.step} of round {message.round} comes from "
                f"worker(s) {sorted(allowed[0])}, not from worker {message.sender}"
            )
        ahead = {(k[0], k[1]) for k in self._slots} | {(key[0], key[1])}
        if len({r for r in ahead if r > self.current}) > AHEAD:
            raise WireError(
                f"data for round {key[0]} (attempt {key[1]}) is too far ahead of this "
                f"worker's round {self.current[0]} (attempt {self.current[1]})"
            )
        if message.tensor.index == 0:
            check_timings(message.timings, int(message.sender), message.contributors)
        slot = self._slots.setdefault((*key, int(message.sender)), _Slot())
        if slot.done is not None:
            raise WireError(f"a second {message.stage} tensor from worker {message.sender}")
        if slot.assembler is None or message.tensor.index == 0:
            slot.assembler = Assembler(message.tensor.key, dtype="<f8", shape=allowed[1])
            slot.first = message
        array = slot.assembler.add(message.tensor, data)  # WireError on a bad chunk
        if array is None:
            return
        first = slot.first
        assert first is not None
        delivery = Delivery(
            int(first.sender),
            int(first.segment),
            tuple(first.contributors),
            array,
            tuple(first.timings),
        )
        slot.done = delivery
        if slot.future is not None and not slot.future.done():
            slot.future.set_result(delivery)
        self._queue(key).put_nowait(delivery)

    def _queue(self, key: Key) -> asyncio.Queue[Delivery]:
        queue = self._arrivals.get(key)
        if queue is None:
            queue = self._arrivals[key] = asyncio.Queue()
        return queue

    async def get(self, key: Key, sender: int) -> Delivery:
        """The tensor ``sender`` sends for ``key``, once it is all here."""
        slot = self._slots.setdefault((*key, sender), _Slot())
        if slot.done is None:
            if slot.future is None:
                slot.future = asyncio.get_running_loop().create_future()
            await slot.future
        assert slot.done is not None
        return self._checked(key, slot.done)

    async def next(self, key: Key) -> Delivery:
        """The next tensor completed for ``key``, from any of its senders, in arrival order."""
        return self._checked(key, await self._queue(key).get())

    def _checked(self, key: Key, delivery: Delivery) -> Delivery:
        """Every delivery was checked on arrival (sender, stage, step, shape)."""
        return delivery
