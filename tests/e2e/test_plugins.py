"""Plugins as a user installs them: the example package under examples/ is pip-installed
(into a temporary folder on PYTHONPATH, never globally) and `codedgd run` trains its
model on its dataset across worker processes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from codedgd.services.errors import ConfigError, DataError
from codedgd.services.models.plugin import PluginModel

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "codedgd-plugin-example"


def _env(*paths: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [*(str(p) for p in paths), *filter(None, [env.get("PYTHONPATH")])]
    )
    return env


def codedgd(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "codedgd.client.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=300,
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example plugin, installed by pip into a folder of its own (from a copy, so the
    build leaves nothing in the checkout)."""
    tmp = tmp_path_factory.mktemp("plugin")
    source = tmp / "src"
    shutil.copytree(EXAMPLE, source)
    target = tmp / "site"
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "pip", "install", "-q", "--no-deps"),
            *("--no-build-isolation", "--no-index", "--target", str(target), str(source)),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert list(target.glob("codedgd_plugin_example-*.dist-info"))
    return target


def test_run_trains_a_plugin_model_on_a_plugin_dataset(site: Path, tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    proc = codedgd(
        *("run", "--model", "svm", "--data", "blobs", "--data-opt", "rows=300"),
        *("-n", "2", "-r", "3", "-o", str(out), "--no-progress"),
        env=_env(site),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    assert doc["job"]["model"]["name"] == "svm" and doc["job"]["data"]["name"] == "blobs"
    rounds = doc["rounds"]
    assert [r["round"] for r in rounds] == [0, 1, 2]
    assert rounds[-1]["loss"] < rounds[0]["loss"]
    assert rounds[-1]["metric_name"] == "accuracy" and rounds[-1]["metric"] > 0.8


def test_plugin_names_are_suggested_and_options_checked(site: Path, tmp_path: Path) -> None:
    proc = codedgd("run", "--model", "svn", "--data", "blobs", env=_env(site), cwd=tmp_path)
    assert proc.returncode != 0
    assert "unknown model 'svn'" in proc.stderr and "Did you mean svm" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = codedgd(
        *("run", "--model", "svm", "--data", "blobs", "--data-opt", "colour=red"),
        env=_env(site),
        cwd=tmp_path,
    )
    assert proc.returncode != 0
    assert "dataset 'blobs' has no option(s) colour" in proc.stderr
    assert "dim, rows, separation" in proc.stderr and "Traceback" not in proc.stderr


def test_a_plugin_that_fails_to_import_is_named_with_its_package(tmp_path: Path) -> None:
    site = tmp_path / "site"
    info = site / "broken_plugin-0.3.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 0.3\n")
    (info / "entry_points.txt").write_text("[codedgd.models]\nbroken = broken_mod:Model\n")
    (site / "broken_mod.py").write_text("raise ImportError('broken_mod needs torch')\n")
    proc = codedgd("run", "--model", "broken", "-n", "1", env=_env(site), cwd=tmp_path)
    assert proc.returncode != 0
    assert "model plugin 'broken'" in proc.stderr and "failed to load" in proc.stderr
    assert "broken-plugin 0.3" in proc.stderr and "needs torch" in proc.stderr
    assert "Traceback" not in proc.stderr


class _WrongShape:
    metric_name = "accuracy"
    higher_is_better = True

    def loss_sum(self, theta: np.ndarray, X: np.ndarray, y: np.ndarray) -> float:
        return 0.0

    def grad_sum(self, theta: np.ndarray, X: np.ndarray, y: np.ndarray) -> np.ndarray:
        return np.zeros(X.shape[1] + 1)

    def metric(self, theta: np.ndarray, X: np.ndarray, y: np.ndarray) -> float:
        return 1.0


def test_a_plugin_model_is_held_to_the_protocol() -> None:
    X, y = np.eye(3), np.array([0.0, 1.0, 0.0])
    model = PluginModel("wrong", _WrongShape(), l2=0.5)
    with pytest.raises(DataError, match=r"model plugin 'wrong': grad_sum returned shape \(4,\)"):
        model.block(X, y).grad_sum(np.zeros(3))
    with pytest.raises(ConfigError, match=r"gives no smoothness\(X\).*--lr"):
        model.smoothness(X)
    with pytest.raises(ConfigError, match=r"lacks loss_sum, grad_sum, metric, metric_name"):
        PluginModel("empty", object(), l2=0.0)
