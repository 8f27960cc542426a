"""The trained model comes out: written beside results, fetched over gRPC, scored,
used to predict and to start another job; a damaged file is refused, naming why."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from codedgd.client import Client, run_local
from codedgd.services.coordinator.server import CoordinatorServer
from codedgd.services.data import load_dataset
from codedgd.services.errors import CodedGDError, ConfigError, DataError
from codedgd.services.job import Component, JobConfig
from codedgd.services.job.trained import trained_model
from codedgd.services.models import LogisticRegression, objective
from codedgd.services.models.saved import SavedModel, load_model, model_path, save_model
from tests.conftest import WorkerProcesses

SYNTH = Component("synthetic", {"rows": 600, "dim": 12})


def _config(rounds: int, **job: object) -> JobConfig:
    return JobConfig(workers=2, rounds=rounds, seed=3, data=SYNTH, **job)  # type: ignore[arg-type]


def _saved(theta: np.ndarray) -> SavedModel:
    return trained_model(_config(5), theta, [])


def test_a_model_file_round_trips_and_a_damaged_one_is_refused(tmp_path: Path) -> None:
    theta = np.random.default_rng(0).standard_normal(12)
    path = save_model(tmp_path / "m.npz", _saved(theta))
    back = load_model(path)
    assert np.array_equal(back.theta, theta) and back.dim == 12
    assert back.model["name"] == "logistic" and back.dataset["name"] == "synthetic"
    # Readable without codedgd: numpy and JSON.
    with np.load(path) as raw:
        assert json.loads(str(raw["meta"]))["format"] == "codedgd.model.v1"
    data = path.read_bytes()
    (tmp_path / "cut.npz").write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match="cut short or not a codedgd model"):
        load_model(tmp_path / "cut.npz")
    forged = _saved(theta).meta()
    forged["theta_sha256"] = "0" * 64
    with pytest.raises(DataError, match="does not match its checksum"):
        SavedModel.from_meta(forged, theta, "forged")
    with pytest.raises(ConfigError, match="does not exist"):
        load_model(tmp_path / "missing.npz")


async def test_a_run_writes_its_model_and_another_job_starts_from_it(tmp_path: Path) -> None:
    """Plain gradient descent: 10 rounds, then 10 more from the saved θ, lands exactly
    where 20 rounds straight do; the saved model scores as the run's last round said."""
    config = _config(10, optimizer={"lr": 0.5})
    first = await run_local(config)
    assert first.theta is not None
    path = save_model(tmp_path / "first.npz", trained_model(config, first.theta, first.records))
    saved = load_model(path)
    assert saved.rounds == 10 and saved.loss == pytest.approx(first.records[-1].loss, rel=1e-12)
    ds = load_dataset("synthetic", SYNTH.options, seed=3)
    model = LogisticRegression(l2=1e-4)
    assert objective(model, saved.theta, ds.X_train, ds.y_train) == pytest.approx(saved.loss)
    more = await run_local(_config(10, optimizer={"lr": 0.5}, init_from=str(path)))
    straight = await run_local(_config(20, optimizer={"lr": 0.5}))
    assert more.theta is not None and straight.theta is not None
    np.testing.assert_allclose(more.theta, straight.theta, rtol=1e-12, atol=1e-15)


async def test_a_start_from_a_model_of_another_kind_or_size_is_refused(tmp_path: Path) -> None:
    path = save_model(tmp_path / "m.npz", _saved(np.zeros(12)))
    other = _config(3, init_from=str(path), model=Component("least-squares"))
    with pytest.raises(CodedGDError, match="holds a 'logistic' model, but the job trains"):
        await run_local(other)
    wider = _config(3, init_from=str(path)).replace(data=Component("synthetic", {"dim": 20}))
    with pytest.raises(CodedGDError, match="has 12 parameters, but the job's model has 20"):
        await run_local(wider)


async def test_the_coordinator_hands_out_a_jobs_model(
    coordinator: CoordinatorServer, worker_processes: WorkerProcesses
) -> None:
    worker_processes.start(coordinator.port, 2)
    async with Client(f"127.0.0.1:{coordinator.port}") as client:
        with pytest.raises(CodedGDError, match="no job 'nope'"):
            await client.model("nope")
        job_id = await client.submit(_config(6))
        records = [r async for r in client.watch(job_id)]
        saved = await client.model(job_id)
    job = coordinator.service.jobs[job_id]
    assert job.theta is not None and np.array_equal(saved.theta, job.theta)
    assert saved.rounds == len(records) == 6 and saved.job["job"]["rounds"] == 6


def test_the_cli_writes_evaluates_and_predicts(tmp_path: Path) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "codedgd.client.cli", *args],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=300,
        )

    run = cli("run", "-n", "2", "-r", "8", "-d", "synthetic", "--data-opt", "rows=600",
              "--data-opt", "dim=12", "--no-progress", "-o", "out/r.json")  # fmt: skip
    assert run.returncode == 0, run.stderr
    model = model_path(tmp_path / "out" / "r.json")
    assert model.is_file() and f"model: out/{model.name}" in run.stdout
    result = json.loads((tmp_path / "out" / "r.json").read_text())
    scored = cli("evaluate", str(model))
    assert scored.returncode == 0, scored.stderr
    assert f"training loss {result['summary']['final_loss']:.6g}" in scored.stdout
    predicted = cli("predict", str(model), "-o", "p.csv", "--rows", "test")
    assert predicted.returncode == 0, predicted.stderr
    rows = list(csv.DictReader((tmp_path / "p.csv").open()))
    assert len(rows) == 120 and all(0.0 <= float(r["prediction"]) <= 1.0 for r in rows)
    broken = tmp_path / "broken.npz"
    broken.write_bytes(model.read_bytes()[:200])
    refused = cli("evaluate", str(broken))
    assert refused.returncode == 2 and "cut short" in refused.stderr
    assert "Traceback" not in refused.stderr
