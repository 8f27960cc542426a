"""What a checkpoint costs: writing (and reading back) a job's state at dimension ℓ.

The state is what :meth:`codedgd.services.job.descent.Descent.state` holds: θ and the
optimizer's look-ahead point (2ℓ floats) for every policy, plus, for a lazy policy with
n units, each unit's last message and the θ it was taken at (2nℓ floats). The write is
:func:`codedgd.services.job.checkpoint.write_checkpoint` (SHA-256, npz, fsync, rename),
the read :func:`read_checkpoint` (checksum verified). The coordinator writes one every
``--checkpoint-every`` rounds, in a thread while its round loop waits.

    python -m bench.bench_checkpoint
    python -m bench.bench_checkpoint --dims 100000 1000000 --units 8 --dir /var/lib/codedgd
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from codedgd.services.job.checkpoint import Checkpoint, read_checkpoint, write_checkpoint


def state(dim: int, units: int) -> dict[str, object]:
    rng = np.random.default_rng(0)
    s: dict[str, object] = {
        "optimizer": {"t": 10, "x": rng.standard_normal(dim), "y": rng.standard_normal(dim)},
        "steps": 10,
        "start_loss": 0.69,
        "last_loss": 0.5,
        "policy": {},
    }
    if units:
        s["policy"] = {
            "latest": rng.standard_normal((units, dim)),
            "theta_hat": rng.standard_normal((units, dim)),
            "has": np.ones(units, dtype=bool),
        }
    return s


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--dims", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    p.add_argument("--units", type=int, default=8, help="n of the lazy policy rows")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dir", default=None, help="where to write (default: a temporary dir)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        path = Path(d) / "checkpoint.npz"
        print(f"{'state':<22} {'ℓ':>9} {'MB':>8} {'write s':>9} {'read s':>9} {'MB/s':>7}")
        for units, label in ((0, "θ only (frc, cyclic…)"), (args.units, f"lazy, n={args.units}")):
            for dim in args.dims:
                st = state(dim, units)
                writes, reads = [], []
                for _ in range(args.repeats):
                    t0 = time.perf_counter()
                    write_checkpoint(path, Checkpoint("bench", 9, st))
                    t1 = time.perf_counter()
                    read_checkpoint(path)
                    reads.append(time.perf_counter() - t1)
                    writes.append(t1 - t0)
                mb = path.stat().st_size / 1e6
                w = min(writes)
                print(
                    f"{label:<22} {dim:>9} {mb:>8.1f} {w:>9.4f} {min(reads):>9.4f} {mb / w:>7.0f}"
                )


if __name__ == "__main__":
    main()
