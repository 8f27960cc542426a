"""ErasureHead's approximate gradient code (Wang, Charles, Papailiopoulos, arXiv 1901.09671).

Placement is fractional repetition with group size r (r | n, see :mod:`codedgd.services.codes.frc`),
coefficients 1. The coordinator stops at the K = ⌈δn⌉-th arrival, or earlier once every
group has an arrival, and sums one message per covered group; an erased group (none of
its r members among the arrivals) contributes 0.

With an exchangeable finishing order the first K arrivals are a uniformly random K-subset,
so a given group is erased with probability p = C(n−r, K) / C(n, K). The early exit does
not change p: it only happens when no group is erased. Hence E[ĝ] = (1−p)·g, and
ĝ/(1−p) is unbiased. The authors' code did not rescale (a contracted, biased estimate);
both are offered by the policy.
"""

from __future__ import annotations

import math


def early_stop_count(n_workers: int, delta: float) -> int:
    """K = ⌈δn⌉ clamped to 1..n (a hair of tolerance so δ = 0.1, n = 30 gives 3, not 4)."""
    k = math.ceil(delta * n_workers - 1e-9)
    return min(max(k, 1), n_workers)


def erasure_probability(n_workers: int, group_size: int, k: int) -> float:
    """p = C(n−r, K) / C(n, K): probability a given group has no member among K arrivals."""
    if not 0 <= k <= n_workers:
        raise ValueError(f"K={k} arrivals out of n={n_workers}")
    if k > n_workers - group_size:
        return 0.0
    return math.comb(n_workers - group_size, k) / math.comb(n_workers, k)


def unbiased_scale(n_workers: int, group_size: int, k: int) -> float:
    """1/(1−p): the factor that makes the sum over covered groups unbiased."""
    return 1.0 / (1.0 - erasure_probability(n_workers, group_size, k))
