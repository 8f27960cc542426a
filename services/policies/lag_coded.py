"""Lazy aggregation with gradient-code placements: ``g-lag`` and ``lagc`` (Zhang & Simeone,
LAGC, IEEE TNNLS 2021; reconstructed rules, see SCHEMES.md and docs/lag.md).

Both keep LAG's rule (:mod:`.lag`: one message per unit, refreshed only when its trigger
fires against RHSᵏ) and add straggler tolerance through data placement:

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

import numpy as np

from codedgd.services.codes.cyclic import CyclicCode
from codedgd.services.codes.frc import divisors, frc_groups
from codedgd.services.codes.residual import ResidualWait
from codedgd.services.errors import DecodeError, PlanError
from codedgd.services.policies.base import (
    Estimate,
    JobContext,
    Param,
    Plan,
    RoundSpec,
    WorkerPlan,
    check_n,
    check_payload,
)
from codedgd.services.policies.cyclic import check_code_options, cyclic_plan
from codedgd.services.policies.frc import check_one_partition_per_worker, nearest
from codedgd.services.policies.lag import (
    D_PARAM,
    DEFAULT_D,
    LazyPolicy,
    check_worker,
    ride_param,
    xi_param,
)
from codedgd.services.policies.registry import register


@register
class GroupLag(LazyPolicy):
    name = "g-lag"
    summary = (
        "G-LAG: groups of s+1 workers share a shard; the lag-ps rule picks groups; the first "
        "arrival of each picked group is used, the rest are cancelled"
    )
    default_xi = 10.0
    parameters = (
        Param("s", int, 1, "stragglers tolerated per group; groups of s+1 (s+1 must divide n)"),
        D_PARAM,
        xi_param(10.0),
        ride_param("groups"),
    )

    def __init__(
        self, s: int = 1, D: int = DEFAULT_D, xi: float | None = None, ride: float = 1.0
    ) -> None:
        super().__init__(D, xi, ride)
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
        check_worker(self.name, worker, self._n, self._seen)
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

    def follow(self, t: int, theta: np.ndarray) -> None:
        """Round t is run by another rule on the same groups (``auto``'s eager rounds):
        keep the θ history, and take the group messages it gets with :meth:`keep`, so a
        switch to lazy rounds goes on from them."""
        self._start(t, theta, int(theta.shape[0]))

    def keep(self, worker: int, payload: np.ndarray | None) -> None:
        """A followed round's message from ``worker``, computed at that round's θ: its
        group's latest, unless the group already has this round's."""
        g = self._group[worker]
        if g not in self._fresh:
            assert self._latest is not None
            self._store(g, check_payload(self.name, worker, payload, self._latest.shape[1]))

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
class LagCoded(LazyPolicy):
    name = "lagc"
    summary = (
        "LAGC: cyclic-code placement; workers whose lag-ps trigger does not fire count at "
        "once with their last coded message; stop at n-S, decode with the cyclic decoder"
    )
    default_xi = 10.0
    parameters = (
        Param("s", int, 1, "stragglers tolerated S (0 <= S < n); S+1 partitions per worker"),
        D_PARAM,
        xi_param(10.0),
        Param("h", str, "orthonormal", "the cyclic code's H: orthonormal or gaussian"),
        Param("tol", float, 1e-6, "largest decode residual max|a^T B_F - 1^T| accepted"),
        Param(
            "ride",
            float,
            1.0,
            "in a round that contacts some worker, also contact those past this fraction of "
            "their trigger; they count at once with their last message, as untriggered "
            "workers do, and a fresh one replaces it if it comes before the round ends "
            "(never waited for); 1: LAG's rule",
        ),
    )

    def __init__(
        self,
        s: int = 1,
        D: int = DEFAULT_D,
        xi: float | None = None,
        h: str = "orthonormal",
        tol: float = 1e-6,
        seed: int = 0,
        ride: float = 1.0,
    ) -> None:
        super().__init__(D, xi, ride)
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
        self._riders: frozenset[int] = frozenset()  # contacted, but never waited for
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
        fired, riders = self._ps_riders(self.smoothness)
        self._acceptable = set(np.flatnonzero(~fired).tolist())  # (riders count at once)
        self._seen = set()
        self._wait.good = self._decodes_well()
        if self._wait.good:  # enough stale messages count, and they decode: no one is contacted
            self._contacted = self._riders = frozenset()
            return RoundSpec(round=t, workers=())
        if len(self._acceptable) >= self.wanted:
            self.extended_rounds += 1  # enough, but near-singular: ask the others too
        self._riders = frozenset(np.flatnonzero(riders).tolist())
        self._contacted = frozenset(np.flatnonzero(fired).tolist()) | self._riders
        return RoundSpec(round=t, workers=tuple(sorted(self._contacted)))

    def _decodes_well(self) -> bool:
        """At least n-S messages count and their decoding residual is within tol."""
        if len(self._acceptable) < self.wanted:
            return False
        return self._code().decoding_vector(self.decoding_set()).residual <= self.tol

    def offer(self, worker: int, payload: np.ndarray | None) -> bool:
        check_worker(self.name, worker, self._n, self._seen)
        if worker not in self._contacted:
            raise DecodeError(f"lagc: worker {worker} was not contacted in round {self._t}")
        assert self._latest is not None
        if self._wait.good:
            self._seen.add(worker)
            return True  # decodable already: a later message is not needed
        vector = check_payload(self.name, worker, payload, self._latest.shape[1])
        self._seen.add(worker)  # after the check: a faulty worker's replacement may offer
        self._store(worker, vector)  # (a rider's fresh message replaces its stale one)
        enough_before = len(self._acceptable) >= self.wanted
        self._acceptable.add(worker)
        self._wait.good = self._decodes_well()
        if not self._wait.good and len(self._acceptable) == self.wanted and not enough_before:
            self.extended_rounds += 1  # the first n-S cannot decode: wait for more
        # Decodable, or no one left to wait for (decode() then refuses, naming the residual):
        # riders are not waited for, their arrivals cannot change the set that counts.
        return self._wait.good or self._contacted - self._riders <= self._seen

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
