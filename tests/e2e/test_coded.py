"""Coded policies end to end: a coordinator and worker OS processes over loopback gRPC.

Jobs run one after another on the same worker processes (workers return to idle after a
job), so each test pays the process start-up once.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import numpy as np

from codedgd.services.coordinator.job_run import JobRun
from codedgd.services.coordinator.server import CoordinatorServer
from codedgd.services.job import Component, JobConfig
from tests.conftest import WorkerProcesses

SYNTH = Component("synthetic", {"rows": 1200, "dim": 20, "task": "classification"})
STRAGGLERS = Component("exponential", {"mean": 0.02})


def _config(policy: str, params: dict[str, Any], *, workers: int, rounds: int) -> JobConfig:
    return JobConfig(
        workers=workers,
        rounds=rounds,
        seed=5,
        data=SYNTH,
        model=Component("logistic", {"l2": 1e-3}),
        policy=Component(policy, params),
        stragglers=STRAGGLERS,
    )


async def _run(server: CoordinatorServer, config: JobConfig) -> JobRun:
    job = server.service.submit(config)

    async def finished() -> None:
        while not job.finished:
            await job.wait_change()

    await asyncio.wait_for(finished(), timeout=120)
    assert job.state == "done", job.error
    assert len(job.records) == config.rounds and job.theta is not None
    return job


def _relative(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


async def test_exact_codes_reach_the_uncoded_theta(
    coordinator: CoordinatorServer, worker_processes: WorkerProcesses
) -> None:
    n, rounds = 6, 8
    worker_processes.start(coordinator.port, n)
    reference = await _run(coordinator, _config("uncoded", {}, workers=n, rounds=rounds))
    assert reference.theta is not None
    cases: list[tuple[str, dict[str, Any], int]] = [
        ("frc", {"s": 2}, 2),  # one message per group of three
        ("cyclic", {"s": 2}, 4),
        ("cyclic", {"s": 2, "h": "gaussian"}, 4),
        ("group-mds", {"s": 1, "m": 2}, 4),
        ("polynomial", {"s": 2, "m": 2}, 4),
    ]
    for name, params, used in cases:
        job = await _run(coordinator, _config(name, params, workers=n, rounds=rounds))
        assert job.theta is not None
        err = _relative(job.theta, reference.theta)
        assert err <= 1e-9, f"{name} {params}: θ differs from uncoded by {err:.2e}"
        records = job.records
        assert all(r.exact for r in records)
        assert all(len(r.workers_used) == used for r in records)
        assert sum(r.cancelled for r in records) > 0  # the slow ones were cancelled
        if name in ("cyclic", "polynomial"):
            assert all(0 < r.decode_residual < 1e-9 for r in records)
        losses = [r.loss for r in records]
        assert losses[-1] < losses[0] < math.log(2)


async def test_erasurehead_converges_under_exponential_delays(
    coordinator: CoordinatorServer, worker_processes: WorkerProcesses
) -> None:
    n = 6
    worker_processes.start(coordinator.port, n)
    for scaled in (True, False):
        config = _config(
            "erasurehead", {"r": 2, "delta": 0.5, "scaled": scaled}, workers=n, rounds=25
        )
        job = await _run(coordinator, config)
        records = job.records
        # K = 3 arrivals or all three groups covered: never more than 3 offered, ≤ 3 used.
        assert all(r.uploads <= 3 and len(r.workers_used) <= 3 for r in records)
        if scaled:
            assert not any(r.exact for r in records)
        assert records[-1].loss < 0.8 * math.log(2)
        assert records[-1].metric > 0.8  # held-out AUC


async def test_group_mds_sends_one_mth_of_the_gradient(
    coordinator: CoordinatorServer, worker_processes: WorkerProcesses
) -> None:
    n, dim = 4, 201
    worker_processes.start(coordinator.port, n)
    data = Component("synthetic", {"rows": 400, "dim": dim, "task": "classification"})
    sizes = {}
    for name, params in (("group-mds", {"s": 0, "m": 2}), ("uncoded", {})):
        config = JobConfig(workers=n, rounds=3, seed=1, data=data, policy=Component(name, params))
        job = await _run(coordinator, config)
        for r in job.records:  # no straggler model: every worker's message counts
            assert r.uploads == n and r.late_dropped == 0
        sizes[name] = [r.bytes_up / n for r in job.records]
    length = math.ceil(dim / 2)  # 101 float64 on the wire per group-mds message
    for per_message in sizes["group-mds"]:
        assert length * 8 <= per_message < length * 8 + 100
    for per_message in sizes["uncoded"]:
        assert dim * 8 <= per_message < dim * 8 + 100
    framing = sizes["group-mds"][0] - length * 8
    assert abs((sizes["uncoded"][0] - dim * 8) - framing) <= 4  # same framing, half the data
