"""The simulator's cost model: how long compute and communication take on the virtual clock.

A worker w contacted in round t responds at (virtual seconds after the round starts)

    down_w + compute_w + delay_w + up_w

- ``down_w``: θ_t reaching the worker: ``latency + bytes_θ / bandwidth`` on its own
  link; with a shared coordinator egress (``egress_bandwidth``) the n copies of θ_t
  leave one after another, so the i-th worker contacted gets its copy after
  ``(i+1)·bytes_θ / egress_bandwidth``, whichever is later.
- ``compute_w``: ``seconds_per_sample · rows_w + seconds_per_partition · partitions_w``
  (``compute = "model"``; the two constants are calibrated on this machine when not
  given: :func:`calibrate`), or the measured wall time of the worker's real
  :class:`~codedgd.services.compute.gradient.Computer` call (``compute = "measured"``), or 0
  (``compute = "none"``, for closed-form checks).
- ``delay_w``: the job's straggler model, called exactly as the worker agent calls
  it: ``delay(w, t, compute_w, load_w)``.
- ``up_w``: the message back: ``latency + bytes_msg / bandwidth`` on its link; with a
  shared coordinator ingress (``ingress_bandwidth``) the messages are received one at a
  time, first come first served.

The round is decodable at the arrival that makes ``policy.offer`` return True; it ends
``decode`` seconds later (measured wall time of ``policy.decode`` or a constant) plus
``round_overhead`` (serialization and the optimizer step of the coordinator).

A link that bursts (``burst_bytes`` = B > 0): every NIC, each way, is a token bucket of
B bytes at its rate (tc's tbf; a cloud NIC's burst allowance): what it holds when a
round starts goes at once, the rest at its rate. So a message within it costs its
latency only, and the coordinator's n copies of θ queue only beyond it. Between rounds
(:class:`Buckets`) a side's bucket refills at its rate, up to B: it holds what it held,
plus its rate times the round's seconds, less the bytes through it in the round. A
side that moves more a round than its rate refills pays its rate in the long run, as a
real bucket makes it; a star worker's own link is taken as full at every round (two
messages a round). B = 0 (the default): a rate only.

How messages share a link (``sharing``): ``"fifo"`` (the default) sends them one after
another, so the first of n copies of θ_t arrives after one message's time; ``"fair"``
shares the link among the messages in flight, as TCP flows on one link do (a fluid
processor-sharing queue, :func:`fair_finish`), so n copies sent together all arrive near
the end. Real links lie between the two (docs/topologies.md compares them with shaped
namespaces).

One machine (``cores``): by default every worker has a machine of its own, as in a
cluster. ``codedgd run`` puts the coordinator and all n workers on one machine, where they
share its cores and where handling a message costs CPU, not just link time. With
``cores`` = C:

- the coordinator serializes the n copies of θ_t one after another, and parses the
  results one at a time in order of arrival, each message costing it
  ``coordinator_cpu_seconds_per_message + coordinator_cpu_seconds_per_byte · bytes``;
- a worker's CPU work of a round is its compute plus, for θ received and its message
  sent, ``worker_cpu_seconds_per_message + worker_cpu_seconds_per_byte · bytes`` each;
- the workers' CPU work and the coordinator's (all of its round's messages, as one more
  task from the round's start) share the C cores: k busy tasks each run at min(1, C/k)
  of a core (processor sharing, :func:`fair_finish`).

A straggler's delay comes after its CPU work (building its message is counted before the
delay). The four CPU constants of a star's messages default to what ``python -m
bench.bench_host_cpu`` measured on the 2-core machine of docs/neural.md.

Rings and trees on one machine (:class:`~codedgd.services.sim.topologies.Cpu`): every
process does its CPU work one task at a time: each end of every hop (a worker's
``peer_cpu_seconds_per_message + peer_cpu_seconds_per_byte · bytes``, measured by
``python -m bench.bench_host_cpu --peer``; the coordinator's as above) and a worker's
compute. A task runs at up to one core on what the tasks placed before it leave of the
C cores (a fluid: no instant holds more than C cores of work).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from codedgd.services.data.dataset import Matrix
from codedgd.services.errors import ConfigError
from codedgd.services.models.base import Model

COMPUTE_MODES = ("model", "measured", "none")
SHARING = ("fifo", "fair")
COORDINATOR = -1  # the coordinator's node (workers are 0 … n - 1)
# Fewer cores than this are not a machine (and the fluid of topologies.Cpu needs some).
MIN_CORES = 0.01


@dataclass(frozen=True)
class CostModel:
    """Seconds of compute and communication on the virtual clock (see the module docstring).

    ``None`` for ``seconds_per_sample``/``seconds_per_partition`` means "calibrate on this
    machine" (:func:`calibrate`); ``None`` for ``decode_seconds`` means "the measured wall
    time of policy.decode"; ``None`` for a shared bandwidth means unlimited.
    """

    compute: str = "model"
    seconds_per_sample: float | None = None
    seconds_per_partition: float | None = None
    latency_seconds: float = 0.0002
    bandwidth_bytes_per_second: float = 1.0e9
    ingress_bandwidth_bytes_per_second: float | None = None
    egress_bandwidth_bytes_per_second: float | None = None
    decode_seconds: float | None = None
    round_overhead_seconds: float = 0.0
    sharing: str = "fifo"
    cores: float | None = None
    # Every NIC's token bucket, bytes each way, full before the first round, refilled at
    # its rate between rounds (Buckets; 0: none).
    burst_bytes: float = 0.0
    # bench/bench_host_cpu.py on the 2-core machine of docs/neural.md (CPU seconds per
    # round of real runs at two message sizes; see the module docstring).
    worker_cpu_seconds_per_message: float = 6.4e-4
    worker_cpu_seconds_per_byte: float = 6.9e-10
    coordinator_cpu_seconds_per_message: float = 3.0e-4
    coordinator_cpu_seconds_per_byte: float = 5.7e-10
    # bench/bench_host_cpu.py --peer on the same machine: one end of a worker-to-worker
    # hop (a ring's or tree's message, built or parsed), per message and per byte.
    peer_cpu_seconds_per_message: float = 2.2e-4
    peer_cpu_seconds_per_byte: float = 7.1e-10

    def __post_init__(self) -> None:
        if self.sharing not in SHARING:
            raise ConfigError(
                f"cost model: sharing must be one of {', '.join(SHARING)}, got {self.sharing!r}"
            )
        if self.compute not in COMPUTE_MODES:
            raise ConfigError(
                f"cost model: compute must be one of {', '.join(COMPUTE_MODES)}, "
                f"got {self.compute!r}"
            )
        for key in ("seconds_per_sample", "seconds_per_partition", "decode_seconds"):
            value = getattr(self, key)
            if value is not None:
                _nonnegative(key, value)
        _nonnegative("latency_seconds", self.latency_seconds)
        _nonnegative("burst_bytes", self.burst_bytes)
        if not math.isfinite(self.burst_bytes):
            raise ConfigError(
                "cost model: burst_bytes must be a finite number of bytes (0: no burst; "
                "for unlimited links give an infinite bandwidth)"
            )
        for key in (
            "worker_cpu_seconds_per_message",
            "worker_cpu_seconds_per_byte",
            "coordinator_cpu_seconds_per_message",
            "coordinator_cpu_seconds_per_byte",
            "peer_cpu_seconds_per_message",
            "peer_cpu_seconds_per_byte",
        ):
            _nonnegative(key, getattr(self, key))
        if self.cores is not None:
            _positive("cores", self.cores)
            if math.isinf(self.cores) or self.cores < MIN_CORES:
                raise ConfigError(
                    f"cost model: cores must be a finite number of cores, at least "
                    f"{MIN_CORES:g}, got {self.cores:g} (leave it unset for a machine per worker)"
                )
        _nonnegative("round_overhead_seconds", self.round_overhead_seconds)
        _positive("bandwidth_bytes_per_second", self.bandwidth_bytes_per_second)
        for key in ("ingress_bandwidth_bytes_per_second", "egress_bandwidth_bytes_per_second"):
            value = getattr(self, key)
            if value is not None:
                _positive(key, value)

    @staticmethod
    def ideal() -> CostModel:
        """No compute, no communication, no decode time: only the straggler delays count.

        The setting of the closed forms of SCHEMES.md.
        """
        return CostModel(
            compute="none",
            latency_seconds=0.0,
            bandwidth_bytes_per_second=math.inf,
            decode_seconds=0.0,
        )

    def side_rate(self, node: int, outgoing: bool) -> float:
        """A node's NIC rate one way, bytes/s: a worker's link, the coordinator's egress
        or ingress (unlimited when not set: inf)."""
        if node != COORDINATOR:
            return self.bandwidth_bytes_per_second
        shared = (
            self.egress_bandwidth_bytes_per_second
            if outgoing
            else self.ingress_bandwidth_bytes_per_second
        )
        return math.inf if shared is None else shared

    def link_seconds(self, nbytes: int) -> float:
        """One message over one worker's own link (the only one through it that way
        this round: beyond the burst only is it paced)."""
        paced = max(nbytes - self.burst_bytes, 0.0)
        return self.latency_seconds + paced / self.bandwidth_bytes_per_second

    def worker_cpu(self, nbytes: float) -> float:
        """A worker's CPU seconds for one message of ``nbytes`` on a shared machine."""
        if self.cores is None:
            return 0.0
        return self.worker_cpu_seconds_per_message + self.worker_cpu_seconds_per_byte * nbytes

    def peer_cpu(self, nbytes: float) -> float:
        """A worker's CPU seconds for one end of a worker-to-worker hop of ``nbytes`` on
        a shared machine (building it to send or parsing it received)."""
        if self.cores is None:
            return 0.0
        return self.peer_cpu_seconds_per_message + self.peer_cpu_seconds_per_byte * nbytes

    def coordinator_cpu(self, nbytes: float | np.ndarray) -> Any:
        """The coordinator's CPU seconds per message of ``nbytes`` on a shared machine."""
        if self.cores is None:
            return 0.0 * np.asarray(nbytes)
        return (
            self.coordinator_cpu_seconds_per_message
            + self.coordinator_cpu_seconds_per_byte * np.asarray(nbytes, dtype=np.float64)
        )

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        return {k: (None if isinstance(v, float) and math.isinf(v) else v) for k, v in d.items()}

    def replace(self, **changes: Any) -> CostModel:
        return CostModel(**{**asdict(self), **changes})


