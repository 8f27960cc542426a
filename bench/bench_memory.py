"""Coordinator memory: peak and per-round RSS on Amazon (ℓ = 241,915) with n = 30 workers.

The coordinator runs in this process; 30 worker OS processes dial in. RSS is
sampled from /proc/self/status after every round, so growth with the number of
rounds shows directly (it must stay flat once the first rounds have warmed up).
The process tunes malloc as ``codedgd coordinator`` does (services/allocator.py;
``CODEDGD_MALLOC_TUNING=0`` measures glibc's defaults).

    python bench/bench_memory.py [--workers 30] [--rounds 200] [--data-dir DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
from pathlib import Path

from codedgd.services.allocator import keep_freed_memory
from codedgd.services.coordinator.server import CoordinatorServer
from codedgd.services.job import Component, JobConfig
from codedgd.services.records import RoundRecord

ROOT = Path(__file__).resolve().parent.parent


def rss_mib() -> tuple[float, float]:
    """(current RSS, peak RSS) of this process in MiB."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) / 1024
    return fields["VmRSS"], fields["VmHWM"]


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--workers", type=int, default=30)
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--policy", default="ignore-stragglers")
    p.add_argument("--data-dir", default=os.environ.get("CODEDGD_DATA_DIR"))
    a = p.parse_args()
    keep_freed_memory()  # as `codedgd coordinator` does
    before, _ = rss_mib()
    server = await CoordinatorServer.start("127.0.0.1:0", data_dir=a.data_dir, assign_timeout=300)
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
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
            ],
            env=env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(a.workers)
    ]
    samples: list[tuple[int, float]] = []

    def sample(record: RoundRecord) -> None:
        samples.append((record.round, rss_mib()[0]))

    try:
        params = {"s": 3} if a.policy == "ignore-stragglers" else {}
        job = server.service.submit(
            JobConfig(
                workers=a.workers,
                rounds=a.rounds,
                eval_every=10,
                data=Component("amazon"),
                model=Component("logistic", {"l2": 1e-6}),
                policy=Component(a.policy, params),
                stragglers=Component("exponential", {"mean": 0.01}),
            )
        )
        job.on_record = sample
        while not job.finished:
            await job.wait_change()
        if job.state != "done":
            raise SystemExit(f"job {job.state}: {job.error}")
    finally:
        await server.stop()
        for proc in procs:
            proc.wait(timeout=60)
    _, peak = rss_mib()
    print(f"coordinator, n = {a.workers}, ℓ = 241,915, {a.rounds} rounds of {a.policy}")
    print(f"RSS before start: {before:.0f} MiB; peak (VmHWM): {peak:.0f} MiB")
    print("| round | RSS MiB |")
    print("|---:|---:|")
    marks = sorted({0, 9, a.rounds // 4, a.rounds // 2, 3 * a.rounds // 4, a.rounds - 1})
    for r, rss in samples:
        if r in marks:
            print(f"| {r + 1} | {rss:.0f} |")
    tail = [rss for r, rss in samples if r >= 10]
    if tail:
        print(f"growth from round 11 to round {a.rounds}: {tail[-1] - tail[0]:+.1f} MiB")


if __name__ == "__main__":
    asyncio.run(main())
