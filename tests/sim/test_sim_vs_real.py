"""Simulated and real runs of the same seeded job step through the same θ's.

Policies, partitions, encodings and the optimizer are shared; only the clock
differs. A replayed trace staggers the workers by 60 ms steps so the real arrival
order is the simulated one, which makes even the floating-point summation order
of the decode the same: θ must agree bit for bit.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest

from codedgd.services.coordinator.server import CoordinatorServer
from codedgd.services.errors import JobFailed
from codedgd.services.job import Component, JobConfig
from codedgd.services.records import RoundRecord
from codedgd.services.sim import CostModel, Simulator
from codedgd.services.stragglers import FailStop, create_straggler_model
from tests.conftest import WorkerProcesses

SYNTH = Component("synthetic", {"rows": 600, "dim": 12})
STEP = 0.06


def staggered_trace(path: Path, n: int, rounds: int) -> Path:
    """Round t: worker w waits STEP·((w + t) mod n): the slowest worker rotates."""
    delays = [[STEP * ((w + t) % n) for w in range(n)] for t in range(rounds)]
    path.write_text(json.dumps({"delays": delays}))
    return path


async def real_thetas(
    server: CoordinatorServer, workers: WorkerProcesses, config: JobConfig
) -> tuple[list[np.ndarray], list[RoundRecord]]:
    workers.start(server.port, config.workers)
    job = server.service.submit(config)
    thetas: list[np.ndarray] = []

    def on_record(record: RoundRecord) -> None:
        assert job.theta is not None
        thetas.append(np.array(job.theta))

    job.on_record = on_record

    async def finished() -> None:
        while not job.finished:
            await job.wait_change()

    await asyncio.wait_for(finished(), timeout=120)
    assert job.state == "done", job.error
    return thetas, list(job.records)


def sim_thetas(config: JobConfig) -> tuple[list[np.ndarray], list[RoundRecord]]:
    thetas: list[np.ndarray] = []
    result = Simulator(config, CostModel()).run(
        on_round=lambda record, theta: thetas.append(np.array(theta))
    )
    return thetas, list(result.records)


LAZY = ("lag-wk", "lag-ps", "g-lag", "lagc")


@pytest.mark.parametrize(
    "policy",
    [
        Component("uncoded"),
        Component("ignore-stragglers", {"s": 1}),
        # Lazy policies with a short warm-up, so stale messages are reused within the run.
        Component("lag-wk", {"D": 2}),
        Component("lag-ps", {"D": 2}),
        Component("g-lag", {"s": 2, "D": 2}),
        Component("lagc", {"s": 1, "D": 2}),
    ],
    ids=lambda c: c.name,
)
async def test_simulated_and_real_runs_produce_the_same_thetas(
    coordinator: CoordinatorServer,
    worker_processes: WorkerProcesses,
    tmp_path: Path,
    policy: Component,
) -> None:
    n, rounds = 3, 5 if policy.name not in LAZY else 12
    trace = staggered_trace(tmp_path / "trace.json", n, rounds)
    config = JobConfig(
        workers=n,
        rounds=rounds,
        seed=5,
        data=SYNTH,
        model=Component("logistic", {"l2": 1e-3}),
        policy=policy,
        stragglers=Component("trace", {"path": str(trace)}),
    )
    real, real_records = await real_thetas(coordinator, worker_processes, config)
    simulated, sim_records = sim_thetas(config)
    assert len(real) == len(simulated) == rounds
    for t in range(rounds):
        np.testing.assert_array_equal(simulated[t], real[t], err_msg=f"round {t}")
        assert sim_records[t].workers_used == real_records[t].workers_used
        assert sim_records[t].loss == real_records[t].loss
    # The trace really decides who is used: with s = 1 the slowest (rotating) worker
    # of each round is left out, in both runs.
    if policy.name == "ignore-stragglers":
        for t, record in enumerate(sim_records):
            slowest = max(range(n), key=lambda w: (w + t) % n)
            assert slowest not in record.workers_used
    if policy.name in LAZY:
        # Same lazy decisions in both: uploads, computations, and some rounds reuse.
        assert [r.uploads for r in sim_records] == [r.uploads for r in real_records]
        assert [r.computations for r in sim_records] == [r.computations for r in real_records]
        assert sum(r.uploads for r in sim_records) < rounds * n
        return
    # Both clocks see the trace's delays: the decoding arrival is the last one used.
    for t, record in enumerate(sim_records):
        used_delay = max(STEP * ((w + t) % n) for w in record.workers_used)
        assert record.wait_seconds >= used_delay
        assert real_records[t].wait_seconds >= used_delay


async def test_fail_stop_leaves_the_same_worker_out_of_real_and_simulated_runs(
    coordinator: CoordinatorServer, worker_processes: WorkerProcesses
) -> None:
    # One of 3 workers hangs from round 0: ignore-stragglers (s = 1) decodes every round
    # from the other two, in both runs, so the sums (two terms) agree bit for bit.
    config = JobConfig(
        workers=3,
        rounds=4,
        seed=5,
        data=SYNTH,
        model=Component("logistic", {"l2": 1e-3}),
        policy=Component("ignore-stragglers", {"s": 1}),
        stragglers=Component("fail-stop", {"count": 1}),
    )
    real, real_records = await real_thetas(coordinator, worker_processes, config)
    simulated, sim_records = sim_thetas(config)
    model = create_straggler_model("fail-stop", {"count": 1}, seed=5, n_workers=3)
    assert isinstance(model, FailStop)
    dead = model.failed
    for t in range(config.rounds):
        np.testing.assert_array_equal(simulated[t], real[t], err_msg=f"round {t}")
        assert real_records[t].workers_used == sim_records[t].workers_used
        assert set(dead).isdisjoint(real_records[t].workers_used)
        assert real_records[t].cancelled == 1  # the hung worker is cancelled each round


async def test_a_real_run_records_a_trace_the_simulator_replays(tmp_path: Path) -> None:
    """`codedgd run` records per-worker response times; replayed, they give the same run."""
    from codedgd.client.local import run_local
    from codedgd.services.records import write_results
    from codedgd.services.sim.trace import trace_from_results, write_trace

    config = JobConfig(
        workers=3,
        rounds=6,
        seed=9,
        data=SYNTH,
        policy=Component("ignore-stragglers", {"s": 1}),
        stragglers=Component("exponential", {"mean": 0.05}),
    )
    real = await run_local(config)
    delays = create_straggler_model("exponential", {"mean": 0.05}, seed=9, n_workers=3)
    for r in real.records:
        assert set(r.response_seconds) == set(r.workers_used)
        for w, response in r.response_seconds.items():
            assert response >= delays.delay(w, r.round, 0.0, 1 / 3)
    path = write_results(tmp_path / "real.json", config.to_dict(), real.records, {})
    trace = write_trace(tmp_path / "trace.json", trace_from_results(path, kind="response"))
    replay = Simulator(
        config.replace(stragglers=Component("trace", {"path": str(trace)})), CostModel.ideal()
    ).run()
    assert [r.workers_used for r in replay.records] == [r.workers_used for r in real.records]
    assert real.theta is not None
    np.testing.assert_array_equal(replay.theta, np.asarray(real.theta))


async def test_a_diverging_job_fails_at_the_same_round_real_and_simulated() -> None:
    """A step size 2.5 times 1/L: the loss grows by half again each round; both stop at the
    round it passes ten times the start's, with the same message, the rounds before kept."""
    from codedgd.client.local import run_local
    from codedgd.services.data import load_dataset
    from codedgd.services.errors import Diverged
    from codedgd.services.models import create_model, objective_smoothness

    data = Component("synthetic", {"rows": 200, "dim": 5, "task": "regression"})
    ds = load_dataset(data.name, data.options, seed=0)
    lr = 2.5 / objective_smoothness(create_model("least-squares", {}), ds.X_train)
    config = JobConfig(
        workers=2,
        rounds=300,
        data=data,
        model=Component("least-squares", {}),
        optimizer={"lr": lr},
    )
    with pytest.raises(Diverged) as simulated:
        Simulator(config, CostModel.ideal()).run()
    records: list[RoundRecord] = []
    with pytest.raises(Diverged) as real:
        await run_local(config, on_record=records.append)
    message = str(simulated.value)
    assert "the training loss grew from" in message and "gradient descent diverged" in message
    assert f"this job's is {lr:g}" in message and message in str(real.value)
    failed_at = int(message.split(":")[0].removeprefix("round "))
    assert 3 < failed_at < 300 and len(records) == failed_at  # the rounds before it stay
    assert all(np.isfinite(r.loss) for r in records)
    start = records[0].loss
    assert max(r.loss for r in records) <= 10 * start * 2.25  # caught within about a round


