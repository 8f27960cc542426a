"""Closed forms of mean round times in the shifted-exponential model (SCHEMES.md).

The model of ErasureHead §4: a full-data gradient takes 1 + Exp(rate λ) time units;
a worker holding a fraction c/n of the data takes c/n + Exp(rate λn/c); workers are
independent. In codedgd this is the ``shifted-exponential`` straggler model with
``shift = 1`` and ``rate = λ`` under the simulator's ideal cost model (no compute,
communication or decode time), since its delay is load·(shift + E/rate) with
load = c/n and E ~ Exp(1).
"""

from __future__ import annotations


def harmonic(m: int) -> float:
    """H_m = Σ_{i≤m} 1/i (H_0 = 0)."""
    return sum(1.0 / i for i in range(1, m + 1))


def uncoded_mean(n: int, lam: float) -> float:
    """Wait for all n workers, each with 1/n of the data: 1/n + H_n/(λn)."""
    return 1.0 / n + harmonic(n) / (lam * n)


def frc_mean(n: int, lam: float, c: int) -> float:
    """FRC, c partitions per worker, n/c groups, wait for one per group: c/n + H_{n/c}/(λn)."""
    if n % c:
        raise ValueError(f"FRC needs c | n, got n={n}, c={c}")
    return c / n + harmonic(n // c) / (lam * n)


def rth_arrival_mean(n: int, lam: float, r: int, c: int = 1) -> float:
    """The r-th of n arrivals, load c/n each: c/n + (c/(λn))(H_n − H_{n−r})."""
    if not 1 <= r <= n:
        raise ValueError(f"need 1 <= r <= n, got r={r}, n={n}")
    return c / n + (c / (lam * n)) * (harmonic(n) - harmonic(n - r))
