"""CodedReduce trees (Reisizadeh et al., IEEE/ACM ToN 2021): shape and data placement.

A tree with the coordinator at its root and ``L`` levels of workers below it. The
coordinator has ``m₀`` children (the *root fanout*, level 1); every other non-leaf node
has ``m`` (the *fanout*). The paper's trees are regular (m₀ = m, N = m + m² + … + m^L);
a separate m₀ lets any N = m₀·(1 + m + … + m^(L−1)) have a tree, e.g. 64 = 16 × (1 + 3).
Workers are numbered level by level (level 1 is 0..m₀−1; the children of worker v are
consecutive). Siblings use the cyclic code B(m, s) (the root's, B(m₀, s)): a parent
waits for its fastest m−s children, decodes their partial sums with a (aᵀB_F = 1ᵀ),
adds its own computed share, and sends one ℓ-vector up; the root decodes its m₀
children the same way and gets the full gradient. With s = 0 (B = I) this is the
uncoded ``tree`` reduce.

Placement, the recursive form of SCHEMES.md's two-level construction (g = s+1,
S_i = {i..i+s} mod the group's size): a group of siblings that must deliver the weighted
gradient of a row set X splits X into one equal consecutive part P_j per sibling. Below
the last level (leaves) sibling i computes Σ_{j∈S_i} B[i,j]·∇(P_j). Above it, each
P_j = Q_j ∪ R_j; sibling i computes h_i = Σ_{j∈S_i} B[i,j]·∇(Q_j) itself and hands its
children the weighted set W_i = ∪_{j∈S_i} R_j (weight B[i,j]) to deliver the same way;
it sends h_i + (its children's decoded sum) = Σ_{j∈S_i} B[i,j]·∇(P_j). Weights multiply
down the tree, so a worker computes Σ_p w_p·∇(D_p) over its base partitions D_p.

Sizes: every node, inner or leaf, computes the same share c = g^L units of u rows. A
group of m siblings at depth d (d levels of workers from it down) handles
T_d = Σ_{l=1..d} m^l·g^(L−l) units, |Q_j| = g^(L−1) and |R_j| = T_(d−1)/g; the root's
group of m₀ handles k = m₀·(g^(L−1) + T_(L−1)/g) = m₀·Σ_{l=0..L−1} m^l·g^(L−1−l) units
(T_L when m₀ = m). So the training set is split into k equal base partitions (the
job's partitions), a node holds g^L of them, and the construction is exact for any
split of the rows (only the partition matters).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from codedgd.services.codes.cyclic import cyclic_support


@dataclass(frozen=True)
class TreeShape:
    """The nodes of a tree of workers: fanout m, L levels, s stragglers per sibling
    group, and root fanout m₀ (``root``; 0 or m: a regular tree)."""

    fanout: int
    levels: int
    s: int = 0
    root: int = 0

    def __post_init__(self) -> None:
        if self.root == 0:
            object.__setattr__(self, "root", self.fanout)
        if self.fanout < 1 or self.levels < 1 or self.root < 1:
            raise ValueError(f"a tree needs fanout >= 1, root >= 1 and levels >= 1, got {self}")
        if not 0 <= self.s < self.fanout:
            raise ValueError(f"a tree needs 0 <= s < fanout, got s={self.s}, m={self.fanout}")
        if self.s >= self.root:
            raise ValueError(f"a tree needs 0 <= s < root, got s={self.s}, m0={self.root}")

    @property
    def group(self) -> int:
        """g = s + 1: how many siblings hold each part of a group's rows."""
        return self.s + 1

    @property
    def regular(self) -> bool:
        """Whether the coordinator has as many children as every other parent (m₀ = m)."""
        return self.root == self.fanout

    @property
    def n_workers(self) -> int:
        """N = m₀·(1 + m + … + m^(L−1)) (m + m² + … + m^L when m₀ = m)."""
        return self.level_start(self.levels + 1)

    @property
    def n_partitions(self) -> int:
        """k = m₀·Σ_{l=0..L−1} m^l·g^(L−1−l): base partitions of u = c/g^L rows each."""
        m, g, levels = self.fanout, self.group, self.levels
        return self.root * sum(int(m**level * g ** (levels - 1 - level)) for level in range(levels))

    @property
    def share(self) -> int:
        """Base partitions each node computes: c = g^L."""
        return int(self.group**self.levels)

    def width(self, level: int) -> int:
        """Workers at ``level`` (1-based): m₀·m^(level−1)."""
        return self.root * int(self.fanout ** (level - 1))

    def level_start(self, level: int) -> int:
        """The first worker of ``level`` (1-based)."""
        return sum(self.width(d) for d in range(1, level))

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
        level = self.level(worker)
        offset = worker - self.level_start(level)
        return offset if level == 1 else offset % self.fanout

    def children(self, worker: int) -> tuple[int, ...]:
        """The workers that report to ``worker`` (−1: the root's), in sibling order."""
        if worker == -1:
            return tuple(range(self.root))
        level = self.level(worker)
        if level == self.levels:
            return ()
        first = self.level_start(level + 1) + (worker - self.level_start(level)) * self.fanout
        return tuple(range(first, first + self.fanout))

    def subtree(self, head: int) -> tuple[int, ...]:
        """``head`` and every worker below it, level by level (ascending: a worker's
        children come after it)."""
        out, level = [head], [head]
        while level:
            level = [c for w in level for c in self.children(w)]
            out.extend(level)
        return tuple(out)

    def describe(self) -> str:
        """The workers per level, as a sum: "3 + 9", or "16 + 48" for m₀ = 16, m = 3."""
        return " + ".join(str(self.width(level)) for level in range(1, self.levels + 1))

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


