"""feasible(), residual checks, seeding and misuse of the coded policies."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

from codedgd.services.errors import DecodeError
from codedgd.services.policies import Policy
from codedgd.services.policies.comm_efficient import GroupMDS, Polynomial
from codedgd.services.policies.cyclic import CyclicRepetition
from tests.policies.support import messages, planned, relative_error, run_round

DIM = 9


def _offered(name: str, n: int, params: dict[str, Any], arrived: list[int]) -> Policy:
    policy, plan = planned(name, n, params)
    grads = np.random.default_rng(0).standard_normal((n, DIM))
    msgs = messages(plan, grads)
    policy.begin_round(0, np.zeros(DIM))
    for w in arrived:
        assert not policy.offer(w, msgs[w])
    return policy


def test_frc_feasible_needs_a_live_worker_in_every_uncovered_group() -> None:
    p = _offered("frc", 6, {"s": 1}, [0])  # groups {0,1} {2,3} {4,5}; group 0 covered
    assert p.feasible(frozenset({1, 2, 4}))
    assert p.feasible(frozenset({3, 5}))
    assert not p.feasible(frozenset({1, 2, 3}))  # group {4,5} entirely lost
    assert not p.feasible(frozenset({0, 2, 4, 5}) - {2})  # group {2,3} lost


def test_cyclic_feasible_counts_arrivals_and_pending() -> None:
    p = _offered("cyclic", 6, {"s": 2}, [3, 1])  # needs 4
    assert p.feasible(frozenset({0, 5}))
    assert p.feasible(frozenset({0, 1, 3, 5}))  # already-arrived workers do not count twice
    assert not p.feasible(frozenset({0, 1, 3}))


def test_group_mds_feasible_per_group() -> None:
    # n=6, d=3, m=2: groups {0,1,2} {3,4,5}, each needs 2 arrivals.
    p = _offered("group-mds", 6, {"s": 1, "m": 2}, [0, 3])
    assert p.feasible(frozenset({1, 4}))
    assert p.feasible(frozenset({2, 5, 1}))
    assert not p.feasible(frozenset({1, 2}))  # group 1 has one arrival and no pending member
    assert not p.feasible(frozenset({0, 3, 4}))  # group 0: worker 0 arrived, not pending


def test_polynomial_feasible_counts() -> None:
    p = _offered("polynomial", 8, {"s": 2, "m": 2}, [7, 2, 5])  # needs 6
    assert p.feasible(frozenset({0, 1, 3}))
    assert not p.feasible(frozenset({0, 1, 2}))


def test_erasurehead_feasible_by_count_or_coverage() -> None:
    # n=8, r=2, delta=0.75: K=6; groups {0,1} {2,3} {4,5} {6,7}.
    p = _offered("erasurehead", 8, {"r": 2, "delta": 0.75}, [0, 2])
    assert p.feasible(frozenset({4, 6}))  # covers every group
    assert p.feasible(frozenset({1, 3, 4, 5}))  # reaches K = 6 arrivals
    assert not p.feasible(frozenset({1, 3, 5}))  # 5 arrivals and group {6,7} uncovered


def test_cyclic_residual_reported_and_refused_above_tolerance() -> None:
    n = 8
    policy, plan = planned("cyclic", n, {"s": 2})
    assert isinstance(policy, CyclicRepetition)
    grads = np.random.default_rng(2).standard_normal((n, DIM))
    msgs = messages(plan, grads)
    est = run_round(policy, msgs, [7, 0, 3, 4, 1, 6], DIM)
    assert 0.0 < est.residual <= policy.tol
    assert est.residual == policy.last_residual and policy.last_condition > 1.0
    assert policy.extended_rounds == 0
    # A tolerance no set reaches: the round waits past n-s for every worker, then the
    # decode is refused and counted, never a wrong step.
    policy.tol = 1e-300
    policy.begin_round(1, np.zeros(DIM))
    offered = [policy.offer(w, msgs[w]) for w in [7, 0, 3, 4, 1, 6, 2, 5]]
    assert offered == [False] * 7 + [True]
    assert policy.extended_rounds == 1
    with pytest.raises(DecodeError, match=r"exceeds tol.*no other worker is left"):
        policy.decode()
    assert policy.residual_errors == 1
    # The decoding vector of a set is cached (offer() solved it, decode() reused it).
    assert policy.code is not None and policy.code.cache.hits >= 1


# n = 4, s = 1 (worker i holds partitions i and i+1 mod 4), with a B chosen so that three
# of the four survivor sets of size n - s cannot decode (rows 0-2 each sum to zero, so any
# set of them misses the all-ones vector) while the fourth, and all four rows, can.
DEGENERATE_B = np.array(
    [
        [1.0, -1.0, 0.0, 0.0],
        [0.0, 1.0, -1.0, 0.0],
        [0.0, 0.0, 1.0, -1.0],
        [1.0, 0.0, 0.0, 1.0],
    ]
)
DECODES_AT_N_MINUS_S = {frozenset({0, 2, 3})}


def _degenerate_cyclic() -> CyclicRepetition:
    policy, _ = planned("cyclic", 4, {"s": 1})
    assert isinstance(policy, CyclicRepetition) and policy.code is not None
    policy.code.B = DEGENERATE_B  # nothing decoded yet: the cache is empty
    return policy


@pytest.mark.parametrize("order", list(itertools.permutations(range(4))))
def test_cyclic_waits_past_n_minus_s_when_the_first_arrivals_cannot_decode(
    order: tuple[int, ...],
) -> None:
    policy = _degenerate_cyclic()
    grads = np.random.default_rng(5).standard_normal((4, DIM))
    msgs = [DEGENERATE_B[i] @ grads for i in range(4)]  # what worker i would send
    est = run_round(policy, msgs, order, DIM)
    good_early = frozenset(order[:3]) in DECODES_AT_N_MINUS_S
    assert len(est.workers_used) == (3 if good_early else 4)
    assert policy.extended_rounds == (0 if good_early else 1)
    assert est.exact and est.residual <= policy.tol
    assert relative_error(est.gradient, grads.sum(axis=0)) < 1e-12


def test_cyclic_waiting_past_n_minus_s_is_infeasible_once_no_one_is_left() -> None:
    policy = _degenerate_cyclic()
    grads = np.random.default_rng(5).standard_normal((4, DIM))
    policy.begin_round(0, np.zeros(DIM))
    for w in (0, 1, 2):
        assert not policy.offer(w, DEGENERATE_B[w] @ grads)
    assert policy.feasible(frozenset({3}))  # worker 3 can still complete the round
    assert not policy.feasible(frozenset())  # lost: the coordinator fails the round clearly
    with pytest.raises(DecodeError, match="exceeds tol"):
        policy.decode()


def test_polynomial_residual_refused_above_tolerance() -> None:
    n = 8
    policy, plan = planned("polynomial", n, {"s": 2, "m": 2, "tol": 1e-30})
    msgs = messages(plan, np.random.default_rng(2).standard_normal((n, DIM)))
    with pytest.raises(DecodeError, match="exceeds tol"):
        run_round(policy, msgs, range(n), DIM)
    assert policy.residual_errors == 1  # type: ignore[attr-defined]


def test_seed_feeds_the_random_codes() -> None:
    a = planned("cyclic", 10, {"s": 2}, seed=1)[1]
    b = planned("cyclic", 10, {"s": 2}, seed=1)[1]
    c = planned("cyclic", 10, {"s": 2}, seed=2)[1]
    assert all(
        np.array_equal(x.coefficients, y.coefficients)
        for x, y in zip(a.workers, b.workers, strict=True)
    )
    assert not np.allclose(a.workers[0].coefficients, c.workers[0].coefficients)
    g1, _ = planned("group-mds", 6, {}, seed=1)
    g2, _ = planned("group-mds", 6, {}, seed=2)
    assert isinstance(g1, GroupMDS) and isinstance(g2, GroupMDS)
    assert g1.code is not None and g2.code is not None
    assert not np.allclose(g1.code.generator, g2.code.generator)


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("frc", {"s": 1}),
        ("cyclic", {"s": 1}),
        ("erasurehead", {}),
        ("group-mds", {"s": 1, "m": 2}),
        ("polynomial", {}),
    ],
)
def test_misuse_is_a_decode_error(name: str, params: dict[str, Any]) -> None:
    n = 6
    policy, plan = planned(name, n, params)
    msgs = messages(plan, np.random.default_rng(0).standard_normal((n, DIM)))
    policy.begin_round(0, np.zeros(DIM))
    with pytest.raises(DecodeError):
        policy.decode()  # nothing arrived
    with pytest.raises(DecodeError, match="skipped its upload"):
        policy.offer(0, None)
    with pytest.raises(DecodeError, match="shape"):
        policy.offer(1, np.zeros(DIM + 5))
    policy.offer(2, msgs[2])
    with pytest.raises(DecodeError, match="twice"):
        policy.offer(2, msgs[2])
    with pytest.raises(DecodeError, match="unknown worker"):
        policy.offer(n, msgs[0])


def test_rounds_are_independent() -> None:
    """A new round forgets the previous one's arrivals (buffers are reused)."""
    n = 6
    policy, plan = planned("group-mds", n, {"s": 1, "m": 2})
    g1 = np.random.default_rng(0).standard_normal((n, DIM))
    g2 = np.random.default_rng(1).standard_normal((n, DIM))
    m1, m2 = messages(plan, g1), messages(plan, g2)
    e1 = run_round(policy, m1, [5, 4, 0, 1], DIM, t=0)
    e2 = run_round(policy, m2, [2, 0, 3, 5], DIM, t=1)
    assert relative_error(e1.gradient, g1.sum(axis=0)) < 1e-12
    assert relative_error(e2.gradient, g2.sum(axis=0)) < 1e-12


