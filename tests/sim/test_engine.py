"""The simulator's clock, cost model and laziness."""

from __future__ import annotations

import math

import numpy as np
import pytest

from codedgd.services.errors import ConfigError, JobFailed
from codedgd.services.job import Component, JobConfig
from codedgd.services.sim import CostModel, Simulator, simulate
from codedgd.services.sim.cost import cpu_done, downlink_times, uplink_arrivals
from codedgd.services.stragglers import FailStop, create_straggler_model

SYNTH = Component("synthetic", {"rows": 400, "dim": 10})


def job(**changes: object) -> JobConfig:
    base = JobConfig(workers=4, rounds=6, seed=3, data=SYNTH)
    return base.replace(**changes)


def test_response_times_follow_the_cost_model_and_the_seeded_delays() -> None:
    cost = CostModel(
        seconds_per_sample=1e-3,
        seconds_per_partition=0.01,
        latency_seconds=0.002,
        bandwidth_bytes_per_second=1e6,
        decode_seconds=0.005,
        round_overhead_seconds=0.001,
    )
    config = job(stragglers=Component("exponential", {"mean": 0.05}))
    sim = Simulator(config, cost)
    result = sim.run()
    delays = create_straggler_model("exponential", {"mean": 0.05}, seed=3, n_workers=4)
    dim = 10
    wall = 0.0
    for r in result.records:
        for w, response in r.response_seconds.items():
            rows = sim.prepared.blocks[w].shape[0]  # uncoded: worker w holds partition w
            compute = 1e-3 * rows + 0.01
            expected = (
                (0.002 + 8 * dim / 1e6)
                + compute
                + delays.delay(w, r.round, compute, 0.25)
                + (0.002 + 8 * dim / 1e6)
            )
            assert response == pytest.approx(expected)
            assert r.worker_compute_seconds[w] == pytest.approx(compute)
        assert r.wait_seconds == max(r.response_seconds.values())
        assert r.round_seconds == pytest.approx(r.wait_seconds + 0.005 + 0.001)
        wall += r.round_seconds
        assert r.wall_seconds == pytest.approx(wall)
        assert r.bytes_down == 4 * 8 * dim and r.bytes_up == 4 * 8 * dim


def test_only_the_gradients_that_are_used_are_computed() -> None:
    config = job(
        workers=6,
        rounds=10,
        policy=Component("ignore-stragglers", {"s": 2}),
        stragglers=Component("exponential", {"mean": 0.1}),
    )
    lazy = simulate(config, CostModel.ideal())
    assert lazy.gradients_computed == 10 * 4 and lazy.gradients_skipped == 10 * 2
    assert all(r.cancelled == 2 and r.uploads == 4 for r in lazy.records)
    # The cancelled workers are the slowest of each round's seeded delays.
    delays = create_straggler_model("exponential", {"mean": 0.1}, seed=3, n_workers=6)
    for r in lazy.records:
        ranked = sorted(range(6), key=lambda w: delays.delay(w, r.round, 0.0, 1 / 6))
        assert set(r.workers_used) == set(ranked[:4])
    # Measured compute computes everyone; θ is the same whenever the used sets agree,
    # which they do here because the delays dwarf the measured compute.
    measured = simulate(config, CostModel.ideal().replace(compute="measured"))
    assert measured.gradients_computed == 10 * 6
    assert [r.workers_used for r in measured.records] == [r.workers_used for r in lazy.records]


def test_shared_links_queue_messages() -> None:
    cost = CostModel(
        latency_seconds=0.0,
        bandwidth_bytes_per_second=math.inf,
        ingress_bandwidth_bytes_per_second=100.0,
        egress_bandwidth_bytes_per_second=50.0,
    )
    # Egress: 3 copies of 100 bytes at 50 B/s leave at 2, 4, 6 s.
    assert downlink_times(cost, 100, 3).tolist() == [2.0, 4.0, 6.0]
    # Ingress: ready at 0, 0.5, 10 with 100 bytes each at 100 B/s, first come first served.
    arrivals = uplink_arrivals(cost, np.array([0.5, 0.0, 10.0]), [100, 100, 100])
    assert arrivals.tolist() == [2.0, 1.0, 11.0]


