"""How big a chunk should be: round time against the chunk size, on loopback.

Every tensor travels in chunks of at most ``--chunk-bytes`` (θ from the coordinator, results
to it, θ and partial sums between peers). Small chunks start passing data on sooner (a
tree's θ flows down as its chunks arrive) but cost a message each; the default, the
largest that keeps a chunk and its envelope under gRPC's default 4 MiB message limit,
costs the fewest messages. One run, real worker processes, zero compute (one near-empty
row per worker, as in bench/bench_transport.py); median milliseconds a round:

    python -m bench.bench_chunks                     # 4 and 16 MB, four chunk sizes
    python -m bench.bench_chunks --mb 4 --rounds 10
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from pathlib import Path

from bench.bench_allreduce import codedgd_seconds
from codedgd.services.allocator import keep_freed_memory
from codedgd.services.wire import DEFAULT_CHUNK_BYTES

# (label, policy, parameters, workers)
POLICIES = (
    ("uncoded (star), n=4", "uncoded", {}, 4),
    ("ring-allreduce, n=4", "ring-allreduce", {}, 4),
    ("tree 2x2, n=6", "tree", {"fanout": 2, "levels": 2}, 6),
)
CHUNKS = (64 * 1024, 256 * 1024, 1024 * 1024, DEFAULT_CHUNK_BYTES)


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--mb", type=float, nargs="+", default=[4, 16], help="gradient megabytes")
    p.add_argument("--rounds", type=int, default=10, help="measured rounds per cell")
    a = p.parse_args()
    keep_freed_memory()
    labels = [f"{c // 1024} KiB" for c in CHUNKS]
    print("| policy | MB | " + " | ".join(labels) + " | best / default |")
    print("|---|---|" + "---:|" * len(CHUNKS) + "---:|")
    for mb in a.mb:
        dim = int(mb * 1e6 / 8)
        for label, policy, params, n in POLICIES:
            cells = [
                await codedgd_seconds(policy, n, dim, a.rounds, params=params, chunk_bytes=c)
                for c in CHUNKS
            ]
            best = min(cells)
            print(
                f"| {label} | {mb:g} | "
                + " | ".join(f"{c * 1e3:.1f}" for c in cells)
                + f" | {best / cells[-1]:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    started = time.time()
    asyncio.run(main())
    print(f"\n({time.time() - started:.0f} s; {Path(__file__).name}, {time.strftime('%F')})")
