"""How the lazy rules' lead over the eager ones depends on the step size.

A lazy round (g-lag) steps with the stale messages of the groups it did not ask. Gradient
descent's steps shrink as it nears the optimum; a stale message's error does not, so the
lazy rules' lead could depend on the step size. bench_tune measures at 1/L (the default,
``lr = "auto"``). This runs, on bench_tune's scenarios, sources and cost model, the fixed
rules auto chooses among (bench_auto_reach's: erasurehead with r in 1, 2, 4 and K in n/4,
n/2, 3n/4, n; g-lag with s = r - 1, xi in 1, 10, with and without riding along) at
``--scale`` times 1/L, three seeded runs each to the loss uncoded reaches at its 100th
round at that step (at most 200 rounds), and prints the best lazy and the best eager rule
and their median times: lead = best eager / best lazy.

    python -m bench.bench_lazy_step
    python -m bench.bench_lazy_step --n 16 --scale 1 0.25
"""

from __future__ import annotations

import argparse
import math
import time

from bench.bench_auto_reach import median_time, source_and_target
from bench.bench_tune import SCENARIOS, cost_for
from codedgd.services.job import Component, JobConfig
from codedgd.services.job.prepare import prepare
from codedgd.services.policies.auto import DEFAULT_RIDE
from codedgd.services.sim.engines import simulate


def _source(n: int, scenario: str, scale: float) -> tuple[JobConfig, float]:
    """bench_tune's source job (bench_auto_reach's) at ``scale`` / L, and its target:
    uncoded's loss after 100 rounds at that step."""
    source, _ = source_and_target(n, scenario)
    lr = scale * prepare(source, None).lr  # (lr "auto" is 1/L)
    source = source.replace(optimizer={**source.optimizer, "lr": lr})
    return source, simulate(source, cost_for(n)).records[-1].loss


def main() -> None:
    p = argparse.ArgumentParser(
        prog="python -m bench.bench_lazy_step",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--n", type=int, nargs="+", default=[16, 64])
    p.add_argument("--scenario", nargs="+", choices=list(SCENARIOS), default=list(SCENARIOS))
    p.add_argument("--scale", type=float, nargs="+", default=[1.0, 0.5, 0.25])
    a = p.parse_args()
    started = time.time()
    print(
        "| scenario | n | step (x 1/L) | best lazy rule | its time (s) | best eager rule | "
        "its time (s) | lead (eager / lazy) |"
    )
    print("|---|---:|---:|---|---:|---|---:|---:|")
    for n in a.n:
        ks = sorted({math.ceil(n * f) for f in (0.25, 0.5, 0.75)} | {n})
        eager = {
            f"r={r} K={k}": Component("erasurehead", {"r": r, "K": k})
            for r in (1, 2, 4)
            for k in ks
        }
        lazy = {
            f"r={r} lazy xi={xi:g}" + (f" ride={ride:g}" if ride < 1 else ""): Component(
                "g-lag", {"s": r - 1, "xi": xi, "ride": ride}
            )
            for r in (1, 2, 4)
            for xi in (1.0, 10.0)
            for ride in (1.0, DEFAULT_RIDE)
        }
        for scenario in a.scenario:
            for scale in a.scale:
                source, target = _source(n, scenario, scale)
                times = {
                    name: median_time(source, rule, target) for name, rule in (eager | lazy).items()
                }
                best_lazy = min(lazy, key=lambda name: times[name])
                best_eager = min(eager, key=lambda name: times[name])
                print(
                    f"| {scenario} | {n} | {scale:g} | {best_lazy} | {times[best_lazy]:.2f} | "
                    f"{best_eager} | {times[best_eager]:.2f} | "
                    f"{times[best_eager] / times[best_lazy]:.2f} |",
                    flush=True,
                )
    print(f"\n({time.time() - started:.0f} s; bench_lazy_step.py, {time.strftime('%F')})")


if __name__ == "__main__":
    main()
