"""Does searching the step size pay? `codedgd tune --lr …` against tune at the run's own step.

For each scenario and n: bench_tune's source run (uncoded, 100 rounds at lr = "auto",
1/L) and its target (the loss that run ends at). tune fits the run's records and ranks
every candidate on replays of them (as `codedgd tune RESULT.json` does), once at the
run's own step and once at every step of ``--lr`` (as `codedgd tune RESULT.json --lr …`).
An exhaustive search then runs every candidate at every step under the scenario's true
delays (bench_tune's three seeds; the first touch of the target). Reported, all in true
seconds:

- the best candidate at 1/L and the best at any step, and their ratio (what the step can
  give on this problem);
- the step-searching pick over the best at any step (tune's goal: <= 1.10);
- the run-step pick over the step-searching pick (what `--lr` gained for the user);
- how long each tune took (`--lr` multiplies the candidates);
- auto as `tune --lr … --write-auto` writes it (the group size and step of the best
  candidate it can run, the source's slowness its prior), over the best at any step
  (bench_auto_reach's runs: at most 200 rounds, the same three seeds).

    python -m bench.bench_tune_steps                       # n = 16 and 64, all six scenarios
    python -m bench.bench_tune_steps --n 16 --scenario pareto --lr 1/L 2/L
"""

from __future__ import annotations

import argparse
import math
import time

from bench.bench_auto_reach import _truth, median_time, source_and_target
from bench.bench_tune import SCENARIOS, cost_for
from codedgd.services.sim.engines import simulate
from codedgd.services.tuning import (
    Outcome,
    auto_start,
    fit_delays,
    label,
    observe,
    search,
    step_sizes,
)

ROUNDS = 250  # most rounds a candidate may take (bench_tune's)


def one(n: int, scenario: str, lrs: list[str], jobs: int) -> dict[str, object]:
    source, target = source_and_target(n, scenario)
    records = simulate(source, cost_for(n)).records
    obs = observe(records, n)
    fit = fit_delays(obs)

    def tune(steps: list[str]) -> tuple[list[Outcome], float]:
        started = time.perf_counter()
        ranked = search(
            source, obs, fit.tail, target_loss=target, rounds=ROUNDS, repeats=3, jobs=jobs,
            steps=steps,
        )  # fmt: skip
        return ranked, time.perf_counter() - started

    at_run_ranked, at_run_seconds = tune([])
    ranked, picked_seconds = tune(lrs)
    at_run, picked = at_run_ranked[0].label, ranked[0].label
    # auto as `tune --lr … --write-auto` writes it: the group size and step of the best
    # candidate it can run, the source's slowness as its prior.
    started = auto_start(ranked, obs)
    tuned_auto = math.inf
    if started is not None:
        policy, origin = started
        at_step = source.replace(optimizer={**source.optimizer, "lr": origin.lr})
        tuned_auto = median_time(at_step, policy, target)
    exhaustive = search(
        source, obs, fit.tail, target_loss=target, rounds=ROUNDS, repeats=3, steps=lrs,
        delays=lambda rep: _truth(source.stragglers, n, pool=source.seed)[rep],
        cost=cost_for(n), hold=1,
    )  # fmt: skip
    true = {(label(o.policy), o.lr): o.predicted for o in exhaustive}
    best = min(exhaustive, key=lambda o: o.predicted)
    at_one = min((o for o in exhaustive if o.lr == "1/L"), key=lambda o: o.predicted)
    return {
        "best_at_1": at_one.label,
        "best_at_1_s": at_one.predicted,
        "best": best.label,
        "best_s": best.predicted,
        "pick": picked,
        "pick_s": true[label(ranked[0].policy), ranked[0].lr],
        "run_pick": at_run,
        "run_pick_s": true[label(at_run_ranked[0].policy), "1/L"],  # (the run's "auto" is 1/L)
        "auto": f"{label(started[0])} lr={started[1].lr}" if started else "-",
        "auto_s": tuned_auto,
        "tune_s": at_run_seconds,
        "tune_lr_s": picked_seconds,
    }


def main() -> None:
    p = argparse.ArgumentParser(
        prog="python -m bench.bench_tune_steps",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--n", type=int, nargs="+", default=[16, 64])
    p.add_argument("--scenario", nargs="+", choices=list(SCENARIOS), default=list(SCENARIOS))
    p.add_argument(
        "--lr",
        nargs="+",
        default=["0.5/L", "1/L", "2/L", "4/L"],
        help="the steps tune --lr searches (1/L, the run's own, is always among them)",
    )
    p.add_argument("--jobs", type=int, default=0, help="tune's processes (0: one per CPU)")
    a = p.parse_args()
    lrs = [str(v) for v in step_sizes(["1/L", *a.lr])]
    started = time.time()
    print(
        "| scenario | n | best at 1/L | its time (s) | best at any step | its time (s) | "
        "1/L best / best | tune --lr's pick | its time (s) | pick / best | tune's pick at "
        "the run's step | its time (s) | it / --lr's pick | tune took (s) | with --lr (s) | "
        "auto from tune --lr | its time (s) | its / best |"
    )
    print("|---|---:|---|---:|---|---:|---:|---|---:|---:|---|---:|---:|---:|---:|---|---:|---:|")
    for n in a.n:
        for scenario in a.scenario:
            r = one(n, scenario, lrs, a.jobs)
            print(
                f"| {scenario} | {n} | {r['best_at_1']} | {_s(r['best_at_1_s'])} | "
                f"{r['best']} | {_s(r['best_s'])} | {_x(r['best_at_1_s'], r['best_s'])} | "
                f"{r['pick']} | {_s(r['pick_s'])} | {_x(r['pick_s'], r['best_s'])} | "
                f"{r['run_pick']} | {_s(r['run_pick_s'])} | "
                f"{_x(r['run_pick_s'], r['pick_s'])} | {r['tune_s']:.1f} | "
                f"{r['tune_lr_s']:.1f} | {r['auto']} | {_s(r['auto_s'])} | "
                f"{_x(r['auto_s'], r['best_s'])} |",
                flush=True,
            )
    print(f"\n({time.time() - started:.0f} s; steps searched: {', '.join(lrs)})")


def _s(v: object) -> str:
    return f"{v:.2f}" if isinstance(v, float) and math.isfinite(v) else "not reached"


def _x(a: object, b: object) -> str:
    ok = isinstance(a, float) and isinstance(b, float) and math.isfinite(a) and math.isfinite(b)
    return f"{a / b:.2f}" if ok else "-"


if __name__ == "__main__":
    main()
