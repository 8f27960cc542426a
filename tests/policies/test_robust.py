"""Robust aggregation: median and trimmed mean bound corrupt messages; frc's vote is exact.

The vote's claims are checked over every corruption and straggler pattern on small codes
and every arrival order of them, and on random patterns of a large code.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from codedgd.services.errors import PlanError
from codedgd.services.policies import create
from codedgd.services.policies.frc import FractionalRepetition

DIM = 5


def _partition_gradients(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, DIM))


def _lie(honest: np.ndarray, kind: int) -> np.ndarray:
    """Three kinds of corrupt message: scaled, negated, random."""
    if kind == 0:
        return honest * 1e6
    if kind == 1:
        return -honest
    return np.random.default_rng(kind).normal(scale=100.0, size=honest.shape)


# ----------------------------------------------------------------- median, trimmed mean


@pytest.mark.parametrize(("name", "params", "n", "tolerated"), [
    ("median", {}, 5, 2),
    ("median", {"s": 1}, 6, 2),
    ("trimmed-mean", {"b": 2}, 5, 2),
    ("trimmed-mean", {"b": 1, "s": 1}, 5, 1),
])  # fmt: skip
def test_corrupt_messages_cannot_move_a_coordinate_outside_the_honest_range(
    name: str, params: dict[str, int], n: int, tolerated: int
) -> None:
    """Every set of up to ``tolerated`` corrupt workers, every kind of lie: each coordinate
    of the estimate stays within n times the honest arrivals' range."""
    g = _partition_gradients(n)
    wanted = n - params.get("s", 0)
    for count in range(tolerated + 1):
        for corrupt in itertools.combinations(range(n), count):
            for kind in range(3):
                policy = create(name, params)
                policy.plan(n, n)
                policy.begin_round(0, np.zeros(DIM))
                done = False
                for w in range(n):
                    if done:
                        break
                    payload = _lie(g[w], kind) if w in corrupt else g[w]
                    done = policy.offer(w, payload)
                assert done
                estimate = policy.decode()
                honest = [w for w in estimate.workers_used if w not in corrupt]
                assert len(estimate.workers_used) == wanted
                low = n * g[honest].min(axis=0)
                high = n * g[honest].max(axis=0)
                assert np.all(estimate.gradient >= low - 1e-12), (corrupt, kind)
                assert np.all(estimate.gradient <= high + 1e-12), (corrupt, kind)
                assert not estimate.exact


@pytest.mark.parametrize("name", ["median", "trimmed-mean"])
def test_with_identical_partitions_the_statistic_is_the_exact_sum(name: str) -> None:
    n = 7
    g = np.tile(_partition_gradients(1), (n, 1))
    policy = create(name)
    policy.plan(n, n)
    policy.begin_round(0, np.zeros(DIM))
    for w in range(n):
        policy.offer(w, g[w] * (1e6 if w == 3 else 1.0))
    np.testing.assert_allclose(policy.decode().gradient, g.sum(axis=0), rtol=1e-12)


def test_the_median_is_not_the_mean() -> None:
    """A fixed example, so a statistic swapped for another one fails."""
    policy = create("median")
    policy.plan(3, 3)
    policy.begin_round(0, np.zeros(1))
    for w, v in enumerate([1.0, 2.0, 10.0]):
        policy.offer(w, np.array([v]))
    assert policy.decode().gradient.tolist() == [6.0]
    trimmed = create("trimmed-mean", {"b": 1})
    trimmed.plan(4, 4)
    trimmed.begin_round(0, np.zeros(1))
    for w, v in enumerate([1.0, 2.0, 4.0, 100.0]):
        trimmed.offer(w, np.array([v]))
    assert trimmed.decode().gradient.tolist() == [12.0]


def test_trimming_more_than_the_arrivals_allow_is_refused_with_the_fix() -> None:
    with pytest.raises(PlanError, match=r"m > 2b; choose b <= 2"):
        create("trimmed-mean", {"b": 3}).plan(6, 6)
    with pytest.raises(PlanError, match="0 <= s < n"):
        create("median", {"s": 4}).plan(4, 4)


def test_a_robust_round_is_feasible_only_while_enough_can_arrive() -> None:
    policy = create("median", {"s": 1})
    policy.plan(4, 4)
    policy.begin_round(0, np.zeros(DIM))
    policy.offer(0, np.ones(DIM))
    assert policy.feasible(frozenset({1, 2}))
    assert not policy.feasible(frozenset({1}))


# ------------------------------------------------------------------------- frc's vote


def _vote_round(
    n: int,
    s: int,
    e: int,
    corrupt: dict[int, int],
    stragglers: set[int],
    order: list[int],
    g: np.ndarray,
) -> tuple[FractionalRepetition, bool, set[int]]:
    """Offer in ``order`` (stragglers never arrive) until decodable; the exposed workers."""
    policy = create("frc", {"s": s, "byzantine": e})
    assert isinstance(policy, FractionalRepetition)
    plan = policy.plan(n, n)
    policy.begin_round(0, np.zeros(DIM))
    exposed: set[int] = set()
    done = False
    for w in order:
        if w in stragglers:
            continue
        honest = sum(g[p] for p in plan.workers[w].partitions)
        payload = _lie(honest, corrupt[w]) if w in corrupt else honest
        done = policy.offer(w, payload)
        exposed |= set(policy.suspects())
        if done:
            break
    return policy, done, exposed


