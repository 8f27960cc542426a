"""The `codedgd` command as a user runs it: exit codes, files, one-line errors."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def codedgd(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "client.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd or ROOT,
        timeout=300,
    )


def test_run_writes_json_and_csv(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    proc = codedgd(
        "run",
        "-n",
        "2",
        "-r",
        "4",
        "--data-opt",
        "rows=500",
        "--data-opt",
        "dim=6",
        "--policy",
        "ignore-stragglers",
        "--param",
        "s=1",
        "-o",
        str(out),
        "--no-progress",
    )
    assert proc.returncode == 0, proc.stderr
    assert "4 rounds of ignore-stragglers" in proc.stdout
    doc = json.loads(out.read_text())
    assert doc["job"]["policy"] == {"name": "ignore-stragglers", "s": 1}
    assert [r["round"] for r in doc["rounds"]] == [0, 1, 2, 3]
    for key in (
        "wall_seconds",
        "loss",
        "metric",
        "workers_used",
        "bytes_up",
        "bytes_down",
        "compute_seconds_max",
        "wait_seconds",
    ):
        assert key in doc["rounds"][0]
    rows = list(csv.DictReader(out.with_suffix(".csv").open()))
    assert len(rows) == 4 and float(rows[-1]["loss"]) == doc["rounds"][-1]["loss"]


def test_run_from_toml_file(tmp_path: Path) -> None:
    job = tmp_path / "job.toml"
    job.write_text(
        '[job]\nworkers = 2\nrounds = 3\n[data]\nname = "synthetic"\nrows = 300\n'
        'dim = 4\n[policy]\nname = "uncoded"\n'
    )
    proc = codedgd("run", "-c", str(job), "-o", str(tmp_path / "o.json"), "--no-progress")
    assert proc.returncode == 0, proc.stderr
    assert len(json.loads((tmp_path / "o.json").read_text())["rounds"]) == 3


def test_errors_are_one_line_without_traceback(tmp_path: Path) -> None:
    bad_toml = tmp_path / "bad.toml"
    bad_toml.write_text("[job\nworkers=")
    cases = [
        (("run", "--policy", "frcc"), "unknown policy"),
        (("run", "-n", "3", "--policy", "ignore-stragglers", "--param", "s=5"), "0 <= s < n"),
        (("run", "-c", str(bad_toml)), "not valid TOML"),
        (("run", "-c", str(tmp_path / "none.toml")), "does not exist"),
        (("run", "-n", "0"), "job.workers must be an integer >= 1"),
        (("status", "--coordinator", "127.0.0.1:1"), "cannot reach the coordinator"),
    ]
    for args, message in cases:
        proc = codedgd(*args, "--no-progress") if args[0] == "run" else codedgd(*args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert message in proc.stderr, (args, proc.stderr)
        assert "Traceback" not in proc.stderr


def test_help_of_every_command() -> None:
    for cmd in ("run", "coordinator", "worker", "submit", "watch", "status", "cancel", "policies"):
        proc = codedgd(cmd, "--help")
        assert proc.returncode == 0 and "usage: codedgd " + cmd in proc.stdout


def test_policies_lists_parameters() -> None:
    proc = codedgd("policies")
    assert proc.returncode == 0
    assert "ignore-stragglers" in proc.stdout and "--param s=<int>" in proc.stdout
