"""Where a round's time goes on bench_shaped's hosts: the processes' CPU, with no delays.

bench_shaped's hosts (a coordinator and 12 workers, each in a network namespace of its
own, every NIC shaped by tbf at ``--rate``), a job with no straggler delay, run for
``--rounds`` and three times as many rounds; each policy's median round, and the
workers' and the coordinator's CPU seconds a round read from /proc, differenced between
the two runs (so a job's setup cancels out). A round whose workers' and coordinator's
CPU over the machine's cores is about its length is CPU-bound: docs/tuning.md, "The
cores as a fluid". Needs root (ip netns, tc); run it alone.

    sudo python -m bench.bench_shaped_cpu
    sudo python -m bench.bench_shaped_cpu --policies ring-allreduce,uncoded,tree
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from bench.bench_shaped import N, build, real_rounds, start, teardown
from codedgd.services.job import Component, JobConfig

TREE = {"tree": {"fanout": 3, "levels": 2}}


def cpu_seconds(pids: list[int]) -> float:
    """User and system CPU seconds of ``pids`` so far."""
    ticks = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rate", default="20mbit")
    p.add_argument("--policies", default="ring-allreduce")
    p.add_argument("--rounds", type=int, default=60)
    p.add_argument("--dim", type=int, default=5000)
    a = p.parse_args()
    hosts = build("sc", a.rate)
    work = Path(tempfile.mkdtemp())
    procs = start(hosts, work)
    workers, coordinator = [q.pid for q in procs[1:]], [procs[0].pid]
    print("| policy | round median (ms) | workers' CPU a round (ms) | coordinator's (ms) |")
    print("|---|---:|---:|---:|")
    try:
        time.sleep(4)
        for name in a.policies.split(","):
            seen = []
            for rounds in (a.rounds, 3 * a.rounds):
                config = JobConfig(
                    workers=N,
                    rounds=rounds,
                    seed=4,
                    data=Component("synthetic", {"rows": 100 * N, "dim": a.dim}),
                    policy=Component(name, TREE.get(name, {})),
                    stragglers=Component("none"),
                    round_timeout=600,
                )
                w0, c0 = cpu_seconds(workers), cpu_seconds(coordinator)
                done = real_rounds(hosts, config, work)
                w1, c1 = cpu_seconds(workers), cpu_seconds(coordinator)
                seen.append((rounds, w1 - w0, c1 - c0, [r[0] for r in done[5:]]))
            (r0, w_a, c_a, _), (r1, w_b, c_b, times) = seen
            extra = r1 - r0
            print(
                f"| {name} | {1e3 * statistics.median(times):.1f} | "
                f"{1e3 * (w_b - w_a) / extra:.1f} | {1e3 * (c_b - c_a) / extra:.1f} |",
                flush=True,
            )
    finally:
        for q in procs:
            q.terminate()
        for q in procs:
            q.wait()
        teardown(hosts)


if __name__ == "__main__":
    main()
