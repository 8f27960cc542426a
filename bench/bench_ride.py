"""g-lag (or lagc) with LAG's own rule against the same with units riding along (``ride``).

With LAG's rule (``ride=1``) each group refreshes when its own trigger fires, and groups
of unequal smoothness drift into firing a round or two apart; every round that asks any
group waits for it. ``ride < 1`` asks, in a round that asks someone anyway, every group
past that fraction of its trigger. This runs fixed g-lag (groups of 1, 2 and 4; ξ = 1 and
10) with each ``--ride`` on bench_tune's scenarios, cost model, source job and target (the
loss 100 rounds of uncoded reach), three seeded runs each under the scenario's true delays
(bench_auto_reach's), and prints the median virtual seconds to the target and the
fraction of rounds that asked some group ("not reached": the median run diverged or
missed the target in 200 rounds).

``--policy lagc`` runs lagc instead (S = 1 and n/8; ξ = 1 and 10), whose riders are
contacted but never waited for: they count at once with their last coded message, as
untriggered workers do, and a fresh one replaces it when it comes before the round ends.

    python -m bench.bench_ride
    python -m bench.bench_ride --n 16 --scenario alternating --ride 1 0.5 0
    python -m bench.bench_ride --policy lagc --ride 1 0.5 0
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from bench.bench_auto_reach import _truth, source_and_target
from bench.bench_tune import SCENARIOS, cost_for
from codedgd.services.errors import Diverged
from codedgd.services.job import Component, JobConfig
from codedgd.services.sim.engines import make_simulator


def _run(source: JobConfig, policy: Component, target: float) -> tuple[float, float]:
    """(median seconds to the target, median fraction of rounds that asked some group)."""
    times, paid = [], []
    for delays in _truth(source.stragglers, source.workers, pool=source.seed):
        config = source.replace(policy=policy, rounds=200, target_loss=target, eval_every=1)
        sim = make_simulator(config, cost_for(source.workers), per_worker=True)
        sim.straggler = delays
        try:
            records = sim.run().records
        except Diverged:  # (lagc at xi = 10, outside LAG's condition, can): never reached
            times.append(math.inf)
            continue
        hit = next((r for r in records if r.loss <= target), None)
        times.append(hit.wall_seconds if hit else math.inf)
        upto = records[: hit.round + 1] if hit else records
        paid.append(sum(r.computations > 0 for r in upto) / len(upto))
    return float(np.median(times)), float(np.median(paid)) if paid else math.nan


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", type=int, nargs="+", default=[16, 64])
    p.add_argument("--scenario", nargs="+", choices=list(SCENARIOS), default=list(SCENARIOS))
    p.add_argument("--ride", type=float, nargs="+", default=[1.0, 0.5])
    p.add_argument("--policy", choices=["g-lag", "lagc"], default="g-lag")
    a = p.parse_args()
    started = time.time()
    base = a.ride[0]
    heads = " | ".join(f"ride={x:g} (s) | asked" for x in a.ride)
    ratios = " | ".join(f"{x:g} / {base:g}" for x in a.ride[1:])
    print(f"| scenario | n | {a.policy} | {heads} | {ratios} |")
    print("|---|---:|---|" + "---:|---:|" * len(a.ride) + "---:|" * (len(a.ride) - 1))
    for n in a.n:
        for scenario in a.scenario:
            source, target = source_and_target(n, scenario)
            # g-lag: groups of 1, 2, 4 (s = r - 1); lagc: S = 1 and n/8 stragglers tolerated
            tolerated = [0, 1, 3] if a.policy == "g-lag" else sorted({1, max(1, n // 8)})
            for s in tolerated:
                for xi in (1.0, 10.0):
                    runs = [
                        _run(source, Component(a.policy, {"s": s, "xi": xi, "ride": x}), target)
                        for x in a.ride
                    ]
                    cells = " | ".join(
                        f"{t:.2f} | {f:.0%}" if math.isfinite(t) else f"not reached | {f:.0%}"
                        for t, f in runs
                    )
                    base_time = runs[0][0]
                    rel = " | ".join(
                        f"{t / base_time:.2f}" if math.isfinite(base_time) else "-"
                        for t, _ in runs[1:]
                    )
                    print(f"| {scenario} | {n} | s={s} xi={xi:g} | {cells} | {rel} |", flush=True)
    print(f"\n({time.time() - started:.0f} s; bench_ride.py, {time.strftime('%F')})")


if __name__ == "__main__":
    main()
