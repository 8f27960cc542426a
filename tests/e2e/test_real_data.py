"""The main job on the real datasets, as a user runs it (slow: loads ../shared/datasets)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.test_cli import codedgd

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("dataset", "model", "metric_name", "dim"),
    [
        ("amazon", "logistic", "auc", 241_915),
        ("covtype", "logistic", "auc", 55),
        ("kc-house", "least-squares", "mse", 27_654),
    ],
)
def test_run_on_real_dataset_decreases_loss(
    tmp_path: Path, data_dir: Path, dataset: str, model: str, metric_name: str, dim: int
) -> None:
    out = tmp_path / "r.json"
    proc = codedgd(
        "run",
        "-n",
        "3",
        "-r",
        "8",
        "--data",
        dataset,
        "--model",
        model,
        "--policy",
        "ignore-stragglers",
        "--param",
        "s=1",
        "--data-dir",
        str(data_dir),
        "-o",
        str(out),
        "--no-progress",
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    rounds = doc["rounds"]
    assert len(rounds) == 8
    assert rounds[-1]["loss"] < rounds[0]["loss"]
    assert rounds[0]["metric_name"] == metric_name
    # every round moves θ (ℓ float64 numbers) down to each of the 3 workers
    assert all(r["bytes_down"] >= 3 * 8 * dim for r in rounds)
