"""Communication-efficient gradient codes: every worker sends ⌈ℓ/m⌉ numbers, not ℓ.

- ``group-mds``: groups of d = s+m workers share d partitions; the member at position t
  sends Σ_u Γ[u, t]·G^(u) (Γ Gaussian m×d); exact once every group has m arrivals.
  See :mod:`codedgd.services.codes.group_mds`.
- ``polynomial``: Ye–Abbe style polynomial code on a cyclic placement with d >= s+m
  partitions per worker; exact from any n − (d − m) arrivals by a Vandermonde solve.
  See :mod:`codedgd.services.codes.polynomial`.

Both keep their messages in an :class:`ArrivalBuffer` and decode with one product of a
small cached weight matrix and the buffer, then concatenate the m chunks.
"""

from __future__ import annotations

import numpy as np

from codedgd.services.codes.encoding import chunk_length, join_chunks
from codedgd.services.codes.frc import divisors
from codedgd.services.codes.group_mds import GroupMDSCode
from codedgd.services.codes.polynomial import POINT_LAYOUTS, PolynomialCode
from codedgd.services.codes.residual import ResidualWait
from codedgd.services.errors import ConfigError, DecodeError, PlanError
from codedgd.services.policies.base import (
    Estimate,
    Param,
    Plan,
    Policy,
    RoundSpec,
    WorkerPlan,
    check_n,
    check_payload,
)
from codedgd.services.policies.cyclic import ArrivalBuffer
from codedgd.services.policies.frc import check_one_partition_per_worker, nearest
from codedgd.services.policies.registry import register


def _check_s_m(name: str, s: int, m: int, n_workers: int) -> None:
    if m < 1:
        raise PlanError(f"{name} needs m >= 1 chunks per message, got m={m}: choose m in 1..")
    if not 0 <= s < n_workers:
        top = n_workers - 1
        raise PlanError(
            f"{name} needs 0 <= s < n; got s={s}, n={n_workers}: choose s in 0..{top} "
            f"(s={min(max(s, 0), top)} is the nearest)"
        )


class _ChunkedPolicy(Policy):
    """Shared round state: a buffer of ⌈ℓ/m⌉-long messages and the arrival order."""

    def __init__(self) -> None:
        self._n = 0
        self._m = 1
        self._dim = 0
        self._length = 0
        self._buffer = ArrivalBuffer()
        self._arrived: list[int] = []
        self._seen: set[int] = set()
        self._started = False
        self.last_residual = 0.0
        self.last_condition = 0.0

    def _reset(self, theta: np.ndarray, rows: int) -> None:
        if self._n == 0:
            raise DecodeError(f"{self.name}: begin_round() before plan()")
        self._dim = int(theta.shape[0])
        self._length = chunk_length(self._dim, self._m)
        self._buffer.reset(rows, self._length)
        self._arrived = []
        self._seen = set()
        self._started = True

    def _check(self, worker: int, payload: np.ndarray | None) -> np.ndarray:
        if not self._started:
            raise DecodeError(f"{self.name}: offer() before begin_round()")
        if not 0 <= worker < self._n:
            raise DecodeError(f"{self.name}: unknown worker {worker} (n = {self._n})")
        if worker in self._seen:
            raise DecodeError(f"{self.name}: worker {worker} offered twice in one round")
        vector = check_payload(self.name, worker, payload, self._length)
        self._seen.add(worker)
        return vector


