"""``ring-allreduce``: the baseline every user compares against (Horovod, gloo, NCCL).

Worker i holds partition i. The workers reduce-scatter their gradients around a ring
(:mod:`codedgd.services.compute.ring`): after n−1 steps of ℓ/n values each, worker i holds
segment (i+1) mod n of g = Σ_j g_j and sends it to the coordinator, which places the n
segments side by side. θ_t goes out the same way in reverse: the coordinator sends worker
i segment i of θ_t and the workers all-gather it. So no link, the coordinator's included,
carries more than about 2ℓ per round, where the star's coordinator link carries 2nℓ.

Exact (the sum's additions are in ring order, not arrival order, so θ matches
``uncoded`` to rounding); tolerates no straggler: every segment is needed.
"""

from __future__ import annotations

import numpy as np

from codedgd.services.compute.ring import reduced_segment, segments
from codedgd.services.errors import DecodeError, PlanError
from codedgd.services.policies.base import (
    Estimate,
    Plan,
    Policy,
    RoundSpec,
    Topology,
    WorkerPlan,
    check_n,
    check_payload,
)
from codedgd.services.policies.registry import register


@register
class RingAllReduce(Policy):
    name = "ring-allreduce"
    summary = (
        "ring all-reduce among the workers (reduce-scatter, each uploads its segment; θ "
        "all-gathered): no link carries more than ~2ℓ per round; waits for all n; exact"
    )
    exact = True

    def __init__(self) -> None:
        self._n = 0
        self._gradient: np.ndarray | None = None
        self._bounds: list[tuple[int, int]] = []
        self._arrived: set[int] = set()

    def plan(self, n_workers: int, n_partitions: int) -> Plan:
        check_n(n_workers, n_partitions, min_workers=2)
        if n_partitions != n_workers:
            raise PlanError(
                f"{self.name} holds one partition per worker: use k = n = {n_workers} "
                f"partitions (got k = {n_partitions}; leave job.partitions at 0)"
            )
        self._n = n_workers
        workers = tuple(WorkerPlan.summing((i,)) for i in range(n_workers))
        return Plan(n_workers, n_partitions, workers, Topology("ring"))

    def begin_round(self, t: int, theta: np.ndarray) -> RoundSpec:
        if self._n == 0:
            raise DecodeError(f"{self.name}: used before plan()")
        dim = int(theta.shape[0])
        self._gradient = np.empty(dim, dtype=np.float64)
        self._bounds = segments(dim, self._n)
        self._arrived = set()
        return RoundSpec(round=t, workers=tuple(range(self._n)))

    def offer(self, worker: int, payload: np.ndarray | None) -> bool:
        if self._gradient is None:
            raise DecodeError(f"{self.name}: offer() before begin_round()")
        if not 0 <= worker < self._n or worker in self._arrived:
            raise DecodeError(f"{self.name}: unexpected segment from worker {worker}")
        start, stop = self._bounds[reduced_segment(worker, self._n)]
        self._gradient[start:stop] = check_payload(self.name, worker, payload, stop - start)
        self._arrived.add(worker)
        return len(self._arrived) == self._n

    def decode(self) -> Estimate:
        if self._gradient is None or len(self._arrived) < self._n:
            raise DecodeError(f"{self.name}: {len(self._arrived)} of {self._n} segments")
        return Estimate(self._gradient, tuple(range(self._n)), exact=True)

    def feasible(self, outstanding: frozenset[int]) -> bool:
        return len(self._arrived | outstanding) >= self._n
