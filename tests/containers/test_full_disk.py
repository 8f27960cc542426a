"""A full disk under the state directory mid-job (a small tmpfs filled up, then freed).

Nothing is lost: while the disk is full the coordinator keeps the round records in
memory (and takes no checkpoint, so the last one on disk stays consistent with the records
on disk), says so once in its log, writes them all once space is back, and the job ends
exactly as an undisturbed one. Root only (mount), so it runs in the container suite.
"""

from __future__ import annotations

import contextlib
import logging
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from codedgd.services.coordinator.server import CoordinatorServer
from codedgd.services.job import Component, JobConfig
from codedgd.services.records import RecordLog, RoundRecord
from tests.conftest import WorkerProcesses
from tests.containers.support import require_tools
from tests.e2e.fakes import wait_for
from tests.e2e.test_training import reference_gd
from tests.sim.test_report import rec


def make_record(t: int) -> RoundRecord:
    return rec(t, t + 1.0, 1.0, 1.0 / (t + 1), 0.5)


pytestmark = pytest.mark.containers


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    require_tools("mount", "umount")
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill(disk: Path) -> Path:
    """Fill ``disk`` to the last byte; the filler file."""
    filler = disk / "filler"
    with filler.open("wb", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * 4096)
    return filler


async def test_a_full_disk_under_the_state_directory_loses_no_round(
    small_disk: Path, worker_processes: WorkerProcesses, caplog: pytest.LogCaptureFixture
) -> None:
    config = JobConfig(
        workers=3,
        rounds=60,
        seed=8,
        data=Component("synthetic", {"rows": 300, "dim": 6}),
        stragglers=Component("fixed", {"count": 3, "delay": 0.05}),
    )
    server = await CoordinatorServer.start(
        "127.0.0.1:0", state_dir=small_disk / "state", checkpoint_every=5, records_in_memory=4
    )
    try:
        worker_processes.start(server.port, config.workers)
        await wait_for(lambda: len(server.service.sessions) == config.workers, timeout=60)
        job = server.service.submit(config)
        await wait_for(lambda: len(job.records) >= 10, timeout=60)
        filler = _fill(small_disk)
        await wait_for(lambda: job.records.unwritten >= 8, timeout=60)
        assert job.records.write_error is not None
        filler.unlink()
        while not job.finished:
            await job.wait_change()
        assert job.state == "done", job.error
    finally:
        await server.stop(0)
    assert any("cannot write round records" in r.getMessage() for r in caplog.records)
    assert any(
        r.levelno == logging.WARNING and "written to" in r.getMessage() for r in caplog.records
    )
    # Every round on disk, in order, and θ exactly that of plain gradient descent.
    on_disk = RecordLog.load(small_disk / "state" / "jobs" / job.id / "records.jsonl", window=4)
    assert on_disk.cut_line is None
    assert [r.round for r in on_disk] == list(range(config.rounds))
    assert job.theta is not None
    expected = reference_gd(config)
    assert np.linalg.norm(job.theta - expected) <= 1e-9 * np.linalg.norm(expected)


def test_a_record_log_keeps_what_it_cannot_write_and_writes_it_later(small_disk: Path) -> None:
    """The unit of the above: reads stay whole across the failure, memory grows only while
    the disk fails, and the file never holds a torn line."""
    log = RecordLog(small_disk / "records.jsonl", window=3)
    for t in range(5):
        log.append(make_record(t))
    filler = _fill(small_disk)
    for t in range(5, 40):
        log.append(make_record(t))
    # The lines that still fit the file's last page were written; none after.
    assert 20 <= log.unwritten <= 35 and log.write_error
    assert log.in_memory == log.unwritten + 3  # the window, and what waits to be written
    assert [r.round for r in log] == list(range(40))
    filler.unlink()
    log.append(make_record(40))
    assert log.unwritten == 0 and log.write_error is None and log.in_memory == 3
    log.close()
    again = RecordLog.load(small_disk / "records.jsonl", window=3)
    assert again.cut_line is None and [r.round for r in again] == list(range(41))
