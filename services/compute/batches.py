"""Mini-batch rounds: which rows of a partition a round uses (``job.batch_size``).

With ``batch_size`` B > 0, round t uses a sample of B rows of each partition p (all of
them when p has B or fewer) instead of all its rows, and every worker that holds p takes
the *same* sample, so an exact code stays exact with respect to the sampled batch. The
partition's sampled gradient sum is scaled by n_p / B (n_p: p's rows), an unbiased
estimate of its full sum, so the coordinator divides by the training rows N as always.

The sample is defined in integers any language reproduces (the wire contract repeats
it): with SplitMix64 (Steele, Lea and Flood's generator's output function, below),

    key   = splitmix64(splitmix64(splitmix64(seed) XOR t) XOR p)
    r_i   = splitmix64(key XOR i)        for each row i = 0..n_p−1 of the partition
    rows  = the B rows of smallest r_i (ties to the smaller i), in ascending order of i

where rows are numbered in the order the partition's rows were sent (PartitionData) and
all arithmetic is modulo 2^64.
"""

from __future__ import annotations

import numpy as np

_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_S27, _S30, _S31 = np.uint64(27), np.uint64(30), np.uint64(31)


def splitmix64(x: np.ndarray | np.uint64 | int) -> np.ndarray:
    """SplitMix64's output for state ``x`` (elementwise, uint64, modulo 2^64)."""
    z = np.array(x, dtype=np.uint64)  # a copy: x is left as it was
    z += _GOLDEN
    # In place, one scratch array: a round's sample hashes every row of a partition, and
    # each temporary of a partition's size costs page faults on every call.
    t = np.empty_like(z)
    np.right_shift(z, _S30, out=t)
    z ^= t
    z *= _MIX1
    np.right_shift(z, _S27, out=t)
    z ^= t
    z *= _MIX2
    np.right_shift(z, _S31, out=t)
    z ^= t
    return z


def batch_key(seed: int, round_: int, partition: int) -> np.uint64:
    """The key of (seed, round, partition): splitmix64(splitmix64(splitmix64(seed) ^ t) ^ p)."""
    k = splitmix64(np.uint64(seed & 0xFFFFFFFFFFFFFFFF))
    k = splitmix64(k ^ np.uint64(round_))
    return np.uint64(splitmix64(k ^ np.uint64(partition)))


def batch_rows(
    seed: int, round_: int, partition: int, n_rows: int, batch: int
) -> np.ndarray | None:
    """The rows (ascending) of a partition of ``n_rows`` that round ``round_`` uses, or None
    for all of them (``batch`` <= 0, or not fewer than ``n_rows``)."""
    if batch <= 0 or batch >= n_rows:
        return None
    r = splitmix64(batch_key(seed, round_, partition) ^ np.arange(n_rows, dtype=np.uint64))
    # The batch smallest r_i, in O(n_rows) (a sort of the partition cost more than the
    # batch's gradient). The r_i are distinct, SplitMix64 being a bijection of the 2^64
    # states and key XOR i distinct for distinct i: the rule's tie-break never applies,
    # and the rows at or below the batch-th smallest value are exactly B.
    cut = r[np.argpartition(r, batch - 1)[batch - 1]]
    chosen = np.flatnonzero(r <= cut)
    return chosen.astype(np.int64)


def batch_scale(n_rows: int, rows: np.ndarray | None) -> float:
    """n_p / B: what a partition's sampled sum is multiplied by (1 for all its rows)."""
    return 1.0 if rows is None or n_rows == 0 else n_rows / int(rows.shape[0])
