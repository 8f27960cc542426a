"""Policy.decode_order, the vectorized simulator's shortcut, says what offer/decode say.

Each worker's payload is its own row of the plan's encoding B (a length-k vector of
partition coefficients), so the decoded "gradient" of the real offer/decode path *is* the
partition weights aᵀB that decode_order must return. Checked over every arrival order
(and every set of workers that never answer) at n = 6, and random ones at n = 60.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from codedgd.services.errors import DecodeError
from codedgd.services.policies.base import Plan, Policy
from codedgd.services.policies.registry import create

SMALL = [
    ("uncoded", {}),
    ("ignore-stragglers", {"s": 0}),
    ("ignore-stragglers", {"s": 2}),
    ("frc", {"s": 1}),
    ("frc", {"s": 2}),
    ("erasurehead", {"r": 2, "K": 3}),
    ("erasurehead", {"r": 3, "K": 2, "scaled": False}),
    ("erasurehead", {"r": 2, "K": 6}),
    ("cyclic", {"s": 1}),
    ("cyclic", {"s": 2, "h": "gaussian"}),
]


def _rows(plan: Plan) -> list[np.ndarray]:
    rows = []
    for wp in plan.workers:
        assert wp.chunks == 1
        row = np.zeros(plan.n_partitions)
        row[list(wp.partitions)] = wp.coefficients[:, 0]
        rows.append(row)
    return rows


def _offered(policy: Policy, rows: list[np.ndarray], order: list[int], t: int):
    """(count, weights, exact, used) by offering payloads; None if never decodable."""
    policy.begin_round(t, np.zeros(len(rows[0])))
    for i, w in enumerate(order, start=1):
        if policy.offer(w, rows[w].copy()):
            try:
                est = policy.decode()
            except DecodeError:  # over, and refused (cyclic: every set above tol)
                return None
            return i, est.gradient, est.exact, sorted(est.workers_used)
    return None


def _check(name: str, params: dict, n: int, orders) -> int:
    policy = create(name, params)
    plan = policy.plan(n, policy.default_partitions(n))
    rows = _rows(plan)
    checked = 0
    for t, order in enumerate(orders):
        want = _offered(policy, rows, list(order), t)
        policy.begin_round(t, np.zeros(plan.n_partitions))
        if want is None:
            with pytest.raises(DecodeError):
                policy.decode_order(np.array(order, dtype=np.int64))
            continue
        got = policy.decode_order(np.array(order, dtype=np.int64))
        assert got is not None
        assert got.count == want[0], (order, got.count, want[0])
        np.testing.assert_allclose(got.weights, want[1], rtol=1e-12, atol=0)
        assert got.exact == want[2]
        assert sorted(got.workers_used) == want[3]
        checked += 1
    return checked


@pytest.mark.parametrize(("name", "params"), SMALL, ids=lambda v: str(v))
def test_every_order_and_every_silent_set_at_n6(name: str, params: dict) -> None:
    n = 6
    orders = [
        perm
        for size in range(n + 1)
        for subset in itertools.combinations(range(n), size)
        for perm in itertools.permutations(subset)
    ]
    assert _check(name, params, n, orders) > 0


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("uncoded", {}),
        ("ignore-stragglers", {"s": 7}),
        ("frc", {"s": 3}),
        ("erasurehead", {"r": 3, "K": 30}),
        ("erasurehead", {"r": 5, "delta": 0.2}),
        ("cyclic", {"s": 5}),
        # Gaussian H at n = 60 and a tight tol: a quarter of the survivor sets decode
        # above it, and the round takes more arrivals (extended rounds) or, with no
        # one left, refuses.
        ("cyclic", {"s": 4, "h": "gaussian", "tol": 1e-12}),
    ],
    ids=lambda v: str(v),
)
def test_random_orders_at_n60(name: str, params: dict) -> None:
    rng = np.random.default_rng(7)
    n = 60
    orders = []
    for _ in range(300):
        silent = int(rng.integers(0, 10))
        orders.append(tuple(int(w) for w in rng.permutation(n)[: n - silent]))
    assert _check(name, params, n, orders) > 0


def test_a_policy_that_reads_values_says_none() -> None:
    policy = create("frc", {"s": 2, "byzantine": 1})
    policy.plan(6, 6)
    policy.begin_round(0, np.zeros(6))
    assert policy.decode_order(np.arange(6)) is None
