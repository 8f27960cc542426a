"""Workers started with --data-dir load their partitions themselves, and prove it."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import numpy as np
import pytest

from codedgd.client.local import run_local
from codedgd.services.coordinator.server import CoordinatorServer
from codedgd.services.job import Component, JobConfig
from tests.conftest import WorkerProcesses

KC = JobConfig(
    workers=3,
    rounds=3,
    seed=5,
    data=Component("kc-house"),
    model=Component("least-squares", {"l2": 1e-4}),
    policy=Component("uncoded"),
)


async def run_with_workers(
    data_dir: Path, worker_data_dir: Path | None, procs: WorkerProcesses, config: JobConfig
) -> tuple[str, str, list[float] | None, int]:
    server = await CoordinatorServer.start("127.0.0.1:0", data_dir=str(data_dir), assign_timeout=60)
    try:
        extra = ("--data-dir", str(worker_data_dir)) if worker_data_dir else ()
        procs.start(server.port, config.workers, extra=("--no-reconnect", *extra))
        job = server.service.submit(config)
        while not job.finished:
            await job.wait_change()
        theta = job.theta.tolist() if job.theta is not None else None
        registry = server.service.metrics.registry
        sent = int(registry.get_sample_value("codedgd_assignment_bytes_total") or 0)
        return job.state, job.error, theta, sent
    finally:
        await server.stop(0)


async def test_disk_and_inline_data_give_the_same_model(
    data_dir: Path, worker_processes: WorkerProcesses
) -> None:
    on_disk = await run_local(KC, data_dir=str(data_dir))  # workers get --data-dir
    state, error, inline, _ = await run_with_workers(data_dir, None, worker_processes, KC)
    assert state == "done", error
    assert on_disk.theta is not None and inline is not None
    # Same data, same arithmetic; only the order in which the coordinator adds
    # the workers' sums may differ (arrival order), so agree to rounding.
    scale = float(np.abs(inline).max())
    np.testing.assert_allclose(on_disk.theta, inline, rtol=1e-12, atol=1e-13 * scale)


async def test_worker_with_different_dataset_files_is_refused(
    data_dir: Path, tmp_path: Path, worker_processes: WorkerProcesses
) -> None:
    # A copy of the dataset with one sale price changed: same shape, different rows.
    bad = tmp_path / "datasets"
    shutil.copytree(data_dir / "kc_house", bad / "kc_house")
    path = bad / "kc_house" / "kc_house_data.csv.gz"
    path.chmod(0o644)
    lines = gzip.decompress(path.read_bytes()).decode().splitlines()
    fields = lines[1].split(",")
    fields[2] = str(float(fields[2].strip('"')) + 12345.0)
    lines[1] = ",".join(fields)
    path.write_bytes(gzip.compress("\n".join(lines).encode() + b"\n"))
    state, error, _, _ = await run_with_workers(data_dir, bad, worker_processes, KC)
    assert state == "failed"
    assert "differs from the coordinator's copy" in error
    assert "without --data-dir" in error


@pytest.mark.parametrize("worker_dir", [False, True])
async def test_assignment_bytes_show_where_data_came_from(
    data_dir: Path, worker_processes: WorkerProcesses, worker_dir: bool
) -> None:
    config = JobConfig(
        workers=2, rounds=1, data=Component("kc-house"), model=Component("least-squares")
    )
    state, error, _, sent = await run_with_workers(
        data_dir, data_dir if worker_dir else None, worker_processes, config
    )
    assert state == "done", error
    if worker_dir:
        assert sent < 100_000  # plans only
    else:
        assert sent > 1_000_000  # the training rows travelled