def shapes(n: int) -> list[tuple[int, int, int]]:
    """Every (root fanout m₀, fanout m, levels L) of a tree of exactly n workers with
    m₀, m >= 2: n = m₀·(1 + m + … + m^(L−1)); one level is (n, n, 1)."""
    out = [(n, n, 1)] if n >= 2 else []
    for m in range(2, n):
        below, levels = 1 + m, 2  # a level-1 worker's subtree
        while below <= n // 2:
            if n % below == 0:
                out.append((n // below, m, levels))
            below, levels = below * m + 1, levels + 1
    return sorted(out, key=lambda shape: (shape[2], -shape[0]))


@dataclass(frozen=True)
class Placement:
    """What one worker computes: Σ_p weights[p]·∇(partition p), one term per partition."""

    partitions: tuple[int, ...]
    weights: tuple[float, ...]


def place(
    shape: TreeShape, code: np.ndarray, root_code: np.ndarray | None = None
) -> list[Placement]:
    """Every worker's partitions and weights (index = worker), for sibling code ``code``.

    ``code`` is the m×m matrix B of the cyclic code B(m, s) every sibling group below
    level 1 uses (row = sibling position); ``root_code`` the m₀×m₀ B(m₀, s) of level 1
    (None: ``code``, for a regular tree). With s = 0 both are the identity.
    """
    m, m0, g = shape.fanout, shape.root, shape.group
    if shape.levels > 1 and code.shape != (m, m):
        raise ValueError(f"the sibling code must be {m}×{m}, got {code.shape}")
    top = code if root_code is None else root_code
    if top.shape != (m0, m0):
        raise ValueError(f"the root's code must be {m0}×{m0}, got {top.shape}")
    placements: list[Placement | None] = [None] * shape.n_workers
    everything = [(p, 1.0) for p in range(shape.n_partitions)]
    _place(shape, top, code, shape.children(-1), everything, shape.levels, placements)
    assert all(p is not None for p in placements)
    assert all(len(p.partitions) == g**shape.levels for p in placements if p is not None)
    return [p for p in placements if p is not None]


def _place(
    shape: TreeShape,
    group_code: np.ndarray,
    code: np.ndarray,
    siblings: Sequence[int],
    rows: list[tuple[int, float]],
    depth: int,
    out: list[Placement | None],
) -> None:
    """Siblings ``siblings`` (depth levels down to the leaves, their group's code
    ``group_code``) deliver Σ weight·∇(rows); the groups below them use ``code``."""
    m, g = len(siblings), shape.group
    size = len(rows) // m
    if size * m != len(rows):
        raise AssertionError(f"{len(rows)} base partitions do not split into {m} parts")
    parts = [rows[j * size : (j + 1) * size] for j in range(m)]
    own_size = size if depth == 1 else g ** (shape.levels - 1)
    for i, worker in enumerate(siblings):
        support = cyclic_support(m, shape.s, i)
        own = [(p, w * group_code[i, j]) for j in support for p, w in parts[j][:own_size]]
        out[worker] = Placement(tuple(p for p, _ in own), tuple(float(w) for _, w in own))
        if depth > 1:
            delegated = [(p, w * group_code[i, j]) for j in support for p, w in parts[j][own_size:]]
            _place(shape, code, code, shape.children(worker), delegated, depth - 1, out)
