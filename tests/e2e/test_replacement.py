"""A worker that connects during a job takes the place of a lost one."""

from __future__ import annotations

import asyncio
import logging
import signal

import numpy as np
import pytest

from codedgd.services.coordinator.job_run import JobRun
from codedgd.services.coordinator.server import CoordinatorServer
from codedgd.services.job import Component, JobConfig
from codedgd.services.machine import this_machine
from codedgd.services.proto import codedgd_pb2 as pb
from codedgd.services.stragglers import create_straggler_model
from tests.conftest import WorkerProcesses
from tests.e2e.fakes import FakeWorker, result, wait_for
from tests.e2e.test_training import SYNTH, reference_gd


async def _finished(job: JobRun, timeout: float = 120) -> None:
    async def until() -> None:
        while not job.finished:
            await job.wait_change()

    await asyncio.wait_for(until(), timeout)


async def _kill_one_after(
    coordinator: CoordinatorServer,
    workers: WorkerProcesses,
    config: JobConfig,
    rounds: int,
    index: int,
) -> JobRun:
    """Start 3 workers and the job; after ``rounds`` rounds, SIGKILL worker ``index``."""
    procs = workers.start(coordinator.port, 3)
    job = coordinator.service.submit(config)
    await wait_for(lambda: len(job.records) >= rounds, timeout=90)
    name = job.places.holders[index].name
    next(p for p in procs if p.args[-1] == name).send_signal(signal.SIGKILL)
    await wait_for(lambda: index in job.places.lost, timeout=30)
    return job


def _assert_exact(job: JobRun, config: JobConfig) -> None:
    """Every round decoded from all three places, and θ is plain gradient descent's."""
    assert all(r.exact and r.workers_used == (0, 1, 2) for r in job.records)
    assert job.theta is not None
    expected = reference_gd(config)
    assert np.linalg.norm(job.theta - expected) <= 1e-9 * np.linalg.norm(expected)


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
    job = await _kill_one_after(coordinator, worker_processes, config, 5, index=1)
    worker_processes.start(coordinator.port, 1, name="newcomer")
    await _finished(job)
    assert job.state == "done", job.error
    assert len(job.records) == 30
    assert job.places.holders[1].name == "newcomer0"
    assert coordinator.service.metrics.replacements._value.get() == 1
    # Every round used all three partitions: the newcomer computed the lost worker's.
    _assert_exact(job, config)


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
    job = await _kill_one_after(coordinator, worker_processes, config, 3, index=0)
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
    job = await _kill_one_after(coordinator, worker_processes, config, 5, index=2)
    lost_at = len(job.records)  # the round in progress may still have used worker 2
    await wait_for(lambda: len(job.records) >= lost_at + 6, timeout=60)
    degraded = job.records[lost_at + 1 : lost_at + 6]
    worker_processes.start(coordinator.port, 1, name="newcomer")
    await wait_for(lambda: 2 not in job.places.lost, timeout=60)
    back_at = len(job.records)
    await _finished(job)
    assert job.state == "done", job.error
    # Without worker 2 the rounds decode from 0 and 1; once replaced, it answers again.
    assert all(r.workers_used == (0, 1) for r in degraded)
    assert any(2 in r.workers_used for r in job.records[back_at:])


async def test_a_newcomer_caught_joining_when_the_job_fails_is_released_for_the_next_job(
    coordinator: CoordinatorServer,
) -> None:
    """The job ends while a newcomer is mid-assignment: it gets JobEnd and serves again."""

    def zeros(round_: int, theta: np.ndarray, a: pb.Assignment) -> list[pb.Result]:
        return result(a.job_id, round_, np.zeros(theta.shape[0]))

    a, b = FakeWorker(coordinator.port, zeros, "a"), FakeWorker(coordinator.port, zeros, "b")
    newcomer = FakeWorker(coordinator.port, zeros, "newcomer", acks=False)
    fakes = [a, b, newcomer]
    a.start()
    b.start()
    try:
        await wait_for(lambda: len(coordinator.service.sessions) == 2)
        config = JobConfig(workers=2, rounds=10_000, data=SYNTH, replace_timeout=3.0)
        first = coordinator.service.submit(config)
        await wait_for(lambda: len(first.records) >= 2)
        await a.stop()  # lost: uncoded cannot decode without it, so the round waits
        await wait_for(lambda: bool(first.places.lost))
        newcomer.start()
        await wait_for(lambda: newcomer.assignment is not None)  # joining, never acks
        await _finished(first)
        assert first.state == "failed"
        assert "no worker took the place of lost worker(s)" in first.error
        # Released with the job, not after: its session is free when the end is published.
        session = next(s for s in coordinator.service.sessions.all() if s.name == "newcomer")
        assert session.job_id is None and session.index == -1
        await wait_for(lambda: any(m.HasField("job_end") for m in newcomer.received))
        newcomer.acks = True
        second = coordinator.service.submit(JobConfig(workers=2, rounds=3, data=SYNTH))
        await _finished(second)
        assert second.state == "done", second.error
        assert sorted(s.name for s in second.places.holders) == ["b", "newcomer"]
    finally:
        for fake in fakes:
            await fake.stop()


