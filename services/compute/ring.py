"""Ring all-reduce: the schedule and the arithmetic order, shared by workers and the simulator.

n workers in a ring (worker i sends to i+1 mod n, receives from i−1). A vector of length
ℓ is cut into n segments (:func:`segments`; the first ℓ mod n one element longer).

- **Reduce-scatter** (n−1 steps): at step k worker i sends segment (i−k) mod n of its
  partial sums to i+1, which adds its own values of that segment to what it received.
  After the last step worker i holds segment (i+1) mod n summed over every worker, in
  the order own_q + own_{q+1} + … + own_{q+n−1} for segment q (:func:`reduced_segments`
  computes exactly that, so the simulator's sums are the workers' bit for bit).
- **All-gather** (n−1 steps): each worker starts with one segment of a vector everyone
  needs (θ_t: the coordinator sends worker i segment i); at step k worker i forwards
  segment (i−k) mod n, which it holds, to i+1. After the last step every worker holds
  all n segments. Nothing is added, so every copy is exact.

Per round each link carries 2(n−1)/n·ℓ values; the coordinator sends ℓ (θ's segments)
and receives ℓ (each worker uploads the reduced segment it holds).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def segments(length: int, n: int) -> list[tuple[int, int]]:
    """The n segments [start, stop) of a vector of ``length`` (sizes differ by at most one)."""
    if n < 1:
        raise ValueError(f"a ring needs at least one worker, got n={n}")
    base, extra = divmod(length, n)
    bounds, start = [], 0
    for q in range(n):
        stop = start + base + (1 if q < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def scatter_segment(worker: int, step: int, n: int) -> int:
    """The segment ``worker`` sends at reduce-scatter step ``step`` (0..n−2)."""
    return (worker - step) % n


def gather_segment(worker: int, step: int, n: int) -> int:
    """The segment ``worker`` forwards at all-gather step ``step`` (0..n−2), starting
    from holding segment ``worker``."""
    return (worker - step) % n


def reduced_segment(worker: int, n: int) -> int:
    """The segment ``worker`` holds, summed over the ring, after reduce-scatter."""
    return (worker + 1) % n


def reduced_segments(messages: Sequence[np.ndarray]) -> list[np.ndarray]:
    """What each worker holds after reduce-scatter (index = worker), summed in the ring's
    order: the reference the simulator uses and the workers' arithmetic matches."""
    n = len(messages)
    bounds = segments(int(messages[0].shape[0]), n)
    out: list[np.ndarray] = []
    for worker in range(n):
        q = reduced_segment(worker, n)
        start, stop = bounds[q]
        acc = np.array(messages[q][start:stop], dtype=np.float64)
        for j in range(1, n):
            acc = acc + messages[(q + j) % n][start:stop]
        out.append(acc)
    return out
