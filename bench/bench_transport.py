"""Transport benchmark: codedgd rounds per second against a raw grpc.aio program.

Zero compute and zero delay: each worker holds a near-empty sparse partition, so
a round is the broadcast of θ (ℓ float64) to n worker processes, n gradient
messages of ℓ float64 back, decoding and the step. The baseline
(bench/raw_grpc.py) moves the same bytes in the same pattern (same chunk size,
same message limits) with no protobuf and no checks. Both run in this process
with worker OS processes, alternately (raw, codedgd, raw, codedgd, ...), in the
same run; each cell reports the median over ``--repeats`` of each, and rounds
scale with 1/ℓ so every measurement lasts about as long. Both programs run with
the same malloc settings (``--allocator``).

    python -m bench.bench_transport                 # n = 4, 8, 16; ℓ = 1e5, 1e6, 4e6
    python -m bench.bench_transport --n 4 --dim 100000 --repeats 5
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
from pathlib import Path

from bench import raw_grpc
from services import allocator
from services.allocator import keep_freed_memory
from services.coordinator.server import CoordinatorServer
from services.job import Component, JobConfig

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def _spawn(args: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, *args],
        env=ENV,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def codedgd_round_seconds(n: int, dim: int, rounds: int) -> float:
    server = await CoordinatorServer.start("127.0.0.1:0", assign_timeout=120)
    procs = [
        _spawn(
            [
                "-m",
                "client.cli",
                "worker",
                "--coordinator",
                f"127.0.0.1:{server.port}",
                "--no-reconnect",
            ]
        )
        for _ in range(n)
    ]
    try:
        config = JobConfig(
            workers=n,
            rounds=rounds + 1,
            eval_every=10**6,
            data=Component(
                "synthetic", {"rows": 2 * n, "dim": dim, "density": 1e-6, "test_fraction": 0.5}
            ),
            model=Component("logistic", {"l2": 0.0}),
            optimizer={"lr": 1e-3},
        )
        job = server.service.submit(config)
        while not job.finished:
            await job.wait_change()
        if job.state != "done":
            raise RuntimeError(job.error)
        times = [r.round_seconds for r in job.records[1:]]  # round 0 warms up
        return statistics.mean(times)
    finally:
        await server.stop()
        for p in procs:
            p.wait(timeout=30)


async def raw_round_seconds(n: int, dim: int, rounds: int) -> float:
    server, raw, port = await raw_grpc.serve(n, dim)
    procs = [
        _spawn(["bench/raw_grpc.py", "worker", "--port", str(port), "--dim", str(dim)])
        for _ in range(n)
    ]
    try:
        await asyncio.wait_for(raw.ready.wait(), timeout=60)
        return await raw_grpc.timed_rounds(raw, rounds)
    finally:
        await server.stop(0)
        for p in procs:
            p.kill()
            p.wait()


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", type=int, nargs="+", default=[4, 8, 16])
    p.add_argument("--dim", type=int, nargs="+", default=[100_000, 1_000_000, 4_000_000])
    p.add_argument(
        "--rounds",
        type=float,
        default=2e7,
        help="rounds x l per measurement (default 2e7: 200 rounds at l = 1e5, 5 at 4e6)",
    )
    p.add_argument("--repeats", type=int, default=3, help="measurements of each program")
    p.add_argument(
        "--allocator",
        choices=["tuned", "default"],
        default="tuned",
        help="glibc malloc as codedgd's processes set it (services/allocator.py), or "
        "glibc's defaults; applies to both programs alike",
    )
    a = p.parse_args()
    if a.allocator == "tuned":
        keep_freed_memory()
    else:
        ENV[allocator.ENV] = "0"
    print("| n | ℓ | MB per round (down+up) | codedgd rounds/s | raw grpc.aio rounds/s | ratio |")
    print("|---|---|---|---|---|---|")
    for dim in a.dim:
        for n in a.n:
            rounds = max(3, round(a.rounds / dim))
            raws, ours = [], []
            for _ in range(a.repeats):
                raws.append(await raw_round_seconds(n, dim, rounds))
                ours.append(await codedgd_round_seconds(n, dim, rounds))
            raw, our = statistics.median(raws), statistics.median(ours)
            mb = 2 * n * dim * 8 / 1e6
            print(
                f"| {n} | {dim:,} | {mb:,.0f} | {1 / our:.2f} | {1 / raw:.2f} | {raw / our:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    asyncio.run(main())
