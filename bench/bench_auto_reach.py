"""How far ``auto`` can get without moving data: against the best K of its own placement.

``auto`` keeps erasurehead's placement with r = 2 and picks only the stop rule K. This
runs, on bench_tune's scenarios and cost model (same source job and target: the loss 100
rounds of uncoded reach), every K that ``auto`` chooses among as a fixed policy
(erasurehead r = 2, K; K = n is frc s = 1) and ``auto`` itself, three seeded runs each
under the scenario's true delays, and prints the best fixed K, its median time to the
target, auto's, and their ratio. A ratio of 1 says auto's K choice is as good as its
placement allows, and that what it loses to the best policy overall (bench_tune) is the
placement: a larger r, which needs data moved.

    python -m bench.bench_auto_reach
    python -m bench.bench_auto_reach --n 16 --scenario alternating
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from bench.bench_tune import SCENARIOS, cost_for
from codedgd.services.job import Component, JobConfig
from codedgd.services.sim.engines import make_simulator, simulate
from codedgd.services.stragglers import StragglerModel, create_straggler_model


def _median_time(source: JobConfig, policy: Component, target: float) -> float:
    times = []
    # Fresh models each run: the same seeded delays for every policy compared.
    for delays in _truth(source.stragglers, source.workers, pool=source.seed):
        config = source.replace(policy=policy, rounds=200, target_loss=target, eval_every=1)
        sim = make_simulator(config, cost_for(source.workers), per_worker=True)
        sim.straggler = delays
        hit = next((r for r in sim.run().records if r.loss <= target), None)
        times.append(hit.wall_seconds if hit else math.inf)
    return float(np.median(times))


def _truth(stragglers: Component, n: int, pool: int) -> list[StragglerModel]:
    """Three seeded draws of the scenario's delays (a speed-classes pool keeps the source's
    slow machines: ``pool``), as bench_tune's exhaustive search uses them."""
    options = dict(stragglers.options)
    if stragglers.name == "speed-classes":
        options["pool"] = pool
    return [
        create_straggler_model(stragglers.name, options, seed=1000 + rep, n_workers=n)
        for rep in range(3)
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", type=int, nargs="+", default=[16, 64])
    p.add_argument("--scenario", nargs="+", choices=list(SCENARIOS), default=list(SCENARIOS))
    a = p.parse_args()
    started = time.time()
    print("| scenario | n | best K of r = 2 | its time (s) | auto (s) | auto / best K |")
    print("|---|---:|---:|---:|---:|---:|")
    for n in a.n:
        for scenario in a.scenario:
            stragglers = SCENARIOS[scenario](n)
            source = JobConfig(
                workers=n,
                rounds=100,
                seed=3,
                data=Component("synthetic", {"rows": 200 * n, "dim": 50}),
                policy=Component("uncoded", {}),
                stragglers=stragglers,
                round_timeout=1e9,
            )
            target = simulate(source, cost_for(n)).records[-1].loss
            ks = sorted({math.ceil(n * f) for f in (0.25, 0.5, 0.75)} | {n})  # auto's choices
            fixed = {
                k: _median_time(source, Component("erasurehead", {"r": 2, "K": k}), target)
                for k in ks
            }
            best = min(fixed, key=lambda k: fixed[k])
            auto = _median_time(source, Component("auto", {}), target)
            print(
                f"| {scenario} | {n} | {best} | {fixed[best]:.2f} | {auto:.2f} | "
                f"{auto / fixed[best]:.2f} |",
                flush=True,
            )
    print(f"\n({time.time() - started:.0f} s; bench_auto_reach.py, {time.strftime('%F')})")


if __name__ == "__main__":
    main()