def _one_machine(cores: float, **cpu: float) -> CostModel:
    """A shared machine with 10 ms of compute per partition and nothing else but ``cpu``."""
    costs = {
        "worker_cpu_seconds_per_message": 0.0,
        "worker_cpu_seconds_per_byte": 0.0,
        "coordinator_cpu_seconds_per_message": 0.0,
        "coordinator_cpu_seconds_per_byte": 0.0,
        **cpu,
    }
    return CostModel(
        seconds_per_sample=0.0,
        seconds_per_partition=0.01,
        latency_seconds=0.0,
        bandwidth_bytes_per_second=math.inf,
        decode_seconds=0.0,
        cores=cores,
        **costs,
    )


def test_workers_on_one_machine_share_its_cores() -> None:
    # 4 workers with 10 ms of compute each: 10 ms on a machine each (or 4 cores), 40 ms
    # on one core, 20 ms on two, round after round.
    def round_seconds(cost: CostModel) -> list[float]:
        return [r.round_seconds for r in simulate(job(), cost).records]

    assert round_seconds(_one_machine(4)) == pytest.approx([0.01] * 6)
    assert round_seconds(_one_machine(1)) == pytest.approx([0.04] * 6)
    assert round_seconds(_one_machine(2)) == pytest.approx([0.02] * 6)
    assert round_seconds(_one_machine(4).replace(cores=None)) == pytest.approx([0.01] * 6)
    # Processor sharing: a task started late gets the cores it shares from then on.
    assert cpu_done(_one_machine(1), np.array([0.0, 1.0]), np.array([2.0, 1.0])).tolist() == [
        3.0,
        3.0,
    ]
    # The coordinator's CPU work takes its share of the cores too.
    assert cpu_done(_one_machine(1), np.array([0.0]), np.array([1.0]), 1.0).tolist() == [2.0]


def test_the_coordinator_handles_a_shared_machines_messages_one_at_a_time() -> None:
    # No compute, 8 cores, 1 ms of coordinator CPU per message: the 4 copies of θ leave at
    # 1, 2, 3, 4 ms, the results come back at once and are parsed one after another, the
    # last at 5 ms.
    cost = _one_machine(8, coordinator_cpu_seconds_per_message=0.001).replace(
        seconds_per_partition=0.0
    )
    assert downlink_times(cost, 80, 4).tolist() == pytest.approx([0.001, 0.002, 0.003, 0.004])
    result = simulate(job(), cost)
    assert [r.round_seconds for r in result.records] == pytest.approx([0.005] * 6)
    # A worker's per-message and per-byte CPU: θ in and its gradient out, 80 bytes each.
    worker = _one_machine(8, worker_cpu_seconds_per_message=0.001, worker_cpu_seconds_per_byte=1e-5)
    expected = 0.01 + 2 * (0.001 + 80 * 1e-5)
    assert [r.round_seconds for r in simulate(job(), worker).records] == pytest.approx(
        [expected] * 6
    )


def test_bad_cores_are_refused_and_the_vectorized_engine_leaves_them() -> None:
    with pytest.raises(ConfigError, match="cores"):
        CostModel(cores=0)
    with pytest.raises(ConfigError, match="finite"):
        CostModel(cores=math.inf)
    # The vectorized engine leaves shared cores to the event engine, which "auto" picks
    # (on one core the 4 equal shares all end at 40 ms: waiting for 3 saves nothing).
    config = job(policy=Component("ignore-stragglers", {"s": 1}))
    with pytest.raises(ConfigError, match="cores"):
        simulate(config, _one_machine(1), engine="vectorized")
    assert [r.round_seconds for r in simulate(config, _one_machine(1)).records] == pytest.approx(
        [0.04] * 6
    )


def test_cost_model_errors_name_the_option() -> None:
    with pytest.raises(ConfigError, match="compute"):
        CostModel(compute="fast")
    with pytest.raises(ConfigError, match="bandwidth_bytes_per_second"):
        CostModel(bandwidth_bytes_per_second=0)
    with pytest.raises(ConfigError, match="latency_seconds"):
        CostModel(latency_seconds=-1)


