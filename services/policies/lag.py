"""Lazy aggregation: ``lag-wk``, ``lag-ps`` (Chen et al., LAG), and the machinery the
coded variants in :mod:`.lag_coded` (``g-lag``, ``lagc``) share (see SCHEMES.md and
docs/lag.md).

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
- ``g-lag``, ``lagc``: the coded variants, in :mod:`.lag_coded`.
"""

from __future__ import annotations

from abc import ABC
from collections import deque
from collections.abc import Mapping
from typing import Any

import numpy as np

from codedgd.services.compute.lazy import THRESHOLD_PARAM
from codedgd.services.errors import ConfigError, DecodeError, WorkerFault
from codedgd.services.policies.base import (
    Estimate,
    JobContext,
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


class LazyPolicy(Policy, ABC):
    """Shared state: the latest message per unit, θ̂ per unit, RHS history, warm-up."""

    exact = False
    default_xi = 10.0

    def __init__(self, D: int = DEFAULT_D, xi: float | None = None, ride: float = 1.0) -> None:
        self.history = LagHistory(D, self.default_xi if xi is None else xi)
        self.D = D
        self.ride = check_ride(self.name, ride)
        self._n = 0
        self._units = 0
        self._context: JobContext | None = None
        self._latest: np.ndarray | None = None  # (units, length): last message per unit
        self._has = np.zeros(0, dtype=bool)  # unit has a message
        self._theta_hat: np.ndarray | None = None  # (units, dim): θ at that message
        self._theta: np.ndarray | None = None  # θᵏ of the running round
        self._t = -1
        self._rounds = 0  # rounds begun (the warm-up counts them; a restored state goes on)
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

    def state(self) -> dict[str, Any]:
        """Each unit's last message and the θ it was taken at, the θ history, counters."""
        history = self.history

        def copy(a: np.ndarray | None) -> np.ndarray | None:
            return None if a is None else a.copy()

        return {
            "t": self._t,
            "rounds": self._rounds,
            "latest": copy(self._latest),
            "has": self._has.copy(),
            "theta_hat": copy(self._theta_hat),
            "moves": list(history._moves),
            "previous": copy(history._previous),
            "uploads_total": self.uploads_total,
        }

    def load_state(self, state: Mapping[str, Any]) -> None:
        latest, theta_hat = state["latest"], state["theta_hat"]
        has = np.asarray(state["has"], dtype=bool)
        if latest is not None and (
            latest.ndim != 2 or latest.shape[0] != self._units or has.shape != (self._units,)
        ):
            raise ConfigError(
                f"{self.name}: the checkpoint holds messages of {latest.shape[0]} units, "
                f"this plan has {self._units}"
            )
        self._t = int(state["t"])
        self._rounds = int(state.get("rounds", self._t + 1))  # (older checkpoints: t + 1)
        self._latest = None if latest is None else np.array(latest, dtype=np.float64)
        self._theta_hat = None if theta_hat is None else np.array(theta_hat, dtype=np.float64)
        self._has = has.copy()
        self.history._moves.clear()
        self.history._moves.extend(float(m) for m in state["moves"])
        previous = state["previous"]
        self.history._previous = None if previous is None else np.array(previous, np.float64)
        self.uploads_total = int(state["uploads_total"])

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
        self._rounds += 1
        self._fresh = set()

    def warming_up(self) -> bool:
        """Every unit refreshes during the first D rounds (of the job: a state restored by
        :meth:`load_state` has its rounds behind it)."""
        return self._rounds <= self.D

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
        """LAG-PS rule per unit: L_u²‖θ̂_u − θᵏ‖² > RHSᵏ, or no message yet, or warm-up;
        and with ``ride`` < 1, once any unit is picked, every unit with
        L_u²‖θ̂_u − θᵏ‖² > ride · RHSᵏ too (it rides along in a round that is asked anyway).

        Riding along keeps LAG's guarantee: each unit left out still satisfies LAG's skip
        condition, and a unit refreshed early only has a fresher message. What it changes
        is the rhythm: units that would fire a round or two apart are asked together, so
        fewer rounds wait for anyone (docs/lag.md, "Riding along")."""
        fired, riders = self._ps_riders(smoothness)
        picked: np.ndarray = fired | riders
        return picked

    def _ps_riders(self, smoothness: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(the units LAG-PS's own rule picks, the units that ride along with them): see
        :meth:`_ps_triggered`. A rider meets LAG's skip condition: its last message may
        stand in for it."""
        if smoothness.shape != (self._units,):
            raise DecodeError(f"{self.name}: used before bind() (the coordinator binds the data)")
        none = np.zeros(self._units, dtype=bool)
        if self.warming_up():
            return np.ones(self._units, dtype=bool), none
        lhs = smoothness**2 * self._stale_distance()
        rhs = self.rhs()
        fired: np.ndarray = (lhs > rhs) | ~self._has
        if self.ride < 1.0 and fired.any():
            riders: np.ndarray = (lhs > self.ride * rhs) & ~fired
            return fired, riders
        return fired, none

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


D_PARAM = Param(
    "D", int, DEFAULT_D, "rounds of θ history in the trigger; all upload in the first D"
)


def xi_param(default: float) -> Param:
    return Param("xi", float, default, f"trigger weight ξ (ξ_d = ξ/D); authors: {default:g}")


def check_ride(name: str, ride: float) -> float:
    """``ride`` itself, or a ConfigError naming the range."""
    if not 0.0 <= ride <= 1.0:
        raise ConfigError(
            f"{name}: ride={ride!r} is not a fraction in [0, 1] (1: LAG's own rule, "
            "no unit rides along; 0.5: units half way to their trigger ride along)"
        )
    return ride


def ride_param(units: str, default: float = 1.0) -> Param:
    """The ``ride`` option of the policies that pick units by the lag-ps rule."""
    return Param(
        "ride",
        float,
        default,
        f"in a round that asks some {units}, also ask those past this fraction of their "
        f"trigger (L^2 |theta_hat - theta|^2 > ride * RHS); 1: LAG's rule, 0: all {units}",
    )


@register
class LagWK(LazyPolicy):
    name = "lag-wk"
    summary = (
        "LAG-WK: every worker computes, uploads only when its gradient moved more than the "
        "threshold sent with the round; the coordinator reuses the last upload otherwise"
    )
    default_xi = 1.0
    parameters = (D_PARAM, xi_param(1.0))

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
        check_worker(self.name, worker, self._n, self._arrived)
        if payload is None:
            if not self._has[worker]:
                raise WorkerFault(
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

    def worker_memory(self, worker: int) -> np.ndarray | None:
        # The worker uploads its message itself, so its last upload is this copy.
        return self.latest(worker)


@register
class LagPS(LazyPolicy):
    name = "lag-ps"
    summary = (
        "LAG-PS: the coordinator contacts worker m only if L_m^2 |theta_hat_m - theta|^2 > RHS "
        "(L_m from the data); the others' last uploads are reused"
    )
    default_xi = 10.0
    parameters = (D_PARAM, xi_param(10.0), ride_param("workers"))

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
        check_worker(self.name, worker, self._n, self._arrived)
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


def check_worker(name: str, worker: int, n: int, seen: set[int]) -> None:
    if not 0 <= worker < n:
        raise DecodeError(f"{name}: unknown worker {worker} (n = {n})")
    if worker in seen:
        raise DecodeError(f"{name}: worker {worker} offered twice in one round")
