"""g-lag with LAG's own rule against g-lag with groups riding along (``ride``).

With LAG's rule (``ride=1``) each group refreshes when its own trigger fires, and groups
of unequal smoothness drift into firing a round or two apart; every round that asks any
group waits for it. ``ride < 1`` asks, in a round that asks someone anyway, every group
past that fraction of its trigger. This runs fixed g-lag (groups of 1, 2 and 4; ξ = 1 and
10) with each ``--ride`` on bench_tune's scenarios, cost model, source job and target (the
loss 100 rounds of uncoded reach), three seeded runs each under the scenario's true delays
(bench_auto_reach's), and prints the median virtual seconds to the target and the
fraction of rounds that asked some group.

    python -m bench.bench_ride
    python -m bench.bench_ride --n 16 --scenario alternating --ride 1 0.5 0
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from bench.bench_auto_reach import _truth, source_and_target
from bench.bench_tune import SCENARIOS, cost_for
from codedgd.services.job import Component, JobConfig
from codedgd.services.sim.engines import make_simulator


def _run(source: JobConfig, policy: Component, target: float) -> tuple[float, float]:
    """(median seconds to the target, median fraction of rounds that asked some group)."""
    times, paid = [], []
    for delays in _truth(source.stragglers, source.workers, pool=source.seed):
        config = source.replace(policy=policy, rounds=200, target_loss=target, eval_every=1)
        sim = make_simulator(config, cost_for(source.workers), per_worker=True)
        sim.straggler = delays
        records = sim.run().records
        hit = next((r for r in records if r.loss <= target), None)
        times.append(hit.wall_seconds if hit else math.inf)
        upto = records[: hit.round + 1] if hit else records
        paid.append(sum(r.computations > 0 for r in upto) / len(upto))
    return float(np.median(times)), float(np.median(paid))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", type=int, nargs="+", default=[16, 64])
    p.add_argument("--scenario", nargs="+", choices=list(SCENARIOS), default=list(SCENARIOS))
    p.add_argument("--ride", type=float, nargs="+", default=[1.0, 0.5])
    a = p.parse_args()
    started = time.time()
    base = a.ride[0]
    heads = " | ".join(f"ride={x:g} (s) | asked" for x in a.ride)
    ratios = " | ".join(f"{x:g} / {base:g}" for x in a.ride[1:])
    print(f"| scenario | n | g-lag | {heads} | {ratios} |")
    print("|---|---:|---|" + "---:|---:|" * len(a.ride) + "---:|" * (len(a.ride) - 1))
    for n in a.n:
        for scenario in a.scenario:
            source, target = source_and_target(n, scenario)
            for r in (1, 2, 4):
                for xi in (1.0, 10.0):
                    runs = [
                        _run(source, Component("g-lag", {"s": r - 1, "xi": xi, "ride": x}), target)
                        for x in a.ride
                    ]
                    cells = " | ".join(f"{t:.2f} | {f:.0%}" for t, f in runs)
                    rel = " | ".join(f"{t / runs[0][0]:.2f}" for t, _ in runs[1:])
                    print(
                        f"| {scenario} | {n} | s={r - 1} xi={xi:g} | {cells} | {rel} |", flush=True
                    )
    print(f"\n({time.time() - started:.0f} s; bench_ride.py, {time.strftime('%F')})")


if __name__ == "__main__":
    main()
