"""`codedgd tune` as a user meets it on bad input: files it would write refused before the
search, a failed run named, a wrong file named for what it is, Ctrl-C obeyed."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.test_tune import _cli

SOURCE = [
    "simulate", "-n", "4", "-r", "20", "--data-opt", "rows=400", "--data-opt", "dim=5",
    "--stragglers", "exponential", "--straggler-opt", "mean=0.02",
]  # fmt: skip


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding a finished run's files: run.json, run.csv, run.model.npz."""
    where = tmp_path_factory.mktemp("tune-inputs")
    done = _cli(*SOURCE, "-o", "run.json", cwd=where)
    assert done.returncode == 0, done.stderr
    return where


def _refused(done: subprocess.CompletedProcess[str], *words: str) -> None:
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    for word in words:
        assert word in done.stderr, done.stderr
    assert "top " not in done.stdout  # refused before the search: no table


def test_a_written_file_never_overwrites_what_tune_reads(run_dir: Path) -> None:
    before = (run_dir / "run.json").read_bytes(), (run_dir / "run.csv").read_bytes()
    for flag, path in (("--write", "run.json"), ("--write-auto", "run.csv")):
        _refused(
            _cli("tune", "run.json", "--policy", "uncoded", flag, path, cwd=run_dir),
            f"{flag} {path} is the run's results (run.json)",
            "give another file name",
        )
    assert ((run_dir / "run.json").read_bytes(), (run_dir / "run.csv").read_bytes()) == before


def test_a_file_that_cannot_be_written_is_refused_before_the_search(run_dir: Path) -> None:
    # A directory named where a file is (run.json is a file, not a directory).
    _refused(
        _cli("tune", "run.json", "--write", "run.json/job.toml", cwd=run_dir),
        "cannot write the job file to run.json/job.toml",
        "choose another --write",
    )
    _refused(
        _cli("tune", "run.json", "--fit-figure", "fit.xyz", cwd=run_dir),
        "--fit-figure fit.xyz",
        ".png",
    )
    _refused(
        _cli("tune", "run.json", "--fit-figure", "fit", cwd=run_dir), "--fit-figure fit", ".png"
    )
    assert not (run_dir / "fit").exists()


def test_each_count_flag_is_named_when_it_is_below_one(run_dir: Path) -> None:
    for flag in ("--repeats", "--rounds", "--top"):
        _refused(_cli("tune", "run.json", flag, "0", cwd=run_dir), f"{flag} must be >= 1, got 0")


def test_a_file_of_the_run_that_is_not_its_result_file_is_named(run_dir: Path) -> None:
    _refused(
        _cli("tune", "run.csv", cwd=run_dir),
        "run.csv is the rounds' CSV of a run: give its result file, run.json",
    )
    _refused(
        _cli("tune", "run.model.npz", cwd=run_dir),
        "run.model.npz is the model file of a run: give its result file, run.json",
    )
    (run_dir / "empty.json").write_text("")
    _refused(_cli("tune", "empty.json", cwd=run_dir), "empty.json is not a codedgd result", "empty")


def test_a_target_no_model_can_reach_is_refused_and_a_trivial_one_is_noted(
    run_dir: Path,
) -> None:
    start = json.loads((run_dir / "run.json").read_text())["rounds"][0]["loss"]
    _refused(
        _cli("tune", "run.json", "--target-loss", "-0.1", cwd=run_dir),
        "--target-loss = -0.1 is below 0, but the logistic objective is never negative",
    )
    # Reached by every candidate within a few rounds: searched, with a note (a loose
    # target may be what the user wants; the ranking then says little).
    quick = ["--policy", "uncoded", "--policy", "frc", "--repeats", "1"]
    for flags, words in (
        (["--target-loss", str(start)], "(give a lower --target-loss to rank the descent)"),
        # F*·(1 + 1000) is far above where the run starts.
        (["--target-gap", "1000"], "(give a smaller --target-gap to rank the descent)"),
    ):
        done = _cli("tune", "run.json", *flags, *quick, cwd=run_dir)
        assert done.returncode == 0, done.stderr
        assert f"at or above the loss the run had after round 0 ({start:.6g})" in done.stderr
        assert words in done.stderr and "top " in done.stdout
    # With a probe, before the probe runs (no coordinator listens here: refused first,
    # not after failing to reach one).
    (run_dir / "probe.toml").write_text('[job]\nworkers = 4\n[model]\nname = "logistic"\n')
    _refused(
        _cli(
            "tune", "--probe", "probe.toml", "--coordinator", "127.0.0.1:9",
            "--target-loss", "-0.1", cwd=run_dir,
        ),
        "--target-loss = -0.1 is below 0",
    )  # fmt: skip


