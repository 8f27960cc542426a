"""Speed-aware loads (hetero) against uniform loads when half the workers are 2x slower.

Issue 22's goal: >= 1.35x faster per round than uniform load at equal exactness (1.5x is
the ideal: the pool's capacity is 0.75n against uniform load's 0.5n). Pairs compared:
uncoded against hetero s=0 (both wait for everyone), and cyclic s=1 and frc s=1 against
hetero s=1 (all three exact with one straggler). The slow half is the straggler model
``speed-classes`` (count = n/2, factor 2: a slow worker takes twice as long at its compute),
and hetero is told the speeds (as `codedgd tune` does from a run's timings).

Simulator: compute costs 0.05 s for a 1/n share of the rows. ``--real``: the same on n = 8
local worker processes (``codedgd run``), where compute is whatever this machine takes.

    python -m bench.bench_hetero                 # simulator, n = 8, 16, 64
    python -m bench.bench_hetero --real          # also n = 8 real processes
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from codedgd.services.job import Component, JobConfig
from codedgd.services.sim import CostModel, simulate
from codedgd.services.stragglers import create_straggler_model

PAIRS = [
    ("uncoded", {}, {"s": 0}),
    ("cyclic", {"s": 1}, {"s": 1}),
    ("frc", {"s": 1}, {"s": 1}),
]


def speeds_for(n: int, seed: int) -> str:
    model = create_straggler_model(
        "speed-classes", {"count": n // 2, "factor": 2.0}, seed=seed, n_workers=n
    )
    return ",".join("1" if slow else "2" for slow in model.slow(0))  # type: ignore[attr-defined]


def simulated(n: int, rounds: int) -> list[tuple[str, float, float]]:
    rows = 400 * n
    cost = CostModel(
        seconds_per_sample=0.05 / (0.8 * rows / n),  # 0.8: the training share of the rows
        seconds_per_partition=0.0,
        decode_seconds=1e-4,
    )
    base = JobConfig(
        workers=n,
        rounds=rounds,
        seed=1,
        data=Component("synthetic", {"rows": rows, "dim": 20}),
        stragglers=Component("speed-classes", {"count": n // 2, "factor": 2.0}),
    )
    speeds = speeds_for(n, base.seed)
    out = []
    for name, uniform, aware in PAIRS:
        try:
            a = simulate(base.replace(policy=Component(name, uniform)), cost).records
        except Exception as exc:
            print(f"  {name}: {exc}", file=sys.stderr)
            continue
        b = simulate(
            base.replace(policy=Component("hetero", {**aware, "speeds": speeds})), cost
        ).records
        label = f"{name} {' '.join(f'{k}={v}' for k, v in uniform.items())}".strip()
        out.append(
            (
                label,
                float(np.mean([r.round_seconds for r in a])),
                float(np.mean([r.round_seconds for r in b])),
            )
        )
    return out


def real(n: int, rounds: int) -> list[tuple[str, float, float]]:
    speeds = speeds_for(n, 1)
    common = [
        "--workers",
        str(n),
        "--rounds",
        str(rounds),
        "--seed",
        "1",
        "--data",
        "synthetic",
        "--data-opt",
        "rows=400000",
        "--data-opt",
        "dim=200",
        "--stragglers",
        "speed-classes",
        "--straggler-opt",
        f"count={n // 2}",
        "--straggler-opt",
        "factor=2",
        "--no-progress",
    ]
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, uniform, aware in PAIRS:
            means = []
            for policy, params in ((name, uniform), ("hetero", {**aware, "speeds": speeds})):
                path = Path(tmp) / f"{policy}-{len(means)}.json"
                cmd = [
                    sys.executable,
                    "-m",
                    "codedgd.client.cli",
                    "run",
                    *common,
                    "--policy",
                    policy,
                    "-o",
                    str(path),
                ]
                for k, v in params.items():
                    cmd += ["--param", f"{k}={v}"]
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
                if done.returncode != 0:
                    raise SystemExit(done.stderr)
                rounds_doc = json.loads(path.read_text())["rounds"]
                means.append(float(np.mean([r["round_seconds"] for r in rounds_doc])))
            label = f"{name} {' '.join(f'{k}={v}' for k, v in uniform.items())}".strip()
            out.append((label, means[0], means[1]))
    return out


def main() -> None:
    p = argparse.ArgumentParser(
        prog="python -m bench.bench_hetero",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--workers", type=int, action="append")
    p.add_argument("--rounds", type=int, default=50)
    p.add_argument("--real", action="store_true", help="also n = 8 real worker processes")
    args = p.parse_args()
    print(
        "| where | n | uniform policy | uniform mean round (s) | hetero mean round (s) | speed-up |"
    )
    print("|---|---:|---|---:|---:|---:|")
    for n in args.workers or [8, 16, 64]:
        for label, uni, het in simulated(n, args.rounds):
            print(
                f"| simulator | {n} | {label} | {uni:.4f} | {het:.4f} | {uni / het:.2f}x |",
                flush=True,
            )
    if args.real:
        for label, uni, het in real(8, 30):
            print(
                f"| 8 processes | 8 | {label} | {uni:.4f} | {het:.4f} | {uni / het:.2f}x |",
                flush=True,
            )


if __name__ == "__main__":
    main()
