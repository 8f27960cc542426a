"""A worker that goes silent (SIGSTOP: alive to TCP, dead to the job) is dropped after
--worker-timeout, its place goes to a live worker, and a silent idle worker is never
handed one. Without heartbeats read, the round would wait for round_timeout."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from codedgd.services.coordinator.server import CoordinatorServer
from codedgd.services.job import Component, JobConfig
from tests.conftest import WorkerProcesses
from tests.e2e.fakes import wait_for

TIMEOUT = 1.5  # seconds of silence before a worker is dropped


async def test_a_stopped_worker_is_dropped_and_a_live_spare_takes_its_place(
    worker_processes: WorkerProcesses,
) -> None:
    server = await CoordinatorServer.start("127.0.0.1:0", worker_timeout=TIMEOUT)
    procs = worker_processes.start(server.port, 4)
    stopped: list[int] = []
    try:
        sessions = server.service.sessions
        await wait_for(lambda: len(sessions) == 4)
        config = JobConfig(
            workers=2,
            rounds=100_000,
            data=Component("synthetic", {"rows": 200, "dim": 4}),
            stragglers=Component("exponential", {"mean": 0.01}),
            round_timeout=600.0,  # far beyond the test: only liveness can unblock the round
            replace_timeout=600.0,
        )
        job = server.service.submit(config)
        await wait_for(lambda: len(job.records) >= 3)
        holders = {s.name for s in job.places.holders}
        idle = sorted(s.name for s in sessions.all() if s.name not in holders)
        # A hung idle worker first: dropped, so it can never be handed a place.
        hung_idle = procs[int(idle[0][1:])]
        os.kill(hung_idle.pid, signal.SIGSTOP)
        stopped.append(hung_idle.pid)
        await wait_for(lambda: idle[0] not in {s.name for s in sessions.all()}, timeout=20)
        # Then a worker of the job: the round it is in cannot decode without it.
        victim = job.places.holders[0].name
        os.kill(procs[int(victim[1:])].pid, signal.SIGSTOP)
        stopped.append(procs[int(victim[1:])].pid)
        before = len(job.records)
        await wait_for(lambda: len(job.records) >= before + 5, timeout=30)
        assert job.places.holders[0].name == idle[1]  # the live spare, not the hung one
        assert server.service.metrics.stragglers.labels("silent")._value.get() == 2
        assert job.state == "running"
        server.service.cancel(job.id)
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
        await server.stop(0)


async def test_workers_heartbeat_as_often_as_the_coordinator_asks(
    worker_processes: WorkerProcesses,
) -> None:
    """Idle workers (no job, nothing else to say) stay connected past many timeouts."""
    server = await CoordinatorServer.start("127.0.0.1:0", worker_timeout=TIMEOUT)
    try:
        worker_processes.start(server.port, 2)
        await wait_for(lambda: len(server.service.sessions) == 2)
        first = {s.id for s in server.service.sessions.all()}
        await asyncio.sleep(5 * TIMEOUT)
        assert {s.id for s in server.service.sessions.all()} == first
        assert server.service.metrics.stragglers.labels("silent")._value.get() == 0
    finally:
        await server.stop(0)


@pytest.mark.parametrize("value", [0.0, -1.0, float("nan")])
async def test_a_worker_timeout_that_is_not_positive_is_refused(value: float) -> None:
    with pytest.raises(Exception, match="--worker-timeout"):
        await CoordinatorServer.start("127.0.0.1:0", worker_timeout=value)
