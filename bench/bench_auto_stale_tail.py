"""``auto`` with a tail option from a run under another delay law than the job's.

``codedgd tune --write-auto`` hands auto the law of its source run's typical delays
(``tail``): the look-ahead draws censored delays beyond their bound from it. When the
cluster's delays have changed since that run, the law is stale. Since 2026-11-30 it gives
way to the job's own once it no longer fits them (tested at every decision from the
job's 4th timed round on, over up to its last 60; :data:`codedgd.services.sim.lookahead.
TAIL_TEST_ROUNDS`). This runs, on
bench_tune's scenarios, source runs and cost model, pairs (source's scenario → the job's
true delays): the best fixed rule (g-lag at groups of 1, 2, 4, xi = 10, with and without
riding along) and ``auto`` from groups of 4 with no tail, with the source's tail that
never gives way (the code before), with the source's tail as auto now takes it, and with
the job's own scenario's tail (what a fresh source run would give). Three seeded runs
each under the job's true delays (medians); times over the best fixed rule's. A pair of
one scenario twice is the control: the option should hold there.

    python -m bench.bench_auto_stale_tail
    python -m bench.bench_auto_stale_tail --n 16 --pair few-slow:pareto
"""

from __future__ import annotations

import argparse
import time

from bench.bench_auto_reach import lazy_rules, median_time, source_and_target
from bench.bench_tune import SCENARIOS, cost_for
from codedgd.services.job import Component
from codedgd.services.sim import lookahead
from codedgd.services.sim.engines import simulate
from codedgd.services.tuning import auto_tail, observe

PAIRS = (
    "exponential:pareto",
    "pareto:exponential",
    "few-slow:pareto",
    "pareto:few-slow",
    "exponential:exponential",
    "pareto:pareto",
)


def _tail_of(scenario: str, n: int) -> str:
    """The tail `tune --write-auto` writes from bench_tune's source run of ``scenario``."""
    source, _ = source_and_target(n, scenario)
    return auto_tail(observe(simulate(source, cost_for(n)).records, n))


def main() -> None:
    p = argparse.ArgumentParser(
        prog="python -m bench.bench_auto_stale_tail",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--n", type=int, nargs="+", default=[16, 64])
    p.add_argument("--pair", nargs="+", default=list(PAIRS), help="SOURCE:JOB scenarios")
    a = p.parse_args()
    for pair in a.pair:
        src, _, job = pair.partition(":")
        if src not in SCENARIOS or job not in SCENARIOS:
            p.error(f"--pair {pair}: give SOURCE:JOB, each one of {', '.join(SCENARIOS)}")
    started = time.time()
    print(
        "| source → job | n | best fixed rule | its time (s) | auto, no tail | stale tail, "
        "never giving way | stale tail | the job's own tail |"
    )
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    for n in a.n:
        for pair in a.pair:
            src, _, job_scenario = pair.partition(":")
            job, target = source_and_target(n, job_scenario)
            stale, fresh = _tail_of(src, n), _tail_of(job_scenario, n)
            fixed = {name: median_time(job, rule, target) for name, rule in lazy_rules(n).items()}
            best = min(fixed, key=lambda name: fixed[name])

            def auto(tail: str) -> float:
                options: dict[str, object] = {"r": 4, **({"tail": tail} if tail else {})}
                return median_time(job, Component("auto", options), target) / fixed[best]  # noqa: B023

            kept = lookahead.TAIL_TEST_ROUNDS
            lookahead.TAIL_TEST_ROUNDS = 10**9  # the code before: the option never gives way
            try:
                never = auto(stale)
            finally:
                lookahead.TAIL_TEST_ROUNDS = kept
            print(
                f"| {src} → {job_scenario} | {n} | {best} | {fixed[best]:.2f} | {auto(''):.2f} | "
                f"{never:.2f} | {auto(stale):.2f} | {auto(fresh):.2f} |",
                flush=True,
            )
    print(f"\n({time.time() - started:.0f} s; bench_auto_stale_tail.py, {time.strftime('%F')})")


if __name__ == "__main__":
    main()
