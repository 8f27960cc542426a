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

How messages share a link (``sharing``): ``"fifo"`` (the default) sends them one after
another, so the first of n copies of θ_t arrives after one message's time; ``"fair"``
shares the link among the messages in flight, as TCP flows on one link do (a fluid
processor-sharing queue, :func:`fair_finish`), so n copies sent together all arrive near
the end. Real links lie between the two (docs/topologies.md compares them with shaped
namespaces).
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

    def link_seconds(self, nbytes: int) -> float:
        """One message over one worker's own link."""
        return self.latency_seconds + nbytes / self.bandwidth_bytes_per_second

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        return {k: (None if isinstance(v, float) and math.isinf(v) else v) for k, v in d.items()}

    def replace(self, **changes: Any) -> CostModel:
        return CostModel(**{**asdict(self), **changes})


def downlink_times(cost: CostModel, nbytes: int, n_contacted: int) -> np.ndarray:
    """When each contacted worker (in send order) holds θ_t, seconds after the round start."""
    own = np.full(n_contacted, cost.link_seconds(nbytes))
    egress = cost.egress_bandwidth_bytes_per_second
    if egress is None:
        return own
    if cost.sharing == "fair":
        starts = np.zeros(n_contacted)
        sizes = np.full(n_contacted, float(nbytes))
        done = fair_finish(starts, sizes, egress, cost.bandwidth_bytes_per_second)
        held: np.ndarray = np.maximum(own, done + cost.latency_seconds)
        return held
    queued = np.arange(1, n_contacted + 1) * (nbytes / egress)
    out: np.ndarray = np.maximum(own, queued + cost.latency_seconds)
    return out


def uplink_arrivals(
    cost: CostModel, ready: np.ndarray, nbytes: Sequence[int] | np.ndarray
) -> np.ndarray:
    """Arrival times at the coordinator of messages ready (sent) at ``ready``.

    Each message crosses its own link; with a shared ingress the coordinator receives
    them first come first served, one at a time.
    """
    sizes = np.asarray(nbytes, dtype=np.float64)
    own: np.ndarray = ready + cost.latency_seconds + sizes / cost.bandwidth_bytes_per_second
    ingress = cost.ingress_bandwidth_bytes_per_second
    if ingress is None:
        return own
    if cost.sharing == "fair":
        starts = np.asarray(ready, dtype=np.float64) + cost.latency_seconds
        shared = fair_finish(starts, sizes, ingress, cost.bandwidth_bytes_per_second)
        arrivals: np.ndarray = np.maximum(shared, own)
        return arrivals
    # First come first served: in order of readiness, message i leaves the queue at
    # free_i = max(start_i, free_{i-1}) + d_i, which unrolls to
    # free_i = D_i + max_{j<=i}(start_j - D_{j-1}) with D the running sum of the d's.
    order = np.argsort(ready, kind="stable")
    starts = np.asarray(ready, dtype=np.float64)[order] + cost.latency_seconds
    service = sizes[order] / ingress
    done = np.cumsum(service)
    free = done + np.maximum.accumulate(starts - (done - service))
    out = np.empty_like(own)
    out[order] = np.maximum(free, own[order])
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


def join_seconds(cost: CostModel, assignment_bytes: int) -> float:
    """A newcomer's join: Hello, its assignment and data over its link, the ack back."""
    return 3 * cost.latency_seconds + assignment_bytes / cost.bandwidth_bytes_per_second


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
    own operation on the partition: the gradient over a sample of ``batch`` rows and over
    four times as many (or the whole partition, if smaller). A network's per-call cost
    weighs much more at 32 rows than a fit over whole partitions says, and a full-data
    gradient of a network is costly to time.
    """
    from codedgd.services.data.dataset import take_rows

    part = model.block(take_rows(X, block_rows), y[block_rows])
    n_part = int(block_rows.shape[0])
    if 0 < batch < n_part:
        small = np.arange(batch, dtype=np.int64)
        large = np.arange(min(4 * batch, n_part), dtype=np.int64)
        t_small = _median_seconds(lambda: part.grad_sum_rows(theta, small), repeats)
        t_large = _median_seconds(lambda: part.grad_sum_rows(theta, large), repeats)
        a = max((t_large - t_small) / (large.size - small.size), 0.0)
        b = max(t_small - a * small.size, 0.0)
        return Calibration(a, b, t_large, t_small, int(large.size), int(small.size))
    whole = model.block(X, y)
    full = _median_seconds(lambda: whole.grad_sum(theta), repeats)
    block = _median_seconds(lambda: part.grad_sum(theta), repeats)
    n_full, n_block = int(X.shape[0]), n_part
    spread = n_full - n_block
    a = max((full - block) / spread, 0.0) if spread > 0 else full / max(n_full, 1)
    b = max(block - a * n_block, 0.0)
    return Calibration(a, b, full, block, n_full, n_block)


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