@register
class GroupMDS(_ChunkedPolicy):
    name = "group-mds"
    summary = (
        "communication-efficient group code: groups of d=s+m workers share d partitions, "
        "each sends l/m numbers (Gaussian m x d generator); exact from m arrivals per group"
    )
    exact = True
    parameters = (
        Param("s", int, 1, "stragglers tolerated per group"),
        Param("m", int, 2, "message is 1/m of the gradient (m chunks)"),
        Param("d", int, 0, "group size and partitions per worker, d >= s+m, d | n (0 = s+m)"),
    )

    def __init__(self, s: int = 1, m: int = 2, d: int = 0, seed: int = 0) -> None:
        super().__init__()
        self.s = s
        self.m = m
        self.d = d
        self.seed = seed
        self.code: GroupMDSCode | None = None
        self._slots: list[list[tuple[int, int]]] = []  # per group: (position, buffer row)
        self._complete = 0  # groups with m arrivals

    def plan(self, n_workers: int, n_partitions: int) -> Plan:
        check_n(n_workers, n_partitions)
        check_one_partition_per_worker(self.name, n_workers, n_partitions)
        _check_s_m(self.name, self.s, self.m, n_workers)
        need = self.s + self.m
        d = self.d or need
        valid = [g for g in divisors(n_workers) if g >= need]
        if need > n_workers:
            raise PlanError(f"group-mds needs s+m <= n: s+m={need} > n={n_workers}: lower s or m")
        if d < need:
            raise PlanError(
                f"group-mds needs d >= s+m: d={d} < s+m={need} (s={self.s}, m={self.m}): "
                f"choose d in {nearest(valid, need)}"
            )
        if n_workers % d:
            what = "d" if self.d else "d = s+m"
            near = nearest(valid, d)
            raise PlanError(
                f"group-mds needs the group size to divide n: {what}={d} does not divide "
                f"n={n_workers}: choose d in {near} (d >= s+m={need}; param d)"
            )
        rng = np.random.default_rng([self.seed, 0x67726F7570])  # the job seed, this code's stream
        self.code = GroupMDSCode(n_workers, d, self.m, rng=rng)
        self._n = n_workers
        self._m = self.m
        workers = tuple(
            WorkerPlan(self.code.partitions(i), self.code.coefficients(i), chunks=self.m)
            for i in range(n_workers)
        )
        return Plan(n_workers, n_partitions, workers)

    def _code(self) -> GroupMDSCode:
        if self.code is None:
            raise DecodeError("group-mds: used before plan()")
        return self.code

    def begin_round(self, t: int, theta: np.ndarray) -> RoundSpec:
        code = self._code()
        self._reset(theta, code.n_groups * code.m)
        self._slots = [[] for _ in range(code.n_groups)]
        self._complete = 0
        return RoundSpec(round=t, workers=tuple(range(code.n)))

    def offer(self, worker: int, payload: np.ndarray | None) -> bool:
        code = self._code()
        vector = self._check(worker, payload)
        slots = self._slots[code.group(worker)]
        if len(slots) < code.m:  # a group's (m+1)-th arrival is not needed
            slots.append((code.position(worker), self._buffer.add(vector)))
            self._arrived.append(worker)
            if len(slots) == code.m:
                self._complete += 1
        return self._complete == code.n_groups

    def decode(self) -> Estimate:
        code = self._code()
        if not self._started or self._complete != code.n_groups:
            short = [g for g, sl in enumerate(self._slots) if len(sl) < code.m]
            raise DecodeError(f"group-mds: groups {short} have fewer than m={code.m} arrivals")
        weights = np.zeros((code.m, self._buffer.count), dtype=np.float64)
        residual = condition = 0.0
        for slots in self._slots:
            solve = code.solve([t for t, _ in slots])
            weights[:, [row for _, row in slots]] = solve.matrix
            residual = max(residual, solve.residual)
            condition = max(condition, solve.condition)
        self.last_residual, self.last_condition = residual, condition
        chunks = weights @ self._buffer.rows()  # (m, ⌈ℓ/m⌉): the chunks of g
        return Estimate(
            join_chunks(chunks, self._dim), tuple(self._arrived), exact=True, residual=residual
        )

    def feasible(self, outstanding: frozenset[int]) -> bool:
        if self.code is None or not self._slots:
            return True
        code = self.code
        pending = [0] * code.n_groups
        for w in outstanding - self._seen:
            pending[code.group(w)] += 1
        return all(len(sl) + pending[g] >= code.m for g, sl in enumerate(self._slots))


