"""`codedgd run --policy auto` on real worker processes: the look-ahead runs in the
coordinator, and its switch is logged and written into the round's record."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_auto_switches_on_a_real_cluster_and_says_so(tmp_path: Path) -> None:
    out = tmp_path / "auto.json"
    done = subprocess.run(
        [
            sys.executable, "-m", "codedgd.client.cli", "run",
            "-n", "4", "-r", "12", "--seed", "1",
            "--data-opt", "rows=400", "--data-opt", "dim=5",
            "--policy", "auto", "--param", "window=5", "--param", "choices=2",
            "--stragglers", "exponential", "--straggler-opt", "mean=0.02",
            "--no-progress", "-o", str(out),
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
