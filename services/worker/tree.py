"""A worker's rounds in a tree (policies ``tree`` and ``codedreduce``).

θ_t comes from this worker's parent (the coordinator's RoundStart at level 1, a peer's
``theta`` push below) and every chunk is passed on to each child as it arrives, so θ
flows down the tree without waiting at any level. The worker computes its own message
and waits its straggler delay; its children's partial sums arrive (``reduce`` pushes);
once the first m−s of them decode within tol (the coordinator's rule:
:class:`~codedgd.services.codes.cyclic.CyclicRound`, sibling code B from the plan), it
sends its own message plus the decoded sum up, naming every worker below it whose message
is in that sum, and tells the children it did not use to stop. The set that counts is
fixed once per round and travels with the sum: a child whose sum comes later is never
mixed in.

A leaf sends its own message. A Cancel (the coordinator's, or the parent's ``cancel``
push) ends the round here and is passed on to the children. The wait for the children is
watched: past the round's peer deadline (which comes down with θ) the children not yet
heard from are reported silent, and the wait goes on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import numpy as np

from codedgd.services.codes.cyclic import CyclicCode, CyclicRound
from codedgd.services.compute.gradient import CancelFlag, Cancelled
from codedgd.services.errors import CodedGDError, DecodeError, WireError
from codedgd.services.proto import codedgd_pb2 as pb
from codedgd.services.wire import Assembler
from codedgd.services.worker.topology import Mailbox, RoundError, TopologyContext, Watch

log = logging.getLogger("codedgd.worker")
COORDINATOR = -1


class TreeRounds:
    """Worker ``ctx.index`` of a tree: its parent, its children (in sibling order), and
    the code it decodes them with."""

    def __init__(
        self,
        ctx: TopologyContext,
        parent: int,
        children: Sequence[int],
        code: CyclicCode | None,
        tol: float,
        on_error: RoundError,
    ) -> None:
        if children and (code is None or code.n != len(children)):
            raise ValueError("a tree node with children needs their sibling code")
        self.ctx = ctx
        self.parent = parent
        self.children = tuple(children)
        self.code = code
        self.tol = tol
        self.on_error = on_error
        self.mailbox = Mailbox(stats=ctx.stats)
        if self.children:  # each child's partial sum, every round
            self.mailbox.expect("reduce", 0, self.children, (ctx.dim,))
        self._theta: Assembler | None = None
        self._theta_round: tuple[int, int] = (-1, -1)
        self._deadline = 0.0  # the running round's peer deadline
        self._theta_ready: asyncio.Future[np.ndarray] | None = None
        self._task: asyncio.Task[None] | None = None
        self._cancel = CancelFlag()
        self._running: tuple[int, int] = (-1, -1)
        self._used: tuple[int, ...] = ()

    @property
    def progress(self) -> tuple[int, int] | None:
        """The latest (round, attempt) whose θ began to arrive here."""
        return self._theta_round if self._theta_round[0] >= 0 else None

    # ------------------------------------------------------------ θ in, and on down

    def theta_chunk(self, start: pb.RoundStart, data: memoryview | None) -> None:
        """A chunk of θ_t from the coordinator (a level-1 worker)."""
        if self.parent != COORDINATOR:
            raise WireError(f"worker {self.ctx.index} hears θ from worker {self.parent}")
        self._theta_in(
            int(start.round),
            int(start.attempt),
            start.theta,
            data,
            float(start.peer_deadline_seconds),
        )

    def receive(self, message: pb.PeerData, data: memoryview | None) -> None:
        """A push from the parent (θ, cancel) or from a child (a partial sum)."""
        key = (int(message.round), int(message.attempt))
        if message.stage != "cancel":
            received = len(data) if data is not None else len(message.tensor.data)
            self.ctx.totals.bytes_received += received
        if message.stage == "theta":
            if message.sender != self.parent:
                raise WireError(
                    f"θ comes from worker {self.parent}, not from worker {message.sender}"
                )
            self._theta_in(
                key[0], key[1], message.tensor, data, float(message.peer_deadline_seconds)
            )
        elif message.stage == "cancel":
            if message.sender == self.parent and key == self._running:
                self.stop()
        else:
            self.mailbox.put(message, data)

    def _theta_in(
        self,
        round_: int,
        attempt: int,
        chunk: pb.TensorChunk,
        data: memoryview | None,
        deadline: float,
    ) -> None:
        if chunk.index == 0:
            if (round_, attempt) < self._theta_round:
                return  # an older round's θ
            self._deadline = deadline if np.isfinite(deadline) and deadline > 0 else 0.0
            self._begin(round_, attempt)
            self._theta = Assembler("theta", dtype="<f8", shape=(self.ctx.dim,))
            self._theta_round = (round_, attempt)
        if self._theta is None or (round_, attempt) != self._theta_round:
            return  # a stray chunk of an abandoned round
        for child in self.children:  # pass it on as it comes: θ flows down unhindered
            self.ctx.push_chunk(child, round_, attempt, "theta", chunk, data, self._deadline)
        theta = self._theta.add(chunk, data)
        if theta is not None:
            self._theta = None
            assert self._theta_ready is not None
            if not self._theta_ready.done():
                self._theta_ready.set_result(theta)

    def _begin(self, round_: int, attempt: int) -> None:
        self.stop()
        self._running = (round_, attempt)
        self.mailbox.begin(round_, attempt)
        self._theta_ready = asyncio.get_running_loop().create_future()
        cancel = self._cancel = CancelFlag()
        self._task = asyncio.create_task(self._round(round_, attempt, self._theta_ready, cancel))

    # ------------------------------------------------------------ the round

    def cancel(self, round_: int) -> None:
        """The coordinator's Cancel{round} (a level-1 worker)."""
        if self._running[0] == round_:
            self.stop()

    def stop(self) -> None:
        """End the round here and tell the children still at it."""
        self._cancel.set()
        if self._task is not None and not self._task.done():
            self._task.cancel()
            self.ctx.stats.rounds_cancelled += 1
            round_, attempt = self._running
            for child in self.children:
                if self.children.index(child) not in self._used:
                    self.ctx.stop(child, round_, attempt)
        self._task = None

    async def _round(
        self,
        round_: int,
        attempt: int,
        theta_ready: asyncio.Future[np.ndarray],
        cancel: CancelFlag,
    ) -> None:
        ctx = self.ctx
        self._used = ()
        try:
            theta = await theta_ready
            result, own = await ctx.compute(round_, theta, cancel)
            up = result.payload
            contributors: tuple[int, ...] = ()
            timings: tuple[pb.WorkerTiming, ...] = (own,)
            if self.children:
                z, used, contributors, below = await self._children_sum(round_, attempt)
                timings += below
                self._used = used
                for position, child in enumerate(self.children):
                    if position not in used:  # slower than the set that counts: stop it
                        ctx.stop(child, round_, attempt)
                        ctx.totals.children_cancelled += 1
                up = up + z
            if self.parent == COORDINATOR:
                ctx.upload(
                    round_,
                    attempt,
                    up,
                    result.seconds,
                    cancel,
                    contributors=contributors,
                    timings=timings,
                )
            else:
                ctx.push(
                    self.parent,
                    round_,
                    attempt,
                    "reduce",
                    "gradient",
                    up,
                    contributors=contributors,
                    timings=timings,
                )
        except (Cancelled, asyncio.CancelledError):
            return
        except (CodedGDError, WireError) as exc:
            self.on_error(round_, f"tree round failed: {exc}")
        except Exception as exc:  # a bug: report it, do not die
            log.exception("tree round %d failed", round_)
            self.on_error(round_, f"tree round failed: {type(exc).__name__}: {exc}")

    async def _children_sum(
        self, round_: int, attempt: int
    ) -> tuple[np.ndarray, tuple[int, ...], tuple[int, ...], tuple[pb.WorkerTiming, ...]]:
        """Σ_{c∈F} a_c·z_c over the first children that decode, F (sibling positions),
        every worker whose message is in that sum, and the timings they sent up."""
        assert self.code is not None
        decoding = CyclicRound(self.code, self.tol)
        decoding.reset(self.ctx.dim)
        position = {child: i for i, child in enumerate(self.children)}
        key = (round_, attempt, "reduce", 0)
        below: dict[int, tuple[int, ...]] = {}
        timed: dict[int, tuple[pb.WorkerTiming, ...]] = {}
        watch = Watch(
            round_,
            attempt,
            self._deadline,
            lambda: [c for c in self.children if position[c] not in decoding.arrived],
            f"children's partial sums ({len(self.children) - self.code.s} of "
            f"{len(self.children)} needed)",
        )
        with self.ctx.watching(watch):
            while True:
                got = await self.ctx.waited(self.mailbox.next(key))
                if position[got.sender] in decoding.arrived:
                    continue
                below[position[got.sender]] = (got.sender, *got.contributors)
                timed[position[got.sender]] = got.timings
                if decoding.add(position[got.sender], got.array):
                    break
        try:
            z, _ = decoding.combine()
        except DecodeError as exc:
            raise DecodeError(
                f"worker {self.ctx.index} cannot decode its children: {exc}"
            ) from None
        used = tuple(decoding.arrived)
        contributors = tuple(sorted(w for p in used for w in below[p]))
        return z, used, contributors, tuple(t for p in used for t in timed[p])

    async def close(self) -> None:
        self.stop()
        await self.ctx.links.close()
