"""Is the simulator's compute model right for a network's mini-batch rounds?

The simulator times one partition's gradient on the job's own model and data (its
calibration: seconds per row and per partition) and models a round's compute on the
rows the round actually uses (``--batches``). This runs the same job, a network on
Fashion-MNIST under a few policies, on real worker processes and on the simulator, and
prints the mean time per round of each and their ratio, and the two calibrated constants.
No stragglers are injected: the round time is compute plus per-round overhead, where a
wrong per-row cost would show. The simulator runs twice: with its default cost model (a
machine per worker, as in a cluster) and with ``cores`` set to this machine's (the real
run's n workers and coordinator share them; ``codedgd simulate --cores local``).

    python -m bench.bench_neural_sim --model mlp --rounds 60
    python -m bench.bench_neural_sim --model cnn --batches 32 --rounds 40
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

import numpy as np

from codedgd.client.local import run_local
from codedgd.services.job import Component, JobConfig
from codedgd.services.sim import simulate
from codedgd.services.sim.cost import CostModel

POLICIES = {
    "uncoded": Component("uncoded"),
    "cyclic s=1": Component("cyclic", {"s": 1}),
    "frc s=1": Component("frc", {"s": 1}),
}


def _config(a: argparse.Namespace, policy: Component, batch: int) -> JobConfig:
    options = {"hidden": a.hidden} if a.model == "mlp" else {}
    return JobConfig(
        workers=a.workers,
        rounds=a.rounds,
        seed=0,
        eval_every=a.rounds,  # evaluations are outside the timed rounds anyway
        data=Component("fashion-mnist"),
        model=Component(a.model, options),
        policy=policy,
        optimizer={"lr": 0.1},
        batch_size=batch,
    )


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", choices=("mlp", "cnn"), default="mlp")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--batches", default="32,256", help="rows per partition a round: 32,256")
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--rounds", type=int, default=60)
    a = p.parse_args()
    started = time.time()
    print(
        f"Fashion-MNIST, {a.model}, n = {a.workers} real processes vs the simulator, "
        f"{a.rounds} rounds, no injected delays; mean seconds per round\n"
    )
    cores = os.cpu_count() or 1
    print(
        f"| policy | batch | real | simulated | sim / real | simulated, cores={cores} "
        "| sim / real | s per row | s per partition |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for batch in (int(b) for b in a.batches.split(",")):
        for label, policy in POLICIES.items():
            config = _config(a, policy, batch)
            real = await run_local(config)
            if real.state != "done":
                raise SystemExit(f"{label}: {real.error}")
            sim = simulate(config)
            local = simulate(config, CostModel(cores=cores))
            # Round 0 pays one-off costs (threads, allocations) on both sides: left out.
            rt = float(np.mean([r.round_seconds for r in real.records[1:]]))
            st = float(np.mean([r.round_seconds for r in sim.records[1:]]))
            lt = float(np.mean([r.round_seconds for r in local.records[1:]]))
            cal = sim.calibration
            per_row = f"{cal.seconds_per_sample:.2e}" if cal else "-"
            per_part = f"{cal.seconds_per_partition:.2e}" if cal else "-"
            print(
                f"| {label} | {batch} | {rt * 1e3:.1f} ms | {st * 1e3:.1f} ms | "
                f"{st / rt:.2f} | {lt * 1e3:.1f} ms | {lt / rt:.2f} | {per_row} | {per_part} |",
                flush=True,
            )
    print(f"\n({time.time() - started:.0f} s; bench_neural_sim.py, {time.strftime('%F')})")


if __name__ == "__main__":
    asyncio.run(main())
