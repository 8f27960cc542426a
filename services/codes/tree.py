"""CodedReduce trees (Reisizadeh et al., IEEE/ACM ToN 2021): shape and data placement.

A regular tree with the coordinator at its root: every non-leaf node has ``m`` children
(the *fanout*), and there are ``L`` levels of workers below the root, N = m + m² + … + m^L
workers in all, numbered level by level (level 1 is 0..m−1; the children of worker v are
consecutive). Siblings use the cyclic code B(m, s): a parent waits for its fastest m−s
children, decodes their partial sums with a (aᵀB_F = 1ᵀ), adds its own computed share,
and sends one ℓ-vector up; the root decodes its m children the same way and gets the
full gradient. With s = 0 (B = I) this is the uncoded ``tree`` reduce.

Placement, the recursive form of SCHEMES.md's two-level construction (g = s+1,
S_i = {i..i+s} mod m): a group of siblings that must deliver the weighted gradient of a
row set X splits X into m equal consecutive parts P_j. Below the last level (leaves)
sibling i computes Σ_{j∈S_i} B[i,j]·∇(P_j). Above it, each P_j = Q_j ∪ R_j; sibling i
computes h_i = Σ_{j∈S_i} B[i,j]·∇(Q_j) itself and hands its children the weighted set
W_i = ∪_{j∈S_i} R_j (weight B[i,j]) to deliver the same way; it sends
h_i + (its children's decoded sum) = Σ_{j∈S_i} B[i,j]·∇(P_j). Weights multiply down the
tree, so a worker computes Σ_p w_p·∇(D_p) over its base partitions D_p.

Sizes: every node, inner or leaf, computes the same share c = |D| / Σ_{l=1..L} (m/g)^l.
In units of u = c/g^L rows every piece is whole: |Q_j| = g^(L−1), and a group at depth
d (d levels of workers from it down) handles T_d = Σ_{l=1..d} m^l·g^(L−l) units. So the
training set is split into k = T_L equal base partitions (the job's partitions), a node
holds g^L of them, and the construction is exact for any split of the rows (only the
partition matters).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from codedgd.services.codes.cyclic import cyclic_support


@dataclass(frozen=True)
class TreeShape:
    """The nodes of a tree of workers: fanout m, L levels, s stragglers per sibling group."""

    fanout: int
    levels: int
    s: int = 0

    def __post_init__(self) -> None:
        if self.fanout < 1 or self.levels < 1:
            raise ValueError(f"a tree needs fanout >= 1 and levels >= 1, got {self}")
        if not 0 <= self.s < self.fanout:
            raise ValueError(f"a tree needs 0 <= s < fanout, got s={self.s}, m={self.fanout}")

    @property
    def group(self) -> int:
        """g = s + 1: how many siblings hold each part of a group's rows."""
        return self.s + 1

    @property
    def n_workers(self) -> int:
        """N = m + m² + … + m^L."""
        m = self.fanout
        return sum(m**level for level in range(1, self.levels + 1))

    @property
    def n_partitions(self) -> int:
        """k = T_L = Σ_{l=1..L} m^l·g^(L−l): base partitions of u = c/g^L rows each."""
        return units(self.fanout, self.group, self.levels, self.levels)

    @property
    def share(self) -> int:
        """Base partitions each node computes: c = g^L."""
        return int(self.group**self.levels)

    def level_start(self, level: int) -> int:
        """The first worker of ``level`` (1-based)."""
        m = self.fanout
        return sum(m**d for d in range(1, level))

    def level(self, worker: int) -> int:
        """The level (1..L) of ``worker``."""
        self._check(worker)
        level = 1
        while worker >= self.level_start(level + 1):
            level += 1
        return level

    def parent(self, worker: int) -> int:
        """The worker ``worker`` reports to; −1: the coordinator (the root)."""
        level = self.level(worker)
        if level == 1:
            return -1
        offset = worker - self.level_start(level)
        return self.level_start(level - 1) + offset // self.fanout

    def position(self, worker: int) -> int:
        """``worker``'s place among its siblings: its row of the group's code."""
        return (worker - self.level_start(self.level(worker))) % self.fanout

    def children(self, worker: int) -> tuple[int, ...]:
        """The workers that report to ``worker`` (−1: the root's), in sibling order."""
        if worker == -1:
            return tuple(range(self.fanout))
        level = self.level(worker)
        if level == self.levels:
            return ()
        first = self.level_start(level + 1) + (worker - self.level_start(level)) * self.fanout
        return tuple(range(first, first + self.fanout))

    def left_out_bounds(
        self, ready: Mapping[int, float], used: Collection[int]
    ) -> dict[int, float]:
        """Lower bounds on the own times of the leaves a round left out.

        ``ready``: each timed worker's own seconds from θ_t to its message (WorkerTiming);
        ``used``: the workers whose messages are in the estimate. A leaf whose parent (or
        the root) summed siblings of it but not it sent later than every sibling used;
        they got θ_t from the same parent at about the same time, so its own time was at
        least the longest of theirs (within a hop's difference). An inner node left out
        gets no bound: its sum waits for its children too, so its own time may be short.
        """
        out: dict[int, float] = {}
        parents = {-1} | {w for w in used if self.children(w)}
        for parent in parents:
            kids = self.children(parent)
            timed = [ready[c] for c in kids if c in used and c in ready]
            if not timed:
                continue
            for c in kids:
                if c not in used and not self.children(c):
                    out[c] = max(timed)
        return out

    def _check(self, worker: int) -> None:
        if not 0 <= worker < self.n_workers:
            raise ValueError(f"worker {worker} is not in a tree of {self.n_workers} workers")


