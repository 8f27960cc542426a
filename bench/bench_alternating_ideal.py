"""How far ahead of every fixed policy can ``auto`` be on the alternating scenario at all?

bench_tune's alternating scenario: every other 50 rounds a quarter of the workers are 5x
slower, none in between. Exact policies make the same progress per round, so an ideal
switcher (no lag, no cost to switch) would take, in each phase, the fastest exact
policy's rounds. This times uncoded, frc s = 1 and frc s = 3 phase by phase on the
simulator (bench_tune's cost model and the first of its seeded delays) and prints that
ideal against frc s = 3, the best fixed policy: the most any switching can gain.

    python -m bench.bench_alternating_ideal
"""

from __future__ import annotations

import numpy as np

from bench.bench_tune import SCENARIOS, cost_for
from codedgd.services.job import Component, JobConfig
from codedgd.services.sim.engines import make_simulator
from codedgd.services.stragglers import create_straggler_model

POLICIES = (("uncoded", {}), ("frc", {"s": 1}), ("frc", {"s": 3}))


def phases(n: int, name: str, options: dict[str, int]) -> tuple[float, float]:
    """Seconds of rounds 0-49 (slow phase) and 50-99 (calm phase) of a fixed policy."""
    stragglers = SCENARIOS["alternating"](n)
    config = JobConfig(
        workers=n,
        rounds=100,
        seed=3,
        data=Component("synthetic", {"rows": 200 * n, "dim": 50}),
        policy=Component(name, options),
        stragglers=stragglers,
        round_timeout=1e9,
    )
    sim = make_simulator(config, cost_for(n), per_worker=False)
    delays = dict(stragglers.options, pool=config.seed)
    sim.straggler = create_straggler_model(stragglers.name, delays, seed=1000, n_workers=n)
    rounds = np.array([r.round_seconds for r in sim.run().records])
    return float(rounds[:50].sum()), float(rounds[50:].sum())


def main() -> None:
    print("| n | policy | slow phase (s) | calm phase (s) | 100 rounds (s) |")
    print("|---:|---|---:|---:|---:|")
    for n in (16, 64):
        times = {}
        for name, options in POLICIES:
            label = name + "".join(f" {k}={v}" for k, v in options.items())
            times[label] = phases(n, name, options)
            slow, calm = times[label]
            print(f"| {n} | {label} | {slow:.2f} | {calm:.2f} | {slow + calm:.2f} |")
        ideal = min(t[0] for t in times.values()) + min(t[1] for t in times.values())
        best = sum(times["frc s=3"])
        print(f"| {n} | ideal switching | | | {ideal:.2f} (frc s=3 / ideal: {best / ideal:.2f}) |")


if __name__ == "__main__":
    main()
