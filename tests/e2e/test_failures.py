"""Workers that die, send old rounds or malformed messages; the coordinator keeps serving."""

from __future__ import annotations

import asyncio
import signal

import numpy as np
import pytest

from codedgd.client.api import Client
from codedgd.services.coordinator.server import CoordinatorServer
from codedgd.services.errors import ConfigError, JobFailed
from codedgd.services.job import Component, JobConfig
from codedgd.services.proto import codedgd_pb2 as pb
from tests.conftest import WorkerProcesses
from tests.e2e.fakes import FakeWorker, result, wait_for

SYNTH = Component("synthetic", {"rows": 600, "dim": 8})


async def _finish(server: CoordinatorServer, job_id: str, timeout: float = 120) -> str:
    job = server.service.jobs[job_id]
    await asyncio.wait_for(_until_finished(job), timeout)
    return job.state


async def _until_finished(job: object) -> None:
    while not job.finished:  # type: ignore[attr-defined]
        await job.wait_change()  # type: ignore[attr-defined]


async def test_killed_worker_does_not_hang_a_tolerant_policy(
    coordinator: CoordinatorServer, worker_processes: WorkerProcesses
) -> None:
    procs = worker_processes.start(coordinator.port, 4)
    config = JobConfig(
        workers=4,
        rounds=40,
        data=SYNTH,
        policy=Component("ignore-stragglers", {"s": 1}),
        stragglers=Component("exponential", {"mean": 0.01}),
    )
    job = coordinator.service.submit(config)
    await wait_for(lambda: len(job.records) >= 5, timeout=90)
    victim = job.places.holders[2]
    index = victim.index
    next(p for p in procs if p.args[-1] == victim.name).send_signal(signal.SIGKILL)
    assert await _finish(coordinator, job.id) == "done"
    assert len(job.records) == 40
    late = [r for r in job.records if r.round > 10]
    assert all(index not in r.workers_used for r in late)


async def test_killed_worker_fails_uncoded_clearly_and_coordinator_keeps_serving(
    coordinator: CoordinatorServer, worker_processes: WorkerProcesses
) -> None:
    procs = worker_processes.start(coordinator.port, 3)
    config = JobConfig(
        workers=3, rounds=500, data=SYNTH, stragglers=Component("exponential", {"mean": 0.01})
    )
    job = coordinator.service.submit(config)
    await wait_for(lambda: len(job.records) >= 3, timeout=90)
    procs[0].send_signal(signal.SIGKILL)
    assert await _finish(coordinator, job.id) == "failed"
    assert "cannot decode" in job.error and "lost" in job.error
    assert "ignore-stragglers" in job.error  # names the fix
    # The coordinator still serves: a new job on the two survivors completes.
    survivor_job = coordinator.service.submit(JobConfig(workers=2, rounds=3, data=SYNTH))
    assert await _finish(coordinator, survivor_job.id) == "done"


async def test_hung_worker_fails_uncoded_at_the_round_timeout_and_its_next_job_runs(
    coordinator: CoordinatorServer, worker_processes: WorkerProcesses
) -> None:
    # fail-stop: one worker (chosen from the seed) computes but never answers from round 2.
    worker_processes.start(coordinator.port, 3)
    config = JobConfig(
        workers=3,
        rounds=10,
        round_timeout=2.0,
        data=SYNTH,
        stragglers=Component("fail-stop", {"count": 1, "start": 2}),
    )
    job = coordinator.service.submit(config)
    assert await _finish(coordinator, job.id) == "failed"
    assert len(job.records) == 2
    assert "round 2 was not decodable within job.round_timeout=2 s" in job.error
    # The hung worker was told the job ended: it takes the next job like the others.
    again = coordinator.service.submit(JobConfig(workers=3, rounds=3, data=SYNTH))
    assert await _finish(coordinator, again.id) == "done"