async def test_a_newcomer_that_never_acknowledges_holds_up_only_its_own_place(
    coordinator: CoordinatorServer,
) -> None:
    """Two places open; one newcomer goes silent; the other still fills its place at once."""

    def zeros(round_: int, theta: np.ndarray, a: pb.Assignment) -> list[pb.Result]:
        return result(a.job_id, round_, np.zeros(theta.shape[0]))

    a, b, c = (FakeWorker(coordinator.port, zeros, name) for name in "abc")
    mute = FakeWorker(coordinator.port, zeros, "mute", acks=False)
    good = FakeWorker(coordinator.port, zeros, "good")
    fakes = [a, b, c, mute, good]
    for fake in (a, b, c):
        fake.start()
    try:
        await wait_for(lambda: len(coordinator.service.sessions) == 3)
        # n - s = 2 of 3 must answer: with two lost, the rounds wait for a replacement.
        # replace_timeout is below the coordinator's assign_timeout (60 s): had the
        # good newcomer queued behind the mute one, the job would fail.
        config = JobConfig(
            workers=3,
            rounds=1_000_000,
            data=SYNTH,
            policy=Component("ignore-stragglers", {"s": 1}),
            replace_timeout=20.0,
        )
        job = coordinator.service.submit(config)
        await wait_for(lambda: len(job.records) >= 2)
        holders = {fake.name: fake for fake in (a, b, c)}
        for index in (0, 1):
            await holders[job.places.holders[index].name].stop()
        await wait_for(lambda: job.places.lost == {0, 1})
        mute.start()
        await wait_for(lambda: mute.assignment is not None)
        assert mute.assignment is not None and mute.assignment.worker_index == 0
        good.start()
        await wait_for(lambda: job.places.holders[1].name == "good", timeout=15)
        resumed_at = len(job.records)
        await wait_for(lambda: len(job.records) >= resumed_at + 5, timeout=15)
        assert job.state == "running", job.error
        assert all(r.workers_used == (1, 2) for r in job.records[resumed_at + 1 :])
        assert job.places.lost == {0} and job.places.candidates[0].name == "mute"
        coordinator.service.cancel(job.id)
        await _finished(job)
        assert job.state == "cancelled"
    finally:
        for fake in fakes:
            await fake.stop()


async def test_a_crashed_worker_that_restarts_takes_its_place_back_and_theta_stays_exact(
    coordinator: CoordinatorServer, worker_processes: WorkerProcesses
) -> None:
    """Straggler model crash: a worker drops its connection on θ of round 4 and connects
    again 0.3 s later as a new worker; uncoded waits for it (replace_timeout)."""
    config = JobConfig(
        workers=3,
        rounds=12,
        seed=3,
        data=SYNTH,
        model=Component("logistic", {"l2": 1e-3}),
        replace_timeout=60.0,
        stragglers=Component("crash", {"count": 1, "start": 4, "restart": 0.3}),
    )
    procs = worker_processes.start(coordinator.port, 3)
    job = coordinator.service.submit(config)
    await _finished(job)
    assert job.state == "done", job.error
    assert coordinator.service.metrics.replacements._value.get() == 1
    assert coordinator.service.metrics.stragglers.labels("lost")._value.get() == 1
    # Every round used all three places; round 4 waited for the restart.
    _assert_exact(job, config)
    assert job.records[4].wait_seconds >= 0.3
    assert all(p.poll() is None for p in procs)  # the crashed one is up again


async def test_a_worker_that_crashes_for_good_leaves_a_tolerant_policy_without_it(
    coordinator: CoordinatorServer, worker_processes: WorkerProcesses
) -> None:
    model = Component("crash", {"count": 1, "start": 2})  # restart < 0: never back
    crashed = create_straggler_model("crash", model.options, seed=0, n_workers=3).failed[0]
    config = JobConfig(
        workers=3,
        rounds=8,
        data=SYNTH,
        policy=Component("ignore-stragglers", {"s": 1}),
        stragglers=model,
    )
    procs = worker_processes.start(coordinator.port, 3)
    job = coordinator.service.submit(config)
    await _finished(job)
    assert job.state == "done", job.error
    # All three get θ up to round 2, where one crashes; rounds decode from the other
    # two. Whether the coordinator sees the disconnect before round 2 decodes (lost) or
    # after (cancelled), and so before round 3 starts or not, is a race of milliseconds;
    # from round 4 on only the two left are contacted.
    computations = [r.computations for r in job.records]
    assert computations[:3] == [3, 3, 3] and computations[4:] == [2] * 4
    assert [r.cancelled for r in job.records[4:]] == [0] * 4
    assert all(crashed not in r.workers_used for r in job.records[2:])
    name = job.places.holders[crashed].name
    crashed_proc = next(p for p in procs if p.args[-1] == name)
    assert crashed_proc.wait(timeout=30) == 0  # it left, and said why in its log
    assert crashed_proc.stderr is not None
    assert b"it never comes back" in crashed_proc.stderr.read()


