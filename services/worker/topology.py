"""What a worker's ring and tree rounds share: their context, their mailbox, their frames.

A round of a ring or a tree is a conversation: a worker waits for θ_t's pieces and for
partial sums from given peers at given steps. :class:`Mailbox` keeps what arrives, by
(round, attempt, stage, step), assembled and checked, until the round asks for it; data
can arrive before the round has started here (a faster neighbour) and is kept, data of
an older round or attempt is dropped (and counted). :class:`TopologyContext` is what the
round code needs from the worker: its computation, its straggler delay, and the two ways
out (to the coordinator, to peers).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from codedgd.services.compute.gradient import CancelFlag, Computer, ComputeResult
from codedgd.services.errors import WireError
from codedgd.services.proto import codedgd_pb2 as pb
from codedgd.services.stragglers.base import StragglerModel
from codedgd.services.wire import PEER_DATA, Assembler, chunks, framed
from codedgd.services.worker.peers import PeerLinks
from codedgd.services.worker.uploads import Outgoing, PeerTotals, Upload, WorkerStats

log = logging.getLogger("codedgd.worker")

T = TypeVar("T")
Key = tuple[int, int, str, int]  # round, attempt, stage, step
# A round that failed here: (round, what happened), reported to the coordinator.
RoundError = Callable[[int, str], None]


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

    @property
    def totals(self) -> PeerTotals:
        return self.stats.role(self.role)

    def _send_peer(self, peer: int, frames: list[bytes]) -> None:
        self.totals.bytes_sent += sum(len(f) for f in frames)
        self.links.send(peer, frames)

    async def waited(self, awaitable: Awaitable[T]) -> T:
        """Await peers' data, counting the time blocked on it."""
        start = time.perf_counter()
        try:
            return await awaitable
        finally:
            self.totals.wait_seconds += time.perf_counter() - start

    async def compute(self, round_: int, theta: np.ndarray, cancel: CancelFlag) -> ComputeResult:
        """This worker's own message at θ (in a thread), then its straggler delay."""
        result = await asyncio.to_thread(self.computer.compute, theta, cancel)
        self.stats.rounds_computed += 1
        self.stats.compute_seconds_total += result.seconds
        if self.straggler is not None:
            delay = float(self.straggler.delay(self.index, round_, result.seconds, self.load))
            if delay > 0:
                self.stats.delay_seconds_total += delay if np.isfinite(delay) else 0.0
                await asyncio.sleep(delay)
        return result

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
    ) -> None:
        """A tensor to ``peer`` (framed now: the array may change after this returns)."""
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
            )
        )
        self._send_peer(peer, frames)

    def push_chunk(
        self,
        peer: int,
        round_: int,
        attempt: int,
        stage: str,
        chunk: pb.TensorChunk,
        data: memoryview | None,
    ) -> None:
        """Pass one received chunk on as it is (a tree's θ going down)."""
        message = pb.PeerData()
        message.job_id = self.job_id
        message.round = round_
        message.attempt = attempt
        message.sender = self.index
        message.stage = stage
        out = message.tensor
        out.key, out.index, out.count, out.dtype = chunk.key, chunk.index, chunk.count, chunk.dtype
        out.shape.extend(chunk.shape)
        payload = data if data is not None else chunk.data
        self._send_peer(peer, [framed(message, PEER_DATA, payload)])

    def stop(self, peer: int, round_: int, attempt: int) -> None:
        """Tell ``peer`` the round is over for it (stage "cancel")."""
        message = pb.PeerData(
            job_id=self.job_id, round=round_, attempt=attempt, sender=self.index, stage="cancel"
        )
        self._send_peer(peer, [message.SerializeToString()])


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
) -> Iterator[bytes]:
    """A tensor as PeerData frames (``contributors`` in the first)."""
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
        c.fill(message.tensor, with_data=False)
        yield framed(message, PEER_DATA, c.data)


@dataclass
class Delivery:
    """A tensor assembled from one peer: what it is and from whom."""

    sender: int
    segment: int
    contributors: tuple[int, ...]
    array: np.ndarray


@dataclass
class _Slot:
    assembler: Assembler | None = None
    first: pb.PeerData | None = None
    future: asyncio.Future[Delivery] | None = None
    done: Delivery | None = None


@dataclass
class Mailbox:
    """Tensors from peers, by (round, attempt, stage, step), kept until asked for.

    ``expect(key, senders, shape)`` says who may send what for a key (set when the round
    knows it); a tensor from anyone else, or of another shape, is refused (WireError:
    the peer server ends that call), so a stray or hostile push never enters a sum.
    Data for a later round is kept; data for an older one is dropped (and counted).
    """

    current: tuple[int, int] = (-1, -1)  # the (round, attempt) in progress here
    dropped: int = 0
    _slots: dict[tuple[int, int, str, int, int], _Slot] = field(default_factory=dict)
    _senders: dict[Key, tuple[frozenset[int], tuple[int, ...]]] = field(default_factory=dict)
    _arrivals: dict[Key, asyncio.Queue[Delivery]] = field(default_factory=dict)

    def begin(self, round_: int, attempt: int) -> None:
        """A (round, attempt) starts: everything older is forgotten."""
        self.current = (round_, attempt)
        for slot_key in [k for k in self._slots if (k[0], k[1]) < self.current]:
            slot = self._slots.pop(slot_key)
            if slot.future is not None and not slot.future.done():
                slot.future.cancel()
        for table in (self._senders, self._arrivals):
            for key in [k for k in table if (k[0], k[1]) < self.current]:
                del table[key]

    def expect(self, key: Key, senders: Sequence[int], shape: tuple[int, ...]) -> None:
        """Only ``senders`` may send ``key``, a float64 tensor of ``shape``."""
        self._senders[key] = (frozenset(senders), shape)

    def put(self, message: pb.PeerData, data: memoryview | None) -> None:
        """One chunk from a peer (the peer server's callback)."""
        key: Key = (int(message.round), int(message.attempt), message.stage, int(message.step))
        if (key[0], key[1]) < self.current:
            self.dropped += 1
            return
        allowed = self._senders.get(key)
        if allowed is not None and message.sender not in allowed[0]:
            raise WireError(
                f"{message.stage} step {message.step} of round {message.round} comes from "
                f"worker(s) {sorted(allowed[0])}, not from worker {message.sender}"
            )
        slot = self._slots.setdefault((*key, int(message.sender)), _Slot())
        if slot.done is not None:
            raise WireError(f"a second {message.stage} tensor from worker {message.sender}")
        if slot.assembler is None or message.tensor.index == 0:
            shape = allowed[1] if allowed is not None else None
            slot.assembler = Assembler(message.tensor.key, dtype="<f8", shape=shape)
            slot.first = message
        array = slot.assembler.add(message.tensor, data)  # WireError on a bad chunk
        if array is None:
            return
        first = slot.first
        assert first is not None
        delivery = Delivery(int(first.sender), int(first.segment), tuple(first.contributors), array)
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
        """Data that came before the round said what it expects is checked now."""
        allowed = self._senders.get(key)
        if allowed is not None and (
            delivery.sender not in allowed[0] or delivery.array.shape != allowed[1]
        ):
            raise WireError(
                f"{key[2]} step {key[3]} of round {key[0]}: worker {delivery.sender} sent "
                f"shape {delivery.array.shape}; expected {allowed[1]} from {sorted(allowed[0])}"
            )
        return delivery
