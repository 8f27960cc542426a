"""Python work per round, codedgd against the raw grpc.aio program: a gauge without noise.

bench_transport's rates drift by ±10 % on this shared machine, so a change of a few
per cent cannot be seen there. This runs each program's coordinator (server) and its n
workers as tasks of one event loop in this process, over real loopback gRPC, under
cProfile for the same rounds, and prints what it counted per round: Python function
calls (deterministic: the same on every run) and profiled seconds (cProfile inflates
many small calls, so read them as shares, not as costs), then the functions that
differ most. The event-loop machinery (loop turns, futures, queue hops) shows up in
both programs; what codedgd adds is its own code and its arithmetic.

    python -m bench.profile_round                       # n = 4, l = 1e5, 300 rounds
    python -m bench.profile_round --n 8 --dim 1000000 --rounds 50 --top 30
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import raw_grpc
from bench.bench_transport import transport_job
from codedgd.services.allocator import keep_freed_memory
from codedgd.services.coordinator.server import CoordinatorServer
from codedgd.services.records import RoundRecord
from codedgd.services.worker.agent import WorkerAgent, WorkerOptions

WARMUP = 5


@dataclass(frozen=True)
class Row:
    """One function's calls and profiled seconds per round."""

    name: str
    calls: float
    seconds: float


def _rows(profile: cProfile.Profile, rounds: int) -> dict[str, Row]:
    rows: dict[str, Row] = {}
    # pstats keeps, per function, (primitive calls, calls, own time, cumulative, callers).
    stats: dict[tuple[str, int, str], tuple[Any, ...]] = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    for (path, line, func), (_, calls, own, *_rest) in stats.items():
        where = _short(path)
        name = f"{where}:{line}({func})" if line else func
        rows[name] = Row(name, calls / rounds, own / rounds)
    return rows


def _short(path: str) -> str:
    """A path from the project or site-packages as a reader knows it."""
    for marker in ("site-packages/", f"{Path(__file__).resolve().parent.parent}/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return "/".join(path.split("/")[-2:])  # the standard library: asyncio/queues.py


async def codedgd_rounds(n: int, dim: int, rounds: int, profile: cProfile.Profile) -> None:
    """bench_transport's job, its workers in-process; profile the rounds after warm-up."""
    server = await CoordinatorServer.start("127.0.0.1:0", assign_timeout=60)
    agents = [
        WorkerAgent(WorkerOptions(coordinator=f"127.0.0.1:{server.port}", reconnect=False))
        for _ in range(n)
    ]
    tasks = [asyncio.create_task(agent.run()) for agent in agents]
    try:
        config = transport_job(n, dim, WARMUP + rounds)
        job = server.service.submit(config)

        def on_record(record: RoundRecord) -> None:
            if record.round == WARMUP - 1:
                profile.enable()

        job.on_record = on_record
        while not job.finished:
            await job.wait_change()
        profile.disable()
        if job.state != "done":
            raise RuntimeError(f"the codedgd job failed: {job.error}")
    finally:
        await server.stop()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def raw_rounds(n: int, dim: int, rounds: int, profile: cProfile.Profile) -> None:
    """bench/raw_grpc.py's server and n of its workers in-process; profile measured rounds."""
    server, raw, port = await raw_grpc.serve(n, dim)
    tasks = [asyncio.create_task(raw_grpc.worker(port, dim)) for _ in range(n)]
    try:
        await asyncio.wait_for(raw.ready.wait(), timeout=60)
        for _ in range(WARMUP):
            await raw.round()
        profile.enable()
        for _ in range(rounds):
            await raw.round()
        profile.disable()
    finally:
        raw.close()
        await server.stop(1)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


Program = Callable[[int, int, int, cProfile.Profile], Coroutine[Any, Any, None]]


def measure(program: Program, n: int, dim: int, rounds: int) -> dict[str, Row]:
    profile = cProfile.Profile()
    asyncio.run(program(n, dim, rounds, profile))
    return _rows(profile, rounds)


def _total(rows: dict[str, Row]) -> tuple[float, float]:
    return sum(r.calls for r in rows.values()), sum(r.seconds for r in rows.values())


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", type=int, default=4, help="workers (default 4)")
    p.add_argument("--dim", type=int, default=100_000, help="l, float64 (default 1e5)")
    p.add_argument("--rounds", type=int, default=300, help="profiled rounds (default 300)")
    p.add_argument("--top", type=int, default=15, help="functions listed (default 15)")
    a = p.parse_args(argv)
    if a.n < 1 or a.dim < 1 or a.rounds < 1:
        p.error("--n, --dim and --rounds must be at least 1")
    keep_freed_memory()
    raw = measure(raw_rounds, a.n, a.dim, a.rounds)
    ours = measure(codedgd_rounds, a.n, a.dim, a.rounds)
    print(f"n = {a.n}, l = {a.dim:,}, {a.rounds} rounds, all processes' work in one")
    print()
    print("| per round | codedgd | raw grpc.aio |")
    print("|---|---:|---:|")
    (oc, os_), (rc, rs) = _total(ours), _total(raw)
    print(f"| Python calls | {oc:,.0f} | {rc:,.0f} |")
    print(f"| profiled ms | {os_ * 1e3:.2f} | {rs * 1e3:.2f} |")
    loop = "asyncio/base_events.py:"
    turns = [
        sum(r.calls for name, r in rows.items() if loop in name and "(_run_once)" in name)
        for rows in (ours, raw)
    ]
    print(f"| event-loop turns | {turns[0]:.1f} | {turns[1]:.1f} |")
    print()
    print(f"The {a.top} functions raw never calls, most profiled time per round first")
    print("(a coroutine's own time includes the C work it resumes from, e.g. gRPC's reads):")
    print()
    print("| function | calls | µs |")
    print("|---|---:|---:|")
    only_ours = sorted(
        (row for name, row in ours.items() if name not in raw),
        key=lambda row: row.seconds,
        reverse=True,
    )
    for row in only_ours[: a.top]:
        print(f"| `{row.name}` | {row.calls:.1f} | {row.seconds * 1e6:.1f} |")
    shared = sum(r.seconds for name, r in ours.items() if name in raw)
    print()
    print(
        f"Functions both call: {shared * 1e3:.2f} profiled ms per round in codedgd, "
        f"{sum(r.seconds for name, r in raw.items() if name in ours) * 1e3:.2f} in raw."
    )


if __name__ == "__main__":
    main()
