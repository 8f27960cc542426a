"""Seeing what the coordinator does: what a job waits for (status, progress bar, log),
its life in the coordinator's log, `status --json` / `watch --json` for scripts, the
policy's counters, and gRPC server reflection."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from codedgd.client.api import Client, CoordinatorStatus, JobState
from codedgd.client.cli import jobs
from codedgd.services.coordinator.server import CoordinatorServer
from codedgd.services.job import Component, JobConfig
from codedgd.services.records import RoundRecord
from codedgd.services.security import Security
from tests.conftest import ROOT, WorkerProcesses
from tests.e2e.fakes import FakeWorker
from tests.factories import round_record

SMALL = Component("synthetic", {"rows": 400, "dim": 5})


def codedgd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "codedgd.client.cli", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )


async def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """The `codedgd` command, run while this event loop serves the coordinator."""
    return await asyncio.to_thread(codedgd, *args)


async def job_status(client: Client, job_id: str, detail: str) -> JobState:
    """The job's state once its detail is ``detail`` (fails after 30 s)."""
    seen = ""
    for _ in range(600):
        status = await client.status(job_id)
        seen = status.jobs[0].detail
        if seen == detail:
            return status.jobs[0]
        await asyncio.sleep(0.05)
    raise AssertionError(f"detail {seen!r}, expected {detail!r}")


async def test_a_job_short_of_workers_says_how_many_more_it_waits_for(
    coordinator: CoordinatorServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="codedgd.coordinator")
    target = f"127.0.0.1:{coordinator.port}"
    fakes: list[FakeWorker] = []
    async with Client(target) as client:
        job_id = await client.submit(JobConfig(workers=3, rounds=2, data=SMALL))
        await job_status(client, job_id, "waiting for 3 more workers (0 connected, job needs 3)")
        for i in range(2):
            fakes.append(FakeWorker(coordinator.port, lambda *_: [], name=f"f{i}"))
            fakes[-1].start()
            await job_status(
                client,
                job_id,
                f"waiting for {2 - i} more worker{'s' if i == 0 else ''} "
                f"({i + 1} connected, job needs 3)",
            )
        job = await job_status(
            client, job_id, "waiting for 1 more worker (2 connected, job needs 3)"
        )
        assert (job.state, job.workers_missing, job.workers_needed) == ("assigning", 1, 3)
        registry = coordinator.service.metrics.registry
        assert registry.get_sample_value("codedgd_workers_missing") == 1

        # `codedgd status`, as text and as one JSON object.
        text = await cli("status", "--coordinator", target)
        assert text.returncode == 0, text.stderr
        assert (
            f"job {job_id}: assigning, 0/2 rounds done "
            "(waiting for 1 more worker (2 connected, job needs 3))"
        ) in text.stdout
        as_json = await cli("status", job_id, "--coordinator", target, "--json")
        assert as_json.returncode == 0, as_json.stderr
        doc = json.loads(as_json.stdout)
        assert doc["workers_connected"] == 2 and sorted(doc["workers"]) == ["f0", "f1"]
        (only,) = doc["jobs"]
        assert only["job_id"] == job_id and only["state"] == "assigning"
        assert only["detail"] == "waiting for 1 more worker (2 connected, job needs 3)"
        assert (only["workers_missing"], only["workers_needed"]) == (1, 3)
        assert only["loss"] is None  # NaN before any round: null in JSON

        # A job submitted meanwhile says whose turn it waits for.
        second = await client.submit(JobConfig(workers=1, rounds=2, data=SMALL))
        queued = (await client.status(second)).jobs[0]
        assert queued.state == "queued"
        assert queued.detail == f"queued behind job {job_id} (jobs run one at a time)"

        assert await client.cancel(second)
        assert await client.cancel(job_id)
    for fake in fakes:
        await fake.stop()
    # The log says it once per count, not on every wake-up.
    waiting = [r.getMessage() for r in caplog.records if "more worker" in r.getMessage()]
    assert waiting == [
        f"job {job_id}: waiting for 3 more workers (0 connected, job needs 3)",
        f"job {job_id}: waiting for 2 more workers (1 connected, job needs 3)",
        f"job {job_id}: waiting for 1 more worker (2 connected, job needs 3)",
    ]
    assert all(r.levelno == logging.INFO for r in caplog.records if "more worker" in r.message)


class RecordingBar:
    """Stands in for the progress bar: what it was told."""

    shown: list[str]

    def __init__(self, rounds: int, *, enabled: bool = True) -> None:
        RecordingBar.shown = []

    def status(self, text: str) -> None:
        RecordingBar.shown.append(text)

    def update(self, record: RoundRecord) -> None:
        RecordingBar.shown.append(f"round {record.round}")

    def close(self) -> None:
        pass


