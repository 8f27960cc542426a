"""A job's watchers hear every change, however they wait for it."""

from __future__ import annotations

import asyncio

import pytest

from codedgd.services.coordinator import job_run
from codedgd.services.coordinator.job_run import JobRun
from codedgd.services.coordinator.metrics import CoordinatorMetrics
from codedgd.services.coordinator.sessions import Sessions, WorkerSession
from codedgd.services.job import JobConfig
from codedgd.services.proto import codedgd_pb2 as pb


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


class _Tree:
    """The data plane of a tree whose worker 1 is the parent of workers 3 and 4."""

    def peers(self, index: int) -> set[int]:
        return {0, 3, 4} if index == 1 else {1}


async def test_a_failed_link_to_a_places_former_holder_costs_the_newcomer_nothing() -> None:
    """A parent's link to a killed leaf may fail only after a newcomer took the leaf's
    place (the report crosses the PeerUpdate): it names the old address, and the
    newcomer keeps its place. The same report naming the newcomer's address loses it."""
    job = JobRun("j", JobConfig(), Sessions(), CoordinatorMetrics())
    sessions = [
        WorkerSession(id=i + 1, name=f"w{i}", peer="", has_data_dir=False, peer_address=f"h:{i}")
        for i in range(5)
    ]
    job.places.take_all(sessions)
    job._plane = _Tree()  # type: ignore[assignment]
    newcomer = WorkerSession(id=9, name="w9", peer="", has_data_dir=False, peer_address="h:9")
    newcomer.job_id, newcomer.index = "j", 4
    job.places.holders[4] = newcomer  # it took the place of the killed w4 (at h:4)

    def report(address: str) -> pb.PeerFailure:
        return pb.PeerFailure(job_id="j", round=5, peer=4, reason="Socket closed", address=address)

    job.peer_failure(sessions[1], report("h:4"))
    assert not job.places.lost
    job.peer_failure(sessions[1], report(""))  # a worker that names no address: as before
    assert job.places.lost == {4}
    job.places.lost.clear()
    job.peer_failure(sessions[1], report("h:9"))
    assert job.places.lost == {4}
