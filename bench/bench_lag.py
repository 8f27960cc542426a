"""Lazy aggregation head to head: uploads, computations and wall-clock time to a target.

Issue 5's comparison, after the LAGC paper (Zhang & Simeone): gd (uncoded), lag-wk,
lag-ps, cyclic, lagc and g-lag with n = 12 workers, least squares on KC House and
logistic regression on the Covertype subset, with compute times drawn from a
shifted exponential (light tail) and a Pareto law (heavy tail), both scaled by the
worker's load (partitions held / k), so a coded worker holding twice the data is
twice as slow. Compute time *is* the straggler delay here (``CostModel(compute=
"none")``); links cost 0.2 ms + bytes / 1 GB/s each. Every policy runs the same seeded
job. The target loss is the loss gd reaches at round ``rounds // 2``.

Also LAG's own synthetic benchmark (M = 9 heterogeneous least-squares workers): rounds,
uploads and computations to a 1e-8 relative objective error.

With ``--real`` one setting also runs as real worker processes (``codedgd.client.local``).

    CODEDGD_DATA_DIR=../shared/datasets python -m bench.bench_lag --real

Raw result files go to results/lag/ (gitignored); plots to docs/img/lag/; the
markdown tables are printed and written to results/lag/tables.md.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from codedgd.services.job import Component, JobConfig
from codedgd.services.records import RoundRecord, write_results
from codedgd.services.sim import CostModel, Simulator

ROOT = Path(__file__).resolve().parents[1]
RAW = ROOT / "results" / "lag"
IMG = ROOT / "docs" / "img" / "lag"

POLICIES: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("gd (uncoded)", "uncoded", {}),
    ("lag-wk", "lag-wk", {}),
    ("lag-ps", "lag-ps", {}),
    ("cyclic s=1", "cyclic", {"s": 1}),
    ("lagc s=1", "lagc", {"s": 1}),
    ("g-lag s=1", "g-lag", {"s": 1}),
    # ξ = 1 for the coordinator-side rules: LAG's convergence condition (Σξ_d < 1 with
    # α = 1/L) holds, where the authors' ξ = 10 does not (see docs/lag.md, stability).
    ("lag-ps ξ=1", "lag-ps", {"xi": 1.0}),
    ("g-lag s=1 ξ=1", "g-lag", {"s": 1, "xi": 1.0}),
)
COLORS = ("#4d4d4d", "#1f77b4", "#17becf", "#ff7f0e", "#d62728", "#2ca02c", "#9edae5", "#98df8a")

DATASETS = (("kc-house", "least-squares"), ("covtype", "logistic"))
STRAGGLERS = {
    "shifted-exponential": Component("shifted-exponential", {"shift": 1.0, "rate": 2.0}),
    "pareto": Component("pareto", {"scale": 1.0, "shape": 1.5, "by_load": True}),
}


@dataclass(frozen=True)
class Row:
    label: str
    rounds: int  # rounds to target (0: never)
    seconds: float  # wall-clock (simulated or real) time to target
    uploads: int
    computations: int
    bytes_up: int

    @property
    def reached(self) -> bool:
        return self.rounds > 0


def slug_of(label: str) -> str:
    return label.replace(" ", "-").replace("ξ", "xi").replace("(", "").replace(")", "")


def to_target(label: str, records: tuple[RoundRecord, ...], target: float) -> Row:
    uploads = computations = bytes_up = 0
    for i, r in enumerate(records):
        uploads += r.uploads
        computations += r.computations
        bytes_up += r.bytes_up
        if not math.isnan(r.loss) and r.loss <= target:
            return Row(label, i + 1, r.wall_seconds, uploads, computations, bytes_up)
    return Row(label, 0, math.inf, uploads, computations, bytes_up)


def config(
    dataset: str,
    model: str,
    policy: str,
    params: dict[str, Any],
    rounds: int,
    stragglers: Component,
) -> JobConfig:
    return JobConfig(
        workers=12,
        rounds=rounds,
        seed=0,
        data=Component(dataset),
        model=Component(model),
        policy=Component(policy, params),
        stragglers=stragglers,
    )


def table(rows: list[Row], title: str) -> str:
    base = rows[0]
    lines = [
        f"**{title}**",
        "",
        "| policy | rounds | time to target (s) | speedup | uploads | computations | MB up |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if not r.reached:
            lines.append(f"| {r.label} | not reached | | | {r.uploads} | {r.computations} | |")
            continue
        lines.append(
            f"| {r.label} | {r.rounds} | {r.seconds:.2f} | {base.seconds / r.seconds:.2f}× | "
            f"{r.uploads} | {r.computations} | {r.bytes_up / 1e6:.2f} |"
        )
    return "\n".join(lines)


def bars(rows: list[Row], title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.0), constrained_layout=True)
    labels = [r.label for r in rows]
    x = np.arange(len(rows))
    panels = (
        ("wall-clock time to target (s)", [r.seconds if r.reached else 0 for r in rows]),
        ("uploads to target (messages)", [r.uploads for r in rows]),
        ("gradient computations to target", [r.computations for r in rows]),
    )
    for ax, (name, values) in zip(axes, panels, strict=True):
        ax.bar(x, values, color=COLORS[: len(rows)])
        ax.set_xticks(x, labels, rotation=30, ha="right")
        ax.set_ylabel(name)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(title)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def loss_plot(
    runs: list[tuple[str, tuple[RoundRecord, ...]]], title: str, path: Path, best: float
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), constrained_layout=True)
    for (label, records), color in zip(runs, COLORS, strict=False):
        t = [r.wall_seconds for r in records if not math.isnan(r.loss)]
        gap = [max(r.loss - best, 1e-16) for r in records if not math.isnan(r.loss)]
        ups = np.cumsum([r.uploads for r in records])
        ups = [u for u, r in zip(ups, records, strict=True) if not math.isnan(r.loss)]
        axes[0].semilogy(t, gap, color=color, label=label)
        axes[1].semilogy(ups, gap, color=color, label=label)
    start = max(r.loss for _, rec in runs for r in rec[:1]) - best
    for ax in axes:  # a diverging run would hide the others
        ax.set_ylim(1e-6 * max(start, 1e-12), 100 * max(start, 1e-12))
    axes[0].set_xlabel("wall-clock time (s)")
    axes[1].set_xlabel("uploads (messages)")
    for ax in axes:
        ax.set_ylabel("loss − best loss")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8)
    fig.suptitle(title)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def keep(name: str, cfg: JobConfig, job_id: str, records: Sequence[RoundRecord]) -> None:
    """Write one run's per-round results to results/lag/<name>.json."""
    write_results(RAW / f"{name}.json", {**cfg.to_dict(), "job_id": job_id}, records, {})