@register
class Polynomial(_ChunkedPolicy):
    name = "polynomial"
    summary = (
        "Ye-Abbe style polynomial code: cyclic placement of d=s+m partitions, each worker "
        "sends l/m numbers; exact from any n-s arrivals (Vandermonde solve)"
    )
    exact = True
    parameters = (
        Param("s", int, 1, "stragglers tolerated (0 <= s < n)"),
        Param("m", int, 2, "message is 1/m of the gradient (m chunks)"),
        Param("d", int, 0, "partitions per worker, s+m <= d <= n (0 = s+m); tolerates d-m"),
        Param(
            "points",
            str,
            "interleaved",
            "evaluation points: interleaved (neighbouring workers far apart, stable) or "
            "ordered (worker i at the i-th Chebyshev node, ill-conditioned)",
        ),
        Param("tol", float, 1e-6, "largest decode residual accepted"),
    )

    def __init__(
        self, s: int = 1, m: int = 2, d: int = 0, points: str = "interleaved", tol: float = 1e-6
    ) -> None:
        super().__init__()
        if points not in POINT_LAYOUTS:
            raise ConfigError(
                f"polynomial: points={points!r}: choose points in {{{','.join(POINT_LAYOUTS)}}}"
            )
        if not tol > 0:
            raise ConfigError(f"polynomial: tol must be positive, got tol={tol}")
        self.s = s
        self.m = m
        self.d = d
        self.points = points
        self.tol = tol
        self.code: PolynomialCode | None = None
        self.residual_errors = 0
        self._wait = ResidualWait()

    def plan(self, n_workers: int, n_partitions: int) -> Plan:
        check_n(n_workers, n_partitions)
        check_one_partition_per_worker(self.name, n_workers, n_partitions)
        _check_s_m(self.name, self.s, self.m, n_workers)
        need = self.s + self.m
        d = self.d or need
        if d < need:
            raise PlanError(
                f"polynomial needs d >= s+m: d={d} < s+m={need} (s={self.s}, m={self.m}): "
                f"choose d in {need}..{n_workers}, or lower s or m"
            )
        if d > n_workers:
            what = f"d={d}" if self.d else f"s+m={d}"
            raise PlanError(
                f"polynomial needs d <= n: {what} > n={n_workers}: lower s or m "
                f"(s+m <= {n_workers})"
            )
        self.code = PolynomialCode(n_workers, self.s, self.m, d, points=self.points)
        self._n = n_workers
        self._m = self.m
        workers = tuple(
            WorkerPlan(self.code.support(i), self.code.coefficients(i), chunks=self.m)
            for i in range(n_workers)
        )
        return Plan(n_workers, n_partitions, workers)

    def _code(self) -> PolynomialCode:
        if self.code is None:
            raise DecodeError("polynomial: used before plan()")
        return self.code

    def begin_round(self, t: int, theta: np.ndarray) -> RoundSpec:
        code = self._code()
        self._reset(theta, code.n)  # rows past n-s only fill in extended rounds
        self._wait.reset()
        return RoundSpec(round=t, workers=tuple(range(code.n)))

    def offer(self, worker: int, payload: np.ndarray | None) -> bool:
        vector = self._check(worker, payload)
        code = self._code()
        if self._wait.good:
            return True  # decodable already: a later message is not needed
        self._buffer.add(vector)
        self._arrived.append(worker)
        if len(self._arrived) < code.need:
            return False
        # A set whose Vandermonde system is too ill-conditioned waits for the next
        # arrival and decodes by least norm over all of them (counted in extended_rounds).
        _, dec = code.weights(self._arrived, len(self._arrived))  # cached: decode() reuses it
        return self._wait.judge(len(self._arrived), code.need, code.n, dec.residual, self.tol)

    @property
    def extended_rounds(self) -> int:
        """Rounds that waited past n−s arrivals for a good residual."""
        return self._wait.extended_rounds

    def decode(self) -> Estimate:
        code = self._code()
        if not self._started or len(self._arrived) < code.need:
            raise DecodeError(f"polynomial: {len(self._arrived)} of {code.need} arrivals")
        weights, dec = code.weights(self._arrived, len(self._arrived))
        self.last_residual, self.last_condition = dec.residual, dec.condition
        if not dec.residual <= self.tol:
            self.residual_errors += 1
            raise DecodeError(
                f"polynomial: decode residual {dec.residual:.3g} exceeds tol={self.tol:g} for "
                f"survivors {list(dec.workers)} (Vandermonde condition number "
                f"{dec.condition:.3g}), and no other worker is left to wait for; use "
                + ("" if self.points == "interleaved" else "points=interleaved, ")
                + "a smaller s, or group-mds"
            )
        chunks = weights @ self._buffer.rows()
        return Estimate(
            join_chunks(chunks, self._dim), tuple(self._arrived), exact=True, residual=dec.residual
        )

    def feasible(self, outstanding: frozenset[int]) -> bool:
        if self.code is None:
            return True
        pending = len(outstanding - self._seen)
        return self._wait.feasible(len(self._arrived), pending, self.code.need)
