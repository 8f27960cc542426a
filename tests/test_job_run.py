"""A job's watchers hear every change, however they wait for it."""

from __future__ import annotations

import asyncio

import pytest

from codedgd.services.coordinator import job_run
from codedgd.services.coordinator.job_run import JobRun
from codedgd.services.coordinator.metrics import CoordinatorMetrics
from codedgd.services.coordinator.sessions import Sessions
from codedgd.services.job import JobConfig


async def test_a_change_published_before_the_waiting_task_runs_is_not_missed() -> None:
    job = JobRun("j", JobConfig(), Sessions(), CoordinatorMetrics())
    # What WatchJob and `codedgd run` do: wrap the wait in a task, which first runs later.
    waiter = asyncio.ensure_future(job.wait_change())
    job.state = "done"
    job._publish()  # the job's end, before the waiter's first step
    await asyncio.wait_for(waiter, timeout=5)  # hung here when the task took the event late


async def test_a_watcher_waits_for_the_next_change_only() -> None:
    job = JobRun("j", JobConfig(), Sessions(), CoordinatorMetrics())
    job._publish()
    waiter = asyncio.ensure_future(job.wait_change())  # after that change
    await asyncio.sleep(0.05)
    assert not waiter.done()
    job._publish()
    await asyncio.wait_for(waiter, timeout=5)


async def test_a_cancel_while_the_job_lets_its_replacer_go_ends_it_cancelled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The client was told 'cancelled': the job must not then report 'done'."""
    job = JobRun("j", JobConfig(), Sessions(), CoordinatorMetrics())
    stopping = asyncio.Event()

    async def nothing(*args: object) -> None:
        await asyncio.sleep(0.05)  # the replacer task starts meanwhile

    class SlowReplacer:
        def __init__(self, *args: object) -> None:
            pass

        async def run(self) -> None:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                stopping.set()
                await asyncio.sleep(0.2)  # releasing newcomers takes a moment
                raise

    monkeypatch.setattr(job_run, "prepare", lambda config, data_dir: None)
    monkeypatch.setattr(job, "_assign", nothing)
    monkeypatch.setattr(job, "_rounds", nothing)  # every round done at once
    monkeypatch.setattr(job_run, "Replacer", SlowReplacer)
    task = asyncio.create_task(job.run())
    await asyncio.wait_for(stopping.wait(), 5)
    task.cancel()  # what CoordinatorService.cancel does
    await asyncio.wait_for(task, 5)
    assert job.state == "cancelled"
