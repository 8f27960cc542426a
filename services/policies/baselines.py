"""Baselines: ``uncoded`` (wait for all n) and ``ignore-stragglers`` (fastest n−s)."""

from __future__ import annotations

import numpy as np

from codedgd.services.errors import DecodeError, PlanError
from codedgd.services.policies.base import (
    Estimate,
    OrderDecode,
    Param,
    Plan,
    Policy,
    RoundSpec,
    WorkerPlan,
    check_n,
    check_payload,
)
from codedgd.services.policies.registry import register


class _OnePartitionEach(Policy):
    """Worker i holds partition i and sends g_i."""

    def __init__(self) -> None:
        self._n = 0
        self._sum: np.ndarray | None = None
        self._arrived: list[int] = []

    def plan(self, n_workers: int, n_partitions: int) -> Plan:
        check_n(n_workers, n_partitions, min_workers=self._min_workers())
        if n_partitions != n_workers:
            raise PlanError(
                f"{self.name} holds one partition per worker: use k = n = {n_workers} "
                f"partitions (got k = {n_partitions})"
            )
        self._n = n_workers
        workers = tuple(WorkerPlan.summing((i,)) for i in range(n_workers))
        return Plan(n_workers, n_partitions, workers)

    def _min_workers(self) -> int:
        return 1

    def begin_round(self, t: int, theta: np.ndarray) -> RoundSpec:
        self._sum = np.zeros(theta.shape[0], dtype=np.float64)
        self._arrived = []
        return RoundSpec(round=t, workers=tuple(range(self._n)))

    def _add(self, worker: int, payload: np.ndarray | None) -> None:
        if self._sum is None:
            raise DecodeError("offer() before begin_round()")
        vector = check_payload(self.name, worker, payload, self._sum.shape[0])
        self._arrive(worker)
        self._sum += vector

    def _arrive(self, worker: int) -> None:
        if self._sum is None:
            raise DecodeError("offer() before begin_round()")
        if worker in self._arrived:
            raise DecodeError(f"{self.name}: worker {worker} offered twice in one round")
        self._arrived.append(worker)


@register
class Uncoded(_OnePartitionEach):
    name = "uncoded"
    summary = "worker i holds partition i; wait for all n; exact, tolerates no straggler"
    exact = True

    def offer(self, worker: int, payload: np.ndarray | None) -> bool:
        self._add(worker, payload)
        return len(self._arrived) == self._n

    def arrival_sum(self) -> np.ndarray | None:
        return self._sum  # every worker's payload, unweighted

    def offer_summed(self, worker: int) -> bool:
        self._arrive(worker)
        return len(self._arrived) == self._n

    def decode(self) -> Estimate:
        if self._sum is None or len(self._arrived) < self._n:
            raise DecodeError(f"uncoded: {len(self._arrived)} of {self._n} workers arrived")
        # begin_round starts a fresh sum, so this one is the caller's from now on.
        return Estimate(self._sum, tuple(self._arrived), exact=True)

    def feasible(self, outstanding: frozenset[int]) -> bool:
        missing = set(range(self._n)) - set(self._arrived)
        return missing <= outstanding

    def decides_by_order(self) -> bool:
        return True

    def decode_order(self, order: np.ndarray) -> OrderDecode | None:
        if len(order) < self._n:
            raise DecodeError(f"uncoded: {len(order)} of {self._n} workers arrive")
        return OrderDecode(self._n, np.ones(self._n), True, tuple(int(w) for w in order))


@register
class IgnoreStragglers(_OnePartitionEach):
    name = "ignore-stragglers"
    summary = "worker i holds partition i; use the first n−s arrivals, rescaled by n/(n−s)"
    exact = False
    parameters = (Param("s", int, 1, "stragglers ignored per round (0 <= s < n)"),)

    def __init__(self, s: int = 1) -> None:
        super().__init__()
        self.s = s

    def plan(self, n_workers: int, n_partitions: int) -> Plan:
        if not 0 <= self.s < n_workers:
            raise PlanError(
                f"ignore-stragglers needs 0 <= s < n; got s={self.s}, n={n_workers}: "
                f"choose s in 0..{max(n_workers - 1, 0)}"
            )
        return super().plan(n_workers, n_partitions)

    def _wanted(self) -> int:
        return self._n - self.s

    def offer(self, worker: int, payload: np.ndarray | None) -> bool:
        self._add(worker, payload)
        return len(self._arrived) >= self._wanted()

    def decode(self) -> Estimate:
        if self._sum is None or len(self._arrived) < self._wanted():
            raise DecodeError(
                f"ignore-stragglers: {len(self._arrived)} of {self._wanted()} arrivals"
            )
        scale = self._n / len(self._arrived)
        exact = len(self._arrived) == self._n
        return Estimate(self._sum * scale, tuple(self._arrived), exact=exact)

    def feasible(self, outstanding: frozenset[int]) -> bool:
        pending = outstanding - set(self._arrived)
        return len(self._arrived) + len(pending) >= self._wanted()

    def decides_by_order(self) -> bool:
        return True

    def decode_order(self, order: np.ndarray) -> OrderDecode | None:
        need = self._wanted()
        if len(order) < need:
            raise DecodeError(f"ignore-stragglers: {len(order)} of {need} arrivals")
        used = order[:need]
        weights = np.zeros(self._n)
        weights[used] = self._n / need
        return OrderDecode(need, weights, need == self._n, tuple(int(w) for w in used))
