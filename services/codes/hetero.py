"""Heterogeneity-aware exact gradient coding: loads in proportion to speed, any s stragglers.

The setting of Wang, Liu and Shroff ("Heterogeneity-aware gradient coding for straggler
tolerance", ICDCS 2019): workers of unequal speeds v_i, and a code that keeps aᵀB_F = 1ᵀ
for every set F of n − s survivors while a worker's load follows its speed, so that fast
workers are not idle while slow ones finish. This module's construction (the project's
own; the paper's decoding matrices differ, its guarantee is the same):

- **Placement on a circle.** The data is cut into k equal partitions laid on a circle.
  Worker i takes the next m_i partitions after worker i − 1's (wrapping around), with
  m_i ∝ v_i and Σ m_i = (s + 1)·k (1 <= m_i <= k, rounded to make the slowest
  finish, max m_i/v_i, as early as integers allow). Going (s + 1)
  times around the circle, every partition is held by exactly s + 1 consecutive workers,
  and no worker holds one twice.
- **Encoding and decoding** are the polynomial code's on that placement
  (:class:`~codedgd.services.codes.polynomial.PolynomialCode` with ``supports``, m = 1):
  partition j's polynomial vanishes at the points of the n − s − 1 workers not holding it,
  so every message has degree <= n − s − 1 and any n − s arrivals interpolate the sum.

With equal speeds and k = n this is a cyclic placement of s + 1 partitions per worker.
``s = 0`` is speed-aware uncoded: each partition once, on a worker chosen by speed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from codedgd.services.codes.polynomial import PolynomialCode


def parse_speeds(text: str, n_workers: int) -> np.ndarray:
    """Speeds from "2,2,1,1" (one positive number per worker); "" means all equal."""
    if not text.strip():
        return np.ones(n_workers)
    try:
        values = np.array([float(v) for v in text.replace(";", ",").split(",")])
    except ValueError:
        raise ValueError(
            f"speeds={text!r}: give one number per worker, comma-separated (e.g. 2,2,1,1)"
        ) from None
    if len(values) != n_workers:
        raise ValueError(f"speeds={text!r} gives {len(values)} speeds for {n_workers} workers")
    if not np.all(np.isfinite(values) & (values > 0)):
        raise ValueError(f"speeds={text!r}: every speed must be a finite number > 0")
    return values


def speed_loads(speeds: Sequence[float] | np.ndarray, s: int, k: int) -> list[int]:
    """Partitions per worker: ∝ speed, summing to (s + 1)·k, each in 1..k, rounded so that
    the largest load/speed is as small as integers allow."""
    v = np.asarray(speeds, dtype=np.float64)
    n = len(v)
    total = (s + 1) * k
    if total < n:
        raise ValueError(
            f"{k} partitions held {s + 1} times each cannot give all {n} workers one: "
            f"use at least {math.ceil(n / (s + 1))} partitions"
        )
    if total > n * k:
        raise ValueError(f"s + 1 = {s + 1} copies of every partition need n >= s + 1 = {s + 1}")
    # Round to the integers that finish soonest: the largest load/speed (a round's
    # compute time) as small as it can be. Greedy: from the floors, each missing partition
    # goes to the worker it would delay least, (m + 1)/v; a surplus leaves the slowest.
    loads = np.clip(np.floor(v / v.sum() * total), 1, k).astype(np.int64)
    while int(loads.sum()) < total:
        cost = np.where(loads < k, (loads + 1) / v, np.inf)
        loads[int(np.argmin(cost))] += 1
    while int(loads.sum()) > total:
        cost = np.where(loads > 1, loads / v, -np.inf)
        loads[int(np.argmax(cost))] -= 1
    return [int(x) for x in loads]


def circle_placement(loads: Sequence[int], k: int) -> list[tuple[int, ...]]:
    """Worker i holds the loads[i] partitions after worker i − 1's, around a circle of k."""
    out = []
    start = 0
    for m in loads:
        out.append(tuple((start + t) % k for t in range(m)))
        start = (start + m) % k
    return out


def hetero_code(
    speeds: Sequence[float] | np.ndarray, s: int, k: int, *, points: str = "interleaved"
) -> PolynomialCode:
    """The heterogeneity-aware code of n = len(speeds) workers over k partitions."""
    n = len(speeds)
    if not 0 <= s < n:
        raise ValueError(f"s must be in 0..{n - 1}, got s={s}")
    supports = circle_placement(speed_loads(speeds, s, k), k)
    return PolynomialCode(n, s, 1, points=points, supports=supports, n_partitions=k)
