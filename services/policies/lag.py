"""Lazy aggregation: ``lag-wk``, ``lag-ps`` (Chen et al., LAG) and ``g-lag``, ``lagc``
(Zhang & Simeone, LAGC; reconstructed rules, see SCHEMES.md and docs/lag.md).

The coordinator keeps one message per *unit* (a worker, or for g-lag a group) and steps
with the sum of the latest ones, fresh or stale:

    ∇ᵏ = Σ_units latest_u,   θᵏ⁺¹ = θᵏ − α(∇ᵏ / N + λθᵏ).

A unit refreshes its message only when its trigger fires, compared with

    RHSᵏ = (1 / (α² M²)) Σ_{d=1..D} ξ_d ‖θ^{k+1−d} − θ^{k−d}‖²,   ξ_d = ξ / D,

(α: the step size of round k, ``JobContext.step_at``; the base step unless a schedule decays it)

where M is the number of units. Scales: a message is a gradient *sum* g (the coordinator
divides by N), so a change δg of a message is a change δg/N of the objective's gradient;
LAG-WK's worker test ‖δ∇f_m‖² > RHS becomes ‖δg_m‖² > N²·RHS, which is the threshold sent.
L_m are smoothness constants of f_m(θ) = (1/N)Σ_{x∈D_m} ℓ(x; θ) computed from the data at
bind time (least squares λ_max(X_mᵀX_m)/N, logistic ¼λ_max/N); the L2 term is applied
fresh by the coordinator every round, so it never goes stale and is not part of L_m.
During the first D rounds every unit refreshes.

- ``lag-wk``: every worker computes every round; the worker uploads only if its message
  moved by more than the threshold (``codedgd.services.compute.lazy``), else sends "skipped".
- ``lag-ps``: the coordinator contacts worker m only if L_m²‖θ̂_m − θᵏ‖² > RHSᵏ.
- ``g-lag``: groups of s+1 workers share a shard (fractional repetition placement); the
  lag-ps rule picks the groups; the first arrival of each picked group is used.
- ``lagc``: cyclic-code placement (S+1 partitions per worker); the coordinator keeps each
  worker's last coded message ĉ_i; workers whose trigger (the lag-ps rule with
  L_i = Σ_j |B_ij| L_j) does not fire count at once with their stale message, the others
  are contacted and count on arrival; the round stops once n−S count and decodes
  Σ_{i∈F} a_i ĉ_i with aᵀB_F = 1ᵀ (least squares, residual checked). When the messages
  that count decode above ``tol`` (a near-singular B_F), the round takes every contacted
  worker's message until they do, as ``cyclic`` does (``extended_rounds``).
"""

from __future__ import annotations

from abc import ABC
from collections import deque

import numpy as np

from codedgd.services.codes.cyclic import CyclicCode
from codedgd.services.codes.frc import divisors, frc_groups
from codedgd.services.compute.lazy import THRESHOLD_PARAM
from codedgd.services.errors import ConfigError, DecodeError, PlanError
from codedgd.services.policies.base import (
    Estimate,
    JobContext,
    Param,
    Plan,
    Policy,
    ResidualWait,
    RoundSpec,
    WorkerPlan,
    check_n,
)
from codedgd.services.policies.cyclic import check_code_options, cyclic_plan
from codedgd.services.policies.frc import check_one_partition_per_worker, check_payload, nearest
from codedgd.services.policies.registry import register

DEFAULT_D = 10


class LagHistory:
    """The right-hand side RHSᵏ of LAG's triggers, from the last D moves of θ."""

    def __init__(self, D: int, xi: float) -> None:
        if D < 1:
            raise ConfigError(f"LAG needs D >= 1 rounds of history, got D={D}")
        if not xi >= 0:
            raise ConfigError(f"LAG needs xi >= 0, got xi={xi}")
        self.D = D
        self.xi = xi
        self._moves: deque[float] = deque(maxlen=D)  # ‖θᵏ − θᵏ⁻¹‖², newest first
        self._previous: np.ndarray | None = None

    def observe(self, theta: np.ndarray) -> None:
        """Record θᵏ at the start of round k."""
        if self._previous is not None:
            step = theta - self._previous
            self._moves.appendleft(float(step @ step))
        self._previous = np.array(theta, dtype=np.float64, copy=True)

    def rhs(self, step_size: float, units: int) -> float:
        """RHSᵏ = (1/(α²M²)) Σ_d (ξ/D)‖θ^{k+1−d} − θ^{k−d}‖² (missing moves count 0)."""
        weighted = (self.xi / self.D) * sum(self._moves)
        return weighted / (step_size**2 * units**2)