def _record(t: int) -> RoundRecord:
    return round_record(
        t,
        wall_seconds=0.5 * (t + 1),
        round_seconds=0.5,
        wait_seconds=0.4,
        compute_seconds_max=0.1,
        loss=1.0 / (t + 1),
        metric_name="mse",
        workers_used=(0, 1),
        bytes_up=80,
        bytes_down=80,
        uploads=2,
        computations=2,
    )


class WaitingClient:
    """A coordinator's client whose job waits for a worker, then runs two rounds."""

    detail = "waiting for 1 more worker (2 connected, job needs 3)"

    async def status(self, job_id: str = "") -> CoordinatorStatus:
        job = JobState(job_id, "assigning", 0, 2, "", float("nan"), float("nan"), "", self.detail)
        return CoordinatorStatus((job,), 2, ("a", "b"))

    async def watch(self, job_id: str) -> AsyncIterator[RoundRecord]:
        while self.detail not in RecordingBar.shown:
            await asyncio.sleep(0.01)
        for t in range(2):
            yield _record(t)


async def test_the_progress_bar_shows_what_the_job_waits_for_then_its_rounds(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("codedgd.client.progress.Progress", RecordingBar)
    client = WaitingClient()
    assert (
        await asyncio.wait_for(
            jobs.watch_job(client, "j1", 2, None, None, progress=True), timeout=30
        )
        == 0
    )
    assert RecordingBar.shown[0] == client.detail
    assert RecordingBar.shown[-2:] == ["round 0", "round 1"]
    # Plain `watch` ends with a line saying how the job ended.
    assert capsys.readouterr().out.splitlines()[-1] == "job j1 done: 2 rounds in 1.00 s, loss 0.5"


async def test_a_job_s_life_in_the_log_and_in_json_for_scripts(
    coordinator: CoordinatorServer,
    worker_processes: WorkerProcesses,
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
) -> None:
    caplog.set_level(logging.INFO, logger="codedgd.coordinator")
    target = f"127.0.0.1:{coordinator.port}"
    worker_processes.start(coordinator.port, 2)
    out = tmp_path / "lag.json"
    rounds = 20
    proc = await cli(
        "submit",
        "--coordinator",
        target,
        "-n",
        "2",
        "-r",
        str(rounds),
        "--data-opt",
        "rows=400",
        "--data-opt",
        "dim=5",
        "--model",
        "least-squares",
        "--policy",
        "lag-wk",
        "--watch",
        "--json",
        "--no-progress",
        "-o",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    first, *per_round, end = lines
    job_id = first["job_id"]
    assert first == {"event": "submitted", "job_id": job_id}
    assert [r["event"] for r in per_round] == ["round"] * rounds
    assert [r["round"] for r in per_round] == list(range(rounds))
    assert end["event"] == "end" and end["job_id"] == job_id and end["state"] == "done"
    assert end["rounds"] == rounds and end["final_loss"] == per_round[-1]["loss"]
    assert end["training_seconds"] == per_round[-1]["wall_seconds"]
    assert end["results"] == str(out) and Path(end["model"]).exists()
    # Every counter the policy keeps, summed: LAG-WK computes on every worker every round
    # and uploads only what moved.
    assert end["computations"] == sum(r["computations"] for r in per_round) == 2 * rounds
    assert end["uploads"] == sum(r["uploads"] for r in per_round)
    summary = json.loads(out.read_text())["summary"]
    assert (summary["uploads"], summary["computations"]) == (end["uploads"], 2 * rounds)

    status = await cli("status", job_id, "--coordinator", target, "--json")
    assert status.returncode == 0, status.stderr
    (job,) = json.loads(status.stdout)["jobs"]
    assert job["state"] == "done" and job["rounds_done"] == rounds and job["detail"] == ""
    assert (job["uploads"], job["computations"]) == (end["uploads"], end["computations"])

    # A finished job watched again: the same rounds, and the same outcome.
    watched = await cli("watch", job_id, "--coordinator", target, "--json")
    assert watched.returncode == 0, watched.stderr
    again = [json.loads(line) for line in watched.stdout.splitlines()]
    assert len(again) == rounds + 1 and again[-1]["state"] == "done"
    assert again[-1]["final_loss"] == end["final_loss"]
    plain = await cli("watch", job_id, "--coordinator", target, "--no-progress")
    assert plain.returncode == 0, plain.stderr
    assert (
        plain.stdout.splitlines()[-1].startswith(f"job {job_id} done: {rounds} rounds in ")
        and f"loss {end['final_loss']:.6g}" in plain.stdout
    )

    # The coordinator's log: submitted, planned, assigned, progress, done.
    log = [r.getMessage() for r in caplog.records if job_id in r.getMessage()]
    assert any(m.startswith(f"job {job_id} queued: policy lag-wk, 2 workers") for m in log)
    assert any(
        m.startswith(
            f"job {job_id} planned: policy lag-wk, n=2 workers, k=2 partitions, topology star"
        )
        for m in log
    ), log
    (assigned,) = [m for m in log if m.startswith(f"job {job_id} assigned to ")]
    assert sorted(assigned.removeprefix(f"job {job_id} assigned to ").split(", ")) in (
        ["0=w0", "1=w1"],
        ["0=w1", "1=w0"],
    )
    progress = [m for m in log if m.startswith(f"job {job_id}: ") and "rounds in" in m]
    assert [m.split()[2] for m in progress][:2] == [f"2/{rounds}", f"4/{rounds}"]
    assert any(m.startswith(f"job {job_id} done: {rounds}/{rounds} rounds in ") for m in log)


async def test_a_failed_job_ends_the_json_watch_with_its_state_and_error(
    coordinator: CoordinatorServer,
) -> None:
    target = f"127.0.0.1:{coordinator.port}"
    async with Client(target) as client:
        job_id = await client.submit(JobConfig(workers=2, rounds=2, data=SMALL))
        watching = asyncio.ensure_future(
            cli("watch", job_id, "--coordinator", target, "--json", "--no-progress")
        )
        await job_status(client, job_id, "waiting for 2 more workers (0 connected, job needs 2)")
        await client.cancel(job_id)
        proc = await watching
    assert proc.returncode == 2
    end = json.loads(proc.stdout.splitlines()[-1])
    assert (end["event"], end["state"], end["rounds"]) == ("end", "cancelled", 0)
    assert end["error"] == "cancelled by a client"
    assert "cancelled by a client" in proc.stderr


async def test_reflection_lists_the_services_without_a_token() -> None:
    server = await CoordinatorServer.start("127.0.0.1:0", security=Security(token="s3cret"))
    target = f"127.0.0.1:{server.port}"

    def reflect() -> tuple[list[str], list[str], grpc.StatusCode]:
        with grpc.insecure_channel(target) as channel:
            db = ProtoReflectionDescriptorDatabase(channel)
            services = sorted(db.get_services())
            coordinator = db.FindFileContainingSymbol("codedgd.v1.Coordinator")
            methods = [
                m.name for s in coordinator.service if s.name == "Coordinator" for m in s.method
            ]
            try:  # the API itself still needs the token
                channel.unary_unary("/codedgd.v1.Coordinator/GetStatus")(b"")
                code = grpc.StatusCode.OK
            except grpc.RpcError as exc:
                code = exc.code()
            # Reflection v1 (tried first by grpcurl) is not served: UNIMPLEMENTED, not
            # UNAUTHENTICATED, so the client falls back to v1alpha.
            v1 = channel.stream_stream("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo")
            with pytest.raises(grpc.RpcError) as refused:
                list(v1(iter([b""])))
            assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
        return services, methods, code

    try:
        services, methods, code = await asyncio.to_thread(reflect)
    finally:
        await server.stop(0)
    assert services == [
        "codedgd.v1.Coordinator",
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
    ]
    assert {"Connect", "SubmitJob", "WatchJob", "GetStatus", "CancelJob", "GetModel"} <= set(
        methods
    )
    assert code == grpc.StatusCode.UNAUTHENTICATED


async def test_how_late_auto_s_look_ahead_comes_is_measured(
    coordinator: CoordinatorServer, worker_processes: WorkerProcesses, tmp_path: Path
) -> None:
    # auto's look-ahead runs in a thread beside the rounds, and its choice applies from
    # the first round after it is done: an operator sees how long it took and how many
    # rounds late its choice came, in the metrics.
    worker_processes.start(coordinator.port, 4)
    trace = tmp_path / "delays.json"
    trace.write_text(json.dumps({"delays": [[0.03, 0.0, 0.0, 0.02]] * 40}))
    config = JobConfig(
        workers=4,
        rounds=40,
        seed=1,
        data=SMALL,
        policy=Component("auto", {"window": 5}),
        stragglers=Component("trace", {"path": str(trace)}),
    )
    async with Client(f"127.0.0.1:{coordinator.port}") as client:
        job_id = await client.submit(config)
        records = [r async for r in client.watch(job_id)]
    assert len(records) == 40
    registry = coordinator.service.metrics.registry
    decided = registry.get_sample_value("codedgd_deliberation_duration_seconds_count")
    assert decided is not None and decided >= 2  # round 2's, and later ones
    assert registry.get_sample_value("codedgd_deliberation_duration_seconds_sum") > 0
    assert registry.get_sample_value("codedgd_deliberation_lag_rounds_count") == decided
    # A look-ahead begun before round t applies from round t + 1 at the earliest.
    assert registry.get_sample_value("codedgd_deliberation_lag_rounds_sum") >= decided
