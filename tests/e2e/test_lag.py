"""Lazy aggregation end to end: a coordinator and worker OS processes over loopback gRPC.

LAG's synthetic benchmark runs for real (the workers' trigger, the skipped results, the
counters), and g-lag and lagc train under light- and heavy-tailed straggler models.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from codedgd.services.coordinator.job_run import JobRun
from codedgd.services.coordinator.server import CoordinatorServer
from codedgd.services.job import Component, JobConfig
from codedgd.services.sim import CostModel, Simulator
from tests.conftest import WorkerProcesses
from tests.policies.test_lag import _lag_setup, _objective_error


async def _run(server: CoordinatorServer, config: JobConfig) -> JobRun:
    job = server.service.submit(config)

    async def finished() -> None:
        while not job.finished:
            await job.wait_change()

    await asyncio.wait_for(finished(), timeout=300)
    assert job.state == "done", job.error
    return job


async def test_lag_wk_and_lag_ps_reach_gd_accuracy_with_fewer_uploads_for_real(
    coordinator: CoordinatorServer, worker_processes: WorkerProcesses
) -> None:
    worker_processes.start(coordinator.port, 9)
    registry = coordinator.service.metrics.registry

    def counter(name: str) -> float:
        return float(registry.get_sample_value(name) or 0.0)

    uploads: dict[str, int] = {}
    for name in ("uncoded", "lag-wk", "lag-ps"):
        config = _lag_setup(name, rounds=150)
        skipped_before = counter("codedgd_uploads_skipped_total")
        uploads_before = counter("codedgd_uploads_total")
        job = await _run(coordinator, config)
        error, cumulative = _objective_error(job.records, config)
        hit = np.flatnonzero(error <= 1e-8)
        assert hit.size, f"{name}: best relative objective error {error.min():.2e}"
        uploads[name] = int(cumulative[hit[0]])
        # The real run is the simulated one: same decisions, same θ.
        simulated = Simulator(config, CostModel(compute="none")).run()
        assert [r.uploads for r in job.records] == [r.uploads for r in simulated.records]
        assert job.theta is not None
        np.testing.assert_allclose(job.theta, simulated.theta, rtol=1e-12, atol=1e-15)
        # Counters: results and metrics agree on what was uploaded and skipped.
        total_uploads = sum(r.uploads for r in job.records)
        computations = sum(r.computations for r in job.records)
        assert counter("codedgd_uploads_total") - uploads_before == total_uploads
        skipped = counter("codedgd_uploads_skipped_total") - skipped_before
        if name == "lag-wk":
            assert computations == 9 * config.rounds  # everyone computes every round
            assert skipped == computations - total_uploads > 0
            assert all(r.bytes_up < 9 * 50 * 8 for r in job.records[config.rounds // 2 :])
        else:
            assert skipped == 0 and computations == total_uploads
    assert uploads["lag-wk"] < uploads["uncoded"] / 2
    assert uploads["lag-ps"] < uploads["uncoded"] / 2


@pytest.mark.parametrize(
    "stragglers",
    [
        Component("shifted-exponential", {"shift": 0.002, "rate": 200.0}),
        Component("pareto", {"scale": 0.005, "shape": 1.5}),
    ],
    ids=["shifted-exponential", "pareto"],
)
async def test_g_lag_and_lagc_converge_under_stragglers(
    coordinator: CoordinatorServer, worker_processes: WorkerProcesses, stragglers: Component
) -> None:
    n, rounds = 6, 40
    worker_processes.start(coordinator.port, n)
    base = JobConfig(
        workers=n,
        rounds=rounds,
        seed=4,
        data=Component("synthetic", {"rows": 1500, "dim": 15}),
        model=Component("logistic", {"l2": 1e-3}),
        stragglers=stragglers,
        policy=Component("uncoded"),
    )
    gd = Simulator(base, CostModel.ideal()).run().records
    start, gd_final = gd[0].loss, gd[-1].loss
    cases: list[tuple[str, dict[str, Any]]] = [("g-lag", {"s": 1}), ("lagc", {"s": 1})]
    for name, params in cases:
        job = await _run(coordinator, base.replace(policy=Component(name, params)))
        final = job.records[-1].loss
        # Converges: at least 97 % of gradient descent's progress in the same rounds ...
        assert start - final >= 0.97 * (start - gd_final), (name, start, final, gd_final)
        # ... while saving uploads and computations (after the D = 10 warm-up rounds).
        late = job.records[10:]
        assert sum(r.uploads for r in late) < (rounds - 10) * n * 0.8
        if name == "g-lag":
            # one message per picked group is used, and counted as an upload: the other
            # member is cancelled as soon as the first one arrives
            assert all(len(r.workers_used) <= n // 2 for r in job.records)
            assert all(r.uploads == len(r.workers_used) for r in job.records)
            assert all(r.uploads + r.cancelled == r.computations for r in job.records)
            # Each cancelled member is bounded where its Cancel went: at its mate's answer
            # (groups of 2 are (0, 1), (2, 3), (4, 5)), or, where that answer completed
            # the round, when the round decoded.
            for r in job.records:
                assert len(r.cancelled_seconds) == r.cancelled
                for w, at in r.cancelled_seconds.items():
                    mate = r.response_seconds[w ^ 1]
                    assert at in (mate, r.wait_seconds) and mate <= at <= r.wait_seconds, w
