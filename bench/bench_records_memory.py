"""Coordinator RSS per round with a bounded window of round records vs all in memory.

A RoundRecord of a 64-worker round holds each worker's response and compute seconds:
about 9 KB. A coordinator that kept every record grew by that much per round, forever;
with ``--records-in-memory N`` (default 1000) it keeps N per job and reads older ones
back from the job's records file.

Two measurements, each variant in a fresh process so that neither reuses the other's
freed memory:

* ``job``: a real job. The coordinator runs in the measuring process; one helper process
  hosts 64 in-process worker agents (WorkerAgent, real gRPC over loopback, a tiny
  synthetic dataset so rounds are short). RSS (VmRSS) is sampled after every round.
* ``feed``: the same number of 64-worker records appended straight to a job's
  RecordLog, no network: the records' own cost without a round loop's noise.

"unbounded" is the window set past the number of rounds (every record stays in memory,
as before the window existed); "window" is the default 1000. Growth per round is the
least-squares slope of RSS over the rounds after the window has filled (from round
``--from``), where a bounded coordinator must be flat.

    python -m bench.bench_records_memory [--rounds 4000] [--workers 64] [--from 2000]
    python -m bench.bench_records_memory --only feed    # seconds, not minutes
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from codedgd.services.allocator import keep_freed_memory
from codedgd.services.coordinator.server import CoordinatorServer
from codedgd.services.job import Component, JobConfig
from codedgd.services.records import DEFAULT_RECORDS_IN_MEMORY, RecordLog, RoundRecord

ROOT = Path(__file__).resolve().parent.parent
SELF = (sys.executable, "-m", "bench.bench_records_memory")
UNBOUNDED = 10**9  # a window no job of the bench fills: every record stays in memory


def rss_kib() -> int:
    """This process's resident set (VmRSS) in KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


class Samples:
    """RSS after each round, in an array allocated up front (the bench must not grow)."""

    def __init__(self, rounds: int) -> None:
        self.kib = np.full(rounds, -1, dtype=np.int64)

    def take(self, t: int) -> None:
        self.kib[t] = rss_kib()

    def slope(self, start: int) -> float:
        """Least-squares KiB per round from round ``start`` on."""
        rounds = np.flatnonzero(self.kib >= 0)
        rounds = rounds[rounds >= start]
        if len(rounds) < 2:
            raise SystemExit(f"fewer than 2 samples from round {start}: raise --rounds")
        return float(np.polyfit(rounds, self.kib[rounds], 1)[0])


# ---------------------------------------------------------------- one variant (a child)


async def measure_job(rounds: int, workers: int, window: int) -> Samples:
    """RSS after every round of a real job with ``workers`` in-process agents."""
    server = await CoordinatorServer.start(
        "127.0.0.1:0", assign_timeout=300, records_in_memory=window
    )
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    helper = [*SELF, "--agents", str(workers), "--port", str(server.port)]
    host = subprocess.Popen(helper, cwd=ROOT, env=env)
    samples = Samples(rounds)
    try:
        job = server.service.submit(
            JobConfig(
                workers=workers,
                rounds=rounds,
                eval_every=10,
                data=Component("synthetic", {"rows": 8 * workers, "dim": 8}),
                policy=Component("uncoded"),
            )
        )
        job.on_record = lambda record: samples.take(record.round)
        while not job.finished:
            await job.wait_change()
        if job.state != "done":
            raise SystemExit(f"job {job.state}: {job.error}")
        assert job.records.in_memory == min(window, rounds)
    finally:
        await server.stop()
        host.wait(timeout=120)
    return samples


def measure_feed(rounds: int, workers: int, window: int) -> Samples:
    """RSS after every record appended to a file-backed RecordLog (no network)."""
    rng = np.random.default_rng(0)
    samples = Samples(rounds)
    with tempfile.TemporaryDirectory(prefix="codedgd-bench-") as tmp:
        log = RecordLog(Path(tmp) / "records.jsonl", window)
        for t in range(rounds):
            log.append(_record(t, workers, rng))
            samples.take(t)
        log.close()
    return samples