def test_a_run_that_made_no_progress_is_named_when_no_target_is_given(tmp_path: Path) -> None:
    # A step far too small to move the loss: its last value is no target to rank by.
    done = _cli(*SOURCE, "--lr", "1e-18", "-o", "flat.json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    losses = [r["loss"] for r in json.loads((tmp_path / "flat.json").read_text())["rounds"]]
    assert losses[-1] >= losses[0]
    _refused(
        _cli("tune", "flat.json", cwd=tmp_path),
        "the run's last loss (the target when none is given)",
        "the run made no progress, and its loss is no target. Give --target-loss",
    )


def test_a_job_whose_target_its_model_cannot_reach_is_refused(tmp_path: Path) -> None:
    # On the simulator, and by `codedgd run` before any worker starts: no job is queued.
    run = ["run", "-n", "2", "-r", "5", "--data-opt", "rows=100", "-o", "r.json"]
    for args in (SOURCE, run):
        done = _cli(*args, "--target-loss", "-1", cwd=tmp_path)
        assert done.returncode == 2, done.stderr
        assert "job.target_loss = -1 is below 0, but the logistic objective" in done.stderr
        assert "failed" not in done.stderr  # refused up front, not "job <id> failed: ..."
        assert "Traceback" not in done.stderr


def test_a_failed_run_is_named_and_no_advice_is_drawn_from_its_missing_round(
    tmp_path: Path,
) -> None:
    # One worker hangs from round 10 on: the run fails there, and its rounds before were
    # all alike (no delays injected but the hang).
    done = _cli(
        "simulate", "-n", "4", "-r", "30", "--data-opt", "rows=400", "--stragglers",
        "fail-stop", "--straggler-opt", "count=1", "--straggler-opt", "start=10",
        "--round-timeout", "1", "-o", "failed.json", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode != 0
    summary = json.loads((tmp_path / "failed.json").read_text())["summary"]
    assert summary["error"] and summary["rounds"] == 10
    done = _cli("tune", "failed.json", cwd=tmp_path)
    assert "failed.json is of a run that failed after 10 recorded round(s)" in done.stderr
    _refused(done, "and the run failed", "Tune from a run that finished")
    assert "needs no coding" not in done.stderr


def test_a_second_ctrl_c_stops_a_search_in_processes_at_once(run_dir: Path) -> None:
    """Ctrl-C reaches the whole process group, the search's processes too (which leave it
    to tune); twice stops it however the two fall, with no traceback and no process left
    behind (a second one during the pool's shutdown once hung tune for good)."""
    for gap in (0.05, 0.3):
        proc = subprocess.Popen(
            [
                sys.executable, "-m", "codedgd.client.cli", "tune", "run.json", "--jobs", "2",
                "--rounds", "5000", "--repeats", "20", "--no-progress",
            ],
            cwd=run_dir,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )  # fmt: skip
        try:
            time.sleep(4)  # into the search
            assert proc.poll() is None, proc.communicate()
            os.killpg(proc.pid, signal.SIGINT)
            time.sleep(gap)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGINT)
            _, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        assert proc.returncode in (130, -signal.SIGINT), err
        assert "Traceback" not in err and "KeyboardInterrupt" not in err
        deadline = time.monotonic() + 10
        while _running_in_group(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _running_in_group(proc.pid) == []  # the search's processes are gone too


def _running_in_group(pgid: int) -> list[int]:
    """The processes of group ``pgid`` still running (a zombie, ended and not yet reaped
    by whoever inherited it, is not)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        state, _ppid, group = stat.rsplit(")", 1)[1].split()[:3]
        if int(group) == pgid and state not in "ZX":
            out.append(int(entry.name))
    return out