class _Lazy(Policy, ABC):
    """Shared state: the latest message per unit, θ̂ per unit, RHS history, warm-up."""

    exact = False
    default_xi = 10.0

    def __init__(self, D: int = DEFAULT_D, xi: float | None = None) -> None:
        self.history = LagHistory(D, self.default_xi if xi is None else xi)
        self.D = D
        self._n = 0
        self._units = 0
        self._context: JobContext | None = None
        self._latest: np.ndarray | None = None  # (units, length): last message per unit
        self._has = np.zeros(0, dtype=bool)  # unit has a message
        self._theta_hat: np.ndarray | None = None  # (units, dim): θ at that message
        self._theta: np.ndarray | None = None  # θᵏ of the running round
        self._t = -1
        self._fresh: set[int] = set()  # units refreshed this round
        self.smoothness = np.zeros(0)  # L per unit (the lag-ps rule), set by bind()
        self.uploads_total = 0

    # ------------------------------------------------------------ helpers

    def divergence_hint(self) -> str:
        if self.history.xi < 1.0:
            return ""
        return (
            f"{self.name}'s trigger weight xi={self.history.xi:g} is outside LAG's "
            "convergence condition (xi < 1) and can diverge in long runs: try --param xi=1 "
            "(docs/lag.md)"
        )

    def bind(self, context: JobContext) -> None:
        self._context = context

    def _ctx(self) -> JobContext:
        if self._context is None:
            raise DecodeError(f"{self.name}: used before bind() (the coordinator binds the data)")
        return self._context

    def _start(self, t: int, theta: np.ndarray, length: int) -> None:
        dim = int(theta.shape[0])
        if self._latest is None or self._latest.shape != (self._units, length):
            self._latest = np.zeros((self._units, length), dtype=np.float64)
            self._theta_hat = np.zeros((self._units, dim), dtype=np.float64)
            self._has = np.zeros(self._units, dtype=bool)
        self.history.observe(theta)
        self._theta = np.array(theta, dtype=np.float64, copy=True)
        self._t = t
        self._fresh = set()

    def warming_up(self) -> bool:
        """Every unit refreshes during the first D rounds."""
        return self._t < self.D

    def rhs(self) -> float:
        ctx = self._ctx()
        return self.history.rhs(ctx.step_at(self._t), self._units)

    def _stale_distance(self) -> np.ndarray:
        """‖θ̂_u − θᵏ‖² per unit."""
        assert self._theta_hat is not None and self._theta is not None
        diff = self._theta_hat - self._theta
        out: np.ndarray = np.einsum("ij,ij->i", diff, diff)
        return out

    def _ps_triggered(self, smoothness: np.ndarray) -> np.ndarray:
        """LAG-PS rule per unit: L_u²‖θ̂_u − θᵏ‖² > RHSᵏ, or no message yet, or warm-up."""
        if smoothness.shape != (self._units,):
            raise DecodeError(f"{self.name}: used before bind() (the coordinator binds the data)")
        if self.warming_up():
            return np.ones(self._units, dtype=bool)
        fired: np.ndarray = smoothness**2 * self._stale_distance() > self.rhs()
        return fired | ~self._has

    def _store(self, unit: int, payload: np.ndarray) -> None:
        assert self._latest is not None and self._theta_hat is not None
        assert self._theta is not None
        self._latest[unit] = payload
        self._theta_hat[unit] = self._theta
        self._has[unit] = True
        self._fresh.add(unit)
        self.uploads_total += 1

    def latest(self, unit: int) -> np.ndarray | None:
        """The unit's last message (None before its first), for tests and tools."""
        if self._latest is None or not self._has[unit]:
            return None
        out: np.ndarray = self._latest[unit].copy()
        return out

    def aggregate(self) -> np.ndarray:
        """Σ_units latest_u, summed in unit order (deterministic)."""
        if self._latest is None or not self._has.all():
            missing = [] if self._latest is None else np.flatnonzero(~self._has).tolist()
            raise DecodeError(f"{self.name}: no message yet from unit(s) {missing}")
        out: np.ndarray = self._latest.sum(axis=0)
        return out

    def _plan_one_each(self, n_workers: int, n_partitions: int) -> Plan:
        """Worker m holds partition m and is its own unit (lag-wk, lag-ps)."""
        check_n(n_workers, n_partitions)
        check_one_partition_per_worker(self.name, n_workers, n_partitions)
        self._n = self._units = n_workers
        workers = tuple(WorkerPlan.summing((i,)) for i in range(n_workers))
        return Plan(n_workers, n_partitions, workers)

    def _smoothness_of(self, partition_sets: list[tuple[int, ...]]) -> np.ndarray:
        ctx = self._ctx()
        return np.array([ctx.smoothness(p) for p in partition_sets], dtype=np.float64)


