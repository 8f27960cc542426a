"""A worker's rounds in a ring (policy ``ring-allreduce``).

Round t, on worker i of n (schedule and arithmetic: :mod:`codedgd.services.compute.ring`):
segment i of θ_t arrives from the coordinator; the workers all-gather θ_t (n−1 steps,
each passing one segment to the next worker); worker i computes its own message and
waits its straggler delay; the workers reduce-scatter (n−1 steps, each passing a partial
sum on and adding its own values of the segment received); worker i uploads the segment
it then holds, summed over the ring. A newer round (or attempt) from the coordinator, or
its Cancel, ends the round in progress. Every wait for the previous worker is watched: past
the round's peer deadline that worker is reported silent (and the wait goes on).
"""

from __future__ import annotations

import asyncio
import logging

import numpy as np

from codedgd.services.compute.gradient import CancelFlag, Cancelled
from codedgd.services.compute.ring import gather_segment, reduced_segment, scatter_segment, segments
from codedgd.services.errors import CodedGDError, WireError
from codedgd.services.proto import codedgd_pb2 as pb
from codedgd.services.wire import Assembler
from codedgd.services.worker.topology import Mailbox, RoundError, TopologyContext, Watch

log = logging.getLogger("codedgd.worker")


class RingRounds:
    """Worker ``ctx.index`` of a ring of ``n``: its rounds, one at a time."""

    def __init__(self, ctx: TopologyContext, n: int, on_error: RoundError) -> None:
        self.ctx = ctx
        self.n = n
        self.on_error = on_error
        self.bounds = segments(ctx.dim, n)
        self.mailbox = Mailbox(stats=ctx.stats)
        prev = self.previous
        for step in range(n - 1):  # what the previous worker sends, every round
            for stage, segment in (("theta", gather_segment), ("reduce", scatter_segment)):
                lo, hi = self.bounds[segment(prev, step, n)]
                self.mailbox.expect(stage, step, [prev], (hi - lo,))
        self._theta: Assembler | None = None
        self._start: pb.RoundStart | None = None
        self._task: asyncio.Task[None] | None = None
        self._cancel = CancelFlag()
        self._running: tuple[int, int] = (-1, -1)

    @property
    def progress(self) -> tuple[int, int] | None:
        """The latest (round, attempt) whose θ segment began to arrive here."""
        start = self._start
        return (int(start.round), int(start.attempt)) if start is not None else None

    @property
    def next(self) -> int:
        return (self.ctx.index + 1) % self.n

    @property
    def previous(self) -> int:
        return (self.ctx.index - 1) % self.n

    def theta_chunk(self, start: pb.RoundStart, data: memoryview | None) -> None:
        """A chunk of this worker's segment of θ_t, from the coordinator."""
        i = self.ctx.index
        if start.theta.index == 0:
            if start.segments != self.n or start.segment != i:
                raise WireError(
                    f"ring worker {i} of {self.n} got θ segment {start.segment} of "
                    f"{start.segments}; expected segment {i} of {self.n}"
                )
            lo, hi = self.bounds[i]
            self._theta = Assembler("theta", dtype="<f8", shape=(hi - lo,))
            self._start = start
        if self._theta is None or self._start is None or start.round != self._start.round:
            return  # a stray chunk of an abandoned round
        own = self._theta.add(start.theta, data)
        if own is None:
            return
        self._theta = None
        self.begin(
            int(self._start.round),
            int(self._start.attempt),
            own,
            float(self._start.peer_deadline_seconds),
        )

    def begin(
        self, round_: int, attempt: int, own_theta: np.ndarray, deadline: float = 0.0
    ) -> None:
        """Round (round_, attempt) starts here with this worker's θ segment; waits for
        the previous worker are watched with ``deadline`` (seconds, 0: not watched)."""
        self.stop()
        self._running = (round_, attempt)
        self.mailbox.begin(round_, attempt)
        cancel = self._cancel = CancelFlag()
        self._task = asyncio.create_task(self._round(round_, attempt, own_theta, cancel, deadline))

    def receive(self, message: pb.PeerData, data: memoryview | None) -> None:
        """A chunk from the previous worker (or a cancel)."""
        if message.stage == "cancel":
            if (message.round, message.attempt) == self._running:
                self.stop()
            return
        self.ctx.totals.bytes_received += (
            len(data) if data is not None else len(message.tensor.data)
        )
        self.mailbox.put(message, data)

    def cancel(self, round_: int) -> None:
        """The coordinator's Cancel{round}."""
        if self._running[0] == round_:
            self.stop()

    def stop(self) -> None:
        self._cancel.set()
        if self._task is not None and not self._task.done():
            self._task.cancel()
            self.ctx.stats.rounds_cancelled += 1
        self._task = None

    async def _round(
        self,
        round_: int,
        attempt: int,
        own_theta: np.ndarray,
        cancel: CancelFlag,
        deadline: float,
    ) -> None:
        ctx, n, i = self.ctx, self.n, self.ctx.index
        previous = [self.previous]

        def watch(what: str, received: int) -> Watch:
            return Watch(round_, attempt, deadline, lambda: previous, what, received)

        try:
            theta = np.empty(ctx.dim, dtype=np.float64)
            lo, hi = self.bounds[i]
            theta[lo:hi] = own_theta
            for step in range(n - 1):  # all-gather θ_t
                q = gather_segment(i, step, n)
                lo, hi = self.bounds[q]
                ctx.push(
                    self.next, round_, attempt, "theta", "theta", theta[lo:hi], step=step, segment=q
                )
                got = await ctx.waited(
                    self.mailbox.get((round_, attempt, "theta", step), self.previous),
                    watch(f"θ segment of all-gather step {step}", step),
                )
                lo, hi = self.bounds[gather_segment(self.previous, step, n)]
                theta[lo:hi] = got.array
            result, timing = await ctx.compute(round_, theta, cancel)
            own = result.payload
            q = scatter_segment(i, 0, n)
            partial = own[slice(*self.bounds[q])]
            for step in range(n - 1):  # reduce-scatter
                q = scatter_segment(i, step, n)
                ctx.push(
                    self.next, round_, attempt, "reduce", "gradient", partial, step=step, segment=q
                )
                got = await ctx.waited(
                    self.mailbox.get((round_, attempt, "reduce", step), self.previous),
                    watch(f"partial sum of reduce-scatter step {step}", n - 1 + step),
                )
                received = scatter_segment(self.previous, step, n)
                partial = got.array + own[slice(*self.bounds[received])]
            held = reduced_segment(i, n)
            ctx.upload(
                round_, attempt, partial, result.seconds, cancel, segment=held, timings=(timing,)
            )
        except (Cancelled, asyncio.CancelledError):
            return
        except (CodedGDError, WireError) as exc:
            self.on_error(round_, f"ring round failed: {exc}")
        except Exception as exc:  # a bug: report it, do not die
            log.exception("ring round %d failed", round_)
            self.on_error(round_, f"ring round failed: {type(exc).__name__}: {exc}")

    async def close(self) -> None:
        self.stop()
        await self.ctx.links.close()
