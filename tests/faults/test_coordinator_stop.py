"""SIGSTOP of the coordinator mid-job: a stalled coordinator (a VM paused, a long GC, a
swap storm) is not a dead one. When it wakes, longer than --worker-timeout later, its
workers are still there, none is dropped as silent for the coordinator's own stall, and
the job ends exactly as an unstalled one."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator

import numpy as np
import pytest

from codedgd.client.api import Client
from codedgd.services.job import Component, JobConfig
from tests.conftest import CoordinatorProcess, WorkerProcesses
from tests.e2e.test_training import reference_gd

pytestmark = pytest.mark.slow

STALL_SECONDS = 20.0  # past the default --worker-timeout of 15 s


@pytest.fixture
def coordinator_process() -> Iterator[CoordinatorProcess]:
    c = CoordinatorProcess()
    yield c
    if c.proc is not None:
        c.proc.send_signal(signal.SIGCONT)
        c.proc.kill()
        c.finish()


async def test_a_stopped_coordinator_resumes_its_job_exactly_when_continued(
    coordinator_process: CoordinatorProcess, worker_processes: WorkerProcesses
) -> None:
    c = coordinator_process
    config = JobConfig(
        workers=4,
        rounds=40,
        seed=6,
        data=Component("synthetic", {"rows": 400, "dim": 6}),
        stragglers=Component("exponential", {"mean": 0.01}),
    )
    c.start()
    worker_processes.start(c.port, config.workers)
    async with Client(c.target) as client:
        job_id = await client.submit(config)
    await asyncio.to_thread(c.wait_round, 10)
    assert c.proc is not None
    c.proc.send_signal(signal.SIGSTOP)
    stopped_at = time.monotonic()
    await asyncio.sleep(STALL_SECONDS)
    c.proc.send_signal(signal.SIGCONT)
    async with Client(c.target) as client:
        records = [r async for r in client.watch(job_id)]
        status = await client.status(job_id)
        model = await client.model(job_id)
    assert time.monotonic() - stopped_at >= STALL_SECONDS
    (job,) = status.jobs
    assert job.state == "done", job.error
    assert status.workers_connected == config.workers
    assert [r.round for r in records] == list(range(config.rounds))
    expected = reference_gd(config)
    assert np.linalg.norm(model.theta - expected) <= 1e-9 * np.linalg.norm(expected)
    # No worker was taken for silent because the coordinator itself was not listening.
    assert all(p.poll() is None for p in worker_processes.procs)
    log = c.finish() if c.proc.poll() is not None else ""
    assert "silent" not in log
