"""How far ahead of every fixed policy can ``auto`` be on the alternating scenario at all?

bench_tune's alternating scenario: every other 50 rounds a quarter of the workers are 5x
slower, none in between (a fixed rule is wrong in one of the phases, if any is).

``--part exact``: exact policies make the same progress per round, so an ideal switcher
among them (no lag, no cost to switch) would take, in each phase, the fastest exact
policy's rounds. This times uncoded, frc s = 1 and frc s = 3 phase by phase on the
simulator (bench_tune's cost model and the first of its seeded delays) and prints that
ideal against frc s = 3, the best fixed exact policy.

``--part auto``: auto's own rules (every group size and stop rule K, and the lazy rules,
as bench_auto_reach runs them), switched by an oracle: auto's machinery (its moves of
data, on the clock; a move of r restarting the lazy rounds) with a chooser that knows the
phases and, at the decisions aligned with them (every 5 rounds from round 5), takes one
rule for the slow phases and one for the calm ones. Every pair of rules is run to
bench_auto_reach's target, three seeded runs each, and the best pair is printed against
the best fixed rule (of bench_auto_reach's: auto's rules, and g-lag without riding
along) and against auto: the most auto's choices could gain where it knew
the phases and decided at once (rounds 0-4 run the slow rule's group size, exact or
lazy as it is).

    python -m bench.bench_alternating_ideal
    python -m bench.bench_alternating_ideal --part auto --n 16
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from bench.bench_auto_reach import lazy_rules, median_time, source_and_target
from bench.bench_tune import SCENARIOS, cost_for
from codedgd.services.job import Component, JobConfig
from codedgd.services.policies.auto import Choice
from codedgd.services.records import RoundRecord
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


def exact_part(ns: Sequence[int]) -> None:
    print("| n | policy | slow phase (s) | calm phase (s) | 100 rounds (s) |")
    print("|---:|---|---:|---:|---:|")
    for n in ns:
        times = {}
        for name, options in POLICIES:
            label = name + "".join(f" {k}={v}" for k, v in options.items())
            times[label] = phases(n, name, options)
            slow, calm = times[label]
            print(f"| {n} | {label} | {slow:.2f} | {calm:.2f} | {slow + calm:.2f} |")
        ideal = min(t[0] for t in times.values()) + min(t[1] for t in times.values())
        best = sum(times["frc s=3"])
        print(f"| {n} | ideal switching | | | {ideal:.2f} (frc s=3 / ideal: {best / ideal:.2f}) |")


class PhaseOracle:
    """A chooser for auto that knows the phases: ``slow`` in the slow ones (rounds 0-49,
    100-149, ...), ``calm`` in the others. Where the rule is not among the choices offered
    (a lazy start's warm-up offers lazy rules only), the offered rule of its group size."""

    def __init__(self, slow: Choice, calm: Choice, every: int) -> None:
        self.slow, self.calm, self.every = slow, calm, every

    def choose(
        self,
        t: int,
        theta: np.ndarray,
        records: Sequence[RoundRecord],
        current: Choice,
        choices: Sequence[Choice],
        memory: Mapping[str, Any] | None = None,
    ) -> tuple[Choice, str]:
        want = self.calm if (t // self.every) % 2 else self.slow
        if want in choices:
            return want, "the oracle's rule for this phase"
        same = [c for c in choices if c.r == want.r]
        return (same[0] if same else current), "the oracle's group size for this phase"

    def renew(self, worker: int, prior: float | None, since: int = 0) -> None:
        pass


def _auto_options(slow: Choice) -> dict[str, Any]:
    """auto started as close to ``slow`` as its start allows, deciding every 5 rounds from
    round 5 (aligned with the 50-round phases)."""
    return {"r": slow.r, "start": "lazy" if slow.lazy else "exact", "first": 5, "window": 5}


def auto_part(ns: Sequence[int]) -> None:
    print(
        "| n | best fixed rule | its time (s) | auto (s) | oracle: slow phases | calm phases "
        "| its time (s) | best fixed / oracle | auto / oracle |"
    )
    print("|---:|---|---:|---:|---|---|---:|---:|---:|")
    for n in ns:
        source, target = source_and_target(n, "alternating")
        every = int(source.stragglers.options["every"])
        ks = sorted({math.ceil(n * f) for f in (0.25, 0.5, 0.75)} | {n})
        sizes = [r for r in (1, 2, 4) if n % r == 0]
        rules = [Choice(r, k) for r in sizes for k in ks]
        rules += [Choice(r, n, xi) for r in sizes for xi in (1.0, 10.0)]
        # Every fixed rule bench_auto_reach runs: auto's own, and LAG's (no riding along).
        eager = {str(rule): _fixed(rule) for rule in rules if not rule.lazy}
        fixed = {
            name: median_time(source, policy, target)
            for name, policy in (eager | lazy_rules(n, (1.0, 10.0))).items()
        }
        best = min(fixed, key=lambda name: fixed[name])
        auto = median_time(source, Component("auto", {}), target)
        pairs = {
            (slow, calm): median_time(
                source,
                Component("auto", _auto_options(slow)),
                target,
                chooser=lambda slow=slow, calm=calm, every=every: PhaseOracle(slow, calm, every),
            )
            for slow in rules
            for calm in rules
        }
        slow, calm = min(pairs, key=lambda pair: pairs[pair])
        ideal = pairs[(slow, calm)]
        print(
            f"| {n} | {best} | {fixed[best]:.2f} | {auto:.2f} | {slow} | {calm} | {ideal:.2f} "
            f"| {fixed[best] / ideal:.2f} | {auto / ideal:.2f} |",
            flush=True,
        )


def _fixed(rule: Choice) -> Component:
    """An eager ``rule`` as the fixed policy bench_auto_reach runs it."""
    return Component("erasurehead", {"r": rule.r, "K": rule.k})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--part", choices=("exact", "auto"), nargs="+", default=["exact", "auto"])
    p.add_argument("--n", type=int, nargs="+", default=[16, 64])
    a = p.parse_args()
    started = time.time()
    if "exact" in a.part:
        exact_part(a.n)
    if "auto" in a.part:
        auto_part(a.n)
    print(f"\n({time.time() - started:.0f} s; bench_alternating_ideal.py, {time.strftime('%F')})")


if __name__ == "__main__":
    main()
