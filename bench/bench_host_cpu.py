"""What handling a message costs the coordinator and a worker in CPU, on this machine.

The simulator's one-machine cost model (``CostModel(cores=...)``, ``codedgd simulate
--cores local``) charges each message CPU time at both ends, ``per_message + per_byte ·
bytes``, besides the compute. This measures those constants: it runs bench_transport's
zero-compute job (n worker processes, one near-empty row each, so a round is θ to every
worker and a gradient of ℓ float64 back) at two sizes ℓ, reads the CPU seconds of the
coordinator and the workers from /proc over the measured rounds, and fits the two
constants of each side from the two sizes (a worker-round is two messages of 8ℓ bytes).
It prints the CostModel fields to set; the defaults in services/sim/cost.py are its
output on the 2-core machine of docs/neural.md.

``--peer`` measures a worker-to-worker hop instead: the same job as ``ring-allreduce``
(each worker listening for its peers on loopback), whose worker-round is 4(n - 1) + 2
messages of a segment (8ℓ/n bytes: θ's segment in, n - 1 of θ's segments forwarded and
n - 1 partial sums, each received and sent, its reduced segment up). It fits
``peer_cpu_seconds_per_message`` and ``peer_cpu_seconds_per_byte``: what one end of a
hop costs a worker, which the simulator's rings and trees charge on a shared machine.

    python -m bench.bench_host_cpu
    python -m bench.bench_host_cpu --n 8 --dims 10000 100000 --repeats 3
    python -m bench.bench_host_cpu --peer
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from bench.bench_transport import codedgd_round_seconds
from codedgd.services.allocator import keep_freed_memory


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", type=int, default=8, help="worker processes (default 8)")
    p.add_argument("--dims", type=int, nargs=2, default=[10_000, 100_000], metavar="L")
    p.add_argument("--rounds", type=int, default=200, help="measured rounds per run")
    p.add_argument("--repeats", type=int, default=3, help="runs per size (median kept)")
    p.add_argument("--peer", action="store_true", help="a ring's hops, not the star's messages")
    a = p.parse_args()
    policy = "ring-allreduce" if a.peer else "uncoded"
    if a.dims[0] == a.dims[1]:
        p.error("--dims needs two different sizes to separate per-message and per-byte cost")
    keep_freed_memory()  # as codedgd's own processes run
    started = time.time()
    print(f"n = {a.n} worker processes, {policy}, zero compute, {a.rounds} rounds per run\n")
    print(
        "| ℓ | bytes per message | coordinator CPU ms per worker-round | worker CPU ms per round |"
    )
    print("|---:|---:|---:|---:|")
    per_side: dict[str, list[float]] = {"coordinator": [], "worker": []}
    for dim in a.dims:
        runs = [
            await codedgd_round_seconds(a.n, dim, a.rounds, warmup=3, policy=policy)
            for _ in range(a.repeats)
        ]
        coord = statistics.median(r.coordinator_cpu_ms for r in runs) / a.n
        worker = statistics.median(r.workers_cpu_ms for r in runs) / a.n
        per_side["coordinator"].append(coord)
        per_side["worker"].append(worker)
        each = 8 * dim // a.n if a.peer else 8 * dim
        print(f"| {dim:,} | {each:,} | {coord:.3f} | {worker:.3f} |", flush=True)
    print()
    if a.peer:
        # A worker-round of the ring: m messages of a segment, 8ℓ/n bytes each.
        m = 4 * (a.n - 1) + 2
        sides = {"peer": (per_side["worker"], m, [8.0 * d / a.n for d in a.dims])}
    else:
        # A worker-round is two messages of 8ℓ bytes (θ in, the gradient out); the
        # coordinator's, per worker, the same two.
        sizes = [8.0 * d for d in a.dims]
        sides = {side: (ms, 2, sizes) for side, ms in per_side.items()}
    for side, ((c0, c1), m, (b0, b1)) in sides.items():
        # m·fixed + m·bytes·per_byte = CPU ms / 1e3.
        per_byte = max((c1 - c0) / 1e3 / (m * (b1 - b0)), 0.0)
        fixed = max(c0 / 1e3 / m - per_byte * b0, 0.0)
        print(f"{side}_cpu_seconds_per_message = {fixed:.2e}")
        print(f"{side}_cpu_seconds_per_byte = {per_byte:.2e}")
    print(f"\n({time.time() - started:.0f} s; bench_host_cpu.py, {time.strftime('%F')})")


if __name__ == "__main__":
    asyncio.run(main())
