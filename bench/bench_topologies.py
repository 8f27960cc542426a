"""Topologies at the CodedReduce paper's scale, on the simulator's link model.

156 workers: a CodedReduce tree of fanout 12 and 2 levels (the authors' library),
against the flat cyclic gradient code at the same s (n = 156), ring all-reduce, the
uncoded tree and the uncoded star. ``--n`` another pool: the tree of two levels whose
critical path (about 2(m₀ + m) messages) is shortest, regular where that ties (64: 8 ×
(1 + 7)). Every node has the same full-duplex NIC, the coordinator's included
(``--bandwidth``, ``--latency``); a worker holding a fraction f of the data computes for
f·``--shift`` seconds (the papers' shift), and straggling is added on top in five
regimes: none; exponential tails scaled by load (the ``shifted-exponential`` model's
random part, mean f·shift and f·10·shift); one, and twelve, random workers a round
delayed by a quarter of the full-data compute (the ``fixed`` model: at least 2.5x any
node's own compute here).

    python -m bench.bench_topologies                     # the table in docs/topologies.md
    python -m bench.bench_topologies --rounds 20 --dim 200000
    python -m bench.bench_topologies --n 64
"""

from __future__ import annotations

import argparse
import statistics
import time

from codedgd.services.codes.tree import shapes
from codedgd.services.job import Component, JobConfig
from codedgd.services.sim import CostModel, simulate
from codedgd.services.tuning import label, tree_options


def policies(n: int) -> tuple[tuple[str, Component], ...]:
    """The compared policies at n: the two-level tree of the shortest critical path."""
    two = [shape for shape in shapes(n) if shape[2] == 2]
    if not two:
        raise SystemExit(f"--n {n}: no tree of two levels has {n} workers")
    tree = tree_options(min(two, key=lambda shape: (shape[0] + shape[1], shape[0] != shape[1])))
    return (
        ("codedreduce", Component("codedreduce", {**tree, "s": 1})),
        ("cyclic (flat, s=1)", Component("cyclic", {"s": 1})),
        ("ring-allreduce", Component("ring-allreduce")),
        ("tree (s=0)", Component("tree", tree)),
        ("uncoded (star)", Component("uncoded")),
    )


def mean_round(policy: Component, stragglers: Component, args: argparse.Namespace) -> float:
    n = args.n
    config = JobConfig(
        workers=n,
        rounds=args.rounds,
        seed=1,
        eval_every=10**6,
        data=Component(
            "synthetic", {"rows": n * 40, "dim": args.dim, "density": 1e-3, "test_fraction": 0.5}
        ),
        model=Component("logistic", {"l2": 0.0}),
        policy=policy,
        stragglers=stragglers,
        optimizer={"lr": 1e-3},
    )
    beta = args.bandwidth
    train_rows = n * 20  # the synthetic set below keeps half of its rows for training
    cost = CostModel(
        compute="model",  # a full-data gradient takes --shift seconds; a share, its fraction
        seconds_per_sample=args.shift / train_rows,
        seconds_per_partition=0.0,
        latency_seconds=args.latency,
        bandwidth_bytes_per_second=beta,
        ingress_bandwidth_bytes_per_second=beta,
        egress_bandwidth_bytes_per_second=beta,
        decode_seconds=0.0,
    )
    result = simulate(config, cost)
    return statistics.mean(r.round_seconds for r in result.records)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", type=int, default=156, help="workers (156: the paper's 12 + 144)")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--dim", type=int, default=100_000, help="ℓ (8ℓ bytes per message)")
    p.add_argument("--bandwidth", type=float, default=125e6, help="bytes/s of every NIC")
    p.add_argument("--latency", type=float, default=5e-4, help="seconds per message")
    p.add_argument("--shift", type=float, default=10.0, help="seconds of a full-data gradient")
    a = p.parse_args()
    compared = policies(a.n)
    started = time.time()

    def shifted(rate: float) -> Component:
        return Component("shifted-exponential", {"shift": 0.0, "rate": rate})

    regimes = (
        ("no stragglers", Component("none")),
        (f"Exp tail, mean {a.shift:g} s × load", shifted(1 / a.shift)),
        (f"Exp tail, mean {10 * a.shift:g} s × load", shifted(1 / (10 * a.shift))),
        (
            f"1 worker/round +{a.shift / 4:g} s",
            Component("fixed", {"count": 1, "delay": a.shift / 4}),
        ),
        (
            f"12 workers/round +{a.shift / 4:g} s",
            Component("fixed", {"count": 12, "delay": a.shift / 4}),
        ),
    )
    print(
        f"n = {a.n} (tree: {label(compared[3][1]).removeprefix('tree ')}), "
        f"ℓ = {a.dim:,} ({8 * a.dim / 1e6:.2f} MB), NIC {a.bandwidth / 1e6:g} MB/s, "
        f"latency {a.latency * 1e3:g} ms, full-data compute {a.shift:g} s; mean round seconds\n"
    )
    print(
        "| regime | " + " | ".join(name for name, _ in compared) + " | codedreduce vs cyclic "
        "| codedreduce vs ring |"
    )
    print("|---|" + "---:|" * (len(compared) + 2))
    for regime, stragglers in regimes:
        means = {name: mean_round(policy, stragglers, a) for name, policy in compared}
        cr = means["codedreduce"]
        print(
            f"| {regime} | "
            + " | ".join(f"{means[name]:.3f}" for name, _ in compared)
            + f" | {means['cyclic (flat, s=1)'] / cr:.1f}x | {means['ring-allreduce'] / cr:.2f}x |",
            flush=True,
        )
    took = time.time() - started
    print(f"\n({took:.0f} s; python -m bench.bench_topologies, {time.strftime('%F')})")


if __name__ == "__main__":
    main()