async def test_a_round_waits_replace_timeout_for_a_replacement_even_past_round_timeout(
    coordinator: CoordinatorServer, worker_processes: WorkerProcesses
) -> None:
    config = JobConfig(
        workers=2,
        rounds=4,
        data=SYNTH,
        round_timeout=0.5,
        replace_timeout=30.0,
        stragglers=Component("crash", {"count": 1, "start": 1, "restart": 1.0}),
    )
    worker_processes.start(coordinator.port, 2)
    job = coordinator.service.submit(config)
    await _finished(job)
    assert job.state == "done", job.error
    assert job.records[1].wait_seconds > 1.0  # past round_timeout, for the newcomer
    assert all(r.workers_used == (0, 1) for r in job.records)


async def test_a_worker_counts_its_crashes_and_exports_them(
    coordinator: CoordinatorServer,
) -> None:
    """In-process agents: the one the crash model picks leaves run() (never back) with
    crashes = 1, which its Prometheus collector exports."""
    from prometheus_client import CollectorRegistry, generate_latest

    from codedgd.services.worker.agent import WorkerAgent, WorkerOptions
    from codedgd.services.worker.metrics import _AgentCollector

    agents = [
        WorkerAgent(WorkerOptions(coordinator=f"127.0.0.1:{coordinator.port}", name=f"a{i}"))
        for i in range(3)
    ]
    tasks = [asyncio.create_task(agent.run()) for agent in agents]
    try:
        await wait_for(lambda: len(coordinator.service.sessions) == 3)
        model = Component("crash", {"count": 1, "start": 1})
        config = JobConfig(
            workers=3,
            rounds=4,
            data=SYNTH,
            policy=Component("ignore-stragglers", {"s": 1}),
            stragglers=model,
        )
        job = coordinator.service.submit(config)
        await _finished(job)
        assert job.state == "done", job.error
        crashed = create_straggler_model("crash", model.options, seed=0, n_workers=3).failed[0]
        name = job.places.holders[crashed].name
        agent = next(a for a in agents if a.options.name == name)
        await asyncio.wait_for(tasks[agents.index(agent)], 10)  # it left run() for good
        assert [a.stats.crashes for a in agents] == [int(a is agent) for a in agents]
        registry = CollectorRegistry()
        registry.register(_AgentCollector(agent))
        assert b"codedgd_worker_crashes_total 1.0" in generate_latest(registry)
    finally:
        for a in agents:
            a.stop()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_worker_that_skips_under_a_policy_that_needs_every_result_is_replaced(
    coordinator: CoordinatorServer,
) -> None:
    """A `skipped` result under uncoded (only lag-wk's workers skip) is the sender's fault:
    it is thrown out, naming why, an idle worker takes its place, and the job ends done."""

    def zeros(round_: int, theta: np.ndarray, a: pb.Assignment) -> list[pb.Result]:
        return result(a.job_id, round_, np.zeros(theta.shape[0]))

    def skips(round_: int, theta: np.ndarray, a: pb.Assignment) -> list[pb.Result]:
        if round_ < 2:
            return zeros(round_, theta, a)
        return [pb.Result(job_id=a.job_id, round=round_, skipped=True)]

    a, skipper = FakeWorker(coordinator.port, zeros, "a"), FakeWorker(coordinator.port, skips, "s")
    spare = FakeWorker(coordinator.port, zeros, "spare")
    fakes = [a, skipper, spare]
    for fake in fakes[:2]:
        fake.start()
    try:
        await wait_for(lambda: len(coordinator.service.sessions) == 2)
        config = JobConfig(workers=2, rounds=6, data=SYNTH, replace_timeout=30.0)
        job = coordinator.service.submit(config)
        await wait_for(lambda: job.state == "running")
        spare.start()
        await _finished(job)
        assert job.state == "done", job.error
        assert len(job.records) == 6
        assert sorted(s.name for s in job.places.holders) == ["a", "spare"]
        assert skipper.rejected is not None
        assert "skipped its upload" in skipper.rejected and "uncoded" in skipper.rejected
        rejected = coordinator.service.metrics.stragglers.labels("rejected")._value.get()
        assert rejected >= 1
    finally:
        for fake in fakes:
            await fake.stop()


