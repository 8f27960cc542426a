"""`codedgd run --policy auto` on real worker processes: the look-ahead runs in the
coordinator, and its switch is logged and written into the round's record."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


# With mini-batch rounds the look-ahead runs on the simulator's events engine (the
# vectorized one refuses them: the job used to fail at its first decision).
@pytest.mark.parametrize("batch", [[], ["--batch-size", "20"]], ids=["full", "mini-batch"])
def test_auto_switches_on_a_real_cluster_and_says_so(tmp_path: Path, batch: list[str]) -> None:
    out = tmp_path / "auto.json"
    done = subprocess.run(
        [
            sys.executable, "-m", "codedgd.client.cli", "run",
            "-n", "4", "-r", "12", "--seed", "1",
            "--data-opt", "rows=400", "--data-opt", "dim=5",
            "--policy", "auto", "--param", "window=5", "--param", "choices=2",
            "--stragglers", "exponential", "--straggler-opt", "mean=0.02",
            "--no-progress", "-o", str(out), *batch,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    rounds = json.loads(out.read_text())["rounds"]
    notes = [(r["round"], r["note"]) for r in rounds if r.get("note")]
    assert len(notes) == 1 and notes[0][0] == 5
    assert notes[0][1].startswith("auto: K 4 -> 2 (predicted loss after")
    # From round 5 on the rounds stop at the 2nd arrival (or once both groups came).
    assert all(r["uploads"] <= 2 for r in rounds[5:] if r["cancelled"] > 0)
    # Said on the terminal, above the progress bar (even without one, and without -v).
    assert "round 5: auto: K 4 -> 2 (predicted loss after" in done.stderr