def test_calibration_fills_the_compute_constants() -> None:
    sim = Simulator(job(), CostModel())
    assert sim.calibration is not None
    assert sim.cost.seconds_per_sample is not None and sim.cost.seconds_per_sample >= 0
    assert sim.cost.seconds_per_partition is not None and sim.cost.seconds_per_partition >= 0
    assert sim.calibration.full_seconds > 0
    assert sim.cost.to_dict()["compute"] == "model"


def test_a_mini_batch_job_is_calibrated_on_a_rounds_own_sample_sizes() -> None:
    """A round of a mini-batch job computes over its sample: the calibration times
    gradients over batch and 4·batch rows of a partition (a network's per-call cost
    dominates there), never the whole training set."""
    sim = Simulator(job(batch_size=10), CostModel())
    cal = sim.calibration
    assert cal is not None
    assert (cal.rows_block, cal.rows_full) == (10, 40)
    assert cal.block_seconds > 0 and cal.full_seconds > 0
    whole = Simulator(job(), CostModel()).calibration
    assert whole is not None and whole.rows_full == sim.prepared.dataset.n_train


def test_round_timeout_fails_like_a_real_job() -> None:
    config = job(round_timeout=0.5, stragglers=Component("fixed", {"count": 1, "delay": 1.0}))
    with pytest.raises(JobFailed, match=r"round_timeout=0\.5"):
        simulate(config, CostModel.ideal())


def test_fail_stop_workers_are_left_out_or_fail_the_job_like_a_real_one() -> None:
    stragglers = Component("fail-stop", {"count": 1, "start": 2})
    model = create_straggler_model("fail-stop", stragglers.options, seed=3, n_workers=4)
    assert isinstance(model, FailStop)
    (dead,) = model.failed
    tolerant = simulate(
        job(policy=Component("ignore-stragglers", {"s": 1}), stragglers=stragglers),
        CostModel.ideal(),
    )
    assert len(tolerant.records) == 6
    assert all(dead not in r.workers_used for r in tolerant.records[2:])
    assert all(len(r.workers_used) == 3 for r in tolerant.records)
    # uncoded needs every worker: it waits for the hung one until the round times out.
    with pytest.raises(JobFailed, match=r"round 2 was not decodable within job\.round_timeout"):
        simulate(job(stragglers=stragglers, round_timeout=5.0), CostModel.ideal())


CRASH = Component("crash", {"count": 1, "start": 2, "restart": 0.3})
CRASH_COST = CostModel(
    compute="none", latency_seconds=0.001, bandwidth_bytes_per_second=1e6, decode_seconds=0.0
)


def _crashed(stragglers: Component = CRASH, n: int = 4) -> int:
    (w,) = create_straggler_model("crash", stragglers.options, seed=3, n_workers=n).failed
    return w


def test_a_crashed_worker_back_within_replace_timeout_keeps_uncoded_exact() -> None:
    """As in a real run: round 2 waits for the restart, θ_2 goes to the newcomer, and
    every round decodes from all n places, so θ is the crash-free one."""
    w = _crashed()
    calm = simulate(job(), CRASH_COST)
    result = simulate(job(stragglers=CRASH, replace_timeout=10.0), CRASH_COST)
    np.testing.assert_allclose(result.theta, calm.theta, rtol=1e-12)
    records = result.records
    assert all(r.workers_used == (0, 1, 2, 3) for r in records)
    # θ_2 reached w at 1 ms + 80 µs, it crashed, came back 0.3 s and a join later
    # (3 latencies + its partition's bytes), got θ_2 and answered after two more links.
    sim = Simulator(job(stragglers=CRASH), CRASH_COST)
    link = 0.001 + 8 * 10 / 1e6
    back = link + 0.3 + sim.join[w]
    assert records[2].response_seconds[w] == pytest.approx(back + 2 * link)
    assert records[2].wait_seconds == pytest.approx(back + 2 * link)
    assert records[2].computations == 5  # four contacted, then the newcomer
    assert [r.computations for r in records[3:]] == [4] * 3  # it never crashes again
    assert records[1].wait_seconds == pytest.approx(2 * link)


