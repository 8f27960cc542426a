"""A job's round records: the last --records-in-memory in memory, the rest on disk.

Watch from round 0 still hears every round once, in order, also while rounds keep
arriving and the window moves past the records being read back; without a state
directory the older records go to a temporary spill directory that shutdown removes;
with one, the job's records.jsonl is their only copy on disk.
"""

from __future__ import annotations

import asyncio
import math
import os
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from codedgd.client.api import Client
from codedgd.services.coordinator import service as service_module
from codedgd.services.coordinator.job_run import JobRun
from codedgd.services.coordinator.server import CoordinatorServer
from codedgd.services.coordinator.state import SpillDir
from codedgd.services.errors import ConfigError
from codedgd.services.job import Component, JobConfig
from codedgd.services.messages import record_to_pb
from codedgd.services.records import RecordLog, RoundRecord
from codedgd.services.worker.agent import WorkerAgent, WorkerOptions
from tests.conftest import ROOT
from tests.e2e.fakes import wait_for
from tests.sim.test_report import rec

WINDOW = 5


def _config(rounds: int) -> JobConfig:
    return JobConfig(
        workers=2,
        rounds=rounds,
        eval_every=1,
        data=Component("synthetic", {"rows": 40, "dim": 4}),
        # A few ms a round: a watcher joins while the job runs and rounds keep coming.
        stragglers=Component("exponential", {"mean": 0.005}),
    )


class Agents:
    """In-process workers, each a WorkerAgent task on this event loop."""

    def __init__(self) -> None:
        self.agents: list[WorkerAgent] = []
        self.tasks: list[asyncio.Task[None]] = []

    def start(self, server: CoordinatorServer, n: int) -> None:
        for i in range(n):
            options = WorkerOptions(coordinator=f"127.0.0.1:{server.port}", name=f"a{i}")
            self.agents.append(WorkerAgent(options))
            self.tasks.append(asyncio.create_task(self.agents[-1].run()))

    async def stop(self) -> None:
        for agent in self.agents:
            agent.stop()
        await asyncio.gather(*self.tasks, return_exceptions=True)


@pytest.fixture
async def agents() -> AsyncIterator[Agents]:
    made = Agents()
    yield made
    await made.stop()


def _watch_in_memory(job: JobRun) -> list[int]:
    """How many records the job holds in memory after each round (its on_record hook)."""
    seen: list[int] = []
    job.on_record = lambda record: seen.append(job.records.in_memory)
    return seen


