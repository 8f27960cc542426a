"""``cyclic``: Tandon's cyclic repetition code (exact), least-squares decoded in float64.

Worker i holds partitions i..i+s (mod n) and sends Σ_j B[i, j]·g_j; the round stops at the
first n−s arrivals F and the estimate is Σ_{i∈F} a_i f_i with aᵀB_F = 1ᵀ solved by least
squares, cached per F. The residual max|aᵀB_F − 1ᵀ| is reported in every Estimate.

When the first n−s arrivals decode with a residual above ``tol`` (a survivor set whose
B_F is numerically near-singular), the round is not decodable yet: it waits for the next
arrival and solves over all arrivals so far (more rows of B can only lower the
least-squares residual), counted in ``extended_rounds``. Only when no worker is left to
wait for is the decode refused with a DecodeError (counted in ``residual_errors`` here and
in the coordinator's decode-error metric): never a silent wrong step.
See :mod:`codedgd.services.codes.cyclic`.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from codedgd.services.codes.cyclic import H_KINDS, CyclicCode, CyclicRound, DecodingVector
from codedgd.services.errors import ConfigError, DecodeError, PlanError
from codedgd.services.policies.base import (
    Estimate,
    OrderDecode,
    Param,
    Plan,
    Policy,
    RoundSpec,
    WorkerPlan,
    check_n,
    check_payload,
)
from codedgd.services.policies.frc import check_one_partition_per_worker
from codedgd.services.policies.registry import register


class ArrivalBuffer:
    """The messages of one round, one row per arrival, reused across rounds.

    Copying each message into its row as it arrives (between arrivals) lets the decode
    be one BLAS product ``weights @ rows`` once the round is decodable.
    """

    def __init__(self) -> None:
        self._rows: np.ndarray | None = None
        self.count = 0

    def reset(self, rows: int, length: int) -> None:
        if self._rows is None or self._rows.shape != (rows, length):
            self._rows = np.empty((rows, length), dtype=np.float64)
        self.count = 0

    def add(self, payload: np.ndarray) -> int:
        """Store a message; return its row."""
        if self._rows is None or self.count >= self._rows.shape[0]:
            raise DecodeError("arrival buffer full: more arrivals than the decode uses")
        self._rows[self.count] = payload
        self.count += 1
        return self.count - 1

    @property
    def full(self) -> bool:
        return self._rows is not None and self.count == self._rows.shape[0]

    def rows(self) -> np.ndarray:
        if self._rows is None:
            raise DecodeError("arrival buffer used before begin_round()")
        return self._rows[: self.count]


def check_code_options(name: str, h: str, tol: float) -> None:
    """Refuse an unknown H kind or a non-positive residual tolerance."""
    if h not in H_KINDS:
        raise ConfigError(f"{name}: h={h!r} is not a known H: choose h in {{{','.join(H_KINDS)}}}")
    if not tol > 0:
        raise ConfigError(f"{name}: tol must be positive, got tol={tol}")


def cyclic_plan(
    name: str, s: int, h: str, seed: int, n_workers: int, n_partitions: int
) -> tuple[CyclicCode, Plan]:
    """The cyclic code B(n, s) of a job (seeded by the job seed) and its plan.

    Shared by ``cyclic`` and ``lagc``: the same seed gives the same B in both.
    """
    check_n(n_workers, n_partitions)
    check_one_partition_per_worker(name, n_workers, n_partitions)
    if not 0 <= s < n_workers:
        top = n_workers - 1
        raise PlanError(
            f"{name} needs 0 <= s < n; got s={s}, n={n_workers}: "
            f"choose s in 0..{top} (s={min(max(s, 0), top)} is the nearest)"
        )
    rng = np.random.default_rng([seed, 0x6379636C])  # the job seed, this code's stream
    code = CyclicCode(n_workers, s, h=h, rng=rng)
    workers = tuple(WorkerPlan(code.support(i), code.coefficients(i)) for i in range(n_workers))
    return code, Plan(n_workers, n_partitions, workers)


@register
class CyclicRepetition(Policy):
    name = "cyclic"
    summary = (
        "Tandon's cyclic repetition: worker i holds partitions i..i+s; decode from the "
        "first n-s arrivals by least squares (residual checked); exact"
    )
    exact = True
    parameters: ClassVar[tuple[Param, ...]] = (
        Param("s", int, 1, "stragglers tolerated (0 <= s < n); load (s+1)/n"),
        Param(
            "h",
            str,
            "orthonormal",
            "the matrix H the code is built from: orthonormal (orthonormal rows, "
            "better conditioned) or gaussian (the paper's)",
        ),
        Param("tol", float, 1e-6, "largest decode residual max|a^T B_F - 1^T| accepted"),
    )

    def __init__(
        self, s: int = 1, h: str = "orthonormal", tol: float = 1e-6, seed: int = 0
    ) -> None:
        check_code_options(self.name, h, tol)
        self.s = s
        self.h = h
        self.tol = tol
        self.seed = seed
        self.code: CyclicCode | None = None
        self.residual_errors = 0  # decodes refused for a residual above tol
        self.last_residual = 0.0
        self.last_condition = 0.0
        self._round: CyclicRound | None = None
        self._dim = 0
        self._started = False

    def plan(self, n_workers: int, n_partitions: int) -> Plan:
        self.code, plan = cyclic_plan(self.name, self.s, self.h, self.seed, n_workers, n_partitions)
        return plan

    def _code(self) -> CyclicCode:
        if self.code is None:
            raise DecodeError(f"{self.name}: used before plan()")
        return self.code

    def _decoding(self) -> CyclicRound:
        if self._round is None or self._round.code is not self.code:
            self._round = CyclicRound(self._code(), self.tol)
        return self._round

    @property
    def wanted(self) -> int:
        return self._code().n - self.s

    def begin_round(self, t: int, theta: np.ndarray) -> RoundSpec:
        code = self._code()
        self._dim = int(theta.shape[0])
        decoding = self._decoding()
        decoding.tol = self.tol
        decoding.reset(self._dim)  # rows past n-s only fill in extended rounds
        self._started = True
        return RoundSpec(round=t, workers=tuple(range(code.n)))

    def offer(self, worker: int, payload: np.ndarray | None) -> bool:
        n = self._code().n
        if not self._started:
            raise DecodeError(f"{self.name}: offer() before begin_round()")
        if not 0 <= worker < n:
            raise DecodeError(f"{self.name}: unknown worker {worker} (n = {n})")
        decoding = self._decoding()
        if worker in decoding.arrived:
            raise DecodeError(f"{self.name}: worker {worker} offered twice in one round")
        vector = check_payload(self.name, worker, payload, self._dim)
        return decoding.add(worker, vector)

    @property
    def extended_rounds(self) -> int:
        """Rounds that waited past n−s arrivals for a good residual."""
        return self._round.wait.extended_rounds if self._round is not None else 0

    def decode(self) -> Estimate:
        decoding = self._decoding()
        if not self._started or len(decoding.arrived) < self.wanted:
            raise DecodeError(f"{self.name}: {len(decoding.arrived)} of {self.wanted} arrivals")
        self._judge(self._code().weights(decoding.arrived)[1])
        gradient, vec = decoding.combine()
        return Estimate(gradient, tuple(decoding.arrived), exact=True, residual=vec.residual)

    def _judge(self, vec: DecodingVector) -> None:
        """Keep a decode's residual and condition; refuse one above tol, naming the fix
        (every arrival of the round is in: no better-conditioned set is left to wait for)."""
        self.last_residual, self.last_condition = vec.residual, vec.condition
        if not vec.residual <= self.tol:
            self.residual_errors += 1
            raise DecodeError(
                f"{self.name}: decode residual max|a^T B_F - 1^T| = {vec.residual:.3g} "
                f"exceeds tol={self.tol:g} for survivors {list(vec.workers)} (condition "
                f"number {vec.condition:.3g}), and no other worker is left to wait for; use "
                + ("" if self.h == "orthonormal" else "h=orthonormal, ")
                + "a smaller s, a larger tol, or a group code"
            )

    def decides_by_order(self) -> bool:
        return True

    def decode_order(self, order: np.ndarray) -> OrderDecode | None:
        """The decode of the first n−s arrivals (more while their set decodes above
        ``tol``, as :meth:`offer` takes them), as the partition weights aᵀB_F: what
        :meth:`decode` gives, from the order alone (the vectorized simulator's shortcut)."""
        code = self._code()
        wait = self._decoding().wait  # extended rounds are counted as offer() counts them
        arrived: list[int] = []
        for worker in order.tolist():
            arrived.append(int(worker))
            if len(arrived) >= self.wanted:
                _, vec = code.weights(arrived)
                if wait.judge(len(arrived), self.wanted, code.n, vec.residual, self.tol):
                    break
        if len(arrived) < self.wanted:
            raise DecodeError(f"{self.name}: {len(arrived)} of {self.wanted} arrivals")
        a, vec = code.weights(arrived)
        self._judge(vec)
        weights = np.asarray(a @ code.B[arrived], dtype=np.float64)
        return OrderDecode(len(arrived), weights, True, tuple(arrived), vec.residual)

    def feasible(self, outstanding: frozenset[int]) -> bool:
        if self.code is None:
            return True
        decoding = self._decoding()
        pending = len(outstanding - set(decoding.arrived))
        return decoding.feasible(pending)
