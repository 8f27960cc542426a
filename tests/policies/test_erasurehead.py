"""ErasureHead: erasure probability by Monte Carlo, unbiasedness of the scaled estimator."""

from __future__ import annotations

import math

import numpy as np

from codedgd.services.codes.erasurehead import erasure_probability
from codedgd.services.policies.erasurehead import ErasureHead
from tests.policies.support import messages, planned, run_round

N, R, DELTA = 30, 2, 0.5  # the authors' setting: K = 15
TRIALS = 20000


def _simulate(scaled: bool, seed: int) -> tuple[np.ndarray, np.ndarray, ErasureHead, np.ndarray]:
    """Per-trial erased-group indicators and estimates over random arrival orders."""
    policy, plan = planned("erasurehead", N, {"r": R, "delta": DELTA, "scaled": scaled})
    assert isinstance(policy, ErasureHead)
    rng = np.random.default_rng(seed)
    dim = 4
    grads = 1.0 + 0.1 * rng.standard_normal((N, dim))  # same-signed: a bias cannot hide
    msgs = messages(plan, grads)
    groups = N // R
    erased = np.zeros((TRIALS, groups), dtype=bool)
    estimates = np.zeros((TRIALS, dim))
    for t in range(TRIALS):
        est = run_round(policy, msgs, rng.permutation(N).tolist(), dim, t)
        covered = {w // R for w in est.workers_used}
        erased[t] = [g not in covered for g in range(groups)]
        estimates[t] = est.gradient
    return erased, estimates, policy, grads.sum(axis=0)


def test_erased_group_probability_matches_closed_form() -> None:
    erased, _, policy, _ = _simulate(scaled=True, seed=0)
    p = erasure_probability(N, R, 15)
    assert policy.k == 15 and math.isclose(policy.p, p) and abs(p - 0.2414) < 1e-4
    # Each group's indicator has std sqrt(p(1-p)); averaging over groups and trials.
    sigma = math.sqrt(p * (1 - p) / TRIALS)
    per_group = erased.mean(axis=0)
    assert np.all(np.abs(per_group - p) < 5 * sigma)
    assert abs(erased.mean() - p) < 2 * sigma  # groups are dependent: still far inside 5σ


def test_scaled_estimator_is_unbiased_and_unscaled_is_contracted() -> None:
    _, est_scaled, policy, g = _simulate(scaled=True, seed=1)
    assert math.isclose(policy.scale, 1 / (1 - policy.p)) and abs(policy.scale - 1.318) < 1e-3
    mean = est_scaled.mean(axis=0)
    assert np.max(np.abs(mean - g) / np.abs(g)) < 0.01
    _, est_plain, _, _ = _simulate(scaled=False, seed=1)
    ratio = est_plain.mean(axis=0) / g
    assert np.all(np.abs(ratio - (1 - policy.p)) < 0.01)  # E[ĝ] = (1-p)·g: biased


def test_early_stop_at_k_or_full_coverage() -> None:
    n = 8  # groups {0,1} {2,3} {4,5} {6,7}; delta 0.75 → K = 6
    policy, plan = planned("erasurehead", n, {"r": 2, "delta": 0.75})
    assert isinstance(policy, ErasureHead)
    grads = np.random.default_rng(0).standard_normal((n, 3))
    msgs = messages(plan, grads)
    policy.begin_round(0, np.zeros(3))
    assert [policy.offer(w, msgs[w]) for w in (0, 2, 4, 6)] == [False, False, False, True]
    est = policy.decode()
    assert est.workers_used == (0, 2, 4, 6)
    assert not est.exact  # rescaled by 1/(1-p) even when every group arrived
    np.testing.assert_allclose(est.gradient, grads.sum(axis=0) * policy.scale)
    # K arrivals with group {6,7} erased: stop at the 6th arrival, that group contributes 0.
    order = [0, 1, 2, 3, 4, 5]
    est = run_round(policy, msgs, order, 3, t=1)
    assert est.workers_used == (0, 2, 4)
    np.testing.assert_allclose(est.gradient, grads[:6].sum(axis=0) * policy.scale)


def test_unscaled_full_coverage_is_exact() -> None:
    n = 6
    policy, plan = planned("erasurehead", n, {"r": 3, "delta": 1.0, "scaled": False})
    grads = np.random.default_rng(3).standard_normal((n, 5))
    est = run_round(policy, messages(plan, grads), [4, 1], 5)
    assert est.exact
    np.testing.assert_allclose(est.gradient, grads.sum(axis=0))


def test_k_overrides_delta() -> None:
    policy, _ = planned("erasurehead", 30, {"r": 3, "K": 12})
    assert isinstance(policy, ErasureHead)
    assert policy.k == 12 and math.isclose(policy.p, erasure_probability(30, 3, 12))