def _reads_while_running(job: JobRun, monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """For each read of the job's records file: whether the job was still running."""
    running: list[bool] = []
    read_file = RecordLog.read_file

    def counted(log: RecordLog, start: int, stop: int) -> list[RoundRecord]:
        running.append(log is job.records and not job.finished)
        return read_file(log, start, stop)

    monkeypatch.setattr(RecordLog, "read_file", counted)
    return running


async def _watch(server: CoordinatorServer, job_id: str, pause: float = 0.0) -> list[int]:
    rounds = []
    async with Client(f"127.0.0.1:{server.port}") as client:
        async for record in client.watch(job_id):
            rounds.append(record.round)
            if pause:
                await asyncio.sleep(pause)  # a slow reader: the window runs ahead of it
    return rounds


async def _finished(job: JobRun) -> None:
    while not job.finished:
        await asyncio.wait_for(job.wait_change(), 60)


# ---------------------------------------------------------------- the log itself


def _records(count: int) -> Iterator[RoundRecord]:
    for t in range(count):
        yield rec(t, t + 1.0, 1.0, 1.0 / (t + 1), 0.5)


def test_a_log_keeps_its_window_in_memory_and_reads_the_rest_back(tmp_path: Path) -> None:
    log = RecordLog(tmp_path / "r.jsonl", WINDOW)
    for record in _records(600):  # past a few seek offsets (one per 256 lines)
        log.append(record)
        assert log.in_memory <= WINDOW
    assert len(log) == 600 and log.first_in_memory == 595
    assert [r.round for r in log] == list(range(600))
    assert [r.round for r in log[250:260]] == list(range(250, 260))
    assert [r.round for r in log[590:]] == list(range(590, 600))  # across the seam
    assert [r.round for r in log[::100]] == [0, 100, 200, 300, 400, 500]
    assert log[0].round == 0 and log[511].round == 511 and log[-1].round == 599
    assert log[3].loss == pytest.approx(0.25)
    with pytest.raises(IndexError):
        log[600]
    log.close()
    back = RecordLog.load(tmp_path / "r.jsonl", WINDOW)
    assert len(back) == 600 and back.in_memory == WINDOW
    assert [r.round for r in back] == list(range(600))


def test_a_record_read_back_from_disk_has_floats_where_json_has_null(tmp_path: Path) -> None:
    """A NaN loss and an infinite residual are null in the file: NaN when read back (the
    wire's RoundReport needs a float), and the line still counts as whole."""
    log = RecordLog(tmp_path / "r.jsonl", 1)
    odd = replace(rec(0, 1.0, 1.0, math.nan, 0.5), decode_residual=math.inf)
    log.append(replace(odd, response_seconds={0: math.inf}))
    log.append(rec(1, 2.0, 1.0, 0.5, 0.5))
    back = log[0]
    assert math.isnan(back.loss) and math.isnan(back.decode_residual)
    assert math.isnan(back.response_seconds[0]) and back.metric == 0.5
    assert record_to_pb(back, "j").round == 0


def test_iterating_a_log_while_it_grows_yields_each_record_once(tmp_path: Path) -> None:
    log = RecordLog(tmp_path / "r.jsonl", WINDOW)
    records = list(_records(40))
    for record in records[:12]:
        log.append(record)
    rounds = []
    for record in log:
        rounds.append(record.round)
        for more in records[len(log) : len(log) + 3]:  # three land for each one read
            log.append(more)
    assert rounds == list(range(40))


# ---------------------------------------------------------------- a coordinator


async def test_a_long_job_keeps_its_window_in_memory_and_watch_from_0_hears_every_round(
    agents: Agents, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Read back 2 records at a time: many seams between disk, window and live rounds.
    monkeypatch.setattr(service_module, "REPLAY_CHUNK", 2)
    server = await CoordinatorServer.start("127.0.0.1:0", records_in_memory=WINDOW)
    try:
        agents.start(server, 2)
        await wait_for(lambda: len(server.service.sessions) == 2)
        job = server.service.submit(_config(rounds=60))
        in_memory = _watch_in_memory(job)
        read_back = _reads_while_running(job, monkeypatch)
        await wait_for(lambda: len(job.records) >= 3 * WINDOW, timeout=60)
        assert not job.finished  # the watchers below join a running job
        watched = await asyncio.gather(_watch(server, job.id), _watch(server, job.id, pause=0.01))
        await _finished(job)
        assert job.state == "done", job.error
        assert list(watched) == [list(range(60)), list(range(60))]
        assert any(read_back)  # older records came from disk while rounds kept arriving
        assert in_memory and max(in_memory) == WINDOW
        assert len(job.records) == 60 and job.records.in_memory == WINDOW
        assert [r.round for r in job.records] == list(range(60))
        assert await _watch(server, job.id) == list(range(60))  # the finished job, again
        async with Client(f"127.0.0.1:{server.port}") as client:
            (status,) = (await client.status(job.id)).jobs
            model = await client.model(job.id)
        assert status.state == "done" and status.loss == job.records[-1].loss
        assert model.rounds == 60
        spill = server.service.spill.path
        assert spill is not None and (spill / f"{job.id}.jsonl").exists()
    finally:
        await server.stop(0)
    assert not spill.exists()  # removed at shutdown


async def test_with_a_state_dir_records_jsonl_is_the_only_copy_and_reads_back(
    tmp_path: Path, agents: Agents
) -> None:
    state = tmp_path / "state"
    server = await CoordinatorServer.start("127.0.0.1:0", state_dir=state, records_in_memory=WINDOW)
    try:
        agents.start(server, 2)
        await wait_for(lambda: len(server.service.sessions) == 2)
        job = server.service.submit(_config(rounds=25))
        await _finished(job)
        assert job.state == "done", job.error
        assert await _watch(server, job.id) == list(range(25))
        assert server.service.spill.path is None  # nothing spilled elsewhere
        assert job.records.path == state / "jobs" / job.id / "records.jsonl"
        lines = job.records.path.read_text().splitlines()
        assert len(lines) == 25 and job.records.in_memory == WINDOW
    finally:
        await server.stop(0)
    again = await CoordinatorServer.start("127.0.0.1:0", state_dir=state, records_in_memory=WINDOW)
    try:
        back = again.service.jobs[job.id]
        assert back.state == "done" and back.records.in_memory == WINDOW
        assert await _watch(again, job.id) == list(range(25))
    finally:
        await again.stop(0)


async def test_records_in_memory_below_1_is_refused_naming_the_flag() -> None:
    with pytest.raises(ConfigError, match="--records-in-memory 0"):
        await CoordinatorServer.start("127.0.0.1:0", records_in_memory=0)


def test_codedgd_records_in_memory_from_the_environment_reaches_the_check() -> None:
    env = {**os.environ, "CODEDGD_RECORDS_IN_MEMORY": "-3"}
    done = subprocess.run(
        [sys.executable, "-m", "codedgd.client.cli", "coordinator", "--listen", "127.0.0.1:0"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "--records-in-memory -3: give the number of round records" in done.stderr


def test_the_spill_directory_of_a_killed_coordinator_is_removed_by_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kill -9 leaves no chance to clean up: the next coordinator that spills removes the
    directory whose owner lock nobody holds, and leaves a live one's alone."""
    killed = (
        "import os, signal\n"
        "from codedgd.services.coordinator.state import SpillDir\n"
        "from tests.sim.test_report import rec\n"
        "spill = SpillDir()\n"
        "spill.records('job').append(rec(0, 1.0, 1.0, 0.5, 0.5))\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", killed], env=env, cwd=ROOT, timeout=60)
    assert done.returncode == -9
    (left,) = tmp_path.glob("codedgd-records-*")
    assert (left / "job.jsonl").exists()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    live = SpillDir()
    live.records("a")
    assert not left.exists()
    after = SpillDir()
    after.records("b")
    assert live.path is not None and live.path.exists()  # its owner holds the lock
    live.remove()
    after.remove()
    assert not list(tmp_path.iterdir())
