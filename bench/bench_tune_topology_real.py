"""`codedgd tune` from a ring's or tree's run, on real worker processes.

bench_tune_topology_source checks on the simulator that tune fits a topology run from
its workers' own times (``ready_seconds``) as well as a star run from its arrivals. Here
the same on n = 6 local worker processes (a tree of fanout 2 and 2 levels), or ``--n 8``
(bench_tune_real's n: a tree of 2 level-1 workers with 3 children each): for each
scenario, one source run of each kind (`codedgd run`: uncoded, tree, codedreduce s = 1,
ring-allreduce), `codedgd tune` on each with the same stated link (``--link-latency
0.0002 --link-bandwidth 1.25e9``) over a few policies, and then a fixed set of
candidates (every source's pick, uncoded, the tree and the ring) run for real to the
same target, ``--repeats`` times each, interleaved; a candidate's median time counts.
Reported per source: tune's pick and its real time over the best real time of the set,
and for the candidates run, tune's predicted time over the real one (lowest and
highest). Wall-clock times on a shared 2-core machine: run it alone.

``--link measured``: the link is measured instead, as ``codedgd tune --probe-links``
measures it on a pool (a coordinator and one worker process started for it here, the
probe's tiny job tuned and thrown away), and every tune is given that.

    python -m bench.bench_tune_topology_real                    # three scenarios, ~15 min
    python -m bench.bench_tune_topology_real --scenario few-slow --repeats 1
    python -m bench.bench_tune_topology_real --link measured
    python -m bench.bench_tune_topology_real --n 8
"""

from __future__ import annotations

import argparse
import json
import math
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.bench_tune import SCENARIOS
from bench.bench_tune_real import cli, time_to
from bench.bench_tune_topology_source import sources
from codedgd.services.tuning import label as label_of

N = 6  # the default: a regular tree of fanout 2 and 2 levels
LINK = ["--link-latency", "0.0002", "--link-bandwidth", "1.25e9"]
SEARCHED = ["uncoded", "frc", "g-lag", "ring-allreduce", "tree", "codedreduce"]


def job_args(n: int) -> list[str]:
    return [
        "-n", str(n), "--seed", "3", "--data-opt", "rows=30000", "--data-opt", "dim=50",
        "--lr", "0.5", "--no-progress",
    ]  # fmt: skip


def source_args(n: int) -> dict[str, list[str]]:
    """The source runs' flags at n: the tree (and codedreduce s = 1) of
    bench_tune_topology_source's choice (n = 6: fanout 2, 2 levels; n = 8: 2 × (1 + 3))."""
    options = sources(n)["tree"].options
    params = [a for k, v in options.items() for a in ("--param", f"{k}={v}")]
    return {
        "uncoded": ["--policy", "uncoded"],
        "tree": ["--policy", "tree", *params],
        "codedreduce": ["--policy", "codedreduce", *params, "--param", "s=1"],
        "ring-allreduce": ["--policy", "ring-allreduce"],
    }


def always(n: int) -> tuple[str, str, str]:
    """The candidates run whatever tune picks: uncoded, the sources' tree, the ring."""
    return ("uncoded", label_of(sources(n)["tree"]), "ring-allreduce")


def scenario_args(scenario: str, n: int) -> list[str]:
    model = SCENARIOS[scenario](n)
    args = ["--stragglers", model.name]
    for key, value in model.options.items():
        shown = str(value).lower() if isinstance(value, bool) else value
        args += ["--straggler-opt", f"{key}={shown}"]
    return args


PROBE_JOB = """
[job]
workers = 1
rounds = 10
[data]
name = "synthetic"
rows = 100
dim = 5
"""


