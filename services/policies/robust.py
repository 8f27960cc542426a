"""Robust aggregation for the uncoded placement: ``median`` and ``trimmed-mean``.

Worker i holds partition i and sends g_i, as under ``uncoded``; the round takes the
first m = n − s arrivals and estimates g = Σ_j g_j coordinate by coordinate with a
statistic that a few wrong messages cannot drag far:

- ``median``: n · median_i g_i[c]. Up to ⌈m/2⌉ − 1 arbitrary (Byzantine) messages
  among the m leave every coordinate between two honest values.
- ``trimmed-mean``: n · (mean of g_i[c] after dropping the b largest and b smallest),
  Yin et al., "Byzantine-robust distributed learning: towards optimal statistical
  rates" (ICML 2018); tolerates b arbitrary messages, with m > 2b.

Both are *approximate* even with honest workers: the median (or trimmed mean) of the
partition gradients times n is not their sum. With i.i.d. partitions the bias is
small; see docs/reliability.md for measured losses. These are the statistics Flower
offers as ``FedMedian`` and ``FedTrimmedAvg``; for an exact gradient despite corrupt
workers use ``frc`` with ``byzantine`` > 0 (a coded vote).
"""

from __future__ import annotations

import numpy as np

from codedgd.services.errors import DecodeError, PlanError
from codedgd.services.policies.base import (
    Estimate,
    Param,
    Plan,
    Policy,
    RoundSpec,
    WorkerPlan,
    check_n,
    check_payload,
)
from codedgd.services.policies.frc import check_one_partition_per_worker
from codedgd.services.policies.registry import register


class _Statistic(Policy):
    """Uncoded placement; the estimate is n times a coordinate-wise statistic of m arrivals."""

    exact = False
    s: int

    def __init__(self) -> None:
        self._n = 0
        self._dim = 0
        self._payloads: dict[int, np.ndarray] = {}
        self._started = False

    def plan(self, n_workers: int, n_partitions: int) -> Plan:
        check_n(n_workers, n_partitions)
        check_one_partition_per_worker(self.name, n_workers, n_partitions)
        if not 0 <= self.s < n_workers:
            raise PlanError(
                f"{self.name} needs 0 <= s < n; got s={self.s}, n={n_workers}: "
                f"choose s in 0..{n_workers - 1}"
            )
        self._check_plan(n_workers)
        self._n = n_workers
        return Plan(
            n_workers, n_partitions, tuple(WorkerPlan.summing((i,)) for i in range(n_workers))
        )

    def _check_plan(self, n_workers: int) -> None:
        """Further PlanErrors of the statistic (default none)."""

    def _wanted(self) -> int:
        return self._n - self.s

    def begin_round(self, t: int, theta: np.ndarray) -> RoundSpec:
        if self._n == 0:
            raise DecodeError(f"{self.name}: begin_round() before plan()")
        self._dim = int(theta.shape[0])
        self._payloads = {}
        self._started = True
        return RoundSpec(round=t, workers=tuple(range(self._n)))

    def offer(self, worker: int, payload: np.ndarray | None) -> bool:
        if not self._started:
            raise DecodeError(f"{self.name}: offer() before begin_round()")
        if not 0 <= worker < self._n:
            raise DecodeError(f"{self.name}: unknown worker {worker} (n = {self._n})")
        if worker in self._payloads:
            raise DecodeError(f"{self.name}: worker {worker} offered twice in one round")
        self._payloads[worker] = check_payload(self.name, worker, payload, self._dim)
        return len(self._payloads) >= self._wanted()

    def decode(self) -> Estimate:
        if not self._started or len(self._payloads) < self._wanted():
            raise DecodeError(
                f"{self.name}: {len(self._payloads)} of {self._wanted()} arrivals so far"
            )
        workers = tuple(self._payloads)
        stacked = np.stack([self._payloads[w] for w in workers])
        return Estimate(self._n * self._statistic(stacked), workers, exact=False)

    def _statistic(self, stacked: np.ndarray) -> np.ndarray:
        """Per coordinate, over the rows of ``stacked`` (m × dim)."""
        raise NotImplementedError

    def feasible(self, outstanding: frozenset[int]) -> bool:
        pending = outstanding - self._payloads.keys()
        return len(self._payloads) + len(pending) >= self._wanted()


@register
class Median(_Statistic):
    name = "median"
    summary = (
        "worker i holds partition i; n x the coordinate-wise median of the first n-s "
        "arrivals; approximate, outvotes fewer than half of them being arbitrary"
    )
    parameters = (Param("s", int, 0, "stragglers ignored per round (0 <= s < n)"),)

    def __init__(self, s: int = 0) -> None:
        super().__init__()
        self.s = s

    def _statistic(self, stacked: np.ndarray) -> np.ndarray:
        return np.asarray(np.median(stacked, axis=0), dtype=np.float64)


@register
class TrimmedMean(_Statistic):
    name = "trimmed-mean"
    summary = (
        "worker i holds partition i; n x the coordinate-wise mean of the first n-s "
        "arrivals after dropping the b largest and b smallest; approximate, tolerates b "
        "arbitrary ones"
    )
    parameters = (
        Param("b", int, 1, "values dropped at each end, per coordinate (n - s > 2b)"),
        Param("s", int, 0, "stragglers ignored per round (0 <= s < n)"),
    )

    def __init__(self, b: int = 1, s: int = 0) -> None:
        super().__init__()
        self.b = b
        self.s = s

    def _check_plan(self, n_workers: int) -> None:
        m = n_workers - self.s
        if self.b < 0 or m <= 2 * self.b:
            most = (m - 1) // 2
            raise PlanError(
                f"trimmed-mean drops b={self.b} of the m = n - s = {m} arrivals at each end: "
                f"it needs 0 <= b and m > 2b; choose b <= {most}"
                + (f" or a smaller s (s={self.s})" if self.s else "")
            )

    def _statistic(self, stacked: np.ndarray) -> np.ndarray:
        m = stacked.shape[0]
        ordered = np.sort(stacked, axis=0)
        return np.asarray(ordered[self.b : m - self.b].mean(axis=0), dtype=np.float64)
