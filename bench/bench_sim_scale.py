"""How fast the simulator runs large jobs: the event engine against the vectorized one.

Issue 22's goal: 10,000 workers x 1,000 rounds of ``ignore-stragglers`` or
``erasurehead`` on a synthetic problem in under 60 s on this machine, so a tuner can
afford many candidates at realistic n. Each case runs in this process, one after the
other, with the default cost model's compute constants fixed (no calibration run) and
evaluation every ``--eval-every`` rounds. ``per_worker=False`` leaves the per-worker
response times out of the records (10,000 floats a round); the vectorized engine is
also timed with them kept.

    python -m bench.bench_sim_scale                       # the table of docs/benchmarks.md
    python -m bench.bench_sim_scale --workers 10000 --rounds 1000 --only vectorized
"""

from __future__ import annotations

import argparse
import time

from codedgd.services.job import Component, JobConfig
from codedgd.services.sim import CostModel
from codedgd.services.sim.engines import make_simulator

COST = CostModel(seconds_per_sample=2e-7, seconds_per_partition=2e-5, decode_seconds=1e-4)
POLICIES = {
    "ignore-stragglers": lambda n: Component("ignore-stragglers", {"s": n // 10}),
    "erasurehead": lambda n: Component("erasurehead", {"r": 2, "delta": 0.5}),
}


def one(
    engine: str, policy: str, n: int, rounds: int, args: argparse.Namespace, per_worker: bool
) -> tuple[float, float]:
    config = JobConfig(
        workers=n,
        rounds=rounds,
        seed=1,
        eval_every=args.eval_every,
        data=Component("synthetic", {"rows": max(args.rows_per_worker * n, 1000), "dim": args.dim}),
        policy=POLICIES[policy](n),
        stragglers=Component("exponential", {"mean": 0.05}),
        round_timeout=1e9,
    )
    built = time.perf_counter()
    sim = make_simulator(config, COST, engine=engine, per_worker=per_worker)
    ready = time.perf_counter()
    result = sim.run()
    done = time.perf_counter()
    assert len(result.records) == rounds
    return ready - built, done - ready


def main() -> None:
    p = argparse.ArgumentParser(
        prog="python -m bench.bench_sim_scale",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--workers", type=int, action="append", help="n (repeatable)")
    p.add_argument("--rounds", type=int, default=0, help="rounds (default per case)")
    p.add_argument("--rows-per-worker", type=int, default=10)
    p.add_argument("--dim", type=int, default=50)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--only", choices=("events", "vectorized"))
    args = p.parse_args()
    cases = (
        [(n, args.rounds or 100) for n in args.workers]
        if args.workers
        else [(1000, 100), (10000, 1000)]
    )
    print("| engine | policy | n | rounds | per-worker records | build (s) | run (s) |")
    print("|---|---|---:|---:|---|---:|---:|")
    for n, rounds in cases:
        for policy in POLICIES:
            for engine, per_worker in (
                ("events", True),
                ("vectorized", True),
                ("vectorized", False),
            ):
                if args.only and engine != args.only:
                    continue
                if engine == "events" and n * rounds > 10**6:
                    continue  # hours: see the 1,000-worker row
                build, run = one(engine, policy, n, rounds, args, per_worker)
                print(
                    f"| {engine} | {policy} | {n:,} | {rounds:,} | "
                    f"{'kept' if per_worker else 'left out'} | {build:.1f} | {run:.1f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