def _record(t: int, n: int, rng: np.random.Generator) -> RoundRecord:
    """A 64-worker round's record, its timing maps filled as a real one's are."""
    response = rng.exponential(0.01, n)
    return RoundRecord(
        round=t,
        wall_seconds=0.01 * t,
        round_seconds=float(response.max()),
        wait_seconds=float(response.max()),
        decode_seconds=1e-4,
        compute_seconds_max=1e-3,
        loss=float(rng.random()),
        metric=float(rng.random()),
        metric_name="auc",
        workers_used=tuple(range(n)),
        exact=True,
        decode_residual=0.0,
        bytes_up=8 * n,
        bytes_down=8 * n,
        uploads=n,
        computations=n,
        cancelled=0,
        late_dropped=0,
        response_seconds={w: float(s) for w, s in enumerate(response)},
        worker_compute_seconds={w: float(s) / 2 for w, s in enumerate(response)},
    )


async def serve_agents(n: int, port: int) -> None:
    """The helper process: n worker agents, until the coordinator lets them go."""
    from codedgd.services.worker.agent import WorkerAgent, WorkerOptions

    agents = [
        WorkerAgent(WorkerOptions(coordinator=f"127.0.0.1:{port}", name=f"b{i}", reconnect=False))
        for i in range(n)
    ]
    await asyncio.gather(*(a.run() for a in agents), return_exceptions=True)


def child(a: argparse.Namespace) -> None:
    keep_freed_memory()  # as `codedgd coordinator` does
    started = time.perf_counter()
    if a.mode == "job":
        samples = asyncio.run(measure_job(a.rounds, a.workers, a.window))
    else:
        samples = measure_feed(a.rounds, a.workers, a.window)
    result = {
        "mode": a.mode,
        "window": a.window,
        "seconds": time.perf_counter() - started,
        "last_kib": int(samples.kib[-1]),
        "slope_kib": samples.slope(a.start),
    }
    print("RESULT " + json.dumps(result), flush=True)


# ---------------------------------------------------------------- the table (the parent)


def run_variant(a: argparse.Namespace, mode: str, window: int) -> dict[str, float]:
    args = [*SELF, "--variant", mode, "--window", str(window), "--rounds", str(a.rounds)]
    args += ["--workers", str(a.workers), "--from", str(a.start)]
    out = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, check=False)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    if out.returncode != 0 or not lines:
        raise SystemExit(f"{mode} window {window} failed:\n{out.stdout}\n{out.stderr}")
    result: dict[str, float] = json.loads(lines[-1][len("RESULT ") :])
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=4000)
    p.add_argument("--workers", type=int, default=64)
    p.add_argument("--window", type=int, default=DEFAULT_RECORDS_IN_MEMORY)
    p.add_argument(
        "--from", dest="start", type=int, default=2000, help="fit RSS from this round on"
    )
    p.add_argument("--only", choices=("job", "feed"), help="one measurement (default both)")
    p.add_argument("--variant", choices=("job", "feed"), help=argparse.SUPPRESS)
    p.add_argument("--agents", type=int, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.agents is not None:
        asyncio.run(serve_agents(a.agents, a.port))
        return
    if a.variant is not None:
        a.mode = a.variant
        child(a)
        return
    print(f"{a.workers} workers, {a.rounds} rounds; RSS slope fitted from round {a.start}")
    print("| measurement | records in memory | RSS growth / round | RSS at end | wall s |")
    print("|---|---|---:|---:|---:|")
    for mode in ("feed", "job") if a.only is None else (a.only,):
        for label, window in (("all (unbounded)", UNBOUNDED), (f"window {a.window}", a.window)):
            r = run_variant(a, mode, window)
            print(
                f"| {mode} | {label} | {r['slope_kib']:+.2f} KiB | "
                f"{r['last_kib'] / 1024:.0f} MiB | {r['seconds']:.0f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
