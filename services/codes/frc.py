"""Fractional repetition placement (Tandon et al., ICML 2017, §3), pure numpy.

n workers are cut into n/r groups of r consecutive workers; group a holds the r
partitions a·r .. a·r+r−1 and every member holds all of them and sends their plain
sum G_a = Σ_{j∈a} g_j (coefficients 1). One arrival per group recovers
g = Σ_a G_a, so any pattern that leaves a live worker in every group is survived;
with r = s+1 that is any s stragglers.

ErasureHead uses the same placement with a group size r chosen for speed, and the
communication-efficient group code uses it with group size d.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np


def divisors(n: int) -> list[int]:
    """The positive divisors of n, ascending."""
    if n < 1:
        return []
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small) | {n // d for d in small})


def frc_groups(n_workers: int, group_size: int) -> tuple[tuple[int, ...], ...]:
    """Groups of ``group_size`` consecutive workers (also their partitions)."""
    if group_size < 1 or n_workers < 1 or n_workers % group_size:
        raise ValueError(f"group size r={group_size} does not divide n={n_workers}")
    return tuple(
        tuple(range(a * group_size, (a + 1) * group_size)) for a in range(n_workers // group_size)
    )


def group_of(worker: int, group_size: int) -> int:
    """The group index of a worker (its partitions are that group's)."""
    return worker // group_size


def frc_matrix(n_workers: int, group_size: int) -> np.ndarray:
    """The n×n encoding matrix B of the placement: B[i, j] = 1 iff j is in i's group."""
    B = np.zeros((n_workers, n_workers), dtype=np.float64)
    for members in frc_groups(n_workers, group_size):
        B[np.ix_(members, members)] = 1.0
    return B


def covered(arrived: Iterable[int], n_workers: int, group_size: int) -> np.ndarray:
    """Boolean per group: has any worker of the group arrived?"""
    out = np.zeros(n_workers // group_size, dtype=bool)
    for w in arrived:
        out[group_of(w, group_size)] = True
    return out