async def test_late_result_of_an_old_round_is_dropped(
    coordinator: CoordinatorServer, worker_processes: WorkerProcesses
) -> None:
    sent: list[int] = []

    def stale(round_: int, theta: np.ndarray, a: pb.Assignment) -> list[pb.Result]:
        if round_ == 0:
            return []
        sent.append(round_ - 1)
        # A plausible gradient of the right shape, but for the previous round.
        return result(a.job_id, round_ - 1, np.full(theta.shape[0], 1e6))

    fake = FakeWorker(coordinator.port, stale)
    fake.start()
    await wait_for(lambda: len(coordinator.service.sessions) == 1)
    worker_processes.start(coordinator.port, 1)
    config = JobConfig(
        workers=2, rounds=8, data=SYNTH, policy=Component("ignore-stragglers", {"s": 1})
    )
    job = coordinator.service.submit(config)
    try:
        assert await _finish(coordinator, job.id) == "done"
    finally:
        await fake.stop()
    fake_index = next(i for i, s in enumerate(job.places.holders) if s.name == "fake")
    assert sent, "the fake worker never sent a stale result"
    assert sum(r.late_dropped for r in job.records) >= 1
    assert all(fake_index not in r.workers_used for r in job.records)
    # Never mixed in: the huge stale vector would have blown up the loss.
    assert all(np.isfinite(r.loss) and r.loss < 1.0 for r in job.records)


def _shape(a: pb.Assignment, round_: int, theta: np.ndarray) -> list[pb.Result | bytes]:
    return list(result(a.job_id, round_, np.zeros(theta.shape[0] - 1)))


def _dtype(a: pb.Assignment, round_: int, theta: np.ndarray) -> list[pb.Result | bytes]:
    return list(result(a.job_id, round_, np.zeros(theta.shape[0], dtype=np.float32)))


def _non_finite(a: pb.Assignment, round_: int, theta: np.ndarray) -> list[pb.Result | bytes]:
    values = np.ones(theta.shape[0])
    values[1] = np.nan  # a worker fault, not a divergence of the descent
    return list(result(a.job_id, round_, values))


def _garbage(a: pb.Assignment, round_: int, theta: np.ndarray) -> list[pb.Result | bytes]:
    # A result field whose length runs past the end of the frame: not protobuf.
    return [b"\x1a\x7f\x0a\x03abc"]


@pytest.mark.parametrize(
    "make,reason",
    [
        (_shape, "shape"),
        (_dtype, "dtype"),
        (_garbage, "malformed WorkerMessage frame"),
        (_non_finite, "not finite numbers (NaN or inf)"),
    ],
    ids=["shape", "dtype", "not-protobuf", "non-finite"],
)
async def test_malformed_gradient_is_rejected_and_job_fails_clearly(
    coordinator: CoordinatorServer,
    worker_processes: WorkerProcesses,
    make: object,
    reason: str,
) -> None:
    def bad(round_: int, theta: np.ndarray, a: pb.Assignment) -> list[pb.Result | bytes]:
        return make(a, round_, theta)  # type: ignore[operator, no-any-return]

    fake = FakeWorker(coordinator.port, bad)
    fake.start()
    await wait_for(lambda: len(coordinator.service.sessions) == 1)
    worker_processes.start(coordinator.port, 1)
    job = coordinator.service.submit(JobConfig(workers=2, rounds=5, data=SYNTH))
    try:
        assert await _finish(coordinator, job.id) == "failed"
        await wait_for(lambda: fake.rejected is not None)
    finally:
        await fake.stop()
    assert fake.rejected is not None and reason in fake.rejected
    assert "sent a bad message" in job.error and reason in job.error
    assert "diverged" not in job.error and "step size" not in job.error
    # Still serving: status answers, and a fresh job on the real worker completes.
    async with Client(f"127.0.0.1:{coordinator.port}") as client:
        status = await client.status()
        assert status.workers_connected == 1
        job_id = await client.submit(JobConfig(workers=1, rounds=2, data=SYNTH))
        records = [r async for r in client.watch(job_id)]
    assert len(records) == 2