@pytest.mark.slow  # 72,000 rounds (36 s): the slow suite runs it
def test_the_vote_is_exact_under_every_corruption_and_straggler_pattern_n6() -> None:
    """n = 6, s = 2, byzantine = 1 (groups of 3): any one corrupt worker per group, with
    any lie, and the remaining s - 2e = 0 stragglers; every arrival order. The estimate is
    the exact sum, only corrupt workers are exposed, and every corrupt worker that arrived
    before its group decided is exposed."""
    n, s, e = 6, 2, 1
    g = _partition_gradients(n)
    total = g.sum(axis=0)
    groups = [range(0, 3), range(3, 6)]
    patterns = [
        dict(zip(chosen, kinds, strict=True))
        for size in range(3)
        for chosen in itertools.combinations(range(n), size)
        if all(sum(w in grp for w in chosen) <= e for grp in groups)
        for kinds in itertools.product(range(3), repeat=size)
    ]
    checked = 0
    for corrupt in patterns:
        for order in itertools.permutations(range(n)):
            policy, done, exposed = _vote_round(n, s, e, corrupt, set(), list(order), g)
            assert done, (corrupt, order)
            estimate = policy.decode()
            np.testing.assert_allclose(estimate.gradient, total, rtol=1e-12, atol=1e-12)
            assert estimate.exact
            assert exposed <= set(corrupt)
            assert not set(estimate.workers_used) & set(corrupt)
            checked += 1
    assert checked == len(patterns) * 720


def test_the_vote_tolerates_stragglers_beside_corrupt_workers_n10() -> None:
    """n = 10, s = 4, byzantine = 1 (groups of 5): per group at most one corrupt worker
    and up to s - 2e = 2 stragglers, every such pattern, a random order each."""
    n, s, e = 10, 4, 1
    g = _partition_gradients(n, seed=1)
    total = g.sum(axis=0)
    rng = np.random.default_rng(0)
    per_group: list[list[tuple[tuple[int, ...], tuple[int, ...]]]] = []
    for base in (0, 5):
        members = range(base, base + 5)
        options = []
        for bad in itertools.chain([()], ((w,) for w in members)):
            rest = [w for w in members if w not in bad]
            for lag in range(3):
                options += [(bad, slow) for slow in itertools.combinations(rest, lag)]
        per_group.append(options)
    for (bad0, slow0), (bad1, slow1) in itertools.product(*per_group):
        corrupt = {w: int(rng.integers(3)) for w in bad0 + bad1}
        order = [int(w) for w in rng.permutation(n)]
        policy, done, exposed = _vote_round(n, s, e, corrupt, set(slow0 + slow1), order, g)
        assert done
        np.testing.assert_allclose(policy.decode().gradient, total, rtol=1e-12, atol=1e-12)
        assert exposed <= set(corrupt)


def test_the_vote_is_exact_on_random_patterns_of_a_large_code() -> None:
    """n = 60, s = 4, byzantine = 2 (groups of 5): two corrupt workers in every group."""
    n, s, e = 60, 4, 2
    g = _partition_gradients(n, seed=2)
    total = g.sum(axis=0)
    rng = np.random.default_rng(3)
    for _ in range(50):
        corrupt = {
            int(w): int(rng.integers(3))
            for base in range(0, n, 5)
            for w in rng.choice(range(base, base + 5), size=e, replace=False)
        }
        order = [int(w) for w in rng.permutation(n)]
        policy, done, exposed = _vote_round(n, s, e, corrupt, set(), order, g)
        assert done
        np.testing.assert_allclose(policy.decode().gradient, total, rtol=1e-10, atol=1e-10)
        assert exposed <= set(corrupt)


def test_colluding_corrupt_workers_beyond_byzantine_are_not_claimed_to_be_caught() -> None:
    """Two identical lies in a group of three outvote the honest one (2 > byzantine = 1):
    the bound is a real bound. The vote then exposes the honest worker."""
    n = 3
    g = _partition_gradients(n)
    honest = g.sum(axis=0)
    policy, done, exposed = _vote_round(n, 2, 1, {0: 0, 1: 0}, set(), [2, 0, 1], g)
    assert done
    np.testing.assert_allclose(policy.decode().gradient, honest * 1e6)
    assert exposed == {2}


def test_a_vote_that_cannot_be_won_is_infeasible() -> None:
    n, s, e = 6, 2, 1
    g = _partition_gradients(n)
    policy = create("frc", {"s": s, "byzantine": e})
    policy.plan(n, n)
    policy.begin_round(0, np.zeros(DIM))
    policy.offer(0, g[0:3].sum(axis=0))
    policy.offer(1, g[0:3].sum(axis=0) * 1e6)  # disagrees: group 0 has 1 + 1 votes
    assert policy.feasible(frozenset({2, 3, 4}))  # worker 2 can still break the tie
    assert not policy.feasible(frozenset({3, 4, 5}))


def test_byzantine_needs_room_in_the_group() -> None:
    with pytest.raises(PlanError, match=r"2\*byzantine <= s.*choose s >= 2"):
        create("frc", {"s": 1, "byzantine": 1}).plan(4, 4)
    with pytest.raises(PlanError, match="vote_tol"):
        create("frc", {"s": 2, "byzantine": 1, "vote_tol": -1.0}).plan(6, 6)


def test_without_byzantine_frc_takes_the_first_arrival_as_before() -> None:
    g = _partition_gradients(4)
    policy = create("frc", {"s": 1})
    plan = policy.plan(4, 4)
    policy.begin_round(0, np.zeros(DIM))
    for w in (0, 2):
        msg = sum(g[p] for p in plan.workers[w].partitions)
        done = policy.offer(w, msg)
    assert done and policy.suspects() == {}