_D_PARAM = Param(
    "D", int, DEFAULT_D, "rounds of θ history in the trigger; all upload in the first D"
)


def _xi_param(default: float) -> Param:
    return Param("xi", float, default, f"trigger weight ξ (ξ_d = ξ/D); authors: {default:g}")


@register
class LagWK(_Lazy):
    name = "lag-wk"
    summary = (
        "LAG-WK: every worker computes, uploads only when its gradient moved more than the "
        "threshold sent with the round; the coordinator reuses the last upload otherwise"
    )
    default_xi = 1.0
    parameters = (_D_PARAM, _xi_param(1.0))

    def plan(self, n_workers: int, n_partitions: int) -> Plan:
        return self._plan_one_each(n_workers, n_partitions)

    def begin_round(self, t: int, theta: np.ndarray) -> RoundSpec:
        self._start(t, theta, int(theta.shape[0]))
        self._arrived: set[int] = set()
        # −1 during warm-up: every worker uploads (and remembers what it sent).
        threshold = -1.0 if self.warming_up() else self._ctx().n_rows ** 2 * self.rhs()
        params = {THRESHOLD_PARAM: threshold}
        return RoundSpec(round=t, workers=tuple(range(self._n)), params=params)

    def offer(self, worker: int, payload: np.ndarray | None) -> bool:
        _check_worker(self.name, worker, self._n, self._arrived)
        if payload is None:
            if not self._has[worker]:
                raise DecodeError(
                    f"lag-wk: worker {worker} skipped its upload but never uploaded before"
                )
        else:
            assert self._latest is not None
            self._store(worker, check_payload(self.name, worker, payload, self._latest.shape[1]))
        self._arrived.add(worker)
        return len(self._arrived) == self._n

    def decode(self) -> Estimate:
        if len(self._arrived) < self._n:
            raise DecodeError(f"lag-wk: {len(self._arrived)} of {self._n} workers answered")
        return Estimate(self.aggregate(), tuple(range(self._n)), exact=len(self._fresh) == self._n)

    def feasible(self, outstanding: frozenset[int]) -> bool:
        return set(range(self._n)) - self._arrived <= outstanding


@register
class LagPS(_Lazy):
    name = "lag-ps"
    summary = (
        "LAG-PS: the coordinator contacts worker m only if L_m^2 |theta_hat_m - theta|^2 > RHS "
        "(L_m from the data); the others' last uploads are reused"
    )
    default_xi = 10.0
    parameters = (_D_PARAM, _xi_param(10.0))

    def plan(self, n_workers: int, n_partitions: int) -> Plan:
        return self._plan_one_each(n_workers, n_partitions)

    def bind(self, context: JobContext) -> None:
        super().bind(context)
        self.smoothness = self._smoothness_of([(m,) for m in range(self._n)])

    def begin_round(self, t: int, theta: np.ndarray) -> RoundSpec:
        self._start(t, theta, int(theta.shape[0]))
        self._arrived: set[int] = set()
        self._selected = frozenset(np.flatnonzero(self._ps_triggered(self.smoothness)).tolist())
        return RoundSpec(round=t, workers=tuple(sorted(self._selected)))

    def offer(self, worker: int, payload: np.ndarray | None) -> bool:
        _check_worker(self.name, worker, self._n, self._arrived)
        if worker not in self._selected:
            raise DecodeError(f"lag-ps: worker {worker} was not contacted in round {self._t}")
        assert self._latest is not None
        self._store(worker, check_payload(self.name, worker, payload, self._latest.shape[1]))
        self._arrived.add(worker)
        return self._arrived >= self._selected

    def decode(self) -> Estimate:
        if not self._arrived >= self._selected:
            raise DecodeError(
                f"lag-ps: {len(self._arrived)} of {len(self._selected)} selected workers arrived"
            )
        return Estimate(self.aggregate(), tuple(range(self._n)), exact=len(self._fresh) == self._n)

    def feasible(self, outstanding: frozenset[int]) -> bool:
        return self._selected - self._arrived <= outstanding


