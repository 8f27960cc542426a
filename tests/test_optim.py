"""The optimizer: convergence, Nesterov's speed-up, schedules, options and errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

from codedgd.services.errors import ConfigError, JobFailed
from codedgd.services.job import Component, JobConfig
from codedgd.services.job.prepare import prepare
from codedgd.services.optim import (
    Optimizer,
    check_converging,
    create_optimizer,
    lr_times_inverse_l,
)
from codedgd.services.policies import create


def _quadratic(eigenvalues: np.ndarray, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """f(x) = ½(x − x*)ᵀA(x − x*) with a random rotation of the given spectrum."""
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.standard_normal((eigenvalues.size, eigenvalues.size)))
    A = (q * eigenvalues) @ q.T
    return A, rng.standard_normal(eigenvalues.size)


def _iterations_to(opt: Optimizer, A: np.ndarray, x_star: np.ndarray, tol: float) -> int:
    def gap(x: np.ndarray) -> float:
        d = x - x_star
        return 0.5 * float(d @ A @ d)

    start = gap(opt.theta)
    for _ in range(100_000):
        if gap(opt.theta) <= tol * start:
            return opt.t
        opt.update(A @ (opt.point() - x_star))
    raise AssertionError("did not converge")


def test_gradient_descent_converges_on_a_quadratic() -> None:
    A, x_star = _quadratic(np.linspace(1.0, 4.0, 10))
    opt = Optimizer(np.zeros(10), lr=1 / 4.0)
    for _ in range(200):
        opt.update(A @ (opt.point() - x_star))
    np.testing.assert_allclose(opt.theta, x_star, atol=1e-8)
    assert opt.t == 200
    assert opt.point() is opt.theta  # plain GD evaluates at the iterate


@pytest.mark.parametrize("momentum", [None, "strongly-convex"])
def test_nesterov_needs_fewer_iterations_when_ill_conditioned(momentum: str | None) -> None:
    L, mu = 1.0, 1e-3
    A, x_star = _quadratic(np.geomspace(mu, L, 30), seed=1)
    plain = _iterations_to(Optimizer(np.zeros(30), lr=1 / L), A, x_star, 1e-8)
    beta = None
    if momentum is not None:
        kappa = L / mu
        beta = (math.sqrt(kappa) - 1) / (math.sqrt(kappa) + 1)
    fast_opt = Optimizer(np.zeros(30), lr=1 / L, nesterov=True, momentum=beta)
    fast = _iterations_to(fast_opt, A, x_star, 1e-8)
    assert fast * 3 < plain, (fast, plain)


def test_nesterov_momentum_sequence_and_lookahead() -> None:
    opt = Optimizer(np.zeros(2), lr=0.5, nesterov=True)
    assert [opt.momentum_at(t) for t in (1, 2, 3)] == [0.0, 0.25, 0.4]
    opt.update(np.array([1.0, 0.0]))  # x1 = (−0.5, 0); β1 = 0 so y1 = x1
    np.testing.assert_allclose(opt.point(), [-0.5, 0.0])
    opt.update(np.array([1.0, 0.0]))  # x2 = y1 − 0.5 g = (−1, 0); y2 = x2 + ¼(x2 − x1)
    np.testing.assert_allclose(opt.theta, [-1.0, 0.0])
    np.testing.assert_allclose(opt.point(), [-1.125, 0.0])


def test_schedules() -> None:
    def rates(**kw: object) -> list[float]:
        opt = Optimizer(np.zeros(1), 1.0, **kw)  # type: ignore[arg-type]
        return [opt.step_size(t) for t in (0, 1, 3, 8)]

    assert rates() == [1.0] * 4
    np.testing.assert_allclose(rates(schedule="inverse-sqrt"), [1, 1 / math.sqrt(2), 0.5, 1 / 3])
    np.testing.assert_allclose(
        rates(schedule="inverse-time", decay=0.5), [1.0, 1 / 1.5, 1 / 2.5, 1 / 5]
    )
    np.testing.assert_allclose(rates(schedule="step", decay=0.5, every=3), [1, 1, 0.5, 0.25])
    np.testing.assert_allclose(rates(schedule="inverse-time"), [1, 1 / 1.01, 1 / 1.03, 1 / 1.08])


def test_update_uses_the_schedule() -> None:
    opt = Optimizer(np.zeros(1), 1.0, schedule="inverse-sqrt")
    for _ in range(4):
        opt.update(np.array([-1.0]))
    assert opt.theta[0] == pytest.approx(1 + 1 / math.sqrt(2) + 1 / math.sqrt(3) + 0.5)


def test_returned_points_are_immutable_snapshots() -> None:
    theta0 = np.ones(3)
    opt = Optimizer(theta0, 0.1, nesterov=True)
    first = opt.point()
    opt.update(np.ones(3))
    np.testing.assert_array_equal(first, np.ones(3))  # not mutated by the step
    np.testing.assert_array_equal(theta0, np.ones(3))  # the caller's θ0 is untouched
    with pytest.raises(ValueError):
        opt.point()[0] = 5.0


def test_state_round_trip() -> None:
    a = Optimizer(np.zeros(2), 0.3, nesterov=True)
    for g in ([1.0, 2.0], [0.5, -1.0]):
        a.update(np.array(g))
    b = Optimizer(np.zeros(2), 0.3, nesterov=True)
    b.load_state(a.state())
    a.update(np.array([1.0, 1.0]))
    b.update(np.array([1.0, 1.0]))
    np.testing.assert_array_equal(a.theta, b.theta)
    assert b.t == 3


def test_create_optimizer_parses_options() -> None:
    opt = create_optimizer(
        {"lr": "0.2", "schedule": "step", "decay": "0.1", "every": "10", "nesterov": "true"},
        np.zeros(4),
    )
    assert opt.lr == 0.2 and opt.nesterov and opt.schedule == "step"
    assert opt.step_size(10) == pytest.approx(0.02)
    auto = create_optimizer({"lr": "auto"}, np.zeros(4), smoothness=4.0)
    assert auto.lr == 0.25
    assert create_optimizer({}, np.zeros(1), smoothness=2.0).lr == 0.5
    heavy = create_optimizer({"nesterov": True, "momentum": 0.9}, np.zeros(1), smoothness=1.0)
    assert heavy.momentum == 0.9


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"lr": 0}, "lr"),
        ({"lr": -1}, "lr"),
        ({"lr": "fast"}, "lr"),
        ({"lr": float("inf")}, "lr"),
        ({"lr": True}, "lr"),
        ({"lr": 0.1, "schedule": "cosine"}, "constant, inverse-sqrt"),
        ({"lr": 0.1, "rate": 3}, "valid options"),
        ({"lr": 0.1, "decay": 0.5}, "decay"),
        ({"lr": 0.1, "schedule": "step", "decay": 2.0}, "decay"),
        ({"lr": 0.1, "schedule": "inverse-time", "decay": 0}, "decay"),
        ({"lr": 0.1, "schedule": "step", "every": 0}, "every"),
        ({"lr": 0.1, "schedule": "step", "every": 2.5}, "every"),
        ({"lr": 0.1, "every": 3}, "every"),
        ({"lr": 0.1, "momentum": 0.9}, "nesterov"),
        ({"lr": 0.1, "nesterov": True, "momentum": 1.0}, "momentum"),
        ({"lr": 0.1, "nesterov": "maybe"}, "nesterov"),
        ({"lr": "auto"}, "smoothness"),
    ],
)
def test_bad_options_raise_config_error(options: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        create_optimizer(options, np.zeros(2))


def test_a_step_relative_to_one_over_l_is_that_multiple_of_it() -> None:
    assert create_optimizer({"lr": "0.5/L"}, np.zeros(1), smoothness=4.0).lr == 0.125
    assert create_optimizer({"lr": " 2 / l "}, np.zeros(1), smoothness=4.0).lr == 0.5
    assert create_optimizer({"lr": "1/L"}, np.zeros(1), smoothness=4.0).lr == 0.25
    assert lr_times_inverse_l("auto") == 1.0 and lr_times_inverse_l(0.3) is None
    assert lr_times_inverse_l("0.3") is None  # (a number as typed: absolute)


@pytest.mark.parametrize("lr", ["0/L", "-1/L", "x/L", "nan/L", "inf/L", "/L", "1_0/L", "1e400/L"])
def test_a_malformed_relative_step_is_named_with_the_forms_meant(lr: str) -> None:
    with pytest.raises(ConfigError, match=r'F/L" needs a number F > 0.*"auto" \(1/L\)'):
        create_optimizer({"lr": lr}, np.zeros(1), smoothness=1.0)


def test_a_relative_step_in_a_job_is_that_multiple_of_the_objectives_one_over_l() -> None:
    job = JobConfig(workers=2, rounds=1, data=Component("synthetic", {"rows": 200, "dim": 5}))
    one = prepare(job, None).lr
    half = prepare(job.replace(optimizer={"lr": "0.5/L"}), None).lr
    assert half == pytest.approx(0.5 * one)
    # A number written as a string (a TOML "0.1") is that number, as the optimizer reads it.
    assert prepare(job.replace(optimizer={"lr": "0.1"}), None).lr == 0.1
    with pytest.raises(ConfigError, match=r"0\.5/L"):
        prepare(job.replace(optimizer={"lr": "fast"}), None)


def test_auto_lr_needs_positive_smoothness() -> None:
    with pytest.raises(ConfigError, match="L > 0"):
        create_optimizer({"lr": "auto"}, np.zeros(2), smoothness=0.0)


def test_wrong_gradient_shape() -> None:
    with pytest.raises(ValueError, match="shape"):
        Optimizer(np.zeros(3), 0.1).update(np.zeros(4))


def test_a_loss_that_is_no_longer_finite_fails_the_job_with_the_fix() -> None:
    check_converging(3, 1e300, 0.5)  # large but finite: training goes on
    for loss in (math.inf, math.nan):
        with pytest.raises(JobFailed, match=r"round 7: .* diverged.*this job's is 0.5"):
            check_converging(7, loss, 0.5)
    with pytest.raises(JobFailed, match="try --param xi=1"):
        check_converging(7, math.inf, 0.5, create("lag-ps", {}).divergence_hint())
    assert create("lag-ps", {"xi": 0.5}).divergence_hint() == ""
    assert create("uncoded", {}).divergence_hint() == ""
