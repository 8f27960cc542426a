"""``hetero``: heterogeneity-aware exact gradient coding (loads in proportion to speed).

Worker i holds partitions in proportion to ``speeds[i]`` on a circle of k = granularity·n
partitions, each partition on s + 1 consecutive workers, with the polynomial code's
encoding; the round decodes exactly from the first n − s arrivals (waiting past them only
when those decode above ``tol``). See :mod:`codedgd.services.codes.hetero`. With ``s = 0``
it is speed-aware uncoded. ``codedgd tune`` proposes it with the speeds it measured.
"""

from __future__ import annotations

from codedgd.services.codes.hetero import hetero_code, parse_speeds, speed_loads
from codedgd.services.codes.polynomial import POINT_LAYOUTS
from codedgd.services.errors import ConfigError, PlanError
from codedgd.services.policies.base import Param, Plan, WorkerPlan, check_n
from codedgd.services.policies.comm_efficient import Polynomial
from codedgd.services.policies.registry import register


@register
class Heterogeneous(Polynomial):
    name = "hetero"
    summary = (
        "heterogeneity-aware exact code (Wang, Liu & Shroff's setting): worker i holds "
        "partitions in proportion to speeds[i], each partition on s+1 workers; exact from "
        "any n-s arrivals (s=0: speed-aware uncoded)"
    )
    exact = True
    parameters = (
        Param("s", int, 1, "stragglers tolerated (0 <= s < n)"),
        Param(
            "speeds",
            str,
            "",
            "relative speed of each worker, comma-separated (e.g. 2,2,1,1; twice as fast "
            "holds twice the data); empty = all equal",
        ),
        Param(
            "granularity",
            int,
            8,
            "partitions per worker on average (k = granularity*n): finer follows the "
            "speeds more closely, at a little more work per partition",
        ),
        Param("points", str, "interleaved", "evaluation points (as for polynomial)"),
        Param("tol", float, 1e-6, "largest decode residual accepted"),
    )

    def __init__(
        self,
        s: int = 1,
        speeds: str = "",
        granularity: int = 8,
        points: str = "interleaved",
        tol: float = 1e-6,
    ) -> None:
        if points not in POINT_LAYOUTS:
            raise ConfigError(
                f"hetero: points={points!r}: choose points in {{{','.join(POINT_LAYOUTS)}}}"
            )
        super().__init__(s=s, m=1, points=points, tol=tol)
        if granularity < 1:
            raise ConfigError(f"hetero: granularity must be >= 1, got {granularity}")
        self.speeds = speeds
        self.granularity = granularity

    def default_partitions(self, n_workers: int) -> int:
        return self.granularity * n_workers

    def plan(self, n_workers: int, n_partitions: int) -> Plan:
        check_n(n_workers, n_partitions)
        if not 0 <= self.s < n_workers:
            raise PlanError(
                f"hetero needs 0 <= s < n; got s={self.s}, n={n_workers}: choose s in "
                f"0..{n_workers - 1}"
            )
        try:
            speeds = parse_speeds(self.speeds, n_workers)
            speed_loads(speeds, self.s, n_partitions)
            self.code = hetero_code(speeds, self.s, n_partitions, points=self.points)
        except ValueError as exc:
            raise PlanError(f"hetero: {exc}") from None
        self._n = n_workers
        self._m = 1
        workers = tuple(
            WorkerPlan(self.code.support(i), self.code.coefficients(i)) for i in range(n_workers)
        )
        return Plan(n_workers, n_partitions, workers)

    def loads(self) -> list[int]:
        """Partitions each worker holds (after :meth:`plan`)."""
        code = self._code()
        return [len(code.support(i)) for i in range(code.n)]


__all__ = ["Heterogeneous"]
