"""What reaches a running job from its workers, as events for the round loop.

Every Result message a worker's stream reader hands over (:meth:`Inbox.deliver`) is
checked against the round in progress. A result of an earlier round is counted and
dropped, never mixed in; a later one is a protocol error (the reader disconnects its
sender). A result's chunks are assembled into a pooled buffer, or, when the policy sums
every payload (``Policy.arrival_sum``), added into that sum chunk by chunk as they
arrive; a complete result becomes an :class:`Arrival`. Losses and replacements join the
same queue (:class:`Lost`, :class:`Replaced`), so the round loop sees one ordered stream
of events.

A worker lost part-way through a result that was being added into the sum leaves those
bytes in it; its replacement computes the same values (same place, same θ_t) and adds
only the rest (:attr:`Inbox.summed_prefix`, ``Assembler(skip_bytes=...)``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from codedgd.services.coordinator.metrics import CoordinatorMetrics
from codedgd.services.coordinator.places import Places
from codedgd.services.coordinator.sessions import WorkerSession
from codedgd.services.errors import WireError
from codedgd.services.proto import codedgd_pb2 as pb
from codedgd.services.wire import Assembler, BufferPool, check_timings


@dataclass
class Arrival:
    """A worker's complete result (or its 'skipped' note) for the round in progress."""

    worker: int
    result: pb.Result
    payload: np.ndarray | None  # assembled payload (None: skipped, or summed on arrival)
    received: float
    summed: bool = False  # the payload was added into the policy's arrival_sum()


@dataclass
class Lost:
    worker: int
    reason: str
    session: WorkerSession  # who held the index then (a later holder is not lost)


@dataclass
class Replaced:
    worker: int  # the index a newly connected worker now holds
    session: WorkerSession


Event = Arrival | Lost | Replaced


@dataclass
class _Partial:
    round: int
    assembler: Assembler | None  # None: the round takes no more of this result; drop it
    first: pb.Result
    summing: bool = False  # chunks are added into the policy's arrival_sum()
    attempt: int = 0


@dataclass
class Inbox:
    """Results in, checked and assembled; the job's queue of round events."""

    places: Places
    metrics: CoordinatorMetrics
    events: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)
    payload_len: list[int] = field(default_factory=list)  # place → its result's length
    pool: BufferPool = field(default_factory=lambda: BufferPool(0))
    round: int = -1  # the round in progress
    attempt: int = 0  # its attempt (a worker-to-worker round started again)
    summing: np.ndarray | None = None  # policy.arrival_sum() of the round in progress
    expecting: set[int] = field(default_factory=set)  # results the sum still takes
    # place → leading bytes of its result in the sum already, from a holder lost part-way
    summed_prefix: dict[int, int] = field(default_factory=dict)
    # Results of an earlier round dropped, a running total: the round loop records the
    # increase per round (one dropped between a decode and the next round's start counts
    # for the next round, instead of being lost to a reset).
    late: int = 0
    bytes_up: int = 0  # result bytes received during this round
    partials: dict[int, _Partial] = field(default_factory=dict)

    def open_round(
        self, t: int, summing: np.ndarray | None, contacted: Iterable[int], attempt: int = 0
    ) -> None:
        """Round t (its ``attempt``) starts: results go into ``summing`` (if not None)
        from ``contacted``."""
        self.round = t
        self.attempt = attempt
        self.bytes_up = 0
        self.summing = summing
        self.expecting = set(contacted)
        self.summed_prefix = {}

    def put(self, event: Event) -> None:
        self.events.put_nowait(event)

    def deliver(
        self,
        session: WorkerSession,
        result: pb.Result,
        nbytes: int,
        data: memoryview | None = None,
    ) -> None:
        """A Result message from a worker of this job (called by the stream reader).

        ``data`` is the payload chunk's bytes when they were kept out of ``result``
        (:func:`codedgd.services.framing.parse`). Raises WireError on a malformed
        result or one for a round not yet started.
        """
        worker = session.index
        if not self.places.holds(worker, session):
            return  # not (or no longer) this job's worker at that index
        if worker in self.places.lost:
            return  # lost (it reported an error, say) while its stream stays open: unused
        self.bytes_up += nbytes
        self.metrics.bytes_up.inc(nbytes)
        if (result.round, result.attempt) < (self.round, self.attempt):
            self.partials.pop(worker, None)
            self.late += 1
            self.metrics.stragglers.labels("late_dropped").inc()
            return
        if (result.round, result.attempt) > (self.round, self.attempt):
            raise WireError(
                f"result for round {result.round} (attempt {result.attempt}) but round "
                f"{self.round} (attempt {self.attempt}) is running"
            )
        if result.payload.index == 0 or result.skipped:
            check_timings(result.timings, worker, result.contributors)
        if result.skipped:
            self.put(Arrival(worker, result, None, time.perf_counter()))
            return
        partial = self.partials.get(worker)
        if partial is not None and partial.attempt != result.attempt:
            partial = None  # a chunk of an abandoned attempt's result
        if partial is None or partial.round != result.round or result.payload.index == 0:
            if partial is not None and partial.round == result.round and partial.summing:
                raise WireError(
                    f"result for round {result.round} started over after part of it was summed"
                )
            partial = self._new_partial(worker, result)
            self.partials[worker] = partial
        if partial.assembler is None or (partial.summing and worker not in self.expecting):
            # A second result this round, or one the round decoded without: dropped.
            if result.payload.index + 1 >= result.payload.count:
                del self.partials[worker]
            return
        payload = partial.assembler.add(result.payload, data)  # WireError on a bad message
        if payload is not None:
            del self.partials[worker]
            now = time.perf_counter()
            if partial.summing:
                self.expecting.discard(worker)
                self.put(Arrival(worker, partial.first, None, now, summed=True))
            else:
                self.put(Arrival(worker, partial.first, payload, now))

    def _new_partial(self, worker: int, result: pb.Result) -> _Partial:
        """Where a result's chunks go: the policy's running sum, a pooled buffer, or nowhere."""
        shape = (self.payload_len[worker],)
        if self.summing is None:
            pooled = Assembler("gradient", dtype="<f8", shape=shape, pool=self.pool, finite=True)
            return _Partial(int(result.round), pooled, result, attempt=int(result.attempt))
        if worker not in self.expecting:
            return _Partial(
                int(result.round), None, result, summing=True, attempt=int(result.attempt)
            )
        adding = Assembler(
            "gradient",
            dtype="<f8",
            shape=shape,
            add_into=self.summing,
            skip_bytes=self.summed_prefix.get(worker, 0),
            finite=True,
        )
        return _Partial(
            int(result.round), adding, result, summing=True, attempt=int(result.attempt)
        )

    def drop_partial(self, worker: int) -> None:
        """Place ``worker``'s holder is gone: forget its unfinished result.

        Bytes of it already added into the running round's sum stay there, and whoever
        takes the place adds only the rest.
        """
        partial = self.partials.pop(worker, None)
        if (
            partial is not None
            and partial.round == self.round
            and partial.summing
            and partial.assembler is not None
        ):
            self.summed_prefix[worker] = partial.assembler.added_bytes

    def forget(self, worker: int) -> None:
        """A newcomer took place ``worker``: nothing of the old holder's carries over."""
        self.partials.pop(worker, None)
