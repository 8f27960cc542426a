"""A worker that connects during a job takes the place of a lost one."""

from __future__ import annotations

import asyncio
import signal

import numpy as np

from services.coordinator.server import CoordinatorServer
from services.job import Component, JobConfig
from tests.conftest import WorkerProcesses
from tests.e2e.fakes import wait_for
from tests.e2e.test_training import SYNTH, reference_gd


async def _finished(job: object, timeout: float = 120) -> None:
    async def until() -> None:
        while not job.finished:  # type: ignore[attr-defined]
            await job.wait_change()  # type: ignore[attr-defined]

    await asyncio.wait_for(until(), timeout)


def _kill(procs: list, name: str) -> None:  # type: ignore[type-arg]
    next(p for p in procs if p.args[-1] == name).send_signal(signal.SIGKILL)


async def test_uncoded_waits_for_a_replacement_and_ends_with_the_exact_theta(
    coordinator: CoordinatorServer, worker_processes: WorkerProcesses
) -> None:
    config = JobConfig(
        workers=3,
        rounds=30,
        seed=7,
        data=SYNTH,
        model=Component("logistic", {"l2": 1e-3}),
        replace_timeout=60.0,
        stragglers=Component("exponential", {"mean": 0.01}),
    )
    procs = worker_processes.start(coordinator.port, 3)
    job = coordinator.service.submit(config)
    await wait_for(lambda: len(job.records) >= 5, timeout=90)
    victim = job._workers[1]
    _kill(procs, victim.name)
    await wait_for(lambda: 1 in job._lost, timeout=30)
    worker_processes.start(coordinator.port, 1, name="newcomer")
    await _finished(job)
    assert job.state == "done", job.error
    assert len(job.records) == 30
    assert job._workers[1].name == "newcomer0"
    assert coordinator.service.metrics.replacements._value.get() == 1
    # Every round used all three partitions: the newcomer computed the lost worker's.
    assert all(r.exact and r.workers_used == (0, 1, 2) for r in job.records)
    assert job.theta is not None
    expected = reference_gd(config)
    assert np.linalg.norm(job.theta - expected) <= 1e-9 * np.linalg.norm(expected)


async def test_no_replacement_within_the_timeout_fails_the_job_clearly(
    coordinator: CoordinatorServer, worker_processes: WorkerProcesses
) -> None:
    config = JobConfig(
        workers=3,
        rounds=500,
        data=SYNTH,
        replace_timeout=1.0,
        stragglers=Component("exponential", {"mean": 0.01}),
    )
    procs = worker_processes.start(coordinator.port, 3)
    job = coordinator.service.submit(config)
    await wait_for(lambda: len(job.records) >= 3, timeout=90)
    _kill(procs, job._workers[0].name)
    await _finished(job)
    assert job.state == "failed"
    assert "no worker took the place of lost worker(s) [0]" in job.error
    assert "job.replace_timeout=1 s" in job.error


async def test_a_tolerant_policy_gets_its_lost_worker_back(
    coordinator: CoordinatorServer, worker_processes: WorkerProcesses
) -> None:
    config = JobConfig(
        workers=3,
        rounds=400,
        data=SYNTH,
        policy=Component("ignore-stragglers", {"s": 1}),
        stragglers=Component("exponential", {"mean": 0.01}),
    )
    procs = worker_processes.start(coordinator.port, 3)
    job = coordinator.service.submit(config)
    await wait_for(lambda: len(job.records) >= 5, timeout=90)
    _kill(procs, job._workers[2].name)
    await wait_for(lambda: 2 in job._lost, timeout=30)
    lost_at = len(job.records)
    worker_processes.start(coordinator.port, 1, name="newcomer")
    await wait_for(lambda: 2 not in job._lost, timeout=60)
    back_at = len(job.records)
    await _finished(job)
    assert job.state == "done", job.error
    # Without worker 2 the rounds decode from 0 and 1; once replaced, it answers again.
    assert all(r.workers_used == (0, 1) for r in job.records[lost_at + 1 : back_at])
    assert any(2 in r.workers_used for r in job.records[back_at + 1 :])
