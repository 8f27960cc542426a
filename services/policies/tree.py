"""Trees of workers: ``codedreduce`` (Reisizadeh et al.) and the uncoded ``tree`` reduce.

A tree below the coordinator: L levels, the coordinator's m₀ children (``root``; by
default m₀ = m, the paper's regular tree) and fanout m below them, so N = m + … + m^L
workers, or m₀·(1 + m + … + m^(L−1)) with a separate root fanout (64 = 16 × (1 + 3));
:mod:`codedgd.services.codes.tree` places the data. θ_t travels down the tree; every
worker computes the same share, adds it to what it decodes from its fastest m−s
children (sibling code B(m, s), residual checked at every node) and sends one ℓ-vector
up. The coordinator is the root: it hears the m₀ level-1 workers only, decodes its
fastest m₀−s of them with B(m₀, s) and the same rule as ``cyclic``
(:class:`~codedgd.services.codes.cyclic.CyclicRound`), and gets the full gradient, exact
for every pattern of at most s stragglers per sibling group. Its inbound traffic is
m₀−s vectors per round where a flat code's is n−s.

``tree`` is the s = 0 reference: B = I, every child waited for, every sum plain.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from codedgd.services.codes.cyclic import CyclicCode
from codedgd.services.codes.tree import TreeShape, place, shapes
from codedgd.services.errors import PlanError
from codedgd.services.policies.base import Param, Plan, Topology, WorkerPlan, check_n
from codedgd.services.policies.cyclic import CyclicRepetition, check_code_options
from codedgd.services.policies.registry import register

ROOT_HELP = "m0: the coordinator's children (level 1); 0: as many as fanout (a regular tree)"


@register
class CodedReduce(CyclicRepetition):
    name = "codedreduce"
    summary = (
        "CodedReduce: a tree of workers (root fanout m0, fanout m, L levels, N = m0*(1+m+"
        "...+m^(L-1))), each parent decodes its fastest m-s children with a cyclic code and "
        "adds its own share; the coordinator hears m0 workers; exact with s stragglers per "
        "sibling group"
    )
    exact = True
    parameters: ClassVar[tuple[Param, ...]] = (
        Param("fanout", int, 3, "m: children of every non-leaf worker"),
        Param("levels", int, 2, "L: levels of workers below the coordinator"),
        Param("s", int, 1, "stragglers tolerated in every sibling group (0 <= s < m, m0)"),
        Param("root", int, 0, ROOT_HELP),
        Param(
            "h",
            str,
            "orthonormal",
            "the matrix H the sibling code is built from: orthonormal or gaussian",
        ),
        Param("tol", float, 1e-6, "largest decode residual accepted, at every node"),
    )

    def __init__(
        self,
        fanout: int = 3,
        levels: int = 2,
        s: int = 1,
        h: str = "orthonormal",
        tol: float = 1e-6,
        root: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__(s=s, h=h, tol=tol, seed=seed)
        check_code_options(self.name, h, tol)
        self.fanout = fanout
        self.levels = levels
        self.root = root
        self.shape = self._shape()

    def _shape(self) -> TreeShape:
        m, levels, s, m0 = self.fanout, self.levels, self.s, self.root or self.fanout
        if m < 2 or levels < 1:
            raise PlanError(
                f"{self.name} needs fanout >= 2 and levels >= 1, got fanout={m}, levels={levels}"
            )
        if m0 < 2:
            raise PlanError(
                f"{self.name} needs root >= 2 (or 0: as many as fanout), got root={self.root}"
            )
        if levels == 1 and m0 != m:
            raise PlanError(
                f"{self.name} with one level has only the coordinator's children: give their "
                f"number as fanout (fanout={m0}) and leave root at 0"
            )
        if not 0 <= s < m:
            raise PlanError(
                f"{self.name} needs 0 <= s < fanout; got s={s}, fanout={m}: choose s in 0..{m - 1}"
            )
        if s >= m0:
            raise PlanError(
                f"{self.name} needs s < root (the coordinator's children); got s={s}, "
                f"root={m0}: choose s in 0..{m0 - 1}"
            )
        return TreeShape(m, levels, s, root=m0)

    def default_partitions(self, n_workers: int) -> int:
        return self.shape.n_partitions

    def plan(self, n_workers: int, n_partitions: int) -> Plan:
        shape = self.shape
        check_n(n_workers, n_partitions)
        if n_workers != shape.n_workers:
            root = "" if shape.regular else f", root {shape.root}"
            raise PlanError(
                f"{self.name} with fanout {shape.fanout}{root} and {shape.levels} level(s) "
                f"needs exactly {shape.n_workers} workers ({shape.describe()}); got n = "
                f"{n_workers}: use -n {shape.n_workers}, or {fitting(n_workers, shape.s)}"
            )
        if n_partitions != shape.n_partitions:
            raise PlanError(
                f"{self.name} places {shape.n_partitions} partitions itself (got k = "
                f"{n_partitions}): leave job.partitions at 0"
            )
        rng = np.random.default_rng([self.seed, 0x74726565])  # the job seed, this code's stream
        sibling = CyclicCode(shape.fanout, shape.s, h=self.h, rng=rng)
        # The coordinator decodes level 1 with B(m₀, s): the siblings' own code when the
        # tree is regular, else the stream's next draw.
        self.code = sibling if shape.regular else CyclicCode(shape.root, shape.s, h=self.h, rng=rng)
        placements = place(shape, sibling.B, self.code.B)
        workers = tuple(
            WorkerPlan(pl.partitions, np.asarray(pl.weights, dtype=np.float64).reshape(-1, 1))
            for pl in placements
        )
        topology = Topology("tree", tree=shape, code=sibling.B.copy(), tol=self.tol)
        return Plan(n_workers, n_partitions, workers, topology)


@register
class TreeReduce(CodedReduce):
    name = "tree"
    summary = (
        "uncoded tree reduce: a tree of workers (root fanout m0, fanout m, L levels, "
        "N = m0*(1+m+...+m^(L-1))), each adds its children's sums to its own share and "
        "sends one vector up; waits for all"
    )
    parameters: ClassVar[tuple[Param, ...]] = (
        Param("fanout", int, 3, "m: children of every non-leaf worker"),
        Param("levels", int, 2, "L: levels of workers below the coordinator"),
        Param("root", int, 0, ROOT_HELP),
    )

    def __init__(self, fanout: int = 3, levels: int = 2, root: int = 0, seed: int = 0) -> None:
        super().__init__(fanout=fanout, levels=levels, s=0, root=root, seed=seed)


def fitting(n: int, s: int) -> str:
    """The trees of two or more levels that fit ``n`` workers with ``s`` stragglers per
    group, as the fix of a refused shape."""
    fits = [(m0, m, lv) for m0, m, lv in shapes(n) if lv > 1 and s < min(m0, m)]
    if not fits:
        return (
            f"choose fanout and levels for your pool (no tree of two or more levels has {n} "
            f"workers and groups of more than s={s})"
        )
    said = ", ".join(
        f"fanout={m} levels={lv}" + ("" if m0 == m else f" root={m0}") for m0, m, lv in fits[:4]
    )
    return f"one that fits {n} workers: {said}"