def measured_link(tmp: Path) -> list[str]:
    """The link flags of what ``tune --probe-links`` measures on a pool of one worker."""
    port = _free_port()
    target = f"127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "codedgd.client.cli"]
    coordinator = subprocess.Popen([*cmd, "coordinator", "--listen", target])
    worker = subprocess.Popen([*cmd, "worker", "--coordinator", target, "--name", "probe"])
    try:
        (tmp / "probe-job.toml").write_text(PROBE_JOB)
        for _ in range(100):  # until the worker has connected
            done = subprocess.run(
                [
                    *cmd, "tune", "--probe", str(tmp / "probe-job.toml"), "--probe-links",
                    "--probe-output", str(tmp / "probe.json"), "--coordinator", target,
                    "--policy", "uncoded", "--repeats", "1", "--json", "--no-progress",
                ],
                capture_output=True,
                text=True,
            )  # fmt: skip
            if done.returncode == 0:
                break
            time.sleep(0.5)
        else:
            raise SystemExit(f"the link probe failed: {done.stderr[-2000:]}")
    finally:
        for proc in (worker, coordinator):
            proc.kill()
            proc.wait()
    link = json.loads(done.stdout)["link"]
    print(f"(measured: {done.stderr.strip().splitlines()[-1]})", file=sys.stderr)
    bandwidth = link["bandwidth_bytes_per_second"]
    return [
        "--link-latency", repr(link["latency_seconds"]),
        "--link-bandwidth", "inf" if bandwidth is None else repr(bandwidth),
    ]  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def one(
    scenario: str, tmp: Path, rounds: int, repeats: int, link: list[str], n: int
) -> list[dict[str, Any]]:
    delays = scenario_args(scenario, n)
    job, kept = job_args(n), always(n)
    runs: dict[str, Path] = {}
    for name, flags in source_args(n).items():
        runs[name] = tmp / f"{scenario}-{name}-source.json"
        cli("run", *job, *delays, "-r", str(rounds), *flags, "-o", str(runs[name]))
    rows = json.loads(runs["uncoded"].read_text())["rounds"]
    target = float(rows[-1]["loss"])  # one target for every source: where uncoded ended
    tuned: dict[str, dict[str, Any]] = {}
    for name, path in runs.items():
        policies = [a for p in SEARCHED for a in ("--policy", p)]
        out = cli(
            "tune", str(path), "--json", "--repeats", "3", "--target-loss", repr(target),
            *link, *policies,
        )  # fmt: skip
        tuned[name] = json.loads(out.stdout)
    flags: dict[str, list[str]] = {}
    for outcome in tuned.values():
        for c in outcome["candidates"]:
            if c["label"] in kept or c is outcome["candidates"][0]:
                flags[c["label"]] = ["--policy", c["policy"]["name"]] + [
                    f"--param={k}={v}" for k, v in c["policy"].items() if k != "name"
                ]
    times: dict[str, list[float]] = {label: [] for label in flags}
    for i in range(repeats):  # interleaved: the machine drifts
        for label, policy in flags.items():
            out_path = tmp / f"{scenario}-{label.replace(' ', '_')}.{i}.json"
            cli(
                "run", *job, *delays, "-r", str(2 * rounds), *policy,
                "--target-loss", repr(target), "-o", str(out_path),
            )  # fmt: skip
            times[label].append(time_to(out_path, target))
    real = {label: float(np.median(t)) for label, t in times.items()}
    best = min(real, key=lambda k: real[k])
    out = []
    for name, outcome in tuned.items():
        predicted = {c["label"]: c["predicted_seconds"] for c in outcome["candidates"]}
        ratios = [
            predicted[label] / real[label]
            for label in real
            if predicted.get(label) is not None and math.isfinite(real[label])
        ]
        pick = outcome["candidates"][0]["label"]
        out.append(
            {
                "scenario": scenario,
                "source": name,
                "pick": pick,
                "pick_real": real[pick],
                "best": best,
                "best_real": real[best],
                "predicted_over_real": (min(ratios), max(ratios)) if ratios else None,
                # the topologies' own: what the link decides
                "hops": {
                    label: predicted[label] / real[label]
                    for label in kept[1:]
                    if predicted.get(label) is not None and math.isfinite(real[label])
                },
            }
        )
    return out


def main() -> None:
    p = argparse.ArgumentParser(
        prog="python -m bench.bench_tune_topology_real",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--scenario",
        action="append",
        choices=list(SCENARIOS),
        help="default: exponential, few-slow, pareto",
    )
    p.add_argument(
        "--n",
        type=int,
        default=N,
        help="worker processes (6: a tree of fanout 2 and 2 levels; 8: 2 x (1 + 3))",
    )
    p.add_argument("--rounds", type=int, default=100, help="the source runs' rounds")
    p.add_argument("--repeats", type=int, default=3, help="real runs of each candidate")
    p.add_argument(
        "--link",
        choices=("stated", "measured"),
        default="stated",
        help="the link every tune is given: stated (0.2 ms, 1.25 GB/s; the default) or "
        "measured by tune --probe-links on this machine",
    )
    args = p.parse_args()
    sources(args.n)  # (a size without a tree: said now)
    with tempfile.TemporaryDirectory() as tmp:
        link = measured_link(Path(tmp)) if args.link == "measured" else LINK
        print(f"the link: {' '.join(link)}\n", flush=True)
        print(
            f"| scenario (n = {args.n} processes) | source run | tune's pick | real (s) | "
            "best real | best (s) | pick / best | candidates run: predicted / real | tree, ring: "
            "predicted / real |"
        )
        print("|---|---|---|---:|---|---:|---:|---|---|")
        for scenario in args.scenario or ["exponential", "few-slow", "pareto"]:
            for r in one(scenario, Path(tmp), args.rounds, args.repeats, link, args.n):
                span = r["predicted_over_real"]
                shown = f"{span[0]:.2f}-{span[1]:.2f}" if span else "-"
                print(
                    f"| {r['scenario']} | {r['source']} | {r['pick']} | {r['pick_real']:.2f} "
                    f"| {r['best']} | {r['best_real']:.2f} | "
                    f"{r['pick_real'] / r['best_real']:.2f} | {shown} | "
                    + ", ".join(f"{v:.2f}" for v in r["hops"].values())
                    + " |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
