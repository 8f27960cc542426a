"""The `codedgd` command as a user runs it: exit codes, files, one-line errors."""

from __future__ import annotations

import csv
import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import CoordinatorProcess, WorkerProcesses

ROOT = Path(__file__).resolve().parents[2]


def codedgd(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "codedgd.client.cli", *args],
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
    commands = ("run", "coordinator", "worker", "submit", "watch", "status", "cancel")
    for cmd in (*commands, "policies", "stragglers"):
        proc = codedgd(cmd, "--help")
        assert proc.returncode == 0 and "usage: codedgd " + cmd in proc.stdout


def test_policies_lists_parameters() -> None:
    proc = codedgd("policies")
    assert proc.returncode == 0
    assert "ignore-stragglers" in proc.stdout and "--param s=<int>" in proc.stdout


def test_stragglers_lists_every_model_with_its_options() -> None:
    from codedgd.services.stragglers import STRAGGLER_MODELS

    proc = codedgd("stragglers")
    assert proc.returncode == 0
    lines = proc.stdout.splitlines()
    for name, info in STRAGGLER_MODELS.items():
        assert name in lines, name  # a line of its own
        for p in info.parameters:
            assert f"--straggler-opt {p.name}=<{p.type.__name__}>" in proc.stdout
    assert "restart=<float>  seconds until a crashed worker connects again" in proc.stdout


@pytest.mark.parametrize("command", ["run", "simulate"])
def test_a_job_that_fails_mid_run_keeps_the_rounds_it_did(tmp_path: Path, command: str) -> None:
    """A worker hangs from round 3 on; uncoded cannot decode without it: the rounds stay."""
    out = tmp_path / "r.json"
    proc = codedgd(
        command,
        "-n",
        "2",
        "-r",
        "50",
        "--data-opt",
        "rows=200",
        "--data-opt",
        "dim=4",
        "--stragglers",
        "fail-stop",
        "--straggler-opt",
        "count=1",
        "--straggler-opt",
        "start=3",
        "--round-timeout",
        "2",
        "-o",
        str(out),
        "--no-progress",
    )
    assert proc.returncode == 2, proc.stderr
    assert f"codedgd {command}: error: " in proc.stderr
    assert proc.stderr.count("round 3 was not decodable within job.round_timeout=2 s") == 1
    assert f"the 3 rounds done: {out}" in proc.stderr
    assert "Traceback" not in proc.stderr
    doc = json.loads(out.read_text())
    assert [r["round"] for r in doc["rounds"]] == [0, 1, 2]
    assert "round 3 was not decodable" in doc["summary"]["error"]
    if command == "run":  # a real job has an id
        assert doc["job"]["job_id"] and doc["job"]["job_id"] in proc.stderr
    assert len(list(csv.DictReader(out.with_suffix(".csv").open()))) == 3


@pytest.mark.parametrize(
    ("sig", "code", "error"),
    [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated (SIGTERM)")],
    ids=["ctrl-c", "sigterm"],
)
def test_ctrl_c_and_sigterm_keep_the_rounds_done_so_far(
    tmp_path: Path, sig: signal.Signals, code: int, error: str
) -> None:
    out = tmp_path / "r.json"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = ["run", "-n", "2", "-r", "1000000", "--data-opt", "rows=200", "--data-opt", "dim=4"]
    args += ["--metrics-port", str(port), "-o", str(out), "--no-progress"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "codedgd.client.cli", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # As in a terminal: a suite started in the background by a non-interactive shell
        # (nohup ... &) passes SIGINT on ignored, and Python then never sees the Ctrl-C.
        preexec_fn=_default_sigint,
    )
    try:
        deadline = time.monotonic() + 120
        while _round_gauge(port) < 3:  # a few rounds done, read from its metrics endpoint
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr
            time.sleep(0.1)
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == code, stderr
    assert f"codedgd run: error: {error}" in stderr and "Traceback" not in stderr
    doc = json.loads(out.read_text())
    assert len(doc["rounds"]) >= 3 and doc["summary"]["error"] == error
    assert len(doc["job"]["job_id"]) == 12  # the coordinator's id of the job
    assert [r["round"] for r in doc["rounds"]] == list(range(len(doc["rounds"])))


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _round_gauge(port: int) -> float:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            text = r.read().decode()
    except OSError:
        return -1.0
    line = next((x for x in text.splitlines() if x.startswith("codedgd_round ")), "")
    return float(line.split()[1]) if line else -1.0


def test_a_watch_cut_short_by_a_lost_coordinator_says_so(
    tmp_path: Path, worker_processes: WorkerProcesses
) -> None:
    """kill -9 of the coordinator under `submit --watch -o`: the result file holds the
    rounds seen, its summary names the cut, and `codedgd report` marks the run incomplete."""
    coordinator = CoordinatorProcess()
    port = coordinator.port
    out = tmp_path / "watched.json"
    try:
        coordinator.start()
        worker_processes.start(port, 2)
        submit = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "codedgd.client.cli",
                "submit",
                "--coordinator",
                f"127.0.0.1:{port}",
                "-n",
                "2",
                "-r",
                "1000000",
                "--data-opt",
                "rows=200",
                "--data-opt",
                "dim=4",
                "--watch",
                "-o",
                str(out),
                "--no-progress",
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 120
        while coordinator.round() < 5:
            assert submit.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        coordinator.signal(signal.SIGKILL)
        _, stderr = submit.communicate(timeout=60)
    finally:
        if coordinator.proc is not None:
            coordinator.signal(signal.SIGKILL)
    assert submit.returncode == 2, stderr
    assert "Traceback" not in stderr
    doc = json.loads(out.read_text())
    assert len(doc["rounds"]) >= 5
    error = doc["summary"]["error"]
    assert error.startswith(f"the watch was cut short after {len(doc['rounds'])} round(s)")
    report = codedgd("report", str(out), "-o", str(tmp_path / "report"), "--no-figures")
    assert report.returncode == 0, report.stderr
    md = (tmp_path / "report" / "report.md").read_text()
    assert "(incomplete)" in md and "the watch was cut short" in md
