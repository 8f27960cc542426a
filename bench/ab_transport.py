"""A/B of the transport benchmark between commits, alternating in one run.

This machine's throughput drifts by ±10 % within minutes, so two versions are only
comparable when measured in turn: A, B, A, B, ... Each measurement is one raw grpc.aio
run followed by one codedgd run (bench_transport's own functions, from a checkout of
that commit) and gives the ratio of the two, which cancels much of the drift.

    python -m bench.ab_transport 4f12348 HEAD                 # n = 4, l = 1e5, 12 pairs
    python -m bench.ab_transport 4f12348 HEAD --n 8 --dim 4000000 --rounds 20 --pairs 4

Each commit is checked out with ``git worktree`` into a temporary directory (removed
at the end); a commit must have ``bench/bench_transport.py`` with
``raw_round_seconds`` and ``codedgd_round_seconds``. Each commit is measured by its own
copy of those functions: a change to the benchmark itself shows in the comparison too.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Run inside a checkout: one raw measurement, then one codedgd measurement, as JSON.
_MEASURE = """
import asyncio, json, sys
from codedgd.services.allocator import keep_freed_memory
import bench.bench_transport as bt
keep_freed_memory()
n, dim, rounds, warmup = (int(a) for a in sys.argv[1:5])
async def main():
    raw = await bt.raw_round_seconds(n, dim, rounds, warmup)
    ours = await bt.codedgd_round_seconds(n, dim, rounds, warmup)
    print(json.dumps({
        "ratio": raw.seconds / ours.seconds,
        "codedgd_rps": 1 / ours.seconds,
        "raw_rps": 1 / raw.seconds,
        "codedgd_cpu_ms": ours.coordinator_cpu_ms + ours.workers_cpu_ms,
        "raw_cpu_ms": raw.coordinator_cpu_ms + raw.workers_cpu_ms,
    }))
asyncio.run(main())
"""


def _checkout(rev: str, into: Path) -> Path:
    path = into / rev.replace("/", "_")
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), rev],
        check=True,
        capture_output=True,
        text=True,
    )
    return path


def _namespace(tree: Path) -> Path:
    """A folder holding ``codedgd/{services,client}`` links into the checkout ``tree``.

    codedgd's packages are mapped folders (services/ installs as codedgd.services), and
    the editable install's finder maps them to the working copy: on PYTHONPATH first,
    this folder makes ``import codedgd.services`` (in the measuring process and in the
    worker processes it starts) load the checkout's code instead.
    """
    root = tree / ".ab-namespace"
    package = root / "codedgd"
    package.mkdir(parents=True, exist_ok=True)
    for name in ("services", "client"):
        link = package / name
        if not link.exists():
            link.symlink_to(tree / name, target_is_directory=True)
    return root


def _measure(tree: Path, n: int, dim: int, rounds: int, warmup: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": f"{_namespace(tree)}{os.pathsep}{tree}"}
    out = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(n), str(dim), str(rounds), str(warmup)],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise SystemExit(f"the measurement in {tree} failed:\n{out.stderr.strip()}")
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("revs", nargs="+", help="commits to compare (two or more)")
    p.add_argument("--n", type=int, default=4, help="workers (default 4)")
    p.add_argument("--dim", type=int, default=100_000, help="ℓ, float64 per tensor (default 1e5)")
    p.add_argument("--rounds", type=int, default=1000, help="measured rounds per run")
    p.add_argument("--warmup", type=int, default=3, help="rounds before the measured ones")
    p.add_argument("--pairs", type=int, default=12, help="measurements of each commit")
    a = p.parse_args()
    if len(a.revs) < 2:
        p.error("give at least two commits to compare")
    if len(set(a.revs)) != len(a.revs):
        p.error("give each commit once")
    results: dict[str, list[dict[str, float]]] = {rev: [] for rev in a.revs}
    with tempfile.TemporaryDirectory(prefix="codedgd-ab-") as tmp:
        trees: dict[str, Path] = {}
        try:
            for rev in a.revs:
                try:
                    trees[rev] = _checkout(rev, Path(tmp))
                except subprocess.CalledProcessError as exc:
                    raise SystemExit(f"cannot check out {rev!r}: {exc.stderr.strip()}") from None
            for i in range(a.pairs):
                for rev, tree in trees.items():
                    m = _measure(tree, a.n, a.dim, a.rounds, a.warmup)
                    results[rev].append(m)
                    print(
                        f"pair {i + 1}/{a.pairs} {rev}: ratio {m['ratio']:.3f} "
                        f"(codedgd {m['codedgd_rps']:.1f}, raw {m['raw_rps']:.1f} rounds/s)",
                        flush=True,
                    )
        finally:
            for tree in trees.values():
                subprocess.run(
                    ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                    check=False,
                    capture_output=True,
                )
            subprocess.run(["git", "-C", str(ROOT), "worktree", "prune"], check=False)
    print()
    print(f"n = {a.n}, ℓ = {a.dim:,}, {a.rounds} rounds a run, {a.pairs} pairs")
    print()
    print(
        "| commit | ratio median | ratio mean | ratio range | codedgd rounds/s | "
        "raw rounds/s | codedgd CPU ms/round | raw CPU ms/round |"
    )
    print("|---|---:|---:|---|---:|---:|---:|---:|")
    for rev, ms in results.items():
        ratios = [m["ratio"] for m in ms]

        def med(key: str, ms: list[dict[str, float]] = ms) -> float:
            return statistics.median(m[key] for m in ms)

        print(
            f"| {rev} | {statistics.median(ratios):.3f} | {statistics.mean(ratios):.3f} | "
            f"{min(ratios):.2f}–{max(ratios):.2f} | {med('codedgd_rps'):.1f} | "
            f"{med('raw_rps'):.1f} | {med('codedgd_cpu_ms'):.2f} | {med('raw_cpu_ms'):.2f} |"
        )


if __name__ == "__main__":
    main()
