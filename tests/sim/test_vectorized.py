"""The vectorized simulator gives the event engine's rounds: same times, records and θ."""

from __future__ import annotations

import math

import numpy as np
import pytest

from codedgd.services.errors import ConfigError, JobFailed
from codedgd.services.job import Component, JobConfig
from codedgd.services.sim import CostModel, Simulator, simulate
from codedgd.services.sim.engines import make_simulator
from codedgd.services.sim.vectorized import VectorizedSimulator

SYNTH = Component("synthetic", {"rows": 600, "dim": 12})
COST = CostModel(
    seconds_per_sample=2e-4,
    seconds_per_partition=0.003,
    latency_seconds=0.001,
    bandwidth_bytes_per_second=2e5,
    ingress_bandwidth_bytes_per_second=5e5,
    decode_seconds=0.002,
    round_overhead_seconds=0.001,
)

POLICIES = [
    Component("uncoded", {}),
    Component("ignore-stragglers", {"s": 3}),
    Component("frc", {"s": 2}),
    Component("erasurehead", {"r": 3, "K": 5}),
    Component("erasurehead", {"r": 2, "delta": 0.25, "scaled": False}),
    Component("cyclic", {"s": 2}),
]
STRAGGLERS = [
    Component("exponential", {"mean": 0.05}),
    Component("shifted-exponential", {"shift": 0.2, "rate": 4.0}),
    Component("pareto", {"scale": 0.01, "shape": 1.5, "by_load": True}),
    Component("fixed", {"count": 2, "delay": 0.3}),
    Component("slowdown", {"count": 3, "factor": 4.0}),
    Component("speed-classes", {"count": 4, "factor": 3.0, "mean": 0.02, "every": 3}),
    Component("none", {}),
]


def job(policy: Component, stragglers: Component, **changes: object) -> JobConfig:
    base = JobConfig(
        workers=12,
        rounds=8,
        seed=5,
        data=SYNTH,
        policy=policy,
        stragglers=stragglers,
        model=Component("logistic", {"l2": 0.01}),
    )
    return base.replace(**changes)


def _same(config: JobConfig, cost: CostModel) -> None:
    events = Simulator(config, cost).run()
    fast = VectorizedSimulator(config, cost).run()
    assert len(events.records) == len(fast.records) == config.rounds
    for a, b in zip(events.records, fast.records, strict=True):
        assert b.round_seconds == pytest.approx(a.round_seconds, rel=1e-12)
        assert b.wall_seconds == pytest.approx(a.wall_seconds, rel=1e-12)
        assert b.wait_seconds == pytest.approx(a.wait_seconds, rel=1e-12)
        assert b.workers_used == a.workers_used
        assert (b.uploads, b.computations, b.cancelled) == (a.uploads, a.computations, a.cancelled)
        assert (b.bytes_up, b.bytes_down, b.exact) == (a.bytes_up, a.bytes_down, a.exact)
        assert b.decode_residual == a.decode_residual
        assert b.compute_seconds_max == pytest.approx(a.compute_seconds_max, rel=1e-12)
        assert b.response_seconds.keys() == a.response_seconds.keys()
        for w, s in a.response_seconds.items():
            assert b.response_seconds[w] == pytest.approx(s, rel=1e-12)
        if not math.isnan(a.loss):
            assert b.loss == pytest.approx(a.loss, rel=1e-9)
    np.testing.assert_allclose(fast.theta, events.theta, rtol=1e-9, atol=1e-12)
    assert (fast.gradients_computed, fast.gradients_skipped) == (
        events.gradients_computed,
        events.gradients_skipped,
    )


@pytest.mark.parametrize("policy", POLICIES, ids=lambda c: f"{c.name}{c.options}")
@pytest.mark.parametrize("stragglers", STRAGGLERS, ids=lambda c: c.name)
def test_both_engines_agree(policy: Component, stragglers: Component) -> None:
    _same(job(policy, stragglers), COST)


