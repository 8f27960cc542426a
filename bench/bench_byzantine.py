"""Corrupt workers against each defence: final loss, round time, and who was thrown out.

n = 6 real worker processes on one in-process coordinator; zero, one or two of them are
started with ``--corrupt`` (a scaled gradient, then a sign flip as the second). Each
defence trains the same synthetic logistic problem for the same rounds; the table gives
the final training loss next to the honest uncoded run's, the mean round time, and the
counters of thrown-out workers.

    python -m bench.bench_byzantine
    python -m bench.bench_byzantine --rounds 40 --rows 20000 --dim 100
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from dataclasses import dataclass

import numpy as np

from codedgd.services.coordinator.server import CoordinatorServer
from codedgd.services.data import load_dataset
from codedgd.services.job import Component, JobConfig
from codedgd.services.models import create_model, objective

N = 6
LIES = ("scale:1e6", "sign")


@dataclass(frozen=True)
class Defence:
    label: str
    policy: Component
    max_norm_ratio: float = 0.0
    spares: int = 0


DEFENCES = (
    Defence("uncoded (none)", Component("uncoded")),
    Defence("uncoded + norm guard", Component("uncoded"), 100.0, spares=2),
    Defence("median", Component("median")),
    Defence("trimmed-mean b=1", Component("trimmed-mean", {"b": 1})),
    Defence("frc s=2 byzantine=1", Component("frc", {"s": 2, "byzantine": 1})),
)


async def one(defence: Defence, liars: int, args: argparse.Namespace) -> dict[str, object]:
    server = await CoordinatorServer.start("127.0.0.1:0", assign_timeout=60)
    procs: list[subprocess.Popen[bytes]] = []
    env = {k: v for k, v in os.environ.items() if not k.startswith("CODEDGD_")}
    env.update({"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"})
    # Liars at places 0 and 4: one per frc group of three.
    corrupt = dict(zip((0, 4), LIES[:liars], strict=False))
    try:
        for i in range(N + defence.spares):
            extra = ["--corrupt", corrupt[i]] if i in corrupt else []
            cmd = [sys.executable, "-m", "codedgd.client.cli", "worker"]
            cmd += ["--coordinator", f"127.0.0.1:{server.port}", "--name", f"w{i}", *extra]
            procs.append(subprocess.Popen(cmd, env=env, stderr=subprocess.DEVNULL))
            while len(server.service.sessions) < i + 1:
                await asyncio.sleep(0.02)
        config = JobConfig(
            workers=N,
            rounds=args.rounds,
            seed=1,
            eval_every=args.rounds,
            data=Component("synthetic", {"rows": args.rows, "dim": args.dim}),
            policy=defence.policy,
            max_norm_ratio=defence.max_norm_ratio,
            replace_timeout=60 if defence.spares else 0,
        )
        job = server.service.submit(config)
        start = time.perf_counter()
        while not job.finished:
            await job.wait_change()
        seconds = time.perf_counter() - start
        stragglers = server.service.metrics.stragglers
        thrown = {r: int(stragglers.labels(r)._value.get()) for r in ("outvoted", "norm_guard")}
        loss = float("nan")
        if job.theta is not None:
            ds = load_dataset(config.data.name, config.data.options, seed=config.seed)
            model = create_model(config.model.name, config.model.options)
            loss = objective(model, np.asarray(job.theta), ds.X_train, ds.y_train)
        return {
            "state": job.state,
            "loss": loss,
            "round_ms": 1000 * seconds / max(1, len(job.records)),
            **thrown,
        }
    finally:
        await server.stop(0)
        for p in procs:
            p.kill()
            p.wait()


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--rows", type=int, default=6000)
    p.add_argument("--dim", type=int, default=50)
    args = p.parse_args()
    print(f"n = {N}, {args.rounds} rounds, synthetic logistic {args.rows} x {args.dim}")
    print("| defence | liars | state | final loss | ms/round | outvoted | norm guard |")
    print("|---|---|---|---|---|---|---|")
    for defence in DEFENCES:
        for liars in (0, 1, 2):
            r = await one(defence, liars, args)
            print(
                f"| {defence.label} | {liars} | {r['state']} | {r['loss']:.6g} | "
                f"{r['round_ms']:.1f} | {r['outvoted']} | {r['norm_guard']} |",
                flush=True,
            )


if __name__ == "__main__":
    asyncio.run(main())
