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
import time
from dataclasses import dataclass
from pathlib import Path

from bench import raw_grpc
from codedgd.services import allocator
from codedgd.services.allocator import keep_freed_memory
from codedgd.services.coordinator.server import CoordinatorServer
from codedgd.services.job import Component, JobConfig
from codedgd.services.records import RoundRecord

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


@dataclass(frozen=True)
class Measured:
    """Seconds per round, and CPU milliseconds per round of the coordinator and of all workers."""

    seconds: float
    coordinator_cpu_ms: float
    workers_cpu_ms: float


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _snapshot(pids: list[int]) -> list[float]:
    return [_cpu_seconds(pid) for pid in pids]


def _measured(seconds: float, before: list[float], after: list[float], rounds: int) -> Measured:
    delta = [(b - a) * 1e3 / rounds for a, b in zip(before, after, strict=True)]
    return Measured(seconds, delta[0], sum(delta[1:]))


def _spawn(args: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, *args],
        env=ENV,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def transport_job(n: int, dim: int, rounds: int) -> JobConfig:
    """The benchmark's job: n workers, each with one near-empty row of ℓ = ``dim`` features."""
    return JobConfig(
        workers=n,
        rounds=rounds,
        eval_every=10**6,
        data=Component(
            "synthetic", {"rows": 2 * n, "dim": dim, "density": 1e-6, "test_fraction": 0.5}
        ),
        model=Component("logistic", {"l2": 0.0}),
        optimizer={"lr": 1e-3},
    )


async def codedgd_round_seconds(
    n: int, dim: int, rounds: int, warmup: int = 1, policy: str = "uncoded"
) -> Measured:
    """The transport job's rounds under ``policy`` (a ring's or tree's workers listen for
    their peers on loopback too)."""
    server = await CoordinatorServer.start("127.0.0.1:0", assign_timeout=120)
    peers = [] if policy == "uncoded" else ["--peer-listen", "127.0.0.1:0"]
    procs = [
        _spawn(
            [
                "-m",
                "codedgd.client.cli",
                "worker",
                "--coordinator",
                f"127.0.0.1:{server.port}",
                "--no-reconnect",
                *peers,
            ]
        )
        for _ in range(n)
    ]
    try:
        config = transport_job(n, dim, warmup + rounds).replace(policy=Component(policy))
        pids = [os.getpid(), *(p.pid for p in procs)]
        cpu: dict[int, list[float]] = {}
        clock: dict[int, float] = {}
        job = server.service.submit(config)
        # No watcher wakes up every round (the raw program has none): the last round's
        # record ends the wait, then the job's own end.
        last_round: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def on_record(record: RoundRecord) -> None:
            if record.round in (warmup - 1, warmup - 1 + rounds):  # rounds < warmup warm up
                clock[record.round] = time.perf_counter()
                cpu[record.round] = _snapshot(pids)
            if record.round == warmup - 1 + rounds and not last_round.done():
                last_round.set_result(None)

        job.on_record = on_record
        while not (last_round.done() or job.finished):  # a failed job never gets there
            await asyncio.wait([last_round], timeout=0.1)
        while not job.finished:
            await job.wait_change()
        if job.state != "done":
            raise RuntimeError(job.error)
        # Wall clock from the end of the last warm-up round to the end of the last one,
        # as for the raw program: everything between rounds counts too.
        first, last = warmup - 1, warmup - 1 + rounds
        return _measured((clock[last] - clock[first]) / rounds, cpu[first], cpu[last], rounds)
    finally:
        await server.stop()
        for p in procs:
            p.wait(timeout=30)


async def raw_round_seconds(n: int, dim: int, rounds: int, warmup: int = 1) -> Measured:
    server, raw, port = await raw_grpc.serve(n, dim)
    procs = [
        _spawn(["bench/raw_grpc.py", "worker", "--port", str(port), "--dim", str(dim)])
        for _ in range(n)
    ]
    try:
        await asyncio.wait_for(raw.ready.wait(), timeout=60)
        for _ in range(warmup):
            await raw.round()
        pids = [os.getpid(), *(p.pid for p in procs)]
        before = _snapshot(pids)
        seconds = await raw_grpc.timed_rounds(raw, rounds)
        return _measured(seconds, before, _snapshot(pids), rounds)
    finally:
        raw.close()
        await server.stop(5)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
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
        "--warmup",
        type=int,
        default=3,
        help="rounds each program runs before the measured ones (default 3: the first "
        "rounds fault in the processes' round-sized buffers)",
    )
    p.add_argument(
        "--cpu",
        action="store_true",
        help="also print CPU milliseconds per round (coordinator, all workers) of both",
    )
    p.add_argument(
        "--allocator",
        choices=["tuned", "default"],
        default="tuned",
        help="glibc malloc as codedgd's processes set it (services/allocator.py), or "
        "glibc's defaults; applies to both programs alike",
    )
    a = p.parse_args()
    if a.warmup < 1:
        p.error("--warmup must be at least 1 (the first round opens the streams)")
    if a.allocator == "tuned":
        keep_freed_memory()
    else:
        ENV[allocator.ENV] = "0"
    cpu_rows: list[tuple[int, int, list[Measured], list[Measured]]] = []
    print("| n | ℓ | MB per round (down+up) | codedgd rounds/s | raw grpc.aio rounds/s | ratio |")
    print("|---|---|---|---|---|---|")
    for dim in a.dim:
        for n in a.n:
            rounds = max(3, round(a.rounds / dim))
            raws: list[Measured] = []
            ours: list[Measured] = []
            for _ in range(a.repeats):
                raws.append(await raw_round_seconds(n, dim, rounds, a.warmup))
                ours.append(await codedgd_round_seconds(n, dim, rounds, a.warmup))
            raw = statistics.median(m.seconds for m in raws)
            our = statistics.median(m.seconds for m in ours)
            mb = 2 * n * dim * 8 / 1e6
            print(
                f"| {n} | {dim:,} | {mb:,.0f} | {1 / our:.2f} | {1 / raw:.2f} | {raw / our:.2f} |",
                flush=True,
            )
            if a.cpu:
                cpu_rows.append((n, dim, raws, ours))
    if cpu_rows:
        print()
        print("CPU ms per round (median over repeats): coordinator, all workers")
        print()
        print("| n | ℓ | codedgd coordinator | raw server | codedgd workers | raw workers |")
        print("|---|---|---:|---:|---:|---:|")
        for n, dim, raws, ours in cpu_rows:
            cells = [
                statistics.median(m.coordinator_cpu_ms for m in ours),
                statistics.median(m.coordinator_cpu_ms for m in raws),
                statistics.median(m.workers_cpu_ms for m in ours),
                statistics.median(m.workers_cpu_ms for m in raws),
            ]
            print(f"| {n} | {dim:,} | " + " | ".join(f"{c:.2f}" for c in cells) + " |")


if __name__ == "__main__":
    asyncio.run(main())