async def test_bad_jobs_get_clear_errors_and_the_coordinator_keeps_serving(
    coordinator: CoordinatorServer,
    worker_processes: WorkerProcesses,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CODEDGD_DATA_DIR", raising=False)
    async with Client(f"127.0.0.1:{coordinator.port}") as client:
        unknown = r"unknown policy 'uncoded2'\. Did you mean uncoded"
        with pytest.raises(ConfigError, match=unknown):
            await client.submit(JobConfig(policy=Component("uncoded2")))
        with pytest.raises(ConfigError, match="0 <= s < n"):
            await client.submit(
                JobConfig(workers=3, policy=Component("ignore-stragglers", {"s": 3}))
            )
        with pytest.raises(ConfigError, match="has no parameter 'q'"):
            await client.submit(JobConfig(policy=Component("ignore-stragglers", {"q": 1})))
        with pytest.raises(ConfigError, match="CODEDGD_DATA_DIR"):
            await client.submit(JobConfig(data=Component("amazon")))
        with pytest.raises(ConfigError, match="unknown model"):
            await client.submit(JobConfig(model=Component("svm")))
        worker_processes.start(coordinator.port, 1)
        job_id = await client.submit(JobConfig(workers=1, rounds=2, data=SYNTH))
        assert len([r async for r in client.watch(job_id)]) == 2


async def test_job_waiting_for_missing_workers_times_out_clearly() -> None:
    server = await CoordinatorServer.start("127.0.0.1:0", assign_timeout=0.5)
    try:
        job = server.service.submit(JobConfig(workers=2, rounds=1, data=SYNTH))
        assert await _finish(server, job.id) == "failed"
        assert "needs 2 workers" in job.error and "start more workers" in job.error
        async with Client(f"127.0.0.1:{server.port}") as client:
            with pytest.raises(JobFailed, match="needs 2 workers"):
                [r async for r in client.watch(job.id)]
    finally:
        await server.stop(0)


async def test_a_worker_sending_nan_is_replaced_and_the_job_stays_exact(
    coordinator: CoordinatorServer, worker_processes: WorkerProcesses
) -> None:
    """The NaN never enters the sum: its sender is thrown out (counted as non-finite), a
    spare takes its place, and θ is plain gradient descent's."""
    from tests.e2e.test_training import reference_gd

    def poisoned(round_: int, theta: np.ndarray, a: pb.Assignment) -> list[pb.Result | bytes]:
        return _non_finite(a, round_, theta)  # its first result: it has no data to do better

    fake = FakeWorker(coordinator.port, poisoned)
    fake.start()
    await wait_for(lambda: len(coordinator.service.sessions) == 1)
    worker_processes.start(coordinator.port, 1)
    await wait_for(lambda: len(coordinator.service.sessions) == 2)
    config = JobConfig(workers=2, rounds=6, seed=2, data=SYNTH, replace_timeout=60)
    job = coordinator.service.submit(config)
    await wait_for(lambda: fake.rejected is not None, timeout=60)
    worker_processes.start(coordinator.port, 1, name="spare")
    try:
        assert await _finish(coordinator, job.id) == "done", job.error
    finally:
        await fake.stop()
    assert "not finite" in (fake.rejected or "")
    stragglers = coordinator.service.metrics.stragglers
    assert stragglers.labels("non_finite")._value.get() == 1
    assert job.theta is not None
    expected = reference_gd(config)
    assert np.linalg.norm(job.theta - expected) <= 1e-9 * np.linalg.norm(expected)


@pytest.mark.parametrize(
    ("name", "peer_address", "machine", "needle"),
    [
        ("w1\n2026-11-25 INFO codedgd.coordinator: forged", "", None, "characters other than"),
        ("x" * 100_000, "", None, "100000 characters long"),
        ("w1", "10.0.0.1:1\nforged", None, "is not HOST:PORT"),
        ("w1", "", pb.Machine(id="m\nforged"), "machine id 'm\\nforged' is not"),
        ("w1", "", pb.Machine(id="m" * 100_000), "is not at most 64 letters"),
        ("w1", "", pb.Machine(id="m1", cpus=2**31), "is not a count of cores"),
    ],
)
async def test_a_worker_whose_hello_would_forge_a_log_line_is_refused(
    coordinator: CoordinatorServer,
    caplog: pytest.LogCaptureFixture,
    name: str,
    peer_address: str,
    machine: pb.Machine | None,
    needle: str,
) -> None:
    """A name with a newline (a forged log line), a 100 KB name, a peer address that is
    not HOST:PORT, or a machine that is no machine's: the worker is refused with the
    reason, and no log line carries it."""
    fake = FakeWorker(
        coordinator.port,
        lambda *_: [],
        name=name,
        peer_address=peer_address,
        machine=machine,
    )
    fake.start()
    try:
        await wait_for(lambda: fake.rejected is not None)
    finally:
        await fake.stop()
    assert fake.rejected is not None and needle in fake.rejected
    assert len(coordinator.service.sessions) == 0
    for record in caplog.records:
        line = record.getMessage()
        assert "\n" not in line and len(line) < 2000


async def test_a_workers_error_text_is_one_escaped_log_line(
    coordinator: CoordinatorServer, caplog: pytest.LogCaptureFixture
) -> None:
    def fails(round_: int, theta: np.ndarray, a: pb.Assignment) -> list[pb.Result | bytes]:
        text = "oops\n2026-11-25 INFO codedgd.coordinator: job done" + "y" * 50_000
        error = pb.WorkerError(job_id=a.job_id, round=round_, message=text)
        return [pb.WorkerMessage(error=error).SerializeToString()]

    fake = FakeWorker(coordinator.port, fails)
    fake.start()
    try:
        await wait_for(lambda: len(coordinator.service.sessions) == 1)
        job = coordinator.service.submit(JobConfig(workers=1, rounds=3, data=SYNTH))
        assert await _finish(coordinator, job.id) == "failed"
    finally:
        await fake.stop()
    assert "oops\\n2026-11-25" in job.error and "characters)" in job.error  # cut, and says so
    assert "\n" not in job.error and len(job.error) < 3000
    reports = [r.getMessage() for r in caplog.records if "reports" in r.getMessage()]
    assert reports and all("\n" not in line and len(line) < 2000 for line in reports)


async def test_a_peer_failure_about_a_worker_it_exchanges_nothing_with_is_ignored(
    coordinator: CoordinatorServer, worker_processes: WorkerProcesses
) -> None:
    """In a star job no worker talks to another: one that reports every other worker
    unreachable (a lie, or a bug) costs nobody their place, and the job finishes."""
    reports: list[int] = []

    def accuses(round_: int, theta: np.ndarray, a: pb.Assignment) -> list[pb.Result | bytes]:
        out: list[pb.Result | bytes] = []
        for peer in range(a.n_workers):
            if peer != a.worker_index:
                reports.append(peer)
                failure = pb.PeerFailure(job_id=a.job_id, round=round_, peer=peer, reason="x")
                out.append(pb.WorkerMessage(peer_failure=failure).SerializeToString())
        return [*out, *result(a.job_id, round_, np.zeros(theta.shape[0]))]

    fake = FakeWorker(coordinator.port, accuses)
    fake.start()
    await wait_for(lambda: len(coordinator.service.sessions) == 1)
    worker_processes.start(coordinator.port, 2)
    await wait_for(lambda: len(coordinator.service.sessions) == 3)
    job = coordinator.service.submit(JobConfig(workers=3, rounds=4, data=SYNTH))
    try:
        assert await _finish(coordinator, job.id) == "done", job.error
    finally:
        await fake.stop()
    assert reports and not job.places.lost
    peer_unreachable = coordinator.service.metrics.stragglers.labels("peer_unreachable")
    assert peer_unreachable._value.get() == 0


async def test_a_worker_lost_while_taking_its_assignment_leaves_a_vacant_place(
    coordinator: CoordinatorServer, worker_processes: WorkerProcesses
) -> None:
    """A worker that disconnects before it acknowledges (a crash at start-up, a cut link)
    does not fail the job: its place is vacant like a lost worker's, and a policy that
    tolerates a straggler trains without it."""
    fake = FakeWorker(coordinator.port, lambda *_: [], acks=False)
    fake.start()
    await wait_for(lambda: len(coordinator.service.sessions) == 1)
    worker_processes.start(coordinator.port, 2)
    await wait_for(lambda: len(coordinator.service.sessions) == 3)
    config = JobConfig(
        workers=3, rounds=4, data=SYNTH, policy=Component("ignore-stragglers", {"s": 1})
    )
    job = coordinator.service.submit(config)
    await wait_for(lambda: fake.assignment is not None)
    await fake.stop()
    assert await _finish(coordinator, job.id) == "done", job.error
    assert len(job.records) == 4
    assert all(len(r.workers_used) == 2 for r in job.records)
