"""Real jobs: a coordinator and worker OS processes over loopback gRPC."""

from __future__ import annotations

import math

import numpy as np
import pytest

from codedgd.client.local import run_local
from codedgd.services.data import load_dataset
from codedgd.services.job import Component, JobConfig
from codedgd.services.job.prepare import choose_lr
from codedgd.services.models import create_model

SYNTH = Component("synthetic", {"rows": 1200, "dim": 20, "task": "classification"})


def reference_gd(config: JobConfig) -> np.ndarray:
    """Plain single-process gradient descent on the full data, same objective and step."""
    ds = load_dataset(config.data.name, config.data.options, seed=config.seed)
    model = create_model(config.model.name, config.model.options)
    lr = choose_lr(config, model, ds.X_train)
    theta = np.zeros(ds.dim)
    for _ in range(config.rounds):
        grad = model.grad_sum(theta, ds.X_train, ds.y_train) / ds.n_train + model.l2 * theta
        theta = theta - lr * grad
    return theta


async def test_uncoded_equals_single_process_gradient_descent() -> None:
    config = JobConfig(
        workers=3,
        rounds=12,
        seed=7,
        data=SYNTH,
        model=Component("logistic", {"l2": 1e-3}),
        policy=Component("uncoded"),
    )
    run = await run_local(config)
    assert run.state == "done" and len(run.records) == 12
    assert run.theta is not None
    theta = np.asarray(run.theta)
    expected = reference_gd(config)
    assert np.linalg.norm(theta - expected) <= 1e-9 * np.linalg.norm(expected)
    assert all(r.exact and r.workers_used == (0, 1, 2) for r in run.records)
    assert all(not r.excluded and r.attempts == 1 for r in run.records)
    losses = [r.loss for r in run.records]
    assert losses[-1] < losses[0] < math.log(2)


async def test_ignore_stragglers_converges_under_exponential_delays() -> None:
    config = JobConfig(
        workers=4,
        rounds=25,
        seed=1,
        data=SYNTH,
        model=Component("logistic", {"l2": 1e-3}),
        policy=Component("ignore-stragglers", {"s": 1}),
        stragglers=Component("exponential", {"mean": 0.02}),
    )
    run = await run_local(config)
    records = run.records
    assert all(len(r.workers_used) == 3 and not r.exact for r in records)
    assert sum(r.cancelled for r in records) >= len(records)  # one straggler cancelled per round
    for r in records:  # the record names the one left out, and why
        assert set(r.excluded) == {0, 1, 2, 3} - set(r.workers_used)
        assert all(why.startswith("cancelled") for why in r.excluded.values()), r.excluded
    assert records[-1].loss < 0.8 * math.log(2)
    assert records[-1].metric > 0.8  # held-out AUC on a learnable synthetic task


async def test_least_squares_with_nesterov_converges() -> None:
    config = JobConfig(
        workers=2,
        rounds=30,
        seed=3,
        data=Component("synthetic", {"rows": 800, "dim": 10, "task": "regression"}),
        model=Component("least-squares", {"l2": 0.0}),
        optimizer={"lr": "auto", "nesterov": True},
    )
    run = await run_local(config)
    assert run.records[-1].loss < 0.05 * run.records[0].loss
    assert run.records[-1].metric_name == "mse"


async def test_round_records_count_bytes() -> None:
    config = JobConfig(workers=2, rounds=3, data=SYNTH)
    run = await run_local(config)
    dim = 20
    for r in run.records:
        # θ down to both workers, one gradient up from each: at least the raw float64 bytes.
        assert r.bytes_down >= 2 * dim * 8
        assert 2 * dim * 8 <= r.bytes_up < 2 * dim * 8 + 400
        assert r.uploads == 2 and r.computations == 2


@pytest.mark.parametrize("policy", ["uncoded", "ignore-stragglers"])
async def test_target_loss_stops_early(policy: str) -> None:
    config = JobConfig(
        workers=2, rounds=200, data=SYNTH, policy=Component(policy, {}), target_loss=0.6
    )
    run = await run_local(config)
    assert len(run.records) < 200
    assert run.records[-1].loss <= 0.6
    assert all(r.loss > 0.6 for r in run.records[:-1])


async def test_codedgd_run_starts_spares_that_take_a_lost_place() -> None:
    """`codedgd run --spares 1`: a worker lost for good costs uncoded nothing but a join."""
    config = JobConfig(
        workers=3,
        rounds=6,
        seed=7,
        data=SYNTH,
        model=Component("logistic", {"l2": 1e-3}),
        replace_timeout=30.0,
        spares=1,
        stragglers=Component("crash", {"count": 1, "start": 2, "restart": -1}),
    )
    statuses: list[str] = []
    run = await run_local(config, on_status=statuses.append)
    assert "started 3 worker processes and 1 spare(s)" in statuses
    assert run.state == "done" and len(run.records) == 6
    assert run.records[2].computations == 4  # the crashed worker's θ_2, then the spare's
    assert run.theta is not None
    expected = reference_gd(config)
    assert np.linalg.norm(np.asarray(run.theta) - expected) <= 1e-9 * np.linalg.norm(expected)