class Buckets:
    """Every NIC side's token bucket from round to round (``CostModel.burst_bytes``).

    ``level(node, outgoing)`` is what the side holds when a round starts (full, B, until
    a round spends it). After a round of ``seconds`` that put ``through`` bytes through
    each side, :meth:`after` refills each at its rate: min(B, held + rate · seconds −
    through), never below 0.
    """

    def __init__(self, cost: CostModel) -> None:
        self.cost = cost
        self._level: dict[tuple[int, bool], float] = {}

    def level(self, node: int, outgoing: bool) -> float:
        return self._level.get((node, outgoing), self.cost.burst_bytes)

    def after(self, through: Mapping[tuple[int, bool], float], seconds: float) -> None:
        """A round (or the time between rounds) of ``seconds`` has passed."""
        full = self.cost.burst_bytes
        if full <= 0:
            return
        for key in set(self._level) | set(through):
            rate = self.cost.side_rate(*key)
            held = self.level(*key) - through.get(key, 0.0)
            left = full if math.isinf(rate) else min(full, held + rate * seconds)
            if left >= full:
                self._level.pop(key, None)
            else:
                self._level[key] = max(left, 0.0)


def downlink_times(
    cost: CostModel, nbytes: int, n_contacted: int, held: float | None = None
) -> np.ndarray:
    """When each contacted worker (in send order) holds θ_t, seconds after the round start.

    ``held``: what the coordinator's sending side's bucket holds at the round's start
    (:class:`Buckets`; None: full)."""
    burst = cost.burst_bytes if held is None else held
    own = np.full(n_contacted, cost.link_seconds(nbytes))
    if cost.cores is not None:  # the coordinator serializes the copies one by one
        serialized = np.arange(1, n_contacted + 1) * float(cost.coordinator_cpu(nbytes))
        own = np.maximum(own, serialized + cost.link_seconds(nbytes))
    egress = cost.egress_bandwidth_bytes_per_second
    if egress is None:
        return own
    copies = np.full(n_contacted, float(nbytes))
    if cost.sharing == "fair":
        starts = np.zeros(n_contacted)
        sizes = paced_together(copies, burst)
        done = fair_finish(starts, sizes, egress, _cap(cost))
        got: np.ndarray = np.maximum(own, done + cost.latency_seconds)
        return got
    queued: np.ndarray = (
        np.cumsum(paced(copies, burst)) / egress
        if cost.burst_bytes > 0
        else np.arange(1, n_contacted + 1) * (nbytes / egress)
    )
    out: np.ndarray = np.maximum(own, queued + cost.latency_seconds)
    return out


