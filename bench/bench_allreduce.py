"""A codedgd round against torch.distributed's gloo all_reduce of the same bytes.

Loopback, no shaping, one run: for each n and each gradient size, the median seconds of

- a codedgd round of ``ring-allreduce`` (and of the star's ``uncoded``, for reference):
  θ out, each worker's gradient (zero compute: one near-empty row each, as in
  bench/bench_transport.py), the reduction, the coordinator's step; real worker
  processes over gRPC, peers pushing to peers;
- ``torch.distributed.all_reduce`` of a float64 tensor of the same bytes over gloo
  among n processes (reduce-scatter plus all-gather: it moves the gradient, not θ).

The codedgd ring moves θ too (scattered, then all-gathered), so it carries about twice
gloo's bytes per link per round; the ratio says what a whole round costs against one
all_reduce. torch is a benchmark-only dependency (pip install torch), never codedgd's.

    python -m bench.bench_allreduce                       # n = 2, 4, 8; 4 MB and 16 MB
    python -m bench.bench_allreduce --n 4 --mb 4 --rounds 20
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.bench_transport import ENV, ROOT, transport_job
from codedgd.services.allocator import keep_freed_memory
from codedgd.services.coordinator.server import CoordinatorServer
from codedgd.services.job import Component

GLOO_WORKER = r"""
import os, sys, time, statistics
import torch, torch.distributed as dist
rank, n, port, dim, reps = (int(a) for a in sys.argv[1:6])
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n)
x = torch.ones(dim, dtype=torch.float64)
for _ in range(3):
    dist.all_reduce(x)
times = []
for _ in range(reps):
    dist.barrier()
    start = time.perf_counter()
    dist.all_reduce(x)
    times.append(time.perf_counter() - start)
if rank == 0:
    print(statistics.median(times), flush=True)
dist.destroy_process_group()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def gloo_seconds(n: int, dim: int, reps: int) -> float:
    port = _free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", GLOO_WORKER, str(r), str(n), str(port), str(dim), str(reps)],
            env=ENV,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        for r in range(n)
    ]
    out = procs[0].communicate(timeout=600)[0]
    for p in procs[1:]:
        p.wait(timeout=600)
    return float(out.strip())


async def codedgd_seconds(
    policy: str,
    n: int,
    dim: int,
    rounds: int,
    *,
    params: dict[str, int] | None = None,
    chunk_bytes: int | None = None,
) -> float:
    """Median round seconds of ``policy`` (with ``params``) at n workers, ℓ = ``dim``,
    coordinator and workers cutting chunks of ``chunk_bytes`` (None: the default)."""
    server = await CoordinatorServer.start(
        "127.0.0.1:0", assign_timeout=120, chunk_bytes=chunk_bytes
    )
    chunking = ("--chunk-bytes", str(chunk_bytes)) if chunk_bytes is not None else ()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "codedgd.client.cli",
                "worker",
                "--coordinator",
                f"127.0.0.1:{server.port}",
                "--no-reconnect",
                "--peer-listen",
                "127.0.0.1:0",
                *chunking,
            ],
            env=ENV,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(n)
    ]
    try:
        warmup = 3
        config = transport_job(n, dim, warmup + rounds).replace(
            policy=Component(policy, dict(params or {}))
        )
        job = server.service.submit(config)
        while not job.finished:
            await job.wait_change()
        if job.state != "done":
            raise RuntimeError(job.error)
        return statistics.median(r.round_seconds for r in job.records[warmup:])
    finally:
        await server.stop()
        for p in procs:
            p.wait(timeout=30)


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", type=int, nargs="+", default=[2, 4, 8])
    p.add_argument("--mb", type=float, nargs="+", default=[4, 16], help="gradient megabytes")
    p.add_argument("--rounds", type=int, default=20, help="measured rounds / all_reduces")
    a = p.parse_args()
    keep_freed_memory()
    print(
        "| n | MB | ring-allreduce round (ms) | uncoded round (ms) | gloo all_reduce (ms) "
        "| ring / gloo | uncoded / gloo |"
    )
    print("|---|---|---:|---:|---:|---:|---:|")
    for mb in a.mb:
        dim = int(mb * 1e6 / 8)
        for n in a.n:
            gloo = gloo_seconds(n, dim, a.rounds)
            ring = await codedgd_seconds("ring-allreduce", n, dim, a.rounds)
            star = await codedgd_seconds("uncoded", n, dim, a.rounds)
            print(
                f"| {n} | {mb:g} | {ring * 1e3:.1f} | {star * 1e3:.1f} | {gloo * 1e3:.1f} "
                f"| {ring / gloo:.2f} | {star / gloo:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    started = time.time()
    asyncio.run(main())
    print(f"\n({time.time() - started:.0f} s; {Path(__file__).name}, {time.strftime('%F')})")