async def test_a_worker_that_reports_an_error_is_released_at_once(
    coordinator: CoordinatorServer,
) -> None:
    """WorkerError: the worker loses its place and gets JobEnd while the job goes on
    without it (ignore-stragglers) or with a newcomer; it serves the next job."""

    def zeros(round_: int, theta: np.ndarray, a: pb.Assignment) -> list[pb.Result]:
        return result(a.job_id, round_, np.zeros(theta.shape[0]))

    def fails(round_: int, theta: np.ndarray, a: pb.Assignment) -> list[pb.Result | bytes]:
        if round_ != 2:
            return list(zeros(round_, theta, a))
        error = pb.WorkerError(job_id=a.job_id, round=round_, message="disk on fire")
        return [pb.WorkerMessage(error=error).SerializeToString()]

    fakes = [FakeWorker(coordinator.port, zeros, "a"), FakeWorker(coordinator.port, zeros, "b")]
    failing = FakeWorker(coordinator.port, fails, "f")  # type: ignore[arg-type]
    fakes.append(failing)
    for fake in fakes:
        fake.start()
    try:
        await wait_for(lambda: len(coordinator.service.sessions) == 3)
        config = JobConfig(
            workers=3, rounds=100_000, data=SYNTH, policy=Component("ignore-stragglers", {"s": 1})
        )
        job = coordinator.service.submit(config)
        session = next(s for s in coordinator.service.sessions.all() if s.name == "f")
        await wait_for(lambda: job.state == "running")
        index = session.index
        await wait_for(lambda: any(m.HasField("job_end") for m in failing.received))
        end = next(m.job_end for m in failing.received if m.HasField("job_end"))
        assert end.job_id == job.id and "disk on fire" in end.reason
        assert session.job_id is None and session.index == -1
        assert not job.finished  # released while the job goes on without it
        rounds = len(job.records)
        await wait_for(lambda: len(job.records) >= rounds + 3)
        assert all(index not in r.workers_used for r in job.records[rounds:])
        coordinator.service.cancel(job.id)
        await _finished(job)
        second = coordinator.service.submit(JobConfig(workers=3, rounds=2, data=SYNTH))
        await _finished(second)
        assert second.state == "done", second.error
        assert "f" in {s.name for s in second.places.holders}
    finally:
        for fake in fakes:
            await fake.stop()


async def test_a_newcomer_in_an_auto_job_is_not_taken_for_the_machine_the_prior_knew(
    coordinator: CoordinatorServer,
    worker_processes: WorkerProcesses,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """auto's prior (tune --write-auto) is each place's machine's slowness: the
    coordinator tells the policy a new machine holds place 1, and its entry goes."""
    caplog.set_level(logging.INFO, logger="codedgd.services.policies.auto")
    config = JobConfig(
        workers=3,
        rounds=12,
        seed=7,
        data=SYNTH,
        model=Component("logistic", {"l2": 1e-3}),
        replace_timeout=60.0,
        policy=Component("auto", {"r": 1, "prior": "2,3,4", "lazy": "none"}),
        stragglers=Component("exponential", {"mean": 0.01}),
    )
    job = await _kill_one_after(coordinator, worker_processes, config, 3, index=1)
    worker_processes.start(coordinator.port, 1, name="newcomer")
    await _finished(job)
    assert job.state == "done", job.error
    assert job.places.holders[1].name == "newcomer0"
    dropped = [r.getMessage() for r in caplog.records if "prior slowness" in r.getMessage()]
    assert dropped == [
        "auto: a new worker, newcomer0, holds place 1: its prior slowness 3 (the old "
        "machine's, from tune) is dropped"
    ]
    # The records say which machine held which place: all three at round 0, then the
    # newcomer, in the first record after it took the place.
    named = [(r.round, dict(r.holders)) for r in job.records if r.holders]
    assert len(named) == 2 and named[0][0] == 0 and set(named[0][1]) == {0, 1, 2}
    assert named[1][1] == {1: "newcomer0"} and named[1][0] >= 3  # (killed after round 2)
    # And on which machine: each holder's Hello said this one, beside the coordinator's.
    here = this_machine()
    assert here.known and here.cpus >= 1
    placed = [(r.round, dict(r.machines), r.coordinator_machine) for r in job.records if r.machines]
    assert placed == [
        (named[0][0], {0: here, 1: here, 2: here}, here),
        (named[1][0], {1: here}, here),
    ]
    assert all(r.coordinator_machine is None for r in job.records if not r.machines)