async def test_a_crash_and_restart_runs_the_same_rounds_real_and_simulated(
    coordinator: CoordinatorServer, worker_processes: WorkerProcesses
) -> None:
    """A worker crashes on θ_2 and is back 0.3 s later; uncoded waits for it in both."""
    config = JobConfig(
        workers=3,
        rounds=5,
        seed=5,
        data=SYNTH,
        model=Component("logistic", {"l2": 1e-3}),
        replace_timeout=60.0,
        stragglers=Component("crash", {"count": 1, "start": 2, "restart": 0.3}),
    )
    real, real_records = await real_thetas(coordinator, worker_processes, config)
    simulated, sim_records = sim_thetas(config)
    for t in range(config.rounds):
        # Same terms; the order of the sum follows arrivals, so agree to rounding.
        np.testing.assert_allclose(simulated[t], real[t], rtol=1e-12, err_msg=f"round {t}")
        assert real_records[t].workers_used == sim_records[t].workers_used == (0, 1, 2)
        assert real_records[t].computations == sim_records[t].computations == (4 if t == 2 else 3)
        assert real_records[t].cancelled == sim_records[t].cancelled == 0  # lost is not cancelled
    assert real_records[2].wait_seconds >= 0.3 and sim_records[2].wait_seconds >= 0.3


async def test_a_spare_takes_a_lost_place_at_once_real_and_simulated(
    coordinator: CoordinatorServer, worker_processes: WorkerProcesses
) -> None:
    """A worker crashes on θ_2 for good; the idle spare takes its place in both runs."""
    config = JobConfig(
        workers=3,
        rounds=5,
        seed=5,
        data=SYNTH,
        model=Component("logistic", {"l2": 1e-3}),
        replace_timeout=60.0,
        spares=1,
        stragglers=Component("crash", {"count": 1, "start": 2, "restart": -1}),
    )
    worker_processes.start(coordinator.port, config.spares, name="spare")  # beside the n
    real, real_records = await real_thetas(coordinator, worker_processes, config)
    simulated, sim_records = sim_thetas(config)
    for t in range(config.rounds):
        np.testing.assert_allclose(simulated[t], real[t], rtol=1e-12, err_msg=f"round {t}")
        assert real_records[t].workers_used == sim_records[t].workers_used == (0, 1, 2)
        assert real_records[t].computations == sim_records[t].computations == (4 if t == 2 else 3)
    # Without the spare the crashed worker's place would stay empty: uncoded would fail.
    with pytest.raises(JobFailed, match="no worker took the place"):
        Simulator(config.replace(spares=0, replace_timeout=1.0), CostModel()).run()