def _cap(cost: CostModel) -> float:
    """A flow's cap on a shared coordinator side: the worker's link. With a burst the
    worker's own bucket may let it go faster; its own link's time is charged apart
    (the arrival is no earlier than that, either way)."""
    return cost.bandwidth_bytes_per_second if cost.burst_bytes <= 0 else math.inf


def paced_together(sizes: np.ndarray, burst: float) -> np.ndarray:
    """As :func:`paced`, for messages that share the NIC side by side from the same
    moment: the bucket drains into all of them equally (a message smaller than its
    share takes only what it needs, the rest goes to the others)."""
    sizes = np.asarray(sizes, dtype=np.float64)
    if burst <= 0 or sizes.size == 0:
        return sizes.copy()
    given = np.zeros_like(sizes)
    left = float(burst)
    open_ = sizes > 0
    while left > 1e-12 and open_.any():
        share = left / int(open_.sum())
        take = np.where(open_, np.minimum(sizes - given, share), 0.0)
        given += take
        left -= float(take.sum())
        open_ = sizes - given > 1e-12
    out: np.ndarray = sizes - given
    return out


def paced(sizes: np.ndarray, burst: float) -> np.ndarray:
    """What of each message (in the order they go through one NIC) its rate paces: the
    first ``burst`` bytes of the round go at once (a token bucket full at its start)."""
    if burst <= 0:
        return np.asarray(sizes, dtype=np.float64)
    sizes = np.asarray(sizes, dtype=np.float64)
    before = np.cumsum(sizes) - sizes  # bytes through it before each message
    free = np.clip(burst - before, 0.0, None)
    out: np.ndarray = np.maximum(sizes - free, 0.0)
    return out


