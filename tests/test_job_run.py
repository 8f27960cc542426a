"""A job's watchers hear every change, however they wait for it."""

from __future__ import annotations

import asyncio

from services.coordinator.metrics import CoordinatorMetrics
from services.coordinator.runner import JobRun
from services.coordinator.sessions import Sessions
from services.job import JobConfig


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
