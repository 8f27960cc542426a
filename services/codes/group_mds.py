"""Communication-efficient group MDS gradient code, pure numpy.

The project's own construction in the spirit of Kadhe, Koyluoglu, Ramchandran
(ISIT 2020, arXiv 2005.07184); m = 1 gives fractional repetition. Each worker sends
ℓ/m numbers instead of ℓ.

- Placement: d | n; n/d groups of d consecutive workers; every member of group a holds
  the group's d partitions a·d .. a·d+d−1 (load d/n).
- Encoding: G_a = Σ_{j∈a} g_j, cut into m equal chunks G_a^(0..m−1) (ℓ zero-padded to a
  multiple of m). A generator Γ ∈ R^{m×d} with i.i.d. N(0, 1) entries (any m columns are
  invertible with probability 1). The member at position t sends
  c_t = Σ_u Γ[u, t]·G_a^(u), a vector of length ⌈ℓ/m⌉. As a worker plan: every partition
  row of its coefficient matrix is Γ[:, t].
- Decoding: once a group has m arrivals at positions R, C_R = Γ[:, R]ᵀ X where the rows of
  X are the chunks of G_a, so X = (Γ[:, R]ᵀ)⁻¹ C_R (an m×m solve, cached per R); sum X
  over groups and concatenate the chunks. Exact from any m arrivals per group: it
  tolerates d − m stragglers per group; d ≥ s + m is the optimal trade-off for s.

The m×m systems are the only numerics: their condition numbers are exposed by
:meth:`GroupMDSCode.condition` and :meth:`GroupMDSCode.worst_condition`.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from codedgd.services.codes.cyclic import LRU
from codedgd.services.codes.frc import frc_groups


@dataclass(frozen=True)
class GroupSolve:
    """The m×m decode of one group from arrivals at ``positions`` (in that order)."""

    positions: tuple[int, ...]
    matrix: np.ndarray  # (m, m) read-only: chunks X = matrix @ C_R, rows of C_R in order
    residual: float  # max |matrix · Γ[:, R]ᵀ − I|
    condition: float  # 2-norm condition number of Γ[:, R]


class GroupMDSCode:
    """Group code with a Gaussian m×d generator for n workers (d | n)."""

    def __init__(
        self,
        n_workers: int,
        d: int,
        m: int,
        *,
        rng: np.random.Generator | None = None,
        generator: np.ndarray | None = None,
    ) -> None:
        if m < 1 or d < m:
            raise ValueError(f"group MDS code needs 1 <= m <= d, got m={m}, d={d}")
        self.n = n_workers
        self.d = d
        self.m = m
        self.groups = frc_groups(n_workers, d)
        if generator is None:
            rng = rng if rng is not None else np.random.default_rng(0)
            generator = rng.standard_normal((m, d))
        if generator.shape != (m, d):
            raise ValueError(f"generator has shape {generator.shape}, expected {(m, d)}")
        self.generator = np.asarray(generator, dtype=np.float64)
        self._solves: LRU[tuple[int, ...], GroupSolve] = LRU(4096)

    @property
    def n_groups(self) -> int:
        return len(self.groups)

    @property
    def stragglers_per_group(self) -> int:
        return self.d - self.m

    def group(self, worker: int) -> int:
        return worker // self.d

    def position(self, worker: int) -> int:
        return worker % self.d

    def partitions(self, worker: int) -> tuple[int, ...]:
        return self.groups[self.group(worker)]

    def coefficients(self, worker: int) -> np.ndarray:
        """(d, m): every partition row is Γ[:, t] for the worker's position t."""
        column = self.generator[:, self.position(worker)]
        return np.tile(column, (self.d, 1))

    def solve(self, positions: Sequence[int]) -> GroupSolve:
        """The inverse of Γ[:, R]ᵀ for arrivals at ``positions`` (exactly m, distinct)."""
        key = tuple(positions)
        if len(key) != self.m or len(set(key)) != self.m:
            raise ValueError(f"need {self.m} distinct positions, got {key}")
        hit = self._solves.get(key)
        if hit is not None:
            return hit
        A = self.generator[:, list(key)].T  # row i: the coefficients of arrival i
        inv = np.linalg.solve(A, np.eye(self.m))
        residual = float(np.max(np.abs(inv @ A - np.eye(self.m))))
        inv.flags.writeable = False
        out = GroupSolve(key, inv, residual, float(np.linalg.cond(A)))
        self._solves.put(key, out)
        return out

    def condition(self, positions: Sequence[int]) -> float:
        return self.solve(positions).condition

    def worst_condition(self) -> float:
        """Largest condition number over every m-subset of positions (C(d, m) solves)."""
        return max(
            float(np.linalg.cond(self.generator[:, list(R)].T))
            for R in itertools.combinations(range(self.d), self.m)
        )

    def decode(self, arrivals: Sequence[tuple[int, np.ndarray]], dim: int) -> np.ndarray:
        """g from (worker, message) pairs: the first m of each group are used.

        A reference decoder for tests and one-off use; the policy decodes from its
        round buffer with the same :meth:`solve` matrices.
        """
        from codedgd.services.codes.encoding import chunk_length, join_chunks

        length = chunk_length(dim, self.m)
        chunks = np.zeros((self.m, length), dtype=np.float64)
        per_group: dict[int, list[tuple[int, np.ndarray]]] = {}
        for worker, message in arrivals:
            got = per_group.setdefault(self.group(worker), [])
            if len(got) < self.m:
                got.append((self.position(worker), message))
        for g in range(self.n_groups):
            got = per_group.get(g, [])
            if len(got) < self.m:
                raise ValueError(f"group {g} has {len(got)} of {self.m} arrivals")
            solve = self.solve([t for t, _ in got])
            chunks += solve.matrix @ np.stack([c for _, c in got])
        return join_chunks(chunks, dim)
