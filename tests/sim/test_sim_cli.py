"""`codedgd simulate` / `codedgd report` through their argparse parsers."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest

from codedgd.client.cli.report import add_parser as add_report_parser
from codedgd.client.cli.simulate import add_parser as add_simulate_parser
from codedgd.services.records import read_results


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="codedgd")
    sub = p.add_subparsers(dest="command", required=True)
    add_simulate_parser(sub)
    add_report_parser(sub)
    return p


def run(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    return int(args.func(args))


def test_help_lists_job_and_cost_flags(capsys: pytest.CaptureFixture[str]) -> None:
    for command, flags in (
        (
            "simulate",
            [
                "--policy",
                "--stragglers",
                "--seconds-per-sample",
                "--latency",
                "--bandwidth",
                "--ingress-bandwidth",
                "--cores",
                "--ideal",
                "--trace-from-results",
            ],
        ),
        ("report", ["--out-dir", "--target-loss", "--baseline", "--label"]),
    ):
        with pytest.raises(SystemExit) as exc:
            parser().parse_args([command, "--help"])
        assert exc.value.code == 0
        text = capsys.readouterr().out
        for flag in flags:
            assert flag in text


def test_cores_local_is_this_machines_and_a_bad_count_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import os

    base = ["simulate", "-n", "2"]
    assert parser().parse_args([*base, "--cores", "local"]).cores == float(os.cpu_count() or 1)
    assert parser().parse_args([*base, "--cores", "3"]).cores == 3.0
    for bad in ("0", "many", "inf"):
        with pytest.raises(SystemExit) as exc:
            parser().parse_args([*base, "--cores", bad])
        assert exc.value.code == 2
        assert "cores" in capsys.readouterr().err


def test_simulate_then_replay_then_report(tmp_path: Path) -> None:
    job = [
        "-n",
        "4",
        "-r",
        "8",
        "--seed",
        "1",
        "--data-opt",
        "rows=300",
        "--data-opt",
        "dim=5",
        "--no-progress",
    ]
    out = tmp_path / "sim.json"
    assert (
        run(
            [
                "simulate",
                *job,
                "--stragglers",
                "exponential",
                "--straggler-opt",
                "mean=0.05",
                "--latency",
                "0.001",
                "-o",
                str(out),
            ]
        )
        == 0
    )
    doc = json.loads(out.read_text())
    assert doc["job"]["simulation"]["cost"]["latency_seconds"] == 0.001
    assert doc["job"]["simulation"]["calibration"]["seconds_per_sample"] >= 0
    assert doc["summary"]["rounds"] == 8 and doc["summary"]["gradients_computed"] == 32
    assert out.with_suffix(".csv").is_file()
    _, records = read_results(out)
    assert all(len(r.response_seconds) == 4 for r in records)

    replay = tmp_path / "replay.json"
    trace = tmp_path / "trace.csv"
    assert (
        run(
            [
                "simulate",
                *job,
                "-p",
                "ignore-stragglers",
                "--param",
                "s=1",
                "--trace-from-results",
                str(out),
                "--trace-out",
                str(trace),
                "--latency",
                "0.001",
                "-o",
                str(replay),
            ]
        )
        == 0
    )
    assert trace.read_text().startswith("round,worker,delay")
    replay_doc = json.loads(replay.read_text())
    assert replay_doc["job"]["stragglers"]["name"] == "trace"
    # The slowest recorded worker of each round is the one the replay leaves out.
    _, replayed = read_results(replay)
    for a, b in zip(records, replayed, strict=True):
        slowest = max(a.response_seconds, key=lambda w: a.response_seconds[w])
        assert slowest not in b.workers_used

    report_dir = tmp_path / "rep"
    assert run(["report", str(out), str(replay), "-o", str(report_dir)]) == 0
    summary = json.loads((report_dir / "report.json").read_text())
    assert [r["rounds"] for r in summary["runs"]] == [8, 8]
    means = [np.mean([r.round_seconds for r in recs]) for recs in (records, replayed)]
    assert summary["runs"][1]["round_speedup"] == pytest.approx(means[0] / means[1])
    assert (report_dir / "round_times.svg").is_file()


@pytest.mark.slow
def test_a_thousand_workers_simulate_in_minutes(tmp_path: Path) -> None:
    out = tmp_path / "big.json"
    assert (
        run(
            [
                "simulate",
                "-n",
                "1000",
                "-r",
                "20",
                "--data-opt",
                "rows=50000",
                "--data-opt",
                "dim=200",
                "-p",
                "ignore-stragglers",
                "--param",
                "s=100",
                "--stragglers",
                "shifted-exponential",
                "--straggler-opt",
                "shift=1",
                "--eval-every",
                "5",
                "--no-progress",
                "-o",
                str(out),
            ]
        )
        == 0
    )
    _, records = read_results(out)
    assert len(records) == 20 and all(len(r.workers_used) == 900 for r in records)
