"""`codedgd tune` on real worker processes: its pick against running every candidate.

For each scenario: a source run of uncoded on n = 8 local worker processes
(`codedgd run`), `codedgd tune` on its result file, then every candidate the tuner ranked
run for real on the same job (same seed, data, delays model) to the same target loss.
Reported: the pick's real time to the target over the best real time (goal <= 1.10),
uncoded's over the pick's (goal > 1), and ``auto``'s (choosing r and K as it runs,
moving data between the processes) over the best real time (goal <= 1.05), and auto as
``codedgd tune --write-auto`` writes it (started at the pick's group size). Wall-clock
times on this shared 2-core machine. One run is as noisy as the differences between the
top candidates, so every candidate runs once, and then those that could be the best (a
first run within 1.5x of the fastest), tune's pick and both autos run until they have
``--repeats`` runs; a candidate's median time counts. Candidates predicted more than
``--within`` times slower than the pick are not run (the predictions were within
0.84-1.47x of the real times), except uncoded, the default.

The scenarios are bench_tune's six at n = 8, phases (rotating, alternating) every 50
rounds as the issue states them. The job is long enough to hold them: step size 0.5
(about a fifth of 1/L), so uncoded takes ``--rounds`` (150) rounds to the target.

    python -m bench.bench_tune_real                      # six scenarios, about an hour
    python -m bench.bench_tune_real --scenario few-slow --repeats 1
    python -m bench.bench_tune_real --only auto             # auto alone: its times
    python -m bench.bench_tune_real --only auto --only "g-lag s=1 xi=10.0" --repeats 5
    python -m bench.bench_tune_real --only "auto from tune" --only "g-lag s=3 xi=10.0"
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from bench.bench_tune import SCENARIOS
from codedgd.services.policies.registry import names

N = 8
TUNED = "auto from tune"  # auto as `codedgd tune --write-auto` writes it
# A job of 100-300 rounds, so the scenarios' phases of 50 rounds come round: with the
# step size 1/L (the default) uncoded gets within 1e-9 of the optimum in 40.
JOB = [
    "-n", str(N), "--seed", "3", "--data-opt", "rows=40000", "--data-opt", "dim=50",
    "--lr", "0.5", "--no-progress",
]  # fmt: skip


def scenario_args(scenario: str) -> list[str]:
    """``codedgd run``'s flags for the delays of ``scenario`` (bench_tune's, at n = 8)."""
    model = SCENARIOS[scenario](N)
    args = ["--stragglers", model.name]
    for key, value in model.options.items():
        args += [
            "--straggler-opt",
            f"{key}={str(value).lower() if isinstance(value, bool) else value}",
        ]
    return args


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "codedgd.client.cli", *args],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if done.returncode not in (0, 1):
        raise SystemExit(f"codedgd {' '.join(args)}:\n{done.stderr}")
    return done


def time_to(path: Path, target: float) -> float:
    rounds = json.loads(path.read_text())["rounds"]
    hit = next((r for r in rounds if r["loss"] is not None and r["loss"] <= target), None)
    return float(hit["wall_seconds"]) if hit else math.inf


def timed_run(scenario: str, out: Path, target: float, rounds: int, *flags: str) -> float:
    """One real run of the scenario's job to ``target``: its time to it (inf: missed)."""
    cli(
        "run", *JOB, *scenario_args(scenario), "-r", str(rounds), *flags,
        "--target-loss", repr(target), "-o", str(out),
    )  # fmt: skip
    return time_to(out, target)