def units(m: int, g: int, depth: int, levels: int) -> int:
    """T_depth in base partitions: what a sibling group ``depth`` levels above the leaves'
    bottom delivers, in a tree of ``levels`` levels."""
    return sum(m**level * g ** (levels - level) for level in range(1, depth + 1))


@dataclass(frozen=True)
class Placement:
    """What one worker computes: Σ_p weights[p]·∇(partition p), one term per partition."""

    partitions: tuple[int, ...]
    weights: tuple[float, ...]


def place(shape: TreeShape, code: np.ndarray) -> list[Placement]:
    """Every worker's partitions and weights (index = worker), for sibling code ``code``.

    ``code`` is the m×m matrix B of the cyclic code B(m, s) every sibling group uses
    (row = sibling position); with s = 0 it is the identity.
    """
    m, g = shape.fanout, shape.group
    if code.shape != (m, m):
        raise ValueError(f"the sibling code must be {m}×{m}, got {code.shape}")
    placements: list[Placement | None] = [None] * shape.n_workers
    everything = [(p, 1.0) for p in range(shape.n_partitions)]
    _place(shape, code, shape.children(-1), everything, shape.levels, placements)
    assert all(p is not None for p in placements)
    assert all(len(p.partitions) == g**shape.levels for p in placements if p is not None)
    return [p for p in placements if p is not None]


def _place(
    shape: TreeShape,
    code: np.ndarray,
    siblings: Sequence[int],
    rows: list[tuple[int, float]],
    depth: int,
    out: list[Placement | None],
) -> None:
    """Siblings ``siblings`` (depth levels down to the leaves) deliver Σ weight·∇(rows)."""
    m, g = shape.fanout, shape.group
    size = len(rows) // m
    if size * m != len(rows):
        raise AssertionError(f"{len(rows)} base partitions do not split into {m} parts")
    parts = [rows[j * size : (j + 1) * size] for j in range(m)]
    own_size = size if depth == 1 else g ** (shape.levels - 1)
    for i, worker in enumerate(siblings):
        support = cyclic_support(m, shape.s, i)
        own = [(p, w * code[i, j]) for j in support for p, w in parts[j][:own_size]]
        out[worker] = Placement(tuple(p for p, _ in own), tuple(float(w) for _, w in own))
        if depth > 1:
            delegated = [(p, w * code[i, j]) for j in support for p, w in parts[j][own_size:]]
            _place(shape, code, shape.children(worker), delegated, depth - 1, out)
