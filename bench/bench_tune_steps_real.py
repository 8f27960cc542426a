"""`codedgd tune --lr` on real worker processes: its pick against tune's at the run's step.

For each scenario: bench_tune_real's source run (uncoded on n = 8 local worker processes,
step 0.5, about a fifth of 1/L, 150 rounds), then `codedgd tune` on its result file twice:
at the run's own step, and with ``--lr`` (default 0.5, 1/L and 2/L). Both picks then run
for real to the same target (the loss the source ended at), ``--repeats`` times each,
interleaved (the machine drifts); the medians count. Reported: each pick, its predicted
and its real time, and the ratio (the run-step pick's real time over the --lr pick's).
Wall-clock times on this shared 2-core machine: run it alone.

    python -m bench.bench_tune_steps_real                    # six scenarios, ~10 minutes
    python -m bench.bench_tune_steps_real --scenario pareto --repeats 5
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from bench.bench_tune import SCENARIOS
from bench.bench_tune_real import JOB, cli, scenario_args, timed_run


def _flags(candidate: dict[str, Any]) -> list[str]:
    policy = candidate["policy"]
    return (
        ["--policy", policy["name"]]
        + [f"--param={k}={v}" for k, v in policy.items() if k != "name"]
        + ["--lr", str(candidate["lr"])]
    )


def one(scenario: str, tmp: Path, steps: list[str], rounds: int, repeats: int) -> dict[str, Any]:
    src = tmp / f"{scenario}-source.json"
    cli(
        "run", *JOB, *scenario_args(scenario), "-r", str(rounds), "--policy", "uncoded",
        "-o", str(src),
    )  # fmt: skip
    at_run = json.loads(cli("tune", str(src), "--json").stdout)
    with_lr = json.loads(cli("tune", str(src), "--json", *[f"--lr={s}" for s in steps]).stdout)
    target = float(at_run["target_loss"])
    picks = {"run's step": at_run["candidates"][0], "--lr": with_lr["candidates"][0]}
    times: dict[str, list[float]] = {name: [] for name in picks}
    for i in range(repeats):
        for name, pick in picks.items():
            out = tmp / f"{scenario}-{name.strip('-').replace(' ', '_')}.{i}.json"
            times[name].append(timed_run(scenario, out, target, 2 * rounds, *_flags(pick)))
    real = {name: float(np.median(t)) for name, t in times.items()}
    return {"picks": picks, "real": real, "times": times}


def main() -> None:
    p = argparse.ArgumentParser(
        prog="python -m bench.bench_tune_steps_real",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--scenario", nargs="+", choices=list(SCENARIOS), default=list(SCENARIOS))
    p.add_argument("--lr", nargs="+", default=["0.5", "1/L", "2/L"], help="tune --lr's steps")
    p.add_argument("--rounds", type=int, default=150, help="the source run's rounds")
    p.add_argument("--repeats", type=int, default=3, help="real runs of each pick (median)")
    a = p.parse_args()
    print(
        "| scenario (n = 8 processes) | pick at the run's step (0.5) | predicted (s) | real (s) "
        "| tune --lr's pick | predicted (s) | real (s) | run-step pick / --lr pick |"
    )
    print("|---|---|---:|---:|---|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for scenario in a.scenario:
            r = one(scenario, Path(tmp), a.lr, a.rounds, a.repeats)
            before, after = r["picks"]["run's step"], r["picks"]["--lr"]
            slow, fast = r["real"]["run's step"], r["real"]["--lr"]
            print(
                f"| {scenario} | {before['label']} | {before['predicted_seconds']:.2f} | "
                f"{slow:.2f} | {after['label']} | {after['predicted_seconds']:.2f} | "
                f"{fast:.2f} | {slow / fast:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
