"""Exact codes decode Σ_j g_j from every straggler pattern they claim to survive.

Messages are encoded from each worker's WorkerPlan with the worker's own encoder, offered
to the registry-built policy in a random order with the stragglers never arriving.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

from tests.policies.support import messages, planned, relative_error, run_round

TOL = 1e-9
DIM = 13  # not a multiple of m: exercises the chunk padding


def _check_all_sets(name: str, n: int, s: int, params: dict[str, Any], seed: int = 0) -> int:
    policy, plan = planned(name, n, params, seed=seed)
    rng = np.random.default_rng(1000 * n + s)
    grads = rng.standard_normal((n, DIM)) + 0.5
    target = grads.sum(axis=0)
    msgs = messages(plan, grads)
    checked = 0
    for t, stragglers in enumerate(itertools.combinations(range(n), s)):
        survivors = [w for w in range(n) if w not in stragglers]
        order = list(rng.permutation(survivors))
        est = run_round(policy, msgs, order, DIM, t)
        assert est.exact
        assert not set(est.workers_used) & set(stragglers)
        err = relative_error(est.gradient, target)
        assert err <= TOL, f"{name} n={n} s={s} stragglers={stragglers}: error {err:.2e}"
        checked += 1
    return checked


FRC_CASES = [(2, 1), (4, 1), (6, 2), (8, 3), (9, 2), (10, 4), (12, 1), (12, 2), (12, 3), (12, 5)]


@pytest.mark.parametrize(("n", "s"), FRC_CASES)
def test_frc_every_straggler_set(n: int, s: int) -> None:
    assert _check_all_sets("frc", n, s, {"s": s}) == len(list(itertools.combinations(range(n), s)))


CYCLIC_CASES = [(n, s) for n in range(2, 13) for s in (1, 2, 3) if s < n] + [(7, 6), (12, 0)]


@pytest.mark.parametrize("h", ["orthonormal", "gaussian"])
@pytest.mark.parametrize(("n", "s"), CYCLIC_CASES)
def test_cyclic_every_straggler_set(n: int, s: int, h: str) -> None:
    _check_all_sets("cyclic", n, s, {"s": s, "h": h}, seed=n)


GROUP_CASES = [(4, 1, 1), (6, 1, 2), (8, 2, 2), (10, 3, 2), (12, 1, 2), (12, 2, 2), (12, 3, 3)]


@pytest.mark.parametrize(("n", "s", "m"), GROUP_CASES)
def test_group_mds_every_straggler_set(n: int, s: int, m: int) -> None:
    _check_all_sets("group-mds", n, s, {"s": s, "m": m}, seed=n + m)


@pytest.mark.parametrize(("n", "s", "m"), [(6, 1, 2), (8, 2, 2), (12, 2, 2)])
def test_group_mds_every_pattern_of_s_per_group(n: int, s: int, m: int) -> None:
    """The group code survives s stragglers in *every* group at once (n/d·s in total)."""
    d = s + m
    policy, plan = planned("group-mds", n, {"s": s, "m": m}, seed=3)
    rng = np.random.default_rng(5)
    grads = rng.standard_normal((n, DIM))
    target = grads.sum(axis=0)
    msgs = messages(plan, grads)
    per_group = [list(itertools.combinations(range(g * d, (g + 1) * d), s)) for g in range(n // d)]
    for t, pattern in enumerate(itertools.product(*per_group)):
        lost = {w for group in pattern for w in group}
        order = list(rng.permutation([w for w in range(n) if w not in lost]))
        est = run_round(policy, msgs, order, DIM, t)
        assert relative_error(est.gradient, target) <= TOL


POLY_CASES: list[tuple[int, int, dict[str, Any]]] = [
    (3, 1, {"m": 1}),
    (5, 1, {"m": 2}),
    (8, 2, {"m": 2}),
    (10, 3, {"m": 2}),
    (12, 3, {"m": 3}),
    (12, 2, {"m": 2, "d": 6}),  # d > s+m: tolerates d-m = 4, still needs only n-4
    (9, 2, {"m": 2, "points": "ordered"}),
]


@pytest.mark.parametrize(("n", "s", "extra"), POLY_CASES)
def test_polynomial_every_straggler_set(n: int, s: int, extra: dict[str, Any]) -> None:
    _check_all_sets("polynomial", n, s, {"s": s, **extra})


def test_polynomial_with_larger_d_survives_d_minus_m() -> None:
    _check_all_sets("polynomial", 12, 4, {"s": 2, "m": 2, "d": 6})


RANDOM_CASES = [
    ("frc", 30, 2, {"s": 2}),
    ("frc", 60, 4, {"s": 4}),
    ("cyclic", 30, 3, {"s": 3}),
    ("cyclic", 30, 3, {"s": 3, "h": "gaussian"}),
    ("cyclic", 60, 5, {"s": 5}),
    ("cyclic", 60, 5, {"s": 5, "h": "gaussian"}),
    ("group-mds", 30, 3, {"s": 3, "m": 2}),
    ("group-mds", 60, 2, {"s": 2, "m": 4}),
    ("polynomial", 30, 3, {"s": 3, "m": 2}),
    ("polynomial", 60, 3, {"s": 3, "m": 3}),
]


@pytest.mark.parametrize(("name", "n", "s", "params"), RANDOM_CASES)
def test_random_straggler_sets_large_n(name: str, n: int, s: int, params: dict[str, Any]) -> None:
    policy, plan = planned(name, n, params, seed=11)
    rng = np.random.default_rng(n + s)
    dim = 101
    grads = rng.standard_normal((n, dim)) + 0.25
    target = grads.sum(axis=0)
    msgs = messages(plan, grads)
    for t in range(25):
        lost = set(rng.choice(n, size=s, replace=False).tolist())
        order = list(rng.permutation([w for w in range(n) if w not in lost]))
        est = run_round(policy, msgs, order, dim, t)
        assert est.exact
        assert relative_error(est.gradient, target) <= TOL, (name, sorted(lost))


@pytest.mark.parametrize(
    ("name", "params", "stop_at"),
    [
        ("frc", {"s": 2}, None),
        ("cyclic", {"s": 2}, 10),
        ("group-mds", {"s": 1, "m": 2}, None),
        ("polynomial", {"s": 2, "m": 2}, 10),
    ],
)
def test_stop_rule_and_workers_used(name: str, params: dict[str, Any], stop_at: int | None) -> None:
    """Decodable exactly when the code says so, with no straggler: offers stop early."""
    n = 12
    policy, plan = planned(name, n, params)
    grads = np.random.default_rng(0).standard_normal((n, DIM))
    msgs = messages(plan, grads)
    policy.begin_round(0, np.zeros(DIM))
    answers = [policy.offer(w, msgs[w]) for w in range(n)]
    first = answers.index(True) + 1
    if stop_at is not None:
        assert first == stop_at
    elif name == "frc":
        assert first == 3 * (n // 3 - 1) + 1  # worker 0 of the last group completes it
    else:
        assert first == 3 * (n // 3 - 1) + 2  # m = 2 arrivals in the last group
    est = policy.decode()
    assert relative_error(est.gradient, grads.sum(axis=0)) <= TOL