def test_both_engines_agree_on_fair_sharing_and_an_egress_queue() -> None:
    cost = COST.replace(sharing="fair", egress_bandwidth_bytes_per_second=4e5)
    _same(job(Component("erasurehead", {"r": 3, "K": 6}), STRAGGLERS[0]), cost)


def test_a_failed_worker_is_waited_out_by_a_code_and_fails_uncoded_alike() -> None:
    stop = Component("fail-stop", {"count": 2, "start": 3})
    _same(job(Component("ignore-stragglers", {"s": 2}), stop), COST)
    for engine in (Simulator, VectorizedSimulator):
        with pytest.raises(JobFailed, match=r"not decodable within job\.round_timeout"):
            engine(job(Component("uncoded", {}), stop, round_timeout=5.0), COST).run()


def test_without_per_worker_records_only_the_per_worker_maps_are_left_out() -> None:
    config = job(POLICIES[1], STRAGGLERS[0])
    full = VectorizedSimulator(config, COST).run()
    lean = VectorizedSimulator(config, COST, per_worker=False).run()
    for a, b in zip(full.records, lean.records, strict=True):
        assert b.response_seconds == {} and b.worker_compute_seconds == {}
        assert b.round_seconds == a.round_seconds and b.workers_used == a.workers_used


def test_a_measured_decode_becomes_one_timed_constant() -> None:
    result = VectorizedSimulator(
        job(POLICIES[3], STRAGGLERS[0]), COST.replace(decode_seconds=None)
    ).run()
    decodes = {r.decode_seconds for r in result.records}
    assert len(decodes) == 1 and 0 < decodes.pop() < 1.0


def test_auto_picks_the_engine_that_can_run_the_job() -> None:
    plain = job(POLICIES[1], STRAGGLERS[0])
    assert isinstance(make_simulator(plain, COST), VectorizedSimulator)
    assert not isinstance(make_simulator(plain, COST, engine="events"), VectorizedSimulator)
    for config, cost in [
        (job(Component("polynomial", {"s": 2}), STRAGGLERS[0]), COST),
        (job(Component("frc", {"s": 2, "byzantine": 1}), STRAGGLERS[0]), COST),
        (job(POLICIES[1], Component("crash", {"count": 1})), COST),
        (plain, COST.replace(compute="measured")),
    ]:
        assert not isinstance(make_simulator(config, cost), VectorizedSimulator)
        with pytest.raises(ConfigError, match="vectorized simulator cannot run this job"):
            make_simulator(config, cost, engine="vectorized")
    with pytest.raises(ConfigError, match="unknown simulator engine 'fast'"):
        make_simulator(plain, COST, engine="fast")


def test_simulate_uses_the_vectorized_engine_when_it_can() -> None:
    config = job(POLICIES[1], STRAGGLERS[0])
    assert simulate(config, COST).records == VectorizedSimulator(config, COST).run().records


@pytest.mark.parametrize("engine", ["vectorized", "events"])
def test_without_the_metric_the_losses_are_the_same_and_the_metric_is_nan(engine: str) -> None:
    # tune and auto's look-ahead read only the loss: they turn the metric off.
    config = JobConfig(
        workers=4,
        rounds=8,
        seed=2,
        data=Component("synthetic", {"rows": 400, "dim": 5}),
        policy=Component("erasurehead", {"r": 2, "K": 2}),
        stragglers=Component("exponential", {"mean": 0.05}),
    )
    runs = []
    for metric in (True, False):
        sim = make_simulator(config, CostModel.ideal(), engine=engine)
        sim.metric = metric
        runs.append(sim.run().records)
    with_metric, without = runs
    assert [r.loss for r in without] == [r.loss for r in with_metric]
    assert all(0.5 < r.metric <= 1.0 for r in with_metric)
    assert all(math.isnan(r.metric) for r in without)