def uplink_arrivals(
    cost: CostModel,
    ready: np.ndarray,
    nbytes: Sequence[int] | np.ndarray,
    held: float | None = None,
) -> np.ndarray:
    """Arrival times at the coordinator of messages ready (sent) at ``ready``.

    Each message crosses its own link; with a shared ingress the coordinator receives
    them first come first served, one at a time. ``held``: what the coordinator's
    receiving side's bucket holds at the round's start (:class:`Buckets`; None: full).
    """
    sizes = np.asarray(nbytes, dtype=np.float64)
    beyond = np.maximum(sizes - cost.burst_bytes, 0.0)  # (one message through its own NIC)
    own: np.ndarray = ready + cost.latency_seconds + beyond / cost.bandwidth_bytes_per_second
    ingress = cost.ingress_bandwidth_bytes_per_second
    if ingress is None:
        return _parsed(cost, own, sizes)
    starts = np.asarray(ready, dtype=np.float64) + cost.latency_seconds
    # The coordinator's bucket goes to the messages in order of readiness.
    order = np.argsort(starts, kind="stable")
    rest = np.empty_like(sizes)
    rest[order] = paced(sizes[order], cost.burst_bytes if held is None else held)
    if cost.sharing == "fair":
        shared = fair_finish(starts, rest, ingress, _cap(cost))
        arrivals: np.ndarray = np.maximum(shared, own)
        return _parsed(cost, arrivals, sizes)
    # First come first served, one message at a time, in order of readiness.
    free = _fcfs(starts, rest / ingress)
    out: np.ndarray = np.maximum(free, own)
    return _parsed(cost, out, sizes)


