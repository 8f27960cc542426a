"""Does `codedgd tune` pick well? Its pick against an exhaustive search, on six delay scenarios.

For each scenario and n: a source run of the default policy (uncoded) is simulated for
``--source-rounds`` rounds with the scenario's delays (the cluster); the tuner sees only that run's
records (as `codedgd tune RESULT.json` does), fits them and ranks every candidate on
replays of them. The exhaustive search then runs every candidate under the scenario's
true delay model, with ``--repeats`` fresh seeds (the same slow machines for the
speed-classes scenarios: ``pool`` = the source's seed), and takes the best median time to the
same target. Reported: the pick's true time over the best true time (goal <= 1.10), the
default policy's true time over the pick's (goal > 1), how long the tuner took, and the
``auto`` policy's true time (its look-ahead refits the live rounds) over the best fixed
candidate's (goal: <= 1.05, and <= 1/1.2 on the alternating scenario), and over the best
of the candidates that are not lazy; and ``auto`` as ``codedgd tune --write-auto`` writes
it (started at the group size of tune's pick, each worker's slowness in the source run
its prior) over the best; and over tune's ten best-ranked candidates, how far its
predicted times are from their true ones (predicted / true, the lowest and the highest).
With ``--source-draws N`` tune also predicts its ten best again on N redrawn sources
(``codedgd tune --source-draws``), and two more columns say for how many of them the
true time is within the replays' range, and within the redrawn sources' range (tune's
time then includes the redrawn predictions).

    python -m bench.bench_tune                          # n = 16 and 64, all six scenarios
    python -m bench.bench_tune --workers 16 --scenario alternating
    python -m bench.bench_tune --workers 64 --scenario pareto --source-delays 7
    python -m bench.bench_tune --workers 64 --scenario pareto --source-draws 5
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from codedgd.services.job import Component, JobConfig
from codedgd.services.policies.lag import LazyPolicy
from codedgd.services.policies.registry import policy_class
from codedgd.services.sim import CostModel
from codedgd.services.sim.engines import make_simulator, simulate
from codedgd.services.stragglers import create_straggler_model
from codedgd.services.tuning import auto_start, fit_delays, label, observe, search

SCENARIOS: dict[str, Callable[[int], Component]] = {
    "exponential": lambda n: Component("exponential", {"mean": 0.1}),
    "few-slow": lambda n: Component(
        "speed-classes", {"count": max(1, n // 8), "factor": 5.0, "mean": 0.02}
    ),
    "pareto": lambda n: Component("pareto", {"scale": 0.02, "shape": 1.5}),
    "two-classes": lambda n: Component("speed-classes", {"factor": 2.0, "mean": 0.05}),
    "rotating": lambda n: Component(
        "speed-classes", {"count": max(1, n // 8), "factor": 5.0, "mean": 0.02, "every": 50}
    ),
    "alternating": lambda n: Component(
        "speed-classes",
        {"count": max(1, n // 4), "factor": 5.0, "mean": 0.02, "every": 50, "calm": True},
    ),
}


def cost_for(n: int) -> CostModel:
    """A worker holding 1/n of the rows computes for 0.05 s; links 1 ms, 1 GB/s."""
    rows = 200 * n
    return CostModel(
        seconds_per_sample=0.05 / (rows / n),
        seconds_per_partition=0.0,
        latency_seconds=0.001,
        decode_seconds=1e-4,
    )


def one(scenario: str, n: int, args: argparse.Namespace) -> dict[str, Any]:
    stragglers = SCENARIOS[scenario](n)
    source = JobConfig(
        workers=n,
        rounds=args.source_rounds,
        seed=3,
        data=Component("synthetic", {"rows": 200 * n, "dim": 50}),
        policy=Component("uncoded", {}),
        stragglers=stragglers,
        round_timeout=1e9,
    )
    cost = cost_for(n)

    def cluster(seed: int) -> Any:
        """The scenario's delays drawn with ``seed``: fresh luck, the same cluster (a
        speed-classes pool keeps the source's slow machines)."""
        options = dict(stragglers.options)
        if stragglers.name == "speed-classes":
            options["pool"] = source.seed
        return create_straggler_model(stragglers.name, options, seed=seed, n_workers=n)

    if args.source_delays is None:
        recorded = simulate(source, cost).records
    else:  # the same job and cluster, other luck in the source run's delays
        sim = make_simulator(source, cost, per_worker=True)
        sim.straggler = cluster(args.source_delays)
        recorded = sim.run().records
    target = recorded[-1].loss
    started = time.perf_counter()
    obs = observe(recorded, n)
    fit = fit_delays(obs)
    picked = search(
        source,
        obs,
        fit.tail,
        target_loss=target,
        rounds=args.rounds,
        repeats=args.repeats,
        jobs=args.jobs,  # as `codedgd tune` searches: on every CPU it may use
        draws=args.source_draws,
        drawn_top=10,
    )
    tune_seconds = time.perf_counter() - started

    def truth(rep: int) -> Any:
        return cluster(1000 + rep)

    exhaustive = search(
        source,
        obs,
        fit.tail,
        target_loss=target,
        rounds=args.rounds,
        repeats=args.repeats,
        delays=truth,
        cost=cost,
        hold=1,  # the truth: where a job given the target stops (tune asks its pick to hold)
    )
    true_time = {o.label: o.predicted for o in exhaustive}
    pick = picked[0].label
    # How far off tune's predictions are, over its top ten (those that reached the target).
    off = [
        o.predicted / true_time[o.label]
        for o in picked[:10]
        if math.isfinite(o.predicted) and math.isfinite(true_time.get(o.label, math.inf))
    ]
    # Whether each of the ten best's true time is within its replays' range, and within
    # its redrawn sources' range (with --source-draws).
    drawn = [o for o in picked[:10] if o.source_interval is not None]

    def within(span: tuple[float, float] | None, o: Any) -> bool:
        return span is not None and span[0] <= true_time.get(o.label, math.inf) <= span[1]

    covered = (
        f"{sum(within(o.interval, o) for o in drawn)}/{len(drawn)}",
        f"{sum(within(o.source_interval, o) for o in drawn)}/{len(drawn)}",
    )
    # The best of the exhaustive search: the lowest median true time of any candidate.
    best = min(exhaustive, key=lambda o: o.predicted)
    # The best eager candidate (what auto with lazy=none chooses among).
    eager = min(
        (o for o in exhaustive if not issubclass(policy_class(o.policy.name), LazyPolicy)),
        key=lambda o: o.predicted,
    )

    def auto_time(policy: Component) -> float:
        times = []
        for rep in range(args.repeats):
            config = source.replace(
                policy=policy, rounds=args.rounds, target_loss=target, eval_every=1
            )
            sim = make_simulator(config, cost, per_worker=True)
            sim.straggler = truth(rep)
            records = sim.run().records
            hit = next((r for r in records if r.loss <= target), None)
            times.append(hit.wall_seconds if hit else math.inf)
        return float(np.median(times))

    # auto as `codedgd tune --write-auto` writes it: started at the pick's group size.
    started = auto_start(picked, obs)  # (with the prior tune writes)
    tuned_auto = auto_time(started[0]) if started is not None else math.inf
    return {
        "scenario": scenario,
        "n": n,
        "source_delays": args.source_delays,  # None: the job's own seed
        "fit": fit.best.describe(),
        "pick": pick,
        "pick_predicted": picked[0].predicted,
        "pick_true": true_time[pick],
        "best": best.label,
        "best_true": best.predicted,
        "best_eager": eager.label,
        "best_eager_true": eager.predicted,
        "default_true": true_time["uncoded"],
        "auto_true": auto_time(Component("auto", {})),
        "auto_start": label(started[0]) if started is not None else "-",
        "tuned_auto_true": tuned_auto,
        "tune_seconds": tune_seconds,
        "candidates": len(picked),
        "predicted_over_true": (min(off), max(off)) if off else None,
        "true_within_replays": covered[0] if drawn else None,
        "true_within_source_draws": covered[1] if drawn else None,
        "pick_source_interval": picked[0].source_interval,
    }


