"""``auto`` against the best fixed choice of its own set, with and without its lazy rules.

``auto`` picks a group size r (among 1, 2, 4: changing it moves data) and the round's rule
every ``window`` rounds: a stop rule K (among n/4, n/2, 3n/4, n) or g-lag's lazy trigger
xi (1 or 10) on the same groups. This runs, on bench_tune's scenarios and cost model (same
source job and target: the loss 100 rounds of uncoded reach), every rule ``auto`` chooses
among as a fixed policy (erasurehead with r and K, where K = n is frc with s = r - 1 and
r = 1, K = n is uncoded; g-lag with s = r - 1 and xi, with LAG's own rule and with auto's
ride), ``auto`` itself (starting in lazy rounds, where the first decision, at round 2,
chooses only the group size), ``auto`` with ``start=exact`` (an exact start) and with its
eager rules only (``lazy=none``), three seeded runs each under the
scenario's true delays, and prints the best fixed rule and the best eager one, their
median times to the target, the autos' and the ratios. auto / best fixed below 1 is a
gain from adapting (a phase each rule is wrong in); above 1, what the look-ahead's lag
and mistakes cost.

    python -m bench.bench_auto_reach
    python -m bench.bench_auto_reach --n 16 --scenario alternating
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable

import numpy as np

from bench.bench_tune import SCENARIOS, cost_for
from codedgd.services.job import Component, JobConfig
from codedgd.services.job.prepare import prepare
from codedgd.services.policies.auto import DEFAULT_RIDE, Auto, Chooser
from codedgd.services.sim.engines import make_simulator, simulate
from codedgd.services.stragglers import StragglerModel, create_straggler_model


def median_time(
    source: JobConfig,
    policy: Component,
    target: float,
    chooser: Callable[[], Chooser] | None = None,
) -> float:
    """The median simulated seconds to ``target`` of ``policy`` on ``source`` over three
    seeded draws of its delays (inf: not within 200 rounds); an auto policy decides by
    ``chooser()`` where given, else by its look-ahead."""
    times = []
    # Fresh models each run: the same seeded delays for every policy compared.
    for delays in _truth(source.stragglers, source.workers, pool=source.seed):
        config = source.replace(policy=policy, rounds=200, target_loss=target, eval_every=1)
        prepared = prepare(config, None)
        if chooser is not None:
            assert isinstance(prepared.policy, Auto)
            prepared.policy.attach(chooser())
        sim = make_simulator(config, cost_for(source.workers), prepared=prepared, per_worker=True)
        sim.straggler = delays
        hit = next((r for r in sim.run().records if r.loss <= target), None)
        times.append(hit.wall_seconds if hit else math.inf)
    return float(np.median(times))


def lazy_rules(n: int, weights: tuple[float, ...] = (10.0,)) -> dict[str, Component]:
    """g-lag on auto's group sizes (those of 1, 2, 4 dividing n) at each trigger weight,
    with LAG's own rule and with auto's riding along (groups near their trigger asked too),
    by name."""
    return {
        f"r={r} lazy xi={xi:g}" + (f" ride={ride:g}" if ride < 1 else ""): Component(
            "g-lag", {"s": r - 1, "xi": xi, "ride": ride}
        )
        for r in (1, 2, 4)
        if n % r == 0
        for xi in weights
        for ride in (1.0, DEFAULT_RIDE)
    }


def source_and_target(n: int, scenario: str) -> tuple[JobConfig, float]:
    """bench_tune's source job for ``scenario`` at n (uncoded, 100 rounds, 200 rows per
    worker, 50 features) and the target: the loss its simulated run ends at."""
    source = JobConfig(
        workers=n,
        rounds=100,
        seed=3,
        data=Component("synthetic", {"rows": 200 * n, "dim": 50}),
        policy=Component("uncoded", {}),
        stragglers=SCENARIOS[scenario](n),
        round_timeout=1e9,
    )
    return source, simulate(source, cost_for(n)).records[-1].loss


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
    print(
        "| scenario | n | best fixed rule | its time (s) | auto (s) | auto / best fixed "
        "| auto, start=exact (s) | its / best fixed "
        "| best eager rule | its time (s) | auto, eager only (s) | eager auto / best eager |"
    )
    print("|---|---:|---|---:|---:|---:|---:|---:|---|---:|---:|---:|")
    for n in a.n:
        for scenario in a.scenario:
            source, target = source_and_target(n, scenario)
            ks = sorted({math.ceil(n * f) for f in (0.25, 0.5, 0.75)} | {n})  # auto's choices
            rules = {
                f"r={r} K={k}": Component("erasurehead", {"r": r, "K": k})
                for r in (1, 2, 4)
                for k in ks
            }
            eager = list(rules)
            rules |= lazy_rules(n, (1.0, 10.0))
            fixed = {name: median_time(source, rule, target) for name, rule in rules.items()}
            best = min(fixed, key=lambda name: fixed[name])
            best_eager = min(eager, key=lambda name: fixed[name])
            only = median_time(source, Component("auto", {"lazy": "none"}), target)
            auto = median_time(source, Component("auto", {}), target)
            exact = median_time(source, Component("auto", {"start": "exact"}), target)
            print(
                f"| {scenario} | {n} | {best} | {fixed[best]:.2f} | {auto:.2f} | "
                f"{auto / fixed[best]:.2f} | {exact:.2f} | {exact / fixed[best]:.2f} | "
                f"{best_eager} | {fixed[best_eager]:.2f} | "
                f"{only:.2f} | {only / fixed[best_eager]:.2f} |",
                flush=True,
            )
    print(f"\n({time.time() - started:.0f} s; bench_auto_reach.py, {time.strftime('%F')})")


if __name__ == "__main__":
    main()