def one(
    scenario: str, tmp: Path, rounds: int, repeats: int, within: float, only: list[str]
) -> dict[str, Any]:
    src = tmp / f"{scenario}-source.json"
    cli(
        "run", *JOB, *scenario_args(scenario), "-r", str(rounds), "--policy", "uncoded",
        "-o", str(src),
    )  # fmt: skip
    written = tmp / f"{scenario}-auto.toml"
    tuned = json.loads(
        cli("tune", str(src), "--json", "--repeats", "3", "--write-auto", str(written)).stdout
    )
    target = float(tuned["target_loss"])
    pick = tuned["candidates"][0]
    flags = {
        c["label"]: ["--policy", c["policy"]["name"]]
        + [f"--param={k}={v}" for k, v in c["policy"].items() if k != "name"]
        for c in tuned["candidates"]
        if c["label"] == "uncoded"
        or (c["predicted_seconds"] or math.inf) <= within * pick["predicted_seconds"]
    }
    flags["auto"] = ["--policy", "auto"]  # it starts at r = 4 (n = 8) and chooses as it runs
    if tuned["auto_start"] is not None:  # as --write-auto writes it: at the pick's group size
        started = tuned["auto_start"]["policy"]
        flags[TUNED] = ["--policy", "auto"] + [
            f"--param={k}={v}" for k, v in started.items() if k != "name"
        ]
        print(
            f"  {scenario} {TUNED}: {flags[TUNED][2:]} (from {tuned['auto_start']['from']})",
            file=sys.stderr,
            flush=True,
        )
    predicted = {c["label"]: c["predicted_seconds"] for c in tuned["candidates"]}
    pick = pick["label"]
    if only:  # these, ``repeats`` times each, interleaved (the machine drifts), nothing else
        for label in only:
            words = label.split()
            if label not in flags and words[0] in names():  # with options: "auto start=exact"
                flags[label] = ["--policy", words[0]] + [f"--param={w}" for w in words[1:]]
            if label not in flags:
                raise SystemExit(
                    f"--only {label!r}: not a candidate of {scenario}'s run; "
                    f"choose among {sorted(flags)}, or 'POLICY KEY=VALUE ...'"
                )
        times_of: dict[str, list[float]] = {label: [] for label in only}
        for i in range(repeats):
            for label in only:
                out = tmp / f"{scenario}-{label.replace(' ', '_')}.{i}.json"
                times_of[label].append(timed_run(scenario, out, target, 2 * rounds, *flags[label]))
                print(f"  {scenario} {label}: real {times_of[label][-1]:.2f} s", file=sys.stderr)
        return {"scenario": scenario, "only": times_of}
    times: dict[str, list[float]] = {label: [] for label in flags}

    def run(label: str) -> None:
        out = tmp / f"{scenario}-{label.replace(' ', '_')}.{len(times[label])}.json"
        times[label].append(timed_run(scenario, out, target, 2 * rounds, *flags[label]))
        said = f"predicted {predicted[label]} s, " if label in predicted else ""
        print(
            f"  {scenario} {label}: {said}real {times[label][-1]:.2f} s",
            file=sys.stderr,
            flush=True,
        )

    # Every candidate once; then those that could be the best (within 1.5x of the fastest
    # first run), the pick and auto, until each has ``repeats`` runs: their medians count.
    for label in flags:
        run(label)
    fastest = min(t[0] for label, t in times.items() if label not in ("auto", TUNED))
    for label in flags:
        if label in (pick, "auto", TUNED) or times[label][0] <= 1.5 * fastest:
            while len(times[label]) < repeats:
                run(label)
    real = {label: float(np.median(t)) for label, t in times.items()}
    notes = [
        r["note"]
        for r in json.loads((tmp / f"{scenario}-auto.0.json").read_text())["rounds"]
        if r.get("note")
    ]
    print(f"  {scenario} auto (first run): {notes}", file=sys.stderr, flush=True)
    auto = real.pop("auto")
    tuned_auto = real.pop(TUNED, math.inf)
    best = min(real, key=lambda k: real[k])
    return {
        "scenario": scenario,
        "pick": pick,
        "pick_real": real[pick],
        "best": best,
        "best_real": real[best],
        "uncoded_real": real["uncoded"],
        "auto_real": auto,
        "tuned_auto_real": tuned_auto,
        "target": target,
    }


def main() -> None:
    p = argparse.ArgumentParser(
        prog="python -m bench.bench_tune_real",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--scenario", action="append", choices=list(SCENARIOS))
    p.add_argument("--rounds", type=int, default=150, help="the source run's rounds")
    p.add_argument(
        "--within",
        type=float,
        default=3.0,
        help="run the candidates predicted at most this many times the pick's time (and uncoded)",
    )
    p.add_argument(
        "--repeats", type=int, default=3, help="real runs of the contenders (median time)"
    )
    p.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="LABEL",
        help="run only this candidate ('auto', 'POLICY KEY=VALUE ...' with a policy's "
        "options, or a label tune prints), --repeats times, after the source run and tune; several "
        "--only run interleaved; prints each run's time to the target",
    )
    args = p.parse_args()
    if args.only:
        with tempfile.TemporaryDirectory() as tmp:
            for scenario in args.scenario or list(SCENARIOS):
                r = one(scenario, Path(tmp), args.rounds, args.repeats, args.within, args.only)
                for label, times in r["only"].items():
                    shown = ", ".join(f"{t:.2f}" for t in times)
                    print(f"| {scenario} | {label} | {float(np.median(times)):.2f} | {shown} |")
        return
    print(
        "| scenario (n = 8 processes) | tune's pick | real (s) | best real | best (s) "
        "| pick / best | uncoded / pick | auto (s) | auto / best | auto from tune (s) "
        "| its / best |"
    )
    print("|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for scenario in args.scenario or list(SCENARIOS):
            r = one(scenario, Path(tmp), args.rounds, args.repeats, args.within, [])
            print(
                f"| {r['scenario']} | {r['pick']} | {r['pick_real']:.2f} | {r['best']} | "
                f"{r['best_real']:.2f} | {r['pick_real'] / r['best_real']:.2f} | "
                f"{r['uncoded_real'] / r['pick_real']:.2f} | {r['auto_real']:.2f} | "
                f"{r['auto_real'] / r['best_real']:.2f} | {r['tuned_auto_real']:.2f} | "
                f"{r['tuned_auto_real'] / r['best_real']:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
