"""``erasurehead``: approximate fractional repetition with an early stop (Wang et al. 2019).

Groups of r workers share r partitions; the round stops at the K = ⌈δn⌉-th arrival or as
soon as every group has one; the estimate sums one message per covered group (erased
groups contribute 0) and, by default, divides by 1 − p with p = C(n−r, K)/C(n, K) so it is
unbiased under an exchangeable finishing order. ``scaled=false`` is the authors' variant
(no rescaling: a contracted, biased estimate). See :mod:`codedgd.services.codes.erasurehead`.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from codedgd.services.codes.erasurehead import early_stop_count, erasure_probability
from codedgd.services.codes.frc import divisors
from codedgd.services.errors import ConfigError, DecodeError, PlanError
from codedgd.services.policies.base import (
    Estimate,
    OrderDecode,
    Param,
    Plan,
    RoundSpec,
    check_n,
)
from codedgd.services.policies.frc import GroupSum, check_one_partition_per_worker, nearest
from codedgd.services.policies.registry import register


@register
class ErasureHead(GroupSum):
    name = "erasurehead"
    summary = (
        "ErasureHead: groups of r workers share r partitions; stop at K=ceil(delta*n) "
        "arrivals or when every group has one; sum one per covered group, rescaled by "
        "1/(1-p) to be unbiased (approximate)"
    )
    exact = False
    parameters: ClassVar[tuple[Param, ...]] = (
        Param("r", int, 2, "group size: workers sharing the same r partitions (r must divide n)"),
        Param("delta", float, 0.5, "stop after K = ceil(delta*n) arrivals (0 < delta <= 1)"),
        Param("K", int, 0, "stop after K arrivals, 1 <= K <= n; overrides delta (0 = use delta)"),
        Param(
            "scaled",
            bool,
            True,
            "divide by 1-p, p = C(n-r,K)/C(n,K), for an unbiased estimate; "
            "false = the authors' unscaled variant",
        ),
    )

    def __init__(self, r: int = 2, delta: float = 0.5, scaled: bool = True, K: int = 0) -> None:
        super().__init__()
        if not 0.0 < delta <= 1.0:
            raise ConfigError(f"erasurehead: delta must be in (0, 1], got delta={delta}")
        if K < 0:
            raise ConfigError(f"erasurehead: K must be >= 1 (or 0 for ceil(delta*n)), got K={K}")
        self.r = r
        self.delta = delta
        self.k_asked = K
        self.scaled = scaled
        self.k = 0
        self.p = 0.0
        self.scale = 1.0
        self._count = 0

    def plan(self, n_workers: int, n_partitions: int) -> Plan:
        check_n(n_workers, n_partitions)
        check_one_partition_per_worker(self.name, n_workers, n_partitions)
        valid = divisors(n_workers)
        if not 1 <= self.r <= n_workers:
            raise PlanError(
                f"erasurehead needs 1 <= r <= n; got r={self.r}, n={n_workers}: "
                f"choose r in {nearest(valid, self.r)}"
            )
        if n_workers % self.r:
            raise PlanError(
                f"r={self.r} does not divide n={n_workers}: choose r in {nearest(valid, self.r)}"
            )
        if self.k_asked > n_workers:
            raise PlanError(
                f"erasurehead: K={self.k_asked} > n={n_workers} arrivals: choose K in "
                f"1..{n_workers} (the authors used K = n/2)"
            )
        plan = self._plan_groups(n_workers, n_partitions, self.r)
        self.k = self.k_asked or early_stop_count(n_workers, self.delta)
        self.p = erasure_probability(n_workers, self.r, self.k)
        self.scale = 1.0 / (1.0 - self.p) if self.scaled else 1.0
        return plan

    def begin_round(self, t: int, theta: np.ndarray) -> RoundSpec:
        self._count = 0
        return super().begin_round(t, theta)

    def _done(self) -> bool:
        return self._count >= self.k or self._all_covered()

    def offer(self, worker: int, payload: np.ndarray | None) -> bool:
        self._record(worker, payload)
        self._count += 1
        return self._done()

    def decode(self) -> Estimate:
        if not self._started or not self._done():
            raise DecodeError(
                f"erasurehead: {self._count} of K={self.k} arrivals and not every group covered"
            )
        g = self._group_sum()
        if self.scale != 1.0:
            g *= self.scale
        # Exact only when nothing is erased and no rescaling distorts the sum.
        exact = self._all_covered() and self.scale == 1.0
        return Estimate(g, tuple(self._used), exact=exact)

    def decides_by_order(self) -> bool:
        return True

    def decode_order(self, order: np.ndarray) -> OrderDecode | None:
        return self._order_outcome(order, self.k, self.scale)

    def feasible(self, outstanding: frozenset[int]) -> bool:
        pending = len(outstanding - self._arrived)
        return self._count + pending >= self.k or self._coverable(outstanding)
