"""`codedgd run --policy auto` on real worker processes: the look-ahead runs in the
coordinator, and its switch is logged and written into the round's record."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest


# With mini-batch rounds the look-ahead runs on the simulator's events engine (the
# vectorized one refuses them: the job used to fail at its first decision).
@pytest.mark.parametrize("batch", [[], ["--batch-size", "20"]], ids=["full", "mini-batch"])
def test_auto_switches_on_a_real_cluster_and_says_so(tmp_path: Path, batch: list[str]) -> None:
    rounds, stderr = _run(
        tmp_path, "auto", "-r", "12", "--policy", "auto", "--param", "window=5",
        "--param", "choices=2", "--param", "sizes=2",
        "--stragglers", "exponential", "--straggler-opt", "mean=0.02", *batch,
    )  # fmt: skip
    notes = [(r["round"], r["note"]) for r in rounds if r.get("note")]
    assert len(notes) == 1 and notes[0][0] == 5
    assert notes[0][1].startswith("auto: r=2 K=4 -> r=2 K=2 (")
    # From round 5 on the rounds stop at the 2nd arrival (or once both groups came).
    assert all(r["uploads"] <= 2 for r in rounds[5:] if r["cancelled"] > 0)
    # Said on the terminal, above the progress bar (even without one, and without -v).
    assert "round 5: auto: r=2 K=4 -> r=2 K=2 (" in stderr


def _run(tmp_path: Path, name: str, *args: str) -> tuple[list[dict[str, Any]], str]:
    """`codedgd run` of a small job on 4 local workers (more options in ``args``):
    (its rounds from the result file, what it wrote to stderr)."""
    out = tmp_path / f"{name}.json"
    done = subprocess.run(
        [
            sys.executable, "-m", "codedgd.client.cli", "run",
            "-n", "4", "--seed", "1", "--data-opt", "rows=400", "--data-opt", "dim=5",
            "--no-progress", "-o", str(out), *args,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    rounds: list[dict[str, Any]] = json.loads(out.read_text())["rounds"]
    return rounds, done.stderr


def test_auto_moves_data_between_real_workers_when_a_larger_group_pays(tmp_path: Path) -> None:
    # Workers 0 and 1 (a group of r = 2) are 0.4 s late in every round: groups of 2 wait
    # for them, one group of 4 does not. Only exact rounds (K = n) are allowed.
    trace = tmp_path / "slow-pair.json"
    trace.write_text(json.dumps({"delays": [[0.4, 0.4, 0.0, 0.0]] * 14}))
    slow = ["--stragglers", "trace", "--straggler-opt", f"path={trace}"]
    rounds, _ = _run(
        tmp_path, "auto", "-r", "14", "--policy", "auto", "--param", "window=5",
        "--param", "choices=4", "--param", "sizes=2,4", *slow,
    )  # fmt: skip
    notes = [(r["round"], r["note"]) for r in rounds if r.get("note")]
    assert [t for t, _ in notes] == [5], notes
    assert notes[0][1].startswith("auto: r=2 K=4 -> r=4 K=4 (saves ")
    # Each worker was shipped the 2 partitions of its new group it lacked, no more.
    assert "re-assigned: 8 partitions (" in notes[0][1]
    assert all(r["wait_seconds"] > 0.4 for r in rounds[:5])
    assert all(r["wait_seconds"] < 0.4 for r in rounds[6:])
    # Every round exact, before and after the move: the workers computed over the rows
    # of their new groups (the kept ones and the shipped ones), as uncoded's do.
    assert all(r["exact"] for r in rounds)
    uncoded, _ = _run(tmp_path, "uncoded", "-r", "14", "--policy", "uncoded")
    assert rounds[-1]["loss"] == pytest.approx(uncoded[-1]["loss"], rel=1e-9)
