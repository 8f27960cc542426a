"""Trees of workers: ``codedreduce`` (Reisizadeh et al.) and the uncoded ``tree`` reduce.

A regular tree below the coordinator, fanout m and L levels (N = m + … + m^L workers,
exactly; :mod:`codedgd.services.codes.tree` places the data). θ_t travels down the tree;
every worker computes the same share, adds it to what it decodes from its fastest m−s
children (sibling code B(m, s), residual checked at every node) and sends one ℓ-vector
up. The coordinator is the root: it hears the m level-1 workers only, decodes its
fastest m−s of them with the same code and the same rule as ``cyclic``
(:class:`~codedgd.services.codes.cyclic.CyclicRound`), and gets the full gradient, exact
for every pattern of at most s stragglers per sibling group. Its inbound traffic is m−s
vectors per round where a flat code's is n−s.

``tree`` is the s = 0 reference: B = I, every child waited for, every sum plain.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from codedgd.services.codes.cyclic import CyclicCode
from codedgd.services.codes.tree import TreeShape, place
from codedgd.services.errors import PlanError
from codedgd.services.policies.base import Param, Plan, Topology, WorkerPlan, check_n
from codedgd.services.policies.cyclic import CyclicRepetition, check_code_options
from codedgd.services.policies.registry import register


@register
class CodedReduce(CyclicRepetition):
    name = "codedreduce"
    summary = (
        "CodedReduce: a tree of workers (fanout m, L levels, N = m+...+m^L), each parent "
        "decodes its fastest m-s children with a cyclic code and adds its own share; the "
        "coordinator hears m workers; exact with s stragglers per sibling group"
    )
    exact = True
    parameters: ClassVar[tuple[Param, ...]] = (
        Param("fanout", int, 3, "m: children of every non-leaf node, and of the coordinator"),
        Param("levels", int, 2, "L: levels of workers below the coordinator"),
        Param("s", int, 1, "stragglers tolerated in every group of m siblings (0 <= s < m)"),
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
        seed: int = 0,
    ) -> None:
        super().__init__(s=s, h=h, tol=tol, seed=seed)
        check_code_options(self.name, h, tol)
        self.fanout = fanout
        self.levels = levels
        self.shape = self._shape()

    def _shape(self) -> TreeShape:
        m, levels, s = self.fanout, self.levels, self.s
        if m < 2 or levels < 1:
            raise PlanError(
                f"{self.name} needs fanout >= 2 and levels >= 1, got fanout={m}, levels={levels}"
            )
        if not 0 <= s < m:
            raise PlanError(
                f"{self.name} needs 0 <= s < fanout; got s={s}, fanout={m}: choose s in 0..{m - 1}"
            )
        return TreeShape(m, levels, s)

    def default_partitions(self, n_workers: int) -> int:
        return self.shape.n_partitions

    def plan(self, n_workers: int, n_partitions: int) -> Plan:
        shape = self.shape
        check_n(n_workers, n_partitions)
        if n_workers != shape.n_workers:
            sizes = " + ".join(str(shape.fanout**level) for level in range(1, shape.levels + 1))
            raise PlanError(
                f"{self.name} with fanout {shape.fanout} and {shape.levels} level(s) needs "
                f"exactly {shape.n_workers} workers ({sizes}); got n = {n_workers}: use "
                f"-n {shape.n_workers}, or choose fanout and levels for your pool"
            )
        if n_partitions != shape.n_partitions:
            raise PlanError(
                f"{self.name} places {shape.n_partitions} partitions itself (got k = "
                f"{n_partitions}): leave job.partitions at 0"
            )
        rng = np.random.default_rng([self.seed, 0x74726565])  # the job seed, this code's stream
        self.code = CyclicCode(shape.fanout, shape.s, h=self.h, rng=rng)
        placements = place(shape, self.code.B)
        workers = tuple(
            WorkerPlan(pl.partitions, np.asarray(pl.weights, dtype=np.float64).reshape(-1, 1))
            for pl in placements
        )
        topology = Topology("tree", tree=shape, code=self.code.B.copy(), tol=self.tol)
        return Plan(n_workers, n_partitions, workers, topology)


@register
class TreeReduce(CodedReduce):
    name = "tree"
    summary = (
        "uncoded tree reduce: a tree of workers (fanout m, L levels, N = m+...+m^L), each "
        "adds its children's sums to its own share and sends one vector up; waits for all"
    )
    parameters: ClassVar[tuple[Param, ...]] = (
        Param("fanout", int, 3, "m: children of every non-leaf node, and of the coordinator"),
        Param("levels", int, 2, "L: levels of workers below the coordinator"),
    )

    def __init__(self, fanout: int = 3, levels: int = 2, seed: int = 0) -> None:
        super().__init__(fanout=fanout, levels=levels, s=0, seed=seed)