def _parsed(cost: CostModel, arrived: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """On a shared machine (``cores``), when the coordinator has parsed each message: one
    at a time, in order of arrival (the FCFS queue of :func:`_fcfs`)."""
    if cost.cores is None:
        return arrived
    return _fcfs(arrived, cost.coordinator_cpu(sizes))


def _fcfs(starts: np.ndarray, service: np.ndarray) -> np.ndarray:
    """When each job leaves a first-come-first-served server (ties in index order)."""
    # In order of start, job i leaves at free_i = max(start_i, free_{i-1}) + d_i, which
    # unrolls to free_i = D_i + max_{j<=i}(start_j - D_{j-1}), D the running sum of the d's.
    order = np.argsort(starts, kind="stable")
    s = np.asarray(starts, dtype=np.float64)[order]
    d = np.asarray(service, dtype=np.float64)[order]
    done = np.cumsum(d)
    free = done + np.maximum.accumulate(s - (done - d))
    out = np.empty_like(s)
    out[order] = free
    return out


def fair_finish(
    starts: np.ndarray, sizes: np.ndarray, rate: float, cap: float = math.inf
) -> np.ndarray:
    """When each flow ends on a link of ``rate`` bytes/s shared equally by the flows in
    flight (fluid processor sharing), each at most ``cap`` bytes/s (its other end's link).

    Flow i starts at ``starts[i]`` with ``sizes[i]`` bytes.
    """
    n = len(starts)
    end = np.full(n, math.inf)
    if not math.isfinite(rate) and not math.isfinite(cap):
        return np.asarray(starts, dtype=np.float64).copy()
    order = sorted(range(n), key=lambda i: (float(starts[i]), i))
    left = {i: float(sizes[i]) for i in range(n)}
    active: list[int] = []
    now = -math.inf
    k = 0  # next flow to start, in order
    while k < n or active:
        if not active:
            now = max(now, float(starts[order[k]]))
        while k < n and float(starts[order[k]]) <= now:
            active.append(order[k])
            k += 1
        each = min(rate / len(active), cap)
        finishing = min(active, key=lambda i: (left[i], i))
        done_at = now + left[finishing] / each
        arriving = float(starts[order[k]]) if k < n else math.inf
        step_to = min(done_at, arriving)
        for i in active:
            left[i] -= each * (step_to - now)
        now = step_to
        for i in [i for i in active if left[i] <= 1e-9 * max(float(sizes[i]), 1.0)]:
            end[i] = now
            active.remove(i)
    return end


def cpu_done(
    cost: CostModel, starts: np.ndarray, work: np.ndarray, coordinator_work: float = 0.0
) -> np.ndarray:
    """When each worker's CPU work of a round (``work`` seconds of one core, started at
    ``starts``) is done: at once on machines of their own; on a shared machine
    (``cost.cores``), sharing the cores with each other and with the coordinator's
    ``coordinator_work`` seconds from the round's start."""
    starts = np.asarray(starts, dtype=np.float64)
    work = np.asarray(work, dtype=np.float64)
    if cost.cores is None:
        out: np.ndarray = starts + work
        return out
    done = fair_finish(
        np.concatenate([[0.0], starts]), np.concatenate([[coordinator_work], work]), cost.cores, 1.0
    )
    return done[1:]


def join_seconds(cost: CostModel, assignment_bytes: int) -> float:
    """A newcomer's join: Hello, its assignment and data over its link, the ack back."""
    return 3 * cost.latency_seconds + assignment_bytes / cost.bandwidth_bytes_per_second


def move_seconds(cost: CostModel, nbytes: Sequence[int] | np.ndarray) -> float:
    """A re-assignment between rounds: every worker's new Assignment and the rows it lacks
    (``nbytes[w]``) over its own link, and its ack back; with a shared egress, all of the
    rows through it too. Nothing to ship: the Assignments and acks alone."""
    sizes = np.asarray(nbytes, dtype=np.float64)
    own = 2 * cost.latency_seconds + float(sizes.max(initial=0.0)) / cost.bandwidth_bytes_per_second
    if sizes.any():
        own += cost.latency_seconds
    egress = cost.egress_bandwidth_bytes_per_second
    if egress is not None:
        own = max(own, 3 * cost.latency_seconds + float(sizes.sum()) / egress)
    return own


@dataclass(frozen=True)
class Calibration:
    """Compute constants measured on this machine, and how: ``full_seconds`` over
    ``rows_full`` rows and ``block_seconds`` over ``rows_block`` (all training rows and one
    partition; in a mini-batch job, 4·batch rows and batch rows of one partition)."""

    seconds_per_sample: float
    seconds_per_partition: float
    full_seconds: float
    block_seconds: float
    rows_full: int
    rows_block: int


def calibrate(
    model: Model,
    X: Matrix,
    y: np.ndarray,
    block_rows: np.ndarray,
    theta: np.ndarray,
    repeats: int = 5,
    batch: int = 0,
) -> Calibration:
    """Fit compute = a·rows + b·partitions from two timings of a worker's gradient.

    Times (median of ``repeats``) one gradient over all training rows and one over a
    single partition's rows, each bound once as a worker binds its partitions
    (``model.block``), so a round's timing leaves out the one-off checks; a is the
    slope, b the fixed per-call cost (the dense output of a sparse product, say). Both
    are clipped at 0.

    With ``batch`` rows a round (mini-batch jobs), the two timings are instead a round's
    own operation on the partition, as a worker's :class:`Computer` does it (drawing the
    round's sample of the partition, the gradient over it, its scaling): with ``batch``
    rows and with four times as many (or the whole partition, if smaller), a few rounds
    each. A network's per-call cost weighs much more at 32 rows than a fit over whole
    partitions says, drawing the sample costs in proportion to the partition, not the
    batch, and a full-data gradient of a network is costly to time.
    """
    from codedgd.services.compute.gradient import Computer, PartitionRows
    from codedgd.services.data.dataset import take_rows

    n_part = int(block_rows.shape[0])
    if 0 < batch < n_part:
        rows = PartitionRows(0, take_rows(X, block_rows), y[block_rows])
        one = np.ones((1, 1))
        sizes = (batch, min(4 * batch, n_part))
        t_small, t_large = (
            _median_seconds(_rounds(Computer(model, [rows], one, batch_size=size), theta), repeats)
            for size in sizes
        )
        a = max((t_large - t_small) / (sizes[1] - sizes[0]), 0.0) if sizes[1] > sizes[0] else 0.0
        b = max(t_small - a * sizes[0], 0.0)
        return Calibration(a, b, t_large, t_small, sizes[1], sizes[0])
    part = model.block(take_rows(X, block_rows), y[block_rows])
    whole = model.block(X, y)
    full = _median_seconds(lambda: whole.grad_sum(theta), repeats)
    block = _median_seconds(lambda: part.grad_sum(theta), repeats)
    n_full, n_block = int(X.shape[0]), n_part
    spread = n_full - n_block
    a = max((full - block) / spread, 0.0) if spread > 0 else full / max(n_full, 1)
    b = max(block - a * n_block, 0.0)
    return Calibration(a, b, full, block, n_full, n_block)


def _rounds(computer: Any, theta: np.ndarray) -> Any:
    """A call per round, each on its own round's sample, as a worker computes them."""
    count = iter(range(1 << 62))
    return lambda: computer.compute(theta, None, next(count))


def _median_seconds(fn: Any, repeats: int) -> float:
    fn()  # warm caches and allocators
    times = []
    for _ in range(max(repeats, 1)):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def _nonnegative(key: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ConfigError(f"cost model: {key} must be a number >= 0, got {value!r}")


def _positive(key: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ConfigError(f"cost model: {key} must be a number > 0 (inf allowed), got {value!r}")


def cost_from_options(options: Mapping[str, Any]) -> CostModel:
    """A cost model from KEY=VALUE options (None values keep the defaults)."""
    known = {f for f in CostModel.__dataclass_fields__}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ConfigError(
            f"cost model has no option(s) {', '.join(unknown)}; valid: {', '.join(sorted(known))}"
        )
    return CostModel(**{k: v for k, v in options.items() if v is not None})
