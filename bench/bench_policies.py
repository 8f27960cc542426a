"""Policies head to head as real processes: time per round and time to a target loss.

Each policy runs the same seeded job (same data, partitions, step size and per-round
straggler delays) with ``n`` worker OS processes through :func:`codedgd.client.local.run_local`,
exactly what ``codedgd run`` does. Result files (the format of ``codedgd run``) go to
``--out``; ``codedgd report`` draws them. The target loss defaults to the loss uncoded
reaches at round ``--target-round``, so every exact policy can reach it.

    CODEDGD_DATA_DIR=../shared/datasets python -m bench.bench_policies \\
        --data amazon --workers 30 --rounds 60 --delay-mean 0.2 \\
        --policy uncoded --policy ignore-stragglers:s=3 --policy frc:s=2 \\
        --policy cyclic:s=2 --policy erasurehead:r=3,K=15 --policy group-mds:s=2,m=2
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import statistics
import time
from pathlib import Path
from typing import Any

from codedgd.client.local import run_local
from codedgd.client.results import summarize
from codedgd.services.job import Component, JobConfig
from codedgd.services.records import RoundRecord, write_results


def parse_policy(text: str) -> Component:
    """``name:key=value,key=value`` → Component."""
    name, _, rest = text.partition(":")
    options: dict[str, Any] = {}
    for item in filter(None, rest.split(",")):
        key, _, value = item.partition("=")
        options[key] = _number(value)
    return Component(name, options)


def _number(value: str) -> Any:
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return value


def label(c: Component) -> str:
    opts = ",".join(f"{k}={v}" for k, v in c.options.items())
    return f"{c.name}({opts})" if opts else c.name


def time_to(records: tuple[RoundRecord, ...], target: float) -> float:
    for r in records:
        if not math.isnan(r.loss) and r.loss <= target:
            return r.wall_seconds
    return math.inf


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", default="amazon")
    p.add_argument("--model", default="logistic")
    p.add_argument("--l2", type=float, default=1e-6)
    p.add_argument("--workers", type=int, default=30)
    p.add_argument("--rounds", type=int, default=60)
    p.add_argument("--delay-mean", type=float, default=0.2, help="exponential delay mean (s)")
    p.add_argument("--target-round", type=int, default=0, help="default: rounds // 2")
    p.add_argument("--target-loss", type=float, help="overrides --target-round")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--policy", action="append", default=[], help="name:key=value,...")
    p.add_argument("--out", default="results/bench_policies")
    p.add_argument("--data-dir", default=os.environ.get("CODEDGD_DATA_DIR"))
    a = p.parse_args()
    policies = [parse_policy(t) for t in a.policy] or [Component("uncoded")]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    runs: list[tuple[Component, tuple[RoundRecord, ...]]] = []
    for policy in policies:
        config = JobConfig(
            workers=a.workers,
            rounds=a.rounds,
            seed=a.seed,
            data=Component(a.data),
            model=Component(a.model, {"l2": a.l2}),
            policy=policy,
            stragglers=Component("exponential", {"mean": a.delay_mean}),
        )
        started = time.perf_counter()
        result = await run_local(config, data_dir=a.data_dir, startup_timeout=600)
        slug = label(policy).replace("(", "-").replace(")", "").replace(",", "-").replace("=", "")
        path = out / f"{a.data}-{slug}.json"
        elapsed = time.perf_counter() - started
        summary = summarize(result.records, elapsed, config)
        write_results(path, {**config.to_dict(), "job_id": result.job_id}, result.records, summary)
        print(
            f"{label(policy)}: {len(result.records)} rounds in "
            f"{elapsed:.1f} s (incl. start-up) → {path}",
            flush=True,
        )
        runs.append((policy, result.records))

    base = runs[0][1]
    if a.target_loss is not None:
        target = a.target_loss
    else:
        target_round = a.target_round or a.rounds // 2
        target = base[min(target_round, len(base) - 1)].loss
    base_round = statistics.mean(r.round_seconds for r in base)
    base_ttt = time_to(base, target)
    print()
    print(
        f"{a.data}, n = {a.workers}, exponential delays mean {a.delay_mean} s, "
        f"{a.rounds} rounds, target loss {target:.6g}"
    )
    print()
    print(
        "| policy | mean round s | p50 round s | speedup/round | time to target s "
        "| speedup to target | final loss | final metric |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for policy, records in runs:
        mean = statistics.mean(r.round_seconds for r in records)
        p50 = statistics.median(r.round_seconds for r in records)
        ttt = time_to(records, target)
        speed = base_ttt / ttt if math.isfinite(ttt) else 0.0
        last = records[-1]
        print(
            f"| {label(policy)} | {mean:.3f} | {p50:.3f} | {base_round / mean:.2f}× | "
            f"{ttt:.2f} | {speed:.2f}× | {last.loss:.5f} | {last.metric:.4f} |"
        )


if __name__ == "__main__":
    asyncio.run(main())