def main() -> None:
    p = argparse.ArgumentParser(
        prog="python -m bench.bench_tune",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--workers", type=int, action="append", help="n (repeatable; 16 and 64)")
    p.add_argument("--scenario", action="append", choices=sorted(SCENARIOS))
    p.add_argument("--source-rounds", type=int, default=100)
    p.add_argument(
        "--source-delays",
        type=int,
        metavar="SEED",
        help="draw the source run's delays with this seed (default: the job's own, 3); the "
        "job, its target, the slow machines and the truth's seeds stay",
    )
    p.add_argument(
        "--source-draws",
        type=int,
        default=0,
        metavar="N",
        help="tune's ten best predicted again on N redrawn sources (tune --source-draws)",
    )
    p.add_argument("--rounds", type=int, default=250, help="most rounds a candidate may take")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--jobs",
        type=int,
        default=0,
        help="processes tune's search runs in (default 0: as `codedgd tune`, one per CPU)",
    )
    p.add_argument("--json", help="also write the rows to this file")
    args = p.parse_args()
    rows = []
    print(
        "| scenario | n | tune's pick | predicted (s) | true (s) | best of exhaustive | "
        "best (s) | pick / best | uncoded / pick | tune took (s) | auto (s) | auto / best | "
        "best not lazy | its time (s) | auto / it | auto from tune | its time (s) | its / best | "
        "tune's top 10: predicted / true |"
        + (" true within replays' range | within draws' range |" if args.source_draws else "")
    )
    print(
        "|---|---:|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---|---:|---:|---|"
        + ("---:|---:|" if args.source_draws else "")
    )
    for n in args.workers or [16, 64]:
        for scenario in args.scenario or list(SCENARIOS):
            r = one(scenario, n, args)
            rows.append(r)
            ratio = r["pick_true"] / r["best_true"]
            gain = r["default_true"] / r["pick_true"]
            print(
                f"| {scenario} | {n} | {r['pick']} | {_s(r['pick_predicted'])} | "
                f"{_s(r['pick_true'])} | {r['best']} | {_s(r['best_true'])} | {ratio:.2f} | "
                f"{gain:.2f} | {r['tune_seconds']:.1f} | {_s(r['auto_true'])} | "
                f"{r['auto_true'] / r['best_true']:.2f} | {r['best_eager']} | "
                f"{_s(r['best_eager_true'])} | {r['auto_true'] / r['best_eager_true']:.2f} | "
                f"{r['auto_start']} | {_s(r['tuned_auto_true'])} | "
                f"{r['tuned_auto_true'] / r['best_true']:.2f} | "
                f"{_range(r['predicted_over_true'])} |"
                + (
                    f" {r['true_within_replays']} | {r['true_within_source_draws']} (the "
                    f"pick's: {_range(r['pick_source_interval'])} s) |"
                    if args.source_draws
                    else ""
                ),
                flush=True,
            )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(rows, fh, indent=1, default=lambda v: None if math.isinf(v) else v)


def _range(span: tuple[float, float] | None) -> str:
    return f"{span[0]:.2f}-{span[1]:.2f}" if span is not None else "-"


def _s(v: float) -> str:
    return f"{v:.2f}" if math.isfinite(v) else "not reached"


if __name__ == "__main__":
    main()