def test_uncoded_sums_on_arrival_and_the_others_are_offered_whole() -> None:
    policy, _ = planned("uncoded", 3, {})
    grads = np.random.default_rng(3).standard_normal((3, DIM))
    policy.begin_round(0, np.zeros(DIM))
    total = policy.arrival_sum()
    assert total is not None
    for w in (2, 0, 1):
        total += grads[w]  # what the coordinator does with the arriving chunks
        assert policy.offer_summed(w) == (w == 1)
    estimate = policy.decode()
    np.testing.assert_array_equal(estimate.gradient, grads[2] + grads[0] + grads[1])
    assert estimate.workers_used == (2, 0, 1)
    with pytest.raises(DecodeError, match="twice"):
        policy.offer_summed(0)
    for name, params in [("ignore-stragglers", {"s": 1}), ("frc", {"s": 1}), ("cyclic", {"s": 1})]:
        other, _ = planned(name, 4, params)
        other.begin_round(0, np.zeros(DIM))
        assert other.arrival_sum() is None, name


def test_polynomial_waits_past_n_minus_s_when_the_first_arrivals_are_ill_conditioned() -> None:
    """points=ordered at n = 24, s = 10: most sets of n - s = 14 decode above tol, and
    waiting for more arrivals (least-norm weights) brings every one within it."""
    n = 24
    policy, plan = planned("polynomial", n, {"s": 10, "m": 2, "points": "ordered"})
    assert isinstance(policy, Polynomial)
    rng = np.random.default_rng(11)
    grads = rng.standard_normal((n, DIM))
    msgs = messages(plan, grads)
    for trial in range(30):
        order = rng.permutation(n).tolist()
        extended = policy.extended_rounds
        est = run_round(policy, msgs, order, DIM, t=trial)
        waited = policy.extended_rounds - extended
        assert len(est.workers_used) >= 14
        assert (len(est.workers_used) > 14) == bool(waited)
        assert est.workers_used == tuple(order[: len(est.workers_used)])
        assert est.exact and est.residual <= policy.tol
        assert relative_error(est.gradient, grads.sum(axis=0)) < 1e-6
    assert policy.extended_rounds >= 15  # most rounds needed more than n - s
    assert policy.residual_errors == 0


def test_polynomial_waiting_past_n_minus_s_is_infeasible_once_no_one_is_left() -> None:
    policy, plan = planned("polynomial", 8, {"s": 2, "m": 2, "tol": 1e-30})
    msgs = messages(plan, np.random.default_rng(2).standard_normal((8, DIM)))
    policy.begin_round(0, np.zeros(DIM))
    for w in range(6):
        assert not policy.offer(w, msgs[w])
    assert policy.feasible(frozenset({6}))
    assert not policy.feasible(frozenset())