def against_gd(
    runs: list[tuple[str, tuple[RoundRecord, ...]]], rounds: int
) -> tuple[float, list[Row]]:
    """The target (gd's loss after rounds // 2; gd runs first) and each run's row to it."""
    target = runs[0][1][rounds // 2].loss
    return target, [to_target(label, records, target) for label, records in runs]


def simulated_grid(rounds: int, data_dir: str) -> list[str]:
    out = []
    cost = CostModel(compute="none")
    for dataset, model in DATASETS:
        for sname, stragglers in STRAGGLERS.items():
            runs = []
            for label, policy, params in POLICIES:
                cfg = config(dataset, model, policy, params, rounds, stragglers)
                started = time.perf_counter()
                result = Simulator(cfg, cost, data_dir=data_dir).run()
                keep(f"sim-{dataset}-{sname}-{slug_of(label)}", cfg, result.job_id, result.records)
                print(
                    f"  {dataset} {sname} {label}: {time.perf_counter() - started:.1f} s",
                    flush=True,
                )
                runs.append((label, result.records))
            target, rows = against_gd(runs, rounds)
            title = (
                f"{dataset} ({model}), n = 12, {sname} compute times, simulated; "
                f"target loss {target:.6g}"
            )
            out.append(table(rows, title))
            slug = f"{dataset}-{sname}"
            bars(rows, title, IMG / f"bars-{slug}.png")
            best = min(min(r.loss for r in rec if not math.isnan(r.loss)) for _, rec in runs)
            loss_plot(runs, title, IMG / f"loss-{slug}.png", best)
    return out


def lag_synthetic() -> str:
    from codedgd.services.data import load_dataset

    ds = load_dataset("lag-synthetic", {}, seed=0)
    X, y = ds.X_train, ds.y_train
    theta_star = np.linalg.lstsq(X, y, rcond=None)[0]
    f_star = 0.5 * float(np.mean((X @ theta_star - y) ** 2))
    f_0 = 0.5 * float(np.mean(y**2))
    lines = [
        "**LAG's synthetic least squares (M = 9 workers, X_m = 1.3^(m−1) q_m q_mᵀ + I), "
        "to a 1e-8 relative objective error**",
        "",
        "| policy | rounds | uploads | computations |",
        "|---|---:|---:|---:|",
    ]
    for policy in ("uncoded", "lag-wk", "lag-ps"):
        cfg = JobConfig(
            workers=9,
            rounds=400,
            seed=0,
            data=Component("lag-synthetic"),
            model=Component("least-squares", {"l2": 0.0}),
            policy=Component(policy),
        )
        records = Simulator(cfg, CostModel(compute="none")).run().records
        target = f_star + 1e-8 * (f_0 - f_star)
        row = to_target(policy, records, target)
        lines.append(f"| {policy} | {row.rounds} | {row.uploads} | {row.computations} |")
    return "\n".join(lines)


def real_run(rounds: int, data_dir: str) -> str:
    from codedgd.client.local import run_local

    stragglers = Component("shifted-exponential", {"shift": 0.5, "rate": 5.0})
    runs = []
    for label, policy, params in POLICIES:
        cfg = config("kc-house", "least-squares", policy, params, rounds, stragglers)
        result = asyncio.run(run_local(cfg, data_dir=data_dir, startup_timeout=600))
        keep(f"real-kc-house-{slug_of(label)}", cfg, result.job_id, result.records)
        print(f"  real {label}: {len(result.records)} rounds", flush=True)
        runs.append((label, result.records))
    target, rows = against_gd(runs, rounds)
    title = (
        f"kc-house (least-squares), n = 12 real worker processes, shifted-exponential "
        f"compute times (shift 0.5, rate 5), {rounds} rounds; target loss {target:.6g}"
    )
    bars(rows, title, IMG / "bars-kc-house-real.png")
    return table(rows, title)


def main() -> None:
    p = argparse.ArgumentParser(
        prog="python -m bench.bench_lag",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--rounds", type=int, default=200, help="simulated rounds (default 200)")
    p.add_argument("--real", action="store_true", help="also run one setting for real")
    p.add_argument("--real-rounds", type=int, default=80)
    p.add_argument("--data-dir", default=os.environ.get("CODEDGD_DATA_DIR", ""))
    a = p.parse_args()
    RAW.mkdir(parents=True, exist_ok=True)
    IMG.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    sections = [lag_synthetic(), *simulated_grid(a.rounds, a.data_dir)]
    if a.real:
        sections.append(real_run(a.real_rounds, a.data_dir))
    text = "\n\n".join(sections) + "\n"
    (RAW / "tables.md").write_text(text, encoding="utf-8")
    print(text)
    print(f"bench_lag took {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
