"""``auto`` started at a given group size, with and without a prior from the source run.

A lazy start at groups of r waits, in each group, for its first arrival: the others are
cancelled, so a worker that is never first is never heard, and the look-ahead does not try
a smaller group size while one of its groups would hold unheard workers only (its rounds
would wait for them). A start at too large an r can then stay there. ``prior`` (what
``codedgd tune --write-auto`` writes: each worker's slowness on the run tune read) stands
in for the unheard workers, so smaller groups are tried. This runs, on bench_tune's
scenarios, source runs and cost model (the target: the loss 100 rounds of uncoded
reach), g-lag's lazy rules at groups of 1, 2 and 4 (xi = 10, with and without riding
along: the best fixed rules of bench_auto_reach) and ``auto`` started at each
``--start`` r, without and with the prior of the source run's slowness, three seeded
runs each under the scenario's true delays (medians), and prints each auto's time over
the best fixed rule's.

With ``--reversed``, auto also runs with the prior's entries in reverse order: the
prior by place of a pool whose machines connected in reverse order this time (the slow
machines' entries at other places), which is what ``prior_names`` (the entries follow
the machines by name) spares a real pool. With the names, the entries are the ones of
the "with prior" column.

    python -m bench.bench_auto_prior
    python -m bench.bench_auto_prior --n 16 --scenario few-slow --start 4
    python -m bench.bench_auto_prior --start 4 --scenario few-slow two-classes --reversed
"""

from __future__ import annotations

import argparse
import time

from bench.bench_auto_reach import lazy_rules, median_time, source_and_target
from bench.bench_tune import SCENARIOS, cost_for
from codedgd.services.job import Component
from codedgd.services.sim.engines import simulate
from codedgd.services.tuning import auto_prior, auto_tail, observe


def main() -> None:
    p = argparse.ArgumentParser(
        prog="python -m bench.bench_auto_prior",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--n", type=int, nargs="+", default=[16, 64])
    p.add_argument("--scenario", nargs="+", choices=list(SCENARIOS), default=list(SCENARIOS))
    p.add_argument("--start", type=int, nargs="+", default=[2, 4], help="auto's starting r")
    p.add_argument(
        "--reversed",
        action="store_true",
        help="also run with the prior's entries reversed (a pool connected in another order)",
    )
    a = p.parse_args()
    started = time.time()
    more = " | reversed prior (s) | reversed / best" if a.reversed else ""
    head = " | ".join(
        f"auto r={r} (s) | with prior (s) | / best | prior / best{more}" for r in a.start
    )
    print(f"| scenario | n | best fixed rule | its time (s) | {head} |")
    print("|---|---:|---|---:|" + "---:|" * ((6 if a.reversed else 4) * len(a.start)))
    for n in a.n:
        for scenario in a.scenario:
            source, target = source_and_target(n, scenario)
            seen = observe(simulate(source, cost_for(n)).records, n)
            prior = auto_prior(seen)
            tail = auto_tail(seen)  # both as tune --write-auto writes them
            fixed = {
                name: median_time(source, rule, target) for name, rule in lazy_rules(n).items()
            }
            best = min(fixed, key=lambda name: fixed[name])
            cells = []
            for r in a.start:
                plain = median_time(source, Component("auto", {"r": r}), target)
                known = median_time(
                    source, Component("auto", {"r": r, "prior": prior, "tail": tail}), target
                )
                cell = (
                    f"{plain:.2f} | {known:.2f} | {plain / fixed[best]:.2f} | "
                    f"{known / fixed[best]:.2f}"
                )
                if a.reversed:
                    other = ",".join(reversed(prior.split(","))) if prior else ""
                    wrong = median_time(
                        source, Component("auto", {"r": r, "prior": other, "tail": tail}), target
                    )
                    cell += f" | {wrong:.2f} | {wrong / fixed[best]:.2f}"
                cells.append(cell)
            print(
                f"| {scenario} | {n} | {best} | {fixed[best]:.2f} | {' | '.join(cells)} |",
                flush=True,
            )
    print(f"\n({time.time() - started:.0f} s; bench_auto_prior.py, {time.strftime('%F')})")


if __name__ == "__main__":
    main()
