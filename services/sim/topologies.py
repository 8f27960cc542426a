"""Rounds of the worker-to-worker topologies on the virtual clock: rings and trees.

The link model: every node (the coordinator and each worker) has a full-duplex NIC. A
transfer of b bytes from u to v asked for at time r starts once u's sending side and
v's receiving side are both free, takes b / β (β: the slower of the two sides), and
arrives ``latency`` later; each side is busy for b over its own rate. A
worker's side is ``CostModel.bandwidth_bytes_per_second``; the coordinator's are the
egress and ingress bandwidths (unlimited when not set: then its workers' links bound it).
So a star's n copies of θ queue on the coordinator's egress while a ring's or a tree's
transfers proceed on many links at once.

The arithmetic is the workers': each worker's own message comes from its
:class:`~codedgd.services.compute.gradient.Computer`; a ring's segments are summed in the
ring's order (:func:`~codedgd.services.compute.ring.reduced_segments`); a tree's inner
nodes decode their children with :class:`~codedgd.services.codes.cyclic.CyclicRound` in
order of virtual arrival; the coordinator's policy is offered what reaches it, in order,
as the real round loop offers it.

A link that bursts (``CostModel.burst_bytes``): each side of every NIC spends its token
bucket (what it held at the round's start, :class:`~codedgd.services.sim.cost.Buckets`)
before its rate paces anything (:meth:`Links.transfer`).

Transfers are store-and-forward per message (a tree node forwards θ once it holds all of
it; the real workers forward chunk by chunk, which only matters for θ larger than a
chunk). Messages leaving or reaching one node go one after another (``CostModel.sharing
= "fifo"``) or share its link while in flight (``"fair"``, as TCP flows do; children a
tree node cancels are counted as if they had kept sending). Crashes (straggler model
``crash``) are not modelled on these topologies.
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from codedgd.services.codes.cyclic import CyclicCode, CyclicRound
from codedgd.services.compute.ring import (
    gather_segment,
    reduced_segment,
    reduced_segments,
    scatter_segment,
    segments,
)
from codedgd.services.errors import DecodeError, JobFailed
from codedgd.services.policies.base import Estimate, Plan, Policy
from codedgd.services.sim.cost import COORDINATOR, Buckets, CostModel, fair_finish, paced_together

FLOAT_BYTES = 8


class Cpu:
    """The machine's cores in one round, when every process shares them (``cost.cores``).

    Each node is one process that does its CPU work (building or parsing a message,
    computing its gradient) one task at a time: a task asked at r is taken up at the
    first moment from r its process is idle long enough for it (the round asks for tasks
    out of time order, so a process's earlier gaps are filled too). The C cores are a
    fluid: a task runs at up to one core, on what the tasks placed before it leave of the
    C, so no instant holds more than C cores of work, and a task that has its process
    waits only while the cores are full (a task placed later gets what is left, as a
    first-come scheduler would run them; one that does not fit in its process's gap
    goes after that process's next task). On one core a round of tasks that never wait
    for each other takes the sum of their work. Without ``cores`` every node has a
    machine of its own and CPU work costs nothing here (a worker's compute is charged by
    the round itself).
    """

    # Cores left below this are taken as none (a float sum that should be C).
    _EPS = 1e-12

    def __init__(self, cost: CostModel) -> None:
        self.cost = cost
        self.cores = float(cost.cores) if cost.cores is not None else math.inf
        # Each node's tasks [start, end), by start (they never overlap).
        self._starts: dict[int, list[float]] = {}
        self._ends: dict[int, list[float]] = {}
        # The cores in use: ``_used[i]`` on [``_at[i]``, ``_at[i + 1]``), the last to
        # infinity; neighbours always differ (a stretch of full cores is one piece).
        self._at: list[float] = [-math.inf]
        self._used: list[float] = [0.0]

    @property
    def shared(self) -> bool:
        return self.cost.cores is not None

    def message(self, node: int, nbytes: float, ready: float) -> float:
        """When ``node`` has built (or parsed) a message of ``nbytes`` asked at ``ready``."""
        if not self.shared:
            return ready
        seconds = (
            float(self.cost.coordinator_cpu(nbytes))
            if node == COORDINATOR
            else self.cost.peer_cpu(nbytes)
        )
        return self.run(node, seconds, ready)

    def run(self, node: int, seconds: float, ready: float) -> float:
        """When ``node``'s task of ``seconds`` of a core, asked at ``ready``, is done."""
        if not self.shared:
            return ready + seconds
        if not (seconds > 0 and math.isfinite(ready)):
            return ready  # (nothing to do, or never asked)
        if not math.isfinite(seconds):
            return math.inf  # (a task that never ends: nothing after it either)
        starts = self._starts.setdefault(node, [])
        ends = self._ends.setdefault(node, [])
        start = ready
        while True:  # the first gap of this process's from ``ready`` that holds the task
            j = bisect.bisect_right(starts, start) - 1
            if j >= 0 and ends[j] > start:
                start = ends[j]  # busy then: from the end of that task
                j += 1
            else:
                j += 1
            limit = starts[j] if j < len(starts) else math.inf  # its next task
            pieces = self._fit(start, seconds, limit)
            if pieces is not None:
                break
            start = ends[j]
        end = pieces[-1][1] if pieces else start
        for a, b, rate in pieces:
            self._take(a, b, rate)
        starts.insert(j, start)
        ends.insert(j, end)
        return end

    def _fit(
        self, start: float, seconds: float, limit: float
    ) -> list[tuple[float, float, float]] | None:
        """The pieces (from, to, cores) over which ``seconds`` of a core, begun at
        ``start``, get done on what the cores leave; None if not before ``limit``."""
        at, used, cores = self._at, self._used, self.cores
        i = bisect.bisect_right(at, start) - 1
        t, left = start, seconds
        # Work within this of done is done: a float sum of pieces that should fill a gap
        # exactly must not miss it by a rounding step (and wait out a full stretch).
        slack = 1e-9 * seconds
        pieces: list[tuple[float, float, float]] = []
        while True:
            if t >= limit:
                return None
            stop = at[i + 1] if i + 1 < len(at) else math.inf
            free = min(1.0, cores - used[i])
            if free > self._EPS:
                to = min(stop, limit)
                if free * (to - t) >= left - slack:
                    end = min(t + left / free, to)
                    if end > t:
                        pieces.append((t, end, free))
                    return pieces
                if to > t:
                    pieces.append((t, to, free))
                left -= free * (to - t)
            t = stop
            i += 1

    def _take(self, a: float, b: float, rate: float) -> None:
        """``rate`` cores in use over [a, b), which lies within one piece of the profile."""
        if not b > a:
            return
        at, used = self._at, self._used
        i = bisect.bisect_right(at, a) - 1
        level = used[i]
        if at[i] < a:  # split at a
            i += 1
            at.insert(i, a)
            used.insert(i, level)
        stop = at[i + 1] if i + 1 < len(at) else math.inf
        if b < stop:  # split at b
            at.insert(i + 1, b)
            used.insert(i + 1, level)
        new = level + rate
        used[i] = self.cores if new > self.cores - self._EPS else new
        # Neighbours at the same level are one piece (full stretches stay one).
        if i + 1 < len(at) and used[i + 1] == used[i]:
            del at[i + 1], used[i + 1]
        if i > 0 and used[i - 1] == used[i]:
            del at[i], used[i]


class Links:
    """The NICs of one round: when each node's sending and receiving sides are free,
    and on a shared machine (:class:`Cpu`) each end's CPU for every message."""

    def __init__(self, cost: CostModel, buckets: Buckets | None = None) -> None:
        self.cost = cost
        self.cpu = Cpu(cost)
        self.buckets = buckets if buckets is not None else Buckets(cost)
        self._send: dict[int, float] = {}
        self._recv: dict[int, float] = {}
        # Each side's token bucket (CostModel.burst_bytes): what is left of it this round.
        self._send_credit: dict[int, float] = {}
        self._recv_credit: dict[int, float] = {}
        # Bytes through each side this round ((node, outgoing) → bytes), for the buckets.
        self.through: dict[tuple[int, bool], float] = {}

    def _cap(self, rate: float) -> float:
        """The cap on a flow inside a shared side: the other side's rate, or none with a
        burst (that side's time is charged apart, :func:`_own_side`)."""
        return rate if self.cost.burst_bytes <= 0 else math.inf

    def _paced(self, node: int, outgoing: bool, nbytes: float) -> float:
        """Of ``nbytes`` through ``node``'s side, what its rate paces: beyond what is
        left of its bucket this round (which the message then spends)."""
        left = self._left(node, outgoing)
        self._spend(node, outgoing, nbytes, left)
        return max(nbytes - left, 0.0)

    def _left(self, node: int, outgoing: bool) -> float:
        credit = self._send_credit if outgoing else self._recv_credit
        return credit.get(node, self.buckets.level(node, outgoing))

    def _spend(self, node: int, outgoing: bool, nbytes: float, left: float) -> None:
        credit = self._send_credit if outgoing else self._recv_credit
        credit[node] = max(left - nbytes, 0.0)
        key = (node, outgoing)
        self.through[key] = self.through.get(key, 0.0) + nbytes

    def _rate(self, node: int, outgoing: bool) -> float:
        return self.cost.side_rate(node, outgoing)

    def transfer(self, src: int, dst: int, nbytes: int, ready: float) -> float:
        """Move ``nbytes`` from ``src`` to ``dst`` once asked at ``ready``; the arrival time.

        The transfer goes at the slower side's rate; each side is busy for as long as it
        needs for the bytes itself (an unlimited side is never busy). On a shared
        machine the sender builds the message first and the receiver parses it after.
        """
        ready = self.cpu.message(src, nbytes, ready)
        start = max(ready, self._send.get(src, -math.inf), self._recv.get(dst, -math.inf))
        out_rate, in_rate = self._rate(src, True), self._rate(dst, False)
        out_s = _seconds(self._paced(src, True, nbytes), out_rate)
        in_s = _seconds(self._paced(dst, False, nbytes), in_rate)
        self._send[src] = start + out_s
        self._recv[dst] = start + in_s
        return self.cpu.message(dst, nbytes, start + max(out_s, in_s) + self.cost.latency_seconds)

    def fan_out(self, src: int, transfers: Sequence[tuple[int, int, float]]) -> list[float]:
        """``src`` sends each (dst, bytes, ready): the arrival times, in that order.

        ``fifo``: one after another; ``fair``: the messages share ``src``'s sending side
        while in flight (each no faster than its receiver), as TCP flows do.
        """
        if self.cost.sharing == "fifo":
            return [self.transfer(src, dst, nbytes, ready) for dst, nbytes, ready in transfers]
        busy = self._send.get(src, -math.inf)
        starts = np.array([max(self.cpu.message(src, b, ready), busy) for _, b, ready in transfers])
        # (src's bucket drains into the messages side by side; each receiver's its own)
        whole = np.array([float(nbytes) for _, nbytes, _ in transfers])
        credit = self._left(src, True)
        sizes = paced_together(whole, credit)
        self._spend(src, True, float(whole.sum()), credit)
        # Each receiver's side: its own bucket, then its rate (_own_side).
        theirs = [(self._paced(d, False, b), self._rate(d, False)) for d, b, _ in transfers]
        done = self._side_by_side(src, True, starts, sizes, theirs)
        for (dst, _, _), end in zip(transfers, done, strict=True):
            self._recv[dst] = max(self._recv.get(dst, -math.inf), float(end))
        if len(done):
            self._send[src] = float(np.max(done))
        return self._parsed([d for d, _, _ in transfers], transfers, done)

    def fan_in(self, dst: int, transfers: Sequence[tuple[int, int, float]]) -> list[float]:
        """Each (src, bytes, ready) sends to ``dst``: the arrival times, in that order
        (``fair``: they share ``dst``'s receiving side while in flight)."""
        if self.cost.sharing == "fifo":
            ordered = sorted(range(len(transfers)), key=lambda i: (transfers[i][2], i))
            out = [0.0] * len(transfers)
            for i in ordered:
                src, nbytes, ready = transfers[i]
                out[i] = self.transfer(src, dst, nbytes, ready)
            return out
        busy = self._recv.get(dst, -math.inf)
        starts = np.array(
            [
                max(self.cpu.message(src, b, ready), busy, self._send.get(src, -math.inf))
                for src, b, ready in transfers
            ]
        )
        by_start = sorted(range(len(transfers)), key=lambda i: (float(starts[i]), i))
        sizes = np.zeros(len(transfers))
        theirs: list[tuple[float, float]] = [(0.0, math.inf)] * len(transfers)
        for i in by_start:  # (the bucket goes to the first in)
            src, nbytes, _ = transfers[i]
            sizes[i] = self._paced(dst, False, nbytes)
            theirs[i] = (self._paced(src, True, nbytes), self._rate(src, True))
        done = self._side_by_side(dst, False, starts, sizes, theirs)
        for (src, _, _), end in zip(transfers, done, strict=True):
            self._send[src] = max(self._send.get(src, -math.inf), float(end))
        if len(done):
            self._recv[dst] = float(np.max(done))
        return self._parsed([dst] * len(transfers), transfers, done)

    def _side_by_side(
        self,
        node: int,
        outgoing: bool,
        starts: np.ndarray,
        sizes: np.ndarray,
        theirs: Sequence[tuple[float, float]],
    ) -> np.ndarray:
        """When the last byte of each message sharing ``node``'s one side (``fair``)
        leaves: ``sizes`` paced there from ``starts``, each also paying its other end
        (``theirs``: bytes paced there, and its rate; :func:`_own_side`)."""
        cap = min((rate for _, rate in theirs), default=math.inf)
        shared = fair_finish(starts, sizes, self._rate(node, outgoing), self._cap(cap))
        return _own_side(shared, starts, theirs, self.cost)

    def _parsed(
        self,
        receivers: Sequence[int],
        transfers: Sequence[tuple[int, int, float]],
        done: np.ndarray,
    ) -> list[float]:
        """Messages whose last byte left at ``done``: when each receiver holds it (a
        latency later, and on a shared machine parsed, in order of arrival)."""
        landed = [float(end) + self.cost.latency_seconds for end in done]
        if not self.cpu.shared:
            return landed
        out = list(landed)
        for i in sorted(range(len(landed)), key=lambda i: (landed[i], i)):
            out[i] = self.cpu.message(receivers[i], transfers[i][1], landed[i])
        return out


def _own_side(
    done: np.ndarray, starts: np.ndarray, theirs: Sequence[tuple[float, float]], cost: CostModel
) -> np.ndarray:
    """With a burst, a shared side's finish times no earlier than each message's other
    side allows: its bytes beyond that side's bucket at that side's rate. (Without
    one, the other side's rate caps the flow inside the sharing, as before.)"""
    if cost.burst_bytes <= 0:
        return done
    other = np.array([_seconds(paced, rate) for paced, rate in theirs])
    out: np.ndarray = np.maximum(done, starts + other)
    return out


def _seconds(nbytes: float, rate: float) -> float:
    return nbytes / rate if math.isfinite(rate) else 0.0


@dataclass
class TopologyRound:
    """One simulated round of a ring or a tree, for the job loop."""

    estimate: Estimate
    wait: float  # seconds after the round start the coordinator could decode
    computations: int  # workers that computed their message
    uploads: int  # results the coordinator received
    bytes_up: int  # into the coordinator
    bytes_down: int  # out of the coordinator
    cancelled: int
    decode: float = 0.0
    compute_max: float = 0.0
    responses: dict[int, float] = field(default_factory=dict)  # reporters, arrival seconds
    computes: dict[int, float] = field(default_factory=dict)
    contributors: tuple[int, ...] = ()  # every worker whose message is in the estimate
    # Worker → compute plus delay, of every worker whose timing reached the coordinator
    # (as the workers' WorkerTiming: a ring's all, a tree's in the sums that arrived).
    ready: dict[int, float] = field(default_factory=dict)
    # Bytes through each NIC side, (node, outgoing) → bytes (Links.through).
    through: dict[tuple[int, bool], float] = field(default_factory=dict)


# Worker w's seconds of compute and of straggler delay in this round.
Timing = Callable[[int], tuple[float, float]]
# Worker w's own message at the round's θ (computed only when used).
Message = Callable[[int], np.ndarray]


def ring_round(
    plan: Plan,
    policy: Policy,
    t: int,
    point: np.ndarray,
    cost: CostModel,
    timing: Timing,
    message: Message,
    buckets: Buckets | None = None,
) -> TopologyRound:
    """θ_t scattered and all-gathered, messages reduce-scattered, segments uploaded."""
    n, dim = plan.n_workers, int(point.shape[0])
    bounds = segments(dim, n)
    seg_bytes = [FLOAT_BYTES * (stop - start) for start, stop in bounds]
    links = Links(cost, buckets)
    policy.begin_round(t, point)
    have: list[dict[int, float]] = [{} for _ in range(n)]
    scatter = links.fan_out(COORDINATOR, [(q, seg_bytes[q], 0.0) for q in range(n)])
    for q in range(n):  # the coordinator sends worker q segment q of θ_t
        have[q][q] = scatter[q]
    for step in range(n - 1):  # all-gather
        for w in range(n):
            q = gather_segment(w, step, n)
            have[(w + 1) % n][q] = links.transfer(w, (w + 1) % n, seg_bytes[q], have[w][q])
    ready = []
    out = TopologyRound(
        estimate=Estimate(np.zeros(0), (), exact=True),
        wait=0.0,
        computations=n,
        uploads=n,
        bytes_up=sum(seg_bytes),
        bytes_down=sum(seg_bytes),
        cancelled=0,
    )
    for w in range(n):
        compute, delay = timing(w)
        out.computes[w] = compute
        held = max(have[w].values())
        ready.append(links.cpu.run(w, compute, held) + delay)
        out.ready[w] = ready[-1] - held
    out.compute_max = max(out.computes.values())
    received = [-math.inf] * n  # when w received the previous step's partial sum
    for step in range(n - 1):  # reduce-scatter
        arrivals = []
        for w in range(n):
            q = scatter_segment(w, step, n)
            asked = max(ready[w], received[w])
            arrivals.append(links.transfer(w, (w + 1) % n, seg_bytes[q], asked))
        for w in range(n):
            received[(w + 1) % n] = arrivals[w]
    done = [max(ready[w], received[w]) for w in range(n)]
    uploads = reduced_segments([message(w) for w in range(n)])
    landed = links.fan_in(
        COORDINATOR, [(w, seg_bytes[reduced_segment(w, n)], done[w]) for w in range(n)]
    )
    arrive = dict(enumerate(landed))
    for w in sorted(arrive, key=lambda w: (arrive[w], w)):
        out.responses[w] = arrive[w]
        out.wait = arrive[w]
        if policy.offer(w, uploads[w]):
            break
    out.through = links.through
    out.estimate = _decode(policy, t, out)
    out.contributors = tuple(range(n))
    return out


def tree_round(
    plan: Plan,
    policy: Policy,
    t: int,
    point: np.ndarray,
    cost: CostModel,
    timing: Timing,
    message: Message,
    buckets: Buckets | None = None,
) -> TopologyRound:
    """θ_t down the tree; partial sums up, each node decoding its fastest children."""
    tree, B = plan.topology.tree, plan.topology.code
    assert tree is not None and B is not None
    code = CyclicCode.from_matrix(B, tree.s)
    theta_bytes = FLOAT_BYTES * int(point.shape[0])
    links = Links(cost, buckets)
    spec = policy.begin_round(t, point)
    theta_at: dict[int, float] = {}

    def down(node: int, at: float) -> None:
        kids = tree.children(node)
        for child, landed in zip(
            kids, links.fan_out(node, [(c, theta_bytes, at) for c in kids]), strict=True
        ):
            theta_at[child] = landed
        for child in kids:
            down(child, theta_at[child])

    down(COORDINATOR, 0.0)
    out = TopologyRound(
        estimate=Estimate(np.zeros(0), (), exact=True),
        wait=0.0,
        computations=tree.n_workers,
        uploads=0,
        bytes_up=0,
        bytes_down=theta_bytes * len(spec.workers),
        cancelled=0,
    )
    own_ready: dict[int, float] = {}
    own: dict[int, float] = {}
    for w in range(tree.n_workers):
        compute, delay = timing(w)
        out.computes[w] = compute
        own_ready[w] = links.cpu.run(w, compute, theta_at[w]) + delay
        own[w] = own_ready[w] - theta_at[w]
    out.compute_max = max(out.computes.values())
    sent: dict[int, float] = {}  # when a worker's partial sum leaves for its parent
    partial: dict[int, np.ndarray] = {}
    below: dict[int, set[int]] = {}  # the workers whose messages are in a partial sum
    for level in range(tree.levels, 0, -1):
        for w in range(tree.level_start(level), tree.level_start(level + 1)):
            kids = tree.children(w)
            if not kids:
                sent[w], partial[w] = own_ready[w], message(w)
                continue
            decided, z, used = _decode_children(
                w, kids, code, plan.topology.tol, links, sent, partial
            )
            out.cancelled += len(kids) - len(used)
            below[w] = {v for c in used for v in (c, *below.get(c, ()))}
            sent[w] = max(own_ready[w], decided)
            partial[w] = message(w) + z
    level1 = tree.children(COORDINATOR)
    landed = links.fan_in(COORDINATOR, [(w, theta_bytes, sent[w]) for w in level1])
    arrive = dict(zip(level1, landed, strict=True))
    for w in sorted(arrive, key=lambda w: (arrive[w], w)):
        out.responses[w] = arrive[w]
        out.wait = arrive[w]
        out.uploads += 1
        out.bytes_up += theta_bytes
        if policy.offer(w, partial[w]):
            break
    out.cancelled += len(level1) - out.uploads
    out.ready = {v: own[v] for w in out.responses for v in (w, *below.get(w, ()))}
    out.through = links.through
    out.estimate = _decode(policy, t, out)
    used = out.estimate.workers_used
    out.contributors = tuple(sorted({v for w in used for v in (w, *below.get(w, ()))}))
    return out


def _decode_children(
    node: int,
    kids: Sequence[int],
    code: CyclicCode,
    tol: float,
    links: Links,
    sent: dict[int, float],
    partial: dict[int, np.ndarray],
) -> tuple[float, np.ndarray, tuple[int, ...]]:
    """When ``node`` can decode its children, what it decodes, and the children it used.

    The children's partial sums arrive over ``node``'s receiving side in the order they
    leave; it decodes them with :class:`CyclicRound`, as a worker does. A group that
    cannot decode (more than s of it lost, or every set above tol) fails the round.
    """
    landed = links.fan_in(node, [(c, FLOAT_BYTES * partial[c].shape[0], sent[c]) for c in kids])
    arrive = dict(zip(kids, landed, strict=True))
    decoding = CyclicRound(code, tol)
    decoding.reset(int(partial[kids[0]].shape[0]))
    position = {c: i for i, c in enumerate(kids)}
    for c in sorted(arrive, key=lambda c: (arrive[c], c)):
        if decoding.add(position[c], partial[c]):
            z, _ = decoding.combine()  # DecodeError when every set is above tol
            return arrive[c], z, tuple(kids[p] for p in decoding.arrived)
    raise DecodeError(f"worker {node} could not decode its children")


def _decode(policy: Policy, t: int, out: TopologyRound) -> Estimate:
    """The coordinator's decode (its wall time kept: the simulator's decode seconds)."""
    start = time.perf_counter()
    try:
        estimate = policy.decode()
    except DecodeError as exc:
        raise JobFailed(f"round {t}: decoding failed: {exc}") from None
    out.decode = time.perf_counter() - start
    return estimate