def test_a_crashed_worker_not_back_within_replace_timeout_fails_like_a_real_job() -> None:
    w = _crashed()
    with pytest.raises(
        JobFailed,
        match=rf"round 2: no worker took the place of lost worker\(s\) \[{w}\] within "
        r"job\.replace_timeout=0\.1 s",
    ):
        simulate(job(stragglers=CRASH, replace_timeout=0.1), CRASH_COST)
    with pytest.raises(
        JobFailed,
        match=rf"worker {w} was lost in round 2 \(disconnected\); policy 'uncoded' cannot decode "
        rf"round 2 without the lost worker\(s\) \[worker {w}\]\. Set job\.replace_timeout",
    ):
        simulate(job(stragglers=CRASH), CRASH_COST)  # replace_timeout 0: at once


def test_a_tolerant_policy_goes_on_without_a_crashed_worker_and_takes_it_back() -> None:
    never = Component("crash", {"count": 1, "start": 2})
    w = _crashed(never)
    tolerant = job(policy=Component("ignore-stragglers", {"s": 1}), rounds=8)
    gone = simulate(tolerant.replace(stragglers=never), CRASH_COST).records
    assert all(w not in r.workers_used and r.computations == 3 for r in gone[3:])
    # Back 0.3 s after the crash: rounds of ~2 ms go on without it meanwhile; the first
    # round starting after its return contacts it again.
    back = simulate(tolerant.replace(stragglers=CRASH, rounds=400), CRASH_COST).records
    returned = next(r.round for r in back[3:] if r.computations == 4)
    assert back[returned - 1].wall_seconds >= 0.3
    assert all(r.computations == 3 for r in back[3:returned])
    assert all(r.computations == 4 for r in back[returned:])


def test_a_round_waiting_for_a_replacement_waits_replace_timeout_not_round_timeout() -> None:
    """The newcomer is back 0.3 s after the crash, past round_timeout (0.1 s) but within
    replace_timeout: the round waits for it, as a real one does."""
    result = simulate(
        job(stragglers=CRASH, round_timeout=0.1, replace_timeout=1.0, rounds=4), CRASH_COST
    )
    assert result.records[2].wait_seconds > 0.3
    assert all(r.workers_used == (0, 1, 2, 3) for r in result.records)


def test_a_crashed_worker_holds_no_place_in_the_coordinators_ingress_queue() -> None:
    """It sends nothing: the round it crashes in waits no longer than the next ones,
    which have the same live workers (no straggler delays)."""
    never = Component("crash", {"count": 1, "start": 0})
    cost = CRASH_COST.replace(ingress_bandwidth_bytes_per_second=1e3)
    tolerant = job(policy=Component("ignore-stragglers", {"s": 1}), stragglers=never, rounds=3)
    records = simulate(tolerant, cost).records
    assert records[0].wait_seconds == pytest.approx(records[1].wait_seconds)
    assert records[1].wait_seconds == pytest.approx(records[2].wait_seconds)
    assert [r.computations for r in records] == [4, 3, 3]
    assert [r.cancelled for r in records] == [0, 0, 0]  # the lost one is not "cancelled"


def test_target_loss_stops_early() -> None:
    full = simulate(job(rounds=20), CostModel.ideal())
    target = full.records[5].loss
    stopped = simulate(job(rounds=20, target_loss=target), CostModel.ideal())
    assert len(stopped.records) == 6


def test_a_cancelled_worker_is_bounded_where_its_cancel_went() -> None:
    # g-lag on pairs: a pair's first answer serves it, and its mate is cancelled then;
    # in a lazy round that asks no pair, no one is either.
    config = job(
        workers=6,
        rounds=20,
        policy=Component("g-lag", {"s": 1}),
        stragglers=Component("exponential", {"mean": 0.05}),
    )
    records = Simulator(config, CostModel.ideal()).run().records
    cancels = 0
    for r in records:
        assert len(r.cancelled_seconds) == r.cancelled
        cancels += r.cancelled
        for w, at in r.cancelled_seconds.items():
            assert w not in r.response_seconds
            assert at == r.response_seconds[w ^ 1] <= r.wait_seconds  # pairs (0, 1), (2, 3), …
        seen = r.response_seconds.keys() | r.cancelled_seconds.keys()
        assert len(seen) == r.computations
    assert cancels > 0 and any(r.computations == 0 for r in records)