@register
class GroupLag(_Lazy):
    name = "g-lag"
    summary = (
        "G-LAG: groups of s+1 workers share a shard; the lag-ps rule picks groups; the first "
        "arrival of each picked group is used, the rest are cancelled"
    )
    default_xi = 10.0
    parameters = (
        Param("s", int, 1, "stragglers tolerated per group; groups of s+1 (s+1 must divide n)"),
        _D_PARAM,
        _xi_param(10.0),
    )

    def __init__(self, s: int = 1, D: int = DEFAULT_D, xi: float | None = None) -> None:
        super().__init__(D, xi)
        self.s = s
        self.groups: tuple[tuple[int, ...], ...] = ()

    def plan(self, n_workers: int, n_partitions: int) -> Plan:
        check_n(n_workers, n_partitions)
        check_one_partition_per_worker(self.name, n_workers, n_partitions)
        r = self.s + 1
        if self.s < 0 or n_workers % r:
            valid = [d - 1 for d in divisors(n_workers)]
            raise PlanError(
                f"g-lag needs groups of s+1 dividing n; got s={self.s}, n={n_workers}: choose s "
                f"in {nearest(valid, self.s)}"
            )
        self._n = n_workers
        self.groups = frc_groups(n_workers, r)
        self._units = len(self.groups)
        self._group = [g for g, members in enumerate(self.groups) for _ in members]
        workers = tuple(WorkerPlan.summing(self.groups[self._group[i]]) for i in range(n_workers))
        return Plan(n_workers, n_partitions, workers)

    def bind(self, context: JobContext) -> None:
        super().bind(context)
        self.smoothness = self._smoothness_of(list(self.groups))

    def begin_round(self, t: int, theta: np.ndarray) -> RoundSpec:
        self._start(t, theta, int(theta.shape[0]))
        self._seen: set[int] = set()
        fired = self._ps_triggered(self.smoothness)
        self._selected = frozenset(np.flatnonzero(fired).tolist())
        self._used: dict[int, int] = {}  # group → worker whose message was used
        workers = tuple(w for g in sorted(self._selected) for w in self.groups[g])
        return RoundSpec(round=t, workers=workers)

    def offer(self, worker: int, payload: np.ndarray | None) -> bool:
        _check_worker(self.name, worker, self._n, self._seen)
        g = self._group[worker]
        if g not in self._selected:
            raise DecodeError(
                f"g-lag: worker {worker}'s group {g} was not picked in round {self._t}"
            )
        assert self._latest is not None
        vector = check_payload(self.name, worker, payload, self._latest.shape[1])
        self._seen.add(worker)
        if g not in self._used:
            self._store(g, vector)
            self._used[g] = worker
        return len(self._used) == len(self._selected)

    def superseded(self) -> frozenset[int]:
        """The other members of every group whose first message arrived."""
        return frozenset(w for g in self._used for w in self.groups[g] if w not in self._seen)

    def decode(self) -> Estimate:
        if len(self._used) < len(self._selected):
            raise DecodeError(
                f"g-lag: {len(self._used)} of {len(self._selected)} picked groups arrived"
            )
        return Estimate(
            self.aggregate(),
            tuple(sorted(self._used.values())),
            exact=len(self._fresh) == self._units,
        )

    def feasible(self, outstanding: frozenset[int]) -> bool:
        live = {self._group[w] for w in outstanding - self._seen}
        return all(g in self._used or g in live for g in self._selected)


