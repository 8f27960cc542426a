"""The optimal loss F*: solved exactly, cached once per problem, and targets relative to it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from codedgd.services.data import load_dataset
from codedgd.services.errors import ConfigError
from codedgd.services.job import Component, JobConfig
from codedgd.services.job import optimum as optimum_module
from codedgd.services.job.optimum import Optimum, job_optimum, optimum, problem_key
from codedgd.services.models import create_model, objective

REGRESSION = Component("synthetic", {"rows": 600, "dim": 9, "task": "regression"})


def test_least_squares_optimum_is_the_normal_equations_solution(tmp_path: Path) -> None:
    l2 = 0.05
    ds = load_dataset(REGRESSION.name, REGRESSION.options, seed=1, data_dir=None)
    model = create_model("least-squares", {"l2": l2})
    X, y = np.asarray(ds.X_train), ds.y_train
    n = X.shape[0]
    theta = np.linalg.solve(X.T @ X / n + l2 * np.eye(X.shape[1]), X.T @ y / n)
    exact = objective(model, theta, X, y)
    found = optimum(model, X, y, key="k", directory=tmp_path)
    assert found.converged
    assert found.loss == pytest.approx(exact, rel=1e-12)


def test_each_problem_is_solved_once_and_a_cut_cache_file_is_solved_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CODEDGD_CACHE_DIR", str(tmp_path))
    config = JobConfig(data=Component("synthetic", {"rows": 400, "dim": 6}), seed=2)
    first = job_optimum(config)
    (cached,) = tmp_path.glob("optimum-*.json")
    calls: list[int] = []
    real_solve = optimum_module.solve

    def counting(*args: object) -> Optimum:
        calls.append(1)
        return real_solve(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(optimum_module, "solve", counting)
    assert job_optimum(config) == first and calls == []
    cached.write_text(cached.read_text()[:20])  # a file cut short
    assert job_optimum(config).loss == pytest.approx(first.loss, rel=1e-12) and calls == [1]
    assert json.loads(cached.read_text())["loss"] == pytest.approx(first.loss, rel=1e-12)
    # Another seed is another split: another problem.
    assert problem_key({"name": "synthetic"}, {"name": "logistic"}, 2) != problem_key(
        {"name": "synthetic"}, {"name": "logistic"}, 3
    )


def test_a_gap_target_is_relative_to_the_optimum() -> None:
    opt = Optimum(loss=0.5, gradient_norm=0.0, iterations=1, converged=True)
    assert opt.target(0.01) == pytest.approx(0.505)
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ConfigError, match="target gap must be a number > 0"):
            opt.target(bad)
    with pytest.raises(ConfigError, match="absolute --target-loss"):
        Optimum(loss=0.0, gradient_norm=0.0, iterations=1, converged=True).target(0.01)
