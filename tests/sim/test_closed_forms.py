"""The simulator's mean round time against the closed forms of SCHEMES.md (within 3 %)."""

from __future__ import annotations

import numpy as np
import pytest

from codedgd.services.job import Component, JobConfig
from codedgd.services.policies import names
from codedgd.services.sim import CostModel, simulate
from codedgd.services.sim.closed_forms import frc_mean, harmonic, rth_arrival_mean, uncoded_mean

ROUNDS = 2500


def mean_round(n: int, lam: float, policy: Component, rounds: int = ROUNDS) -> float:
    config = JobConfig(
        workers=n,
        rounds=rounds,
        seed=11,
        eval_every=rounds,  # one evaluation at the end: this test is about the clock
        data=Component("synthetic", {"rows": 2 * n, "dim": 2}),
        policy=policy,
        stragglers=Component("shifted-exponential", {"shift": 1.0, "rate": lam}),
    )
    result = simulate(config, CostModel.ideal())
    assert len(result.records) == rounds
    return float(np.mean([r.round_seconds for r in result.records]))


def test_harmonic_numbers() -> None:
    assert harmonic(0) == 0.0
    assert harmonic(3) == pytest.approx(1 + 1 / 2 + 1 / 3)
    # FRC with c = 1 is uncoded; the r-th of n with r = n is uncoded too.
    assert frc_mean(10, 2.0, 1) == pytest.approx(uncoded_mean(10, 2.0))
    assert rth_arrival_mean(10, 2.0, 10) == pytest.approx(uncoded_mean(10, 2.0))


@pytest.mark.parametrize(("n", "lam"), [(10, 1.0), (20, 0.5)])
def test_uncoded_matches_closed_form(n: int, lam: float) -> None:
    measured = mean_round(n, lam, Component("uncoded"))
    assert measured == pytest.approx(uncoded_mean(n, lam), rel=0.03)


@pytest.mark.parametrize(("n", "lam", "r"), [(10, 1.0, 6), (20, 2.0, 15)])
def test_rth_arrival_matches_closed_form(n: int, lam: float, r: int) -> None:
    # ignore-stragglers with s = n − r stops at the r-th arrival.
    measured = mean_round(n, lam, Component("ignore-stragglers", {"s": n - r}))
    assert measured == pytest.approx(rth_arrival_mean(n, lam, r), rel=0.03)


@pytest.mark.skipif("frc" not in names(), reason="the frc policy is not in this checkout yet")
@pytest.mark.parametrize(("n", "lam", "c"), [(12, 1.0, 3), (20, 0.5, 2)])
def test_frc_matches_closed_form(n: int, lam: float, c: int) -> None:
    measured = mean_round(n, lam, Component("frc", {"s": c - 1}))
    assert measured == pytest.approx(frc_mean(n, lam, c), rel=0.03)


def test_the_closed_forms_tell_the_rules_apart() -> None:
    # The tolerance is meaningful: the rules' means differ by far more than 3 %.
    assert rth_arrival_mean(10, 1.0, 6) < 0.7 * uncoded_mean(10, 1.0)
