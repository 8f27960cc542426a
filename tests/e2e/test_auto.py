"""`codedgd run --policy auto` on real worker processes: the look-ahead runs in the
coordinator, in a thread while the rounds go on; its switch takes effect at the first
round after it is done, and is logged and written into that round's record."""

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
        tmp_path, "auto", "-r", "30", "--policy", "auto", "--param", "window=30",
        "--param", "choices=2", "--param", "sizes=2", "--param", "lazy=none",
        "--stragglers", "exponential", "--straggler-opt", "mean=0.02", *batch,
    )  # fmt: skip
    notes = [(r["round"], r["note"]) for r in rounds if r.get("note")]
    assert len(notes) == 1 and notes[0][0] > 2, notes  # K = 2 is the only other choice
    at, note = notes[0]
    assert note.startswith("auto: r=2 K=4 -> r=2 K=2 (") and "looked ahead from round 2)" in note
    # Rounds before it waited for both groups; from it on they stop at the 2nd arrival
    # (or once both groups came).
    assert all(r["uploads"] >= 2 for r in rounds[:at])
    assert all(r["uploads"] <= 2 for r in rounds[at:] if r["cancelled"] > 0)
    # Said on the terminal, above the progress bar (even without one, and without -v).
    assert f"round {at}: auto: r=2 K=4 -> r=2 K=2 (" in stderr


def test_auto_switches_to_lazy_rounds_on_a_real_cluster(tmp_path: Path) -> None:
    # From exact rounds (K = n, start=exact) to g-lag's lazy rounds (xi = 10) on the same
    # groups; a short warm-up (D = 2) so the first decision (round 5) can see them pay.
    rounds, stderr = _run(
        tmp_path, "lazy", "-r", "40", "--policy", "auto", "--param", "window=30",
        "--param", "first=5", "--param", "choices=4", "--param", "sizes=2",
        "--param", "lazy=10", "--param", "D=2", "--param", "start=exact",
        "--stragglers", "exponential", "--straggler-opt", "mean=0.02",
    )  # fmt: skip
    notes = [(r["round"], r["note"]) for r in rounds if r.get("note")]
    assert len(notes) == 1 and notes[0][0] > 5, notes
    at, note = notes[0]
    assert note.startswith("auto: r=2 K=4 -> r=2 lazy xi=10 (saves ")
    assert f"round {at}: auto: r=2 K=4 -> r=2 lazy xi=10 (" in stderr
    # Exact rounds hear from both groups; lazy ones ask only the groups whose trigger
    # fires (some rounds none), and step with the others' last messages.
    assert all(r["uploads"] >= 2 and r["exact"] for r in rounds[:at])
    lazy = rounds[at:]
    assert any(r["uploads"] < 2 for r in lazy) and sum(r["uploads"] for r in lazy) < 2 * len(lazy)
    assert rounds[-1]["loss"] < rounds[at - 1]["loss"]


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
    # for them, one group of 4 does not. Only exact rounds (K = n, no lazy ones) are allowed.
    trace = tmp_path / "slow-pair.json"
    trace.write_text(json.dumps({"delays": [[0.4, 0.4, 0.0, 0.0]] * 20}))
    slow = ["--stragglers", "trace", "--straggler-opt", f"path={trace}"]
    rounds, _ = _run(
        tmp_path, "auto", "-r", "20", "--policy", "auto", "--param", "window=20",
        "--param", "choices=4", "--param", "sizes=2,4", "--param", "lazy=none", *slow,
    )  # fmt: skip
    notes = [(r["round"], r["note"]) for r in rounds if r.get("note")]
    assert len(notes) == 1 and notes[0][0] > 2, notes
    at, note = notes[0]
    assert note.startswith("auto: r=2 K=4 -> r=4 K=4 (saves ")
    # Each worker was shipped the 2 partitions of its new group it lacked, no more.
    assert "re-assigned: 8 partitions (" in note
    assert all(r["wait_seconds"] > 0.4 for r in rounds[:at])
    assert all(r["wait_seconds"] < 0.4 for r in rounds[at + 1 :])
    # Every round exact, before and after the move: the workers computed over the rows
    # of their new groups (the kept ones and the shipped ones), as uncoded's do.
    assert all(r["exact"] for r in rounds)
    uncoded, _ = _run(tmp_path, "uncoded", "-r", "20", "--policy", "uncoded")
    assert rounds[-1]["loss"] == pytest.approx(uncoded[-1]["loss"], rel=1e-9)
