"""A coordinator with --state-dir loses nothing when it dies: jobs resume exactly.

The coordinator runs as its own process; kill -9 (or SIGTERM) takes it down mid-job,
a new one starts on the same state directory, the workers (reconnecting with backoff)
are assigned again, and the job ends where an uninterrupted run of it ends: the same
loss every round and the same θ, bit for bit (policies whose rounds are deterministic
given the seed: frc's group sums and the lazy sums do not depend on arrival order; a
lag-wk worker is handed its last upload with its assignment, so it skips as it would have).
"""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from codedgd.client.api import Client
from codedgd.services.job import Component, JobConfig
from codedgd.services.records import RoundRecord
from tests.conftest import CoordinatorProcess, WorkerProcesses


@pytest.fixture
def coordinators(tmp_path: Path) -> Iterator[list[CoordinatorProcess]]:
    made: list[CoordinatorProcess] = []
    yield made
    for c in made:
        if c.proc is not None:
            c.proc.kill()
            c.finish()


def _config(policy: Component) -> JobConfig:
    return JobConfig(
        workers=4,
        rounds=60,
        seed=3,
        eval_every=1,
        data=Component("synthetic", {"rows": 400, "dim": 6}),
        policy=policy,
        # Rounds of a few ms each would end the job before the kill lands.
        stragglers=Component("exponential", {"mean": 0.01}),
    )


async def _run(
    c: CoordinatorProcess,
    workers: WorkerProcesses,
    config: JobConfig,
    kill_at: int | None = None,
    sig: signal.Signals = signal.SIGKILL,
) -> tuple[list[RoundRecord], np.ndarray, str]:
    """The job on coordinator ``c``; with ``kill_at``, ``sig`` takes the coordinator down
    once that round is running and a new one resumes it. (records, θ, job id)."""
    c.start()
    workers.start(c.port, config.workers)
    async with Client(c.target) as client:
        job_id = await client.submit(config)
    if kill_at is not None:
        await asyncio.to_thread(c.wait_round, kill_at)
        await asyncio.to_thread(c.signal, sig)
        await asyncio.to_thread(c.start)
    async with Client(c.target) as client:
        records = [r async for r in client.watch(job_id)]
        model = await client.model(job_id)
    return records, model.theta, job_id


async def _killed_and_resumed(
    tmp_path: Path,
    workers: WorkerProcesses,
    coordinators: list[CoordinatorProcess],
    config: JobConfig,
    kill_at: int,
) -> tuple[list[RoundRecord], np.ndarray, list[RoundRecord], np.ndarray, int]:
    """The job run straight, then on a coordinator (checkpoint every 5 rounds) killed -9
    at round ``kill_at`` and started again: (records and θ straight, records and θ
    resumed, the round it resumed at)."""
    straight = CoordinatorProcess(tmp_path / "straight")
    coordinators.append(straight)
    expected, theta, _ = await _run(straight, workers, config)
    workers.stop()
    killed = CoordinatorProcess(tmp_path / "killed", every=5)
    coordinators.append(killed)
    records, resumed, job_id = await _run(killed, workers, config, kill_at=kill_at)
    killed.signal(signal.SIGTERM)
    second_life = killed.logs[1]
    at = int(second_life.split(f"job {job_id} (running) will resume at round ")[1].split()[0])
    return expected, theta, records, resumed, at


@pytest.mark.parametrize(
    "policy",
    [
        Component("frc", {"s": 1}),
        # The lazy policies' memory (13 s each): the slow suite runs them.
        pytest.param(Component("lag-ps", {"xi": 1.0}), marks=pytest.mark.slow),
        pytest.param(Component("lag-wk", {"xi": 1.0}), marks=pytest.mark.slow),
    ],
    ids=["frc", "lag-ps", "lag-wk"],
)
async def test_kill_9_of_the_coordinator_mid_job_resumes_bit_identical(
    tmp_path: Path,
    worker_processes: WorkerProcesses,
    coordinators: list[CoordinatorProcess],
    policy: Component,
) -> None:
    config = _config(policy)
    expected, theta, records, resumed, at = await _killed_and_resumed(
        tmp_path, worker_processes, coordinators, config, kill_at=17
    )
    assert at >= 15 and at % 5 == 0  # from the last checkpoint (every 5 rounds) before it died
    assert [r.round for r in records] == list(range(60))
    assert [r.loss for r in records] == [r.loss for r in expected]  # bit for bit
    assert np.array_equal(resumed, theta)


