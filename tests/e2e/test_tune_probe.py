"""`codedgd tune --probe` on a live pool: a short job, its timings over WatchJob, a ranking."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from codedgd.services.job import Component, JobConfig
from codedgd.services.tuning import parse_tail
from tests.conftest import CoordinatorProcess, WorkerProcesses

JOB = """
[job]
workers = {n}
rounds = 100
seed = 1
target_loss = 0.6
[data]
name = "synthetic"
rows = 600
dim = 6
[policy]
name = "frc"
s = 1
[stragglers]
name = "exponential"
mean = 0.02
"""


def _tune(tmp: Path, coordinator: str, n: int) -> subprocess.CompletedProcess[str]:
    (tmp / f"job{n}.toml").write_text(JOB.format(n=n))
    return subprocess.run(
        [
            sys.executable, "-m", "codedgd.client.cli", "tune", "--probe", f"job{n}.toml",
            "--probe-rounds", "8", "--coordinator", coordinator, "--repeats", "1", "--json",
            "--policy", "uncoded", "--policy", "frc", "--write", "best.toml",
            "--write-auto", "auto.toml",
        ],
        capture_output=True,
        text=True,
        cwd=tmp,
        timeout=300,
        env={"CODEDGD_CACHE_DIR": str(tmp / "cache"), **__import__("os").environ},
    )  # fmt: skip


def _wait_connected(coordinator: CoordinatorProcess, n: int) -> None:
    deadline = time.monotonic() + 120
    url = f"http://127.0.0.1:{coordinator.metrics}/metrics"
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                text = r.read().decode()
        except OSError:
            text = ""
        line = next(
            (x for x in text.splitlines() if x.startswith("codedgd_workers_connected ")), ""
        )
        if line and float(line.split()[1]) >= n:
            return
        assert time.monotonic() < deadline, "the workers did not connect"
        time.sleep(0.1)


def test_a_probe_job_is_tuned_on_and_a_pool_too_small_is_refused(
    tmp_path: Path, worker_processes: WorkerProcesses
) -> None:
    coordinator = CoordinatorProcess()
    try:
        coordinator.start()
        worker_processes.start(coordinator.port, 4)
        _wait_connected(coordinator, 4)
        done = _tune(tmp_path, coordinator.target, 4)
        assert done.returncode == 0, done.stderr
        # The probe ran as uncoded; its rounds came over WatchJob with per-worker timings.
        probe = json.loads((tmp_path / "probe.json").read_text())
        assert probe["job"]["policy"]["name"] == "uncoded" and len(probe["rounds"]) == 8
        assert all(len(r["response_seconds"]) == 4 for r in probe["rounds"])
        assert all(len(r["worker_compute_seconds"]) == 4 for r in probe["rounds"])
        # Each worker's own time from θ to its result, sent with it: no network in it.
        for r in probe["rounds"]:
            assert r["topology"] == "star" and len(r["ready_seconds"]) == 4
            for w, own in r["ready_seconds"].items():
                assert r["worker_compute_seconds"][w] <= own < r["response_seconds"][w]
        assert json.loads(done.stdout)["timings"] == "arrivals"  # (no links: the network in)
        doc = json.loads(done.stdout)
        # The target and the rounds a candidate may take are the job's, not the probe's.
        assert doc["target_loss"] == 0.6 and doc["rounds"] == 100
        labels = [c["label"] for c in doc["candidates"]]
        assert set(labels) == {"uncoded", "frc s=1"}
        # The written jobs are the user's job (job4.toml: 100 rounds), not the probe's, with
        # the winner, and auto at the winner's group size (uncoded's is 1, frc s=1's 2),
        # with the probe's slowness of each of the 4 workers as its prior.
        job = JobConfig.from_toml(tmp_path / "job4.toml")
        best = doc["candidates"][0]
        winner = Component(best["policy"].pop("name"), best["policy"])
        assert JobConfig.from_toml(tmp_path / "best.toml") == job.replace(policy=winner)
        size = 1 if winner.name == "uncoded" else 2
        adaptive = JobConfig.from_toml(tmp_path / "auto.toml")
        prior = adaptive.policy.options["prior"]
        assert [float(v) for v in prior.split(",")] == pytest.approx(doc["slowness"], rel=5e-3)
        # And the law of its typical workers' delays, for the ones it cancels.
        tail = adaptive.policy.options["tail"]
        assert parse_tail(tail) is not None
        expected = {"r": size, "prior": prior, "tail": tail}
        assert adaptive == job.replace(policy=Component("auto", expected))
        small = _tune(tmp_path, coordinator.target, 6)
        assert small.returncode == 2
        assert "has 4 worker(s) connected but the probe job needs 6" in small.stderr
        assert "Traceback" not in small.stderr
    finally:
        if coordinator.proc is not None:
            coordinator.proc.kill()
            coordinator.proc.wait(timeout=30)


def test_the_links_are_measured_on_the_pool_and_the_topologies_pay_them(
    tmp_path: Path, worker_processes: WorkerProcesses
) -> None:
    """--probe-links: three jobs of one worker with small, medium and large messages; the
    link they fit is what the topology candidates pay, printed, and refitted from the
    files kept."""
    from codedgd.services.records import read_result_file
    from codedgd.services.tuning import fit_link

    coordinator = CoordinatorProcess()
    try:
        coordinator.start()
        worker_processes.start(coordinator.port, 2)
        _wait_connected(coordinator, 2)
        (tmp_path / "job2.toml").write_text(JOB.format(n=2))
        done = subprocess.run(
            [
                sys.executable, "-m", "codedgd.client.cli", "tune", "--probe", "job2.toml",
                "--probe-rounds", "8", "--probe-links", "--coordinator", coordinator.target,
                "--repeats", "1", "--json", "--policy", "uncoded", "--policy", "tree",
            ],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert "links measured: round trips beyond compute" in done.stderr
        doc = json.loads(done.stdout)
        link = doc["link"]
        assert link["latency_seconds"] > 0
        assert link["bandwidth_bytes_per_second"] is None or link["bandwidth_bytes_per_second"] > 0
        # The probes' rounds are kept: one worker each, and they give the same link.
        runs = []
        for size, features in (("small", 1_000), ("medium", 62_500), ("large", 250_000)):
            job_doc, _, records = read_result_file(tmp_path / f"probe.link-{size}.json")
            # (the medium probe pauses each round so the NICs' buckets refill)
            assert (job_doc["stragglers"]["name"] == "fixed") == (size == "medium")
            assert job_doc["job"]["workers"] == 1 and len(records) == 20
            assert job_doc["data"]["dim"] == features
            assert all(len(r.response_seconds) == 1 for r in records)
            runs.append(records)
        again = fit_link(runs[0], runs[2], medium=runs[1]).to_dict()
        # The coordinator's NIC is taken as fast as the link measured through it.
        coordinator_rate = again["bandwidth_bytes_per_second"]
        assert again | {"coordinator_bandwidth_bytes_per_second": coordinator_rate} == (
            pytest.approx(link)
        )
        assert any(c["label"].startswith("tree") for c in doc["candidates"])
        assert doc["timings"] == "own"  # (the links known: the star's own times read)
    finally:
        if coordinator.proc is not None:
            coordinator.proc.kill()
            coordinator.proc.wait(timeout=30)