@register
class LagCoded(_Lazy):
    name = "lagc"
    summary = (
        "LAGC: cyclic-code placement; workers whose lag-ps trigger does not fire count at "
        "once with their last coded message; stop at n-S, decode with the cyclic decoder"
    )
    default_xi = 10.0
    parameters = (
        Param("s", int, 1, "stragglers tolerated S (0 <= S < n); S+1 partitions per worker"),
        _D_PARAM,
        _xi_param(10.0),
        Param("h", str, "orthonormal", "the cyclic code's H: orthonormal or gaussian"),
        Param("tol", float, 1e-6, "largest decode residual max|a^T B_F - 1^T| accepted"),
    )

    def __init__(
        self,
        s: int = 1,
        D: int = DEFAULT_D,
        xi: float | None = None,
        h: str = "orthonormal",
        tol: float = 1e-6,
        seed: int = 0,
    ) -> None:
        super().__init__(D, xi)
        check_code_options(self.name, h, tol)
        self.s = s
        self.h = h
        self.tol = tol
        self.seed = seed
        self.code: CyclicCode | None = None
        self.residual_errors = 0
        self.extended_rounds = 0  # rounds that took more than n-S messages for a good residual
        self.last_weights: dict[int, float] = {}
        self._acceptable: set[int] = set()  # workers whose (stale or fresh) message counts
        self._seen: set[int] = set()  # contacted workers that answered this round
        self._contacted: frozenset[int] = frozenset()
        # Whether the messages that count decode within tol, and the wait-past-n-S rule
        # (cyclic's); lagc counts its own extended rounds, stale messages included.
        self._wait = ResidualWait()

    def plan(self, n_workers: int, n_partitions: int) -> Plan:
        self.code, plan = cyclic_plan(self.name, self.s, self.h, self.seed, n_workers, n_partitions)
        self._n = self._units = n_workers
        return plan

    def _code(self) -> CyclicCode:
        if self.code is None:
            raise DecodeError("lagc: used before plan()")
        return self.code

    def bind(self, context: JobContext) -> None:
        super().bind(context)
        code = self._code()
        per_partition = self._smoothness_of([(j,) for j in range(code.n)])
        # L of the coded function c_i = Σ_j B_ij f_j is at most Σ_j |B_ij| L_j.
        self.smoothness = np.abs(code.B) @ per_partition

    @property
    def wanted(self) -> int:
        return self._code().n - self.s

    def begin_round(self, t: int, theta: np.ndarray) -> RoundSpec:
        self._start(t, theta, int(theta.shape[0]))
        fired = self._ps_triggered(self.smoothness)
        self._acceptable = set(np.flatnonzero(~fired).tolist())
        self._seen = set()
        self._wait.good = self._decodes_well()
        if self._wait.good:  # enough stale messages count, and they decode: no one is contacted
            self._contacted = frozenset()
            return RoundSpec(round=t, workers=())
        if len(self._acceptable) >= self.wanted:
            self.extended_rounds += 1  # enough, but near-singular: ask the others too
        self._contacted = frozenset(np.flatnonzero(fired).tolist())
        return RoundSpec(round=t, workers=tuple(sorted(self._contacted)))

    def _decodes_well(self) -> bool:
        """At least n-S messages count and their decoding residual is within tol."""
        if len(self._acceptable) < self.wanted:
            return False
        return self._code().decoding_vector(self.decoding_set()).residual <= self.tol

    def offer(self, worker: int, payload: np.ndarray | None) -> bool:
        _check_worker(self.name, worker, self._n, self._seen)
        if worker not in self._contacted:
            raise DecodeError(f"lagc: worker {worker} was not contacted in round {self._t}")
        assert self._latest is not None
        self._seen.add(worker)
        if self._wait.good:
            return True  # decodable already: a later message is not needed
        self._store(worker, check_payload(self.name, worker, payload, self._latest.shape[1]))
        self._acceptable.add(worker)
        enough_before = len(self._acceptable) - 1 >= self.wanted
        self._wait.good = self._decodes_well()
        if not self._wait.good and len(self._acceptable) == self.wanted and not enough_before:
            self.extended_rounds += 1  # the first n-S cannot decode: wait for more
        # Decodable, or no one left to wait for (decode() then refuses, naming the residual).
        return self._wait.good or self._seen == self._contacted

    def decoding_set(self) -> tuple[int, ...]:
        """F: the workers whose (fresh or stale) coded message the decode uses."""
        return tuple(sorted(self._acceptable))

    def decode(self) -> Estimate:
        if len(self._acceptable) < self.wanted:
            raise DecodeError(f"lagc: {len(self._acceptable)} of {self.wanted} messages count")
        assert self._latest is not None
        F = self.decoding_set()
        vec = self._code().decoding_vector(F)
        if not vec.residual <= self.tol:
            self.residual_errors += 1
            raise DecodeError(
                f"lagc: decode residual max|a^T B_F - 1^T| = {vec.residual:.3g} exceeds "
                f"tol={self.tol:g} for F = {list(F)} (condition number {vec.condition:.3g}), "
                "and no other worker is left to wait for; use "
                + ("" if self.h == "orthonormal" else "h=orthonormal, ")
                + "a smaller s or a larger tol"
            )
        self.last_weights = dict(zip(F, vec.a.tolist(), strict=True))
        gradient: np.ndarray = vec.a @ self._latest[list(F)]
        exact = all(i in self._fresh for i in F)
        return Estimate(gradient, F, exact=exact, residual=vec.residual)

    def feasible(self, outstanding: frozenset[int]) -> bool:
        if self._wait.good:
            return True
        pending = len(outstanding - self._seen - self._acceptable)
        return self._wait.feasible(len(self._acceptable), pending, self.wanted)


def _check_worker(name: str, worker: int, n: int, seen: set[int]) -> None:
    if not 0 <= worker < n:
        raise DecodeError(f"{name}: unknown worker {worker} (n = {n})")
    if worker in seen:
        raise DecodeError(f"{name}: worker {worker} offered twice in one round")