async def test_sigterm_checkpoints_the_round_it_stopped_at_and_workers_come_back(
    tmp_path: Path, worker_processes: WorkerProcesses, coordinators: list[CoordinatorProcess]
) -> None:
    config = _config(Component("frc", {"s": 1}))
    straight = CoordinatorProcess(tmp_path / "straight")
    coordinators.append(straight)
    expected, theta, _ = await _run(straight, worker_processes, config)
    worker_processes.stop()
    c = CoordinatorProcess(tmp_path / "termed", every=1000)  # no periodic checkpoint
    coordinators.append(c)
    records, resumed, _ = await _run(c, worker_processes, config, 12, signal.SIGTERM)
    first_life = c.logs[0]
    resumed_at = int(first_life.split("resumes it at round ")[1].split()[0])
    assert resumed_at >= 12
    assert [r.loss for r in records] == [r.loss for r in expected]
    assert np.array_equal(resumed, theta)
    # The same worker processes served both lives: they reconnected after the Shutdown.
    assert all(p.poll() is None for p in worker_processes.procs[-config.workers :])


async def test_finished_jobs_and_their_models_survive_a_restart(
    tmp_path: Path, worker_processes: WorkerProcesses, coordinators: list[CoordinatorProcess]
) -> None:
    c = CoordinatorProcess(tmp_path / "state")
    coordinators.append(c)
    config = _config(Component("uncoded", {}))
    records, theta, job_id = await _run(c, worker_processes, config)
    c.signal(signal.SIGTERM)
    c.start()
    async with Client(c.target) as client:
        status = await client.status(job_id)
        assert status.jobs[0].state == "done" and status.jobs[0].rounds_done == 60
        assert [r.loss for r in [r async for r in client.watch(job_id)]] == [
            r.loss for r in records
        ]
        assert np.array_equal((await client.model(job_id)).theta, theta)


async def test_a_job_that_moved_its_data_resumes_with_its_new_plan(
    tmp_path: Path, worker_processes: WorkerProcesses, coordinators: list[CoordinatorProcess]
) -> None:
    # auto moves from groups of 2 to one group of 4 once its first look-ahead (from round
    # 2, in a thread) is done (workers 0 and 1 are late in every round); the coordinator
    # dies after a later checkpoint. The new one
    # must assign the workers groups of 4, not the job file's r = 2: otherwise they would
    # compute other partitions than the policy decodes (wrong gradients), or wait for the
    # late pair again.
    trace = tmp_path / "slow-pair.json"
    # (Rounds after the move take 0.05 s, so the kill lands in time.)
    trace.write_text(json.dumps({"delays": [[0.4, 0.4, 0.05, 0.05]] * 30}))
    config = JobConfig(
        workers=4,
        rounds=30,
        seed=3,
        eval_every=1,
        data=Component("synthetic", {"rows": 400, "dim": 6}),
        # (Eager rules only: every round exact, so the losses match wherever the move lands.)
        policy=Component("auto", {"window": 5, "choices": "4", "sizes": "2,4", "lazy": "none"}),
        stragglers=Component("trace", {"path": str(trace)}),
    )
    expected, theta, records, resumed, at = await _killed_and_resumed(
        tmp_path, worker_processes, coordinators, config, kill_at=17
    )
    notes = [(r.round, r.note.split(" (")[0]) for r in records if r.note]
    assert [note for _, note in notes] == ["auto: r=2 K=4 -> r=4 K=4"]
    assert at % 5 == 0 and at > notes[0][0]  # a checkpoint after the move
    assert all(r.exact for r in records)
    assert all(r.wait_seconds < 0.4 for r in records[at:])  # resumed with groups of 4
    np.testing.assert_allclose([r.loss for r in records], [r.loss for r in expected], rtol=1e-12)
    np.testing.assert_allclose(resumed, theta, rtol=1e-12)
