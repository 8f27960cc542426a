"""``frc``: Tandon's fractional repetition code (exact), and helpers shared by code policies.

Groups of s+1 consecutive workers hold the same s+1 partitions and send their plain
sum; the round is decodable once every group has an arrival, and the estimate is the
sum of one message per group. See :mod:`codedgd.services.codes.frc` and SCHEMES.md.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from codedgd.services.codes.frc import divisors, frc_groups
from codedgd.services.errors import DecodeError, PlanError
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
from codedgd.services.policies.registry import register


def nearest(choices: Iterable[int], asked: int, count: int = 4) -> str:
    """The ``count`` valid choices closest to what was asked, as "{a,b,c}"."""
    picks = sorted(sorted(set(choices), key=lambda c: (abs(c - asked), c))[:count])
    return "{" + ",".join(str(c) for c in picks) + "}"


def check_one_partition_per_worker(name: str, n_workers: int, n_partitions: int) -> None:
    if n_partitions != n_workers:
        raise PlanError(
            f"{name} places the k = n partitions itself: use k = n = {n_workers} partitions "
            f"(got k = {n_partitions}; leave job.partitions at 0)"
        )


class GroupSum(Policy):
    """Fractional-repetition placement with groups of ``group_size``; sums one per group."""

    def __init__(self) -> None:
        self._n = 0
        self._r = 1
        self._dim = 0
        self._first: list[np.ndarray | None] = []
        self._used: list[int] = []
        self._arrived: set[int] = set()
        self._started = False

    def _plan_groups(self, n_workers: int, n_partitions: int, group_size: int) -> Plan:
        self._n = n_workers
        self._r = group_size
        workers = tuple(
            WorkerPlan.summing(members)
            for members in frc_groups(n_workers, group_size)
            for _ in members
        )
        return Plan(n_workers, n_partitions, workers)

    @property
    def n_groups(self) -> int:
        return self._n // self._r

    def begin_round(self, t: int, theta: np.ndarray) -> RoundSpec:
        if self._n == 0:
            raise DecodeError(f"{self.name}: begin_round() before plan()")
        self._dim = int(theta.shape[0])
        self._first = [None] * self.n_groups
        self._used = []
        self._arrived = set()
        self._started = True
        return RoundSpec(round=t, workers=tuple(range(self._n)))

    def _record(self, worker: int, payload: np.ndarray | None) -> None:
        vector = self._arrival(worker, payload)
        group = worker // self._r
        if self._first[group] is None:  # later members of a covered group are not needed
            self._first[group] = vector
            self._used.append(worker)

    def _arrival(self, worker: int, payload: np.ndarray | None) -> np.ndarray:
        """Check an arrival and count it; its payload as a vector."""
        if not self._started:
            raise DecodeError(f"{self.name}: offer() before begin_round()")
        if not 0 <= worker < self._n:
            raise DecodeError(f"{self.name}: unknown worker {worker} (n = {self._n})")
        if worker in self._arrived:
            raise DecodeError(f"{self.name}: worker {worker} offered twice in one round")
        vector = check_payload(self.name, worker, payload, self._dim)
        self._arrived.add(worker)
        return vector

    def _all_covered(self) -> bool:
        return len(self._used) == self.n_groups

    def _group_sum(self) -> np.ndarray:
        vectors = [v for v in self._first if v is not None]
        out = np.zeros(self._dim, dtype=np.float64) if not vectors else vectors[0].copy()
        for v in vectors[1:]:
            out += v
        return out

    def _order_outcome(self, order: np.ndarray, stop: int, scale: float) -> OrderDecode:
        """:class:`OrderDecode` of the first min(``stop``, all groups covered) arrivals."""
        groups = np.asarray(order, dtype=np.int64) // self._r
        seen, first = np.unique(groups, return_index=True)
        covered_at = int(first.max()) + 1 if len(seen) == self.n_groups else len(order) + 1
        count = min(stop, covered_at)
        if count > len(order):
            raise DecodeError(
                f"{self.name}: {len(order)} arrivals cover {len(seen)} of {self.n_groups} groups"
            )
        kept = first < count
        firsts = np.sort(first[kept])
        weights = np.zeros(self._n)
        for g in seen[kept]:
            weights[g * self._r : (g + 1) * self._r] = scale
        all_covered = len(firsts) == self.n_groups
        used = tuple(int(order[i]) for i in firsts)
        return OrderDecode(count, weights, all_covered and scale == 1.0, used)

    def _coverable(self, outstanding: frozenset[int]) -> bool:
        pending = {w // self._r for w in outstanding if w not in self._arrived}
        return all(f is not None or g in pending for g, f in enumerate(self._first))


@register
class FractionalRepetition(GroupSum):
    name = "frc"
    summary = (
        "Tandon's fractional repetition: groups of s+1 workers share s+1 partitions and "
        "send their sum; done when every group has an arrival; exact, tolerates any s "
        "(with byzantine=e, any e corrupt workers per group too, outvoted)"
    )
    exact = True
    parameters = (
        Param("s", int, 1, "stragglers tolerated (s+1 must divide n)"),
        Param(
            "byzantine",
            int,
            0,
            "corrupt workers outvoted per group (2*byzantine <= s): a group counts once "
            "byzantine+1 of its results agree, and members that disagree are thrown out",
        ),
        Param(
            "vote_tol",
            float,
            1e-6,
            "two results of a group agree when max|a-b| <= vote_tol * max(|a|max, |b|max)",
        ),
    )

    def __init__(self, s: int = 1, byzantine: int = 0, vote_tol: float = 1e-6) -> None:
        super().__init__()
        self.s = s
        self.byzantine = byzantine
        self.vote_tol = vote_tol
        # The vote (byzantine > 0): per group, clusters of agreeing results (the first
        # one's vector stands for the cluster), and the workers outvoted this round.
        self._clusters: list[list[tuple[np.ndarray, list[int]]]] = []
        self._outvoted: set[int] = set()
        self._unreported: list[int] = []

    def plan(self, n_workers: int, n_partitions: int) -> Plan:
        check_n(n_workers, n_partitions)
        check_one_partition_per_worker(self.name, n_workers, n_partitions)
        valid_s = [d - 1 for d in divisors(n_workers)]
        if not 0 <= self.s < n_workers:
            raise PlanError(
                f"frc needs 0 <= s < n; got s={self.s}, n={n_workers}: "
                f"choose s in {nearest(valid_s, self.s)}"
            )
        if n_workers % (self.s + 1):
            raise PlanError(
                f"frc needs s+1 to divide n: s+1={self.s + 1} does not divide n={n_workers}: "
                f"choose s in {nearest(valid_s, self.s)}"
            )
        if self.byzantine < 0 or 2 * self.byzantine > self.s:
            raise PlanError(
                f"frc with byzantine={self.byzantine} needs 0 <= 2*byzantine <= s (a group of "
                f"s+1 must hold byzantine+1 honest results besides byzantine corrupt ones); "
                f"got s={self.s}: choose s >= {2 * max(self.byzantine, 0)} with s+1 dividing "
                f"n={n_workers}, or byzantine <= {self.s // 2}"
            )
        if not self.vote_tol >= 0:
            raise PlanError(f"frc vote_tol must be >= 0, got {self.vote_tol}")
        return self._plan_groups(n_workers, n_partitions, self.s + 1)

    def begin_round(self, t: int, theta: np.ndarray) -> RoundSpec:
        spec = super().begin_round(t, theta)
        self._clusters = [[] for _ in range(self.n_groups)]
        self._outvoted = set()
        self._unreported = []
        return spec

    def offer(self, worker: int, payload: np.ndarray | None) -> bool:
        if self.byzantine == 0:
            self._record(worker, payload)
        else:
            self._vote(worker, self._arrival(worker, payload))
        return self._all_covered()

    def _vote(self, worker: int, vector: np.ndarray) -> None:
        """Count ``worker``'s result in its group's vote (DRACO's majority rule, Chen et al.
        2018): the group's sum is the first value that byzantine+1 of its results agree on;
        a result that disagrees with it exposes its sender."""
        group = worker // self._r
        decided = self._first[group]
        if decided is not None:
            if not self._agree(decided, vector):
                self._expose(worker)
            return
        clusters = self._clusters[group]
        for representative, members in clusters:
            if self._agree(representative, vector):
                members.append(worker)
                break
        else:
            representative, members = vector, [worker]
            clusters.append((representative, members))
        if len(members) == self.byzantine + 1:
            self._first[group] = representative
            self._used.append(members[0])
            for _, others in clusters:
                if others is not members:
                    for w in others:
                        self._expose(w)

    def _agree(self, a: np.ndarray, b: np.ndarray) -> bool:
        if a.shape != b.shape:
            return False
        scale = max(float(np.max(np.abs(a), initial=0.0)), float(np.max(np.abs(b), initial=0.0)))
        return bool(np.max(np.abs(a - b), initial=0.0) <= self.vote_tol * scale)

    def _expose(self, worker: int) -> None:
        if worker not in self._outvoted:
            self._outvoted.add(worker)
            self._unreported.append(worker)

    def suspects(self) -> dict[int, str]:
        exposed = {
            w: f"frc vote: its result disagrees with the {self.byzantine + 1} agreeing results "
            f"of its group (workers {w // self._r * self._r}..{(w // self._r + 1) * self._r - 1})"
            for w in self._unreported
        }
        self._unreported = []
        return exposed

    def decode(self) -> Estimate:
        if not self._started or not self._all_covered():
            missing = [g for g, f in enumerate(self._first) if f is None]
            raise DecodeError(f"frc: groups {missing} have no arrival yet")
        return Estimate(self._group_sum(), tuple(self._used), exact=True)

    def decides_by_order(self) -> bool:
        return self.byzantine == 0

    def decode_order(self, order: np.ndarray) -> OrderDecode | None:
        if self.byzantine:
            return None  # the vote reads the results' values
        return self._order_outcome(order, len(order) + 1, 1.0)

    def feasible(self, outstanding: frozenset[int]) -> bool:
        if self.byzantine == 0:
            return self._coverable(outstanding)
        pending: dict[int, int] = {}
        for w in outstanding - self._arrived:
            pending[w // self._r] = pending.get(w // self._r, 0) + 1
        for group, decided in enumerate(self._first):
            if decided is None:
                best = max((len(m) for _, m in self._clusters[group]), default=0)
                if best + pending.get(group, 0) < self.byzantine + 1:
                    return False
        return True
