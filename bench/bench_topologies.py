"""Topologies at the CodedReduce paper's scale, on the simulator's link model.

156 workers: a CodedReduce tree of fanout 12 and 2 levels (the authors' library), against
the flat cyclic gradient code at the same s (n = 156), ring all-reduce, the uncoded tree
and the uncoded star. Every node has the same full-duplex NIC, the coordinator's included
(``--bandwidth``, ``--latency``); a worker holding a fraction f of the data computes for
f·``--shift`` seconds (the papers' shift), and straggling is added on top in five regimes:
none; exponential tails scaled by load (the ``shifted-exponential`` model's random part,
mean f·shift and f·10·shift); one, and twelve, random workers a round delayed by a quarter
of the full-data compute (the ``fixed`` model: at least 2.5x any node's own compute here).

    python -m bench.bench_topologies                     # the table in docs/topologies.md
    python -m bench.bench_topologies --rounds 20 --dim 200000
"""

from __future__ import annotations

import argparse
import statistics
import time

from codedgd.services.job import Component, JobConfig
from codedgd.services.sim import CostModel, simulate

POLICIES = (
    ("codedreduce", Component("codedreduce", {"fanout": 12, "levels": 2, "s": 1})),
    ("cyclic (flat, s=1)", Component("cyclic", {"s": 1})),
    ("ring-allreduce", Component("ring-allreduce")),
    ("tree (s=0)", Component("tree", {"fanout": 12, "levels": 2})),
    ("uncoded (star)", Component("uncoded")),
)


def mean_round(policy: Component, stragglers: Component, args: argparse.Namespace) -> float:
    config = JobConfig(
        workers=156,
        rounds=args.rounds,
        seed=1,
        eval_every=10**6,
        data=Component(
            "synthetic", {"rows": 156 * 40, "dim": args.dim, "density": 1e-3, "test_fraction": 0.5}
        ),
        model=Component("logistic", {"l2": 0.0}),
        policy=policy,
        stragglers=stragglers,
        optimizer={"lr": 1e-3},
    )
    beta = args.bandwidth
    train_rows = 156 * 20  # the synthetic set below keeps half of its rows for training
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
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--dim", type=int, default=100_000, help="ℓ (8ℓ bytes per message)")
    p.add_argument("--bandwidth", type=float, default=125e6, help="bytes/s of every NIC")
    p.add_argument("--latency", type=float, default=5e-4, help="seconds per message")
    p.add_argument("--shift", type=float, default=10.0, help="seconds of a full-data gradient")
    a = p.parse_args()
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
        f"n = 156, ℓ = {a.dim:,} ({8 * a.dim / 1e6:.2f} MB), NIC {a.bandwidth / 1e6:g} MB/s, "
        f"latency {a.latency * 1e3:g} ms, full-data compute {a.shift:g} s; mean round seconds\n"
    )
    print(
        "| regime | " + " | ".join(name for name, _ in POLICIES) + " | codedreduce vs cyclic "
        "| codedreduce vs ring |"
    )
    print("|---|" + "---:|" * (len(POLICIES) + 2))
    for regime, stragglers in regimes:
        means = {name: mean_round(policy, stragglers, a) for name, policy in POLICIES}
        cr = means["codedreduce"]
        print(
            f"| {regime} | "
            + " | ".join(f"{means[name]:.3f}" for name, _ in POLICIES)
            + f" | {means['cyclic (flat, s=1)'] / cr:.1f}x | {means['ring-allreduce'] / cr:.2f}x |",
            flush=True,
        )
    took = time.time() - started
    print(f"\n({took:.0f} s; python -m bench.bench_topologies, {time.strftime('%F')})")


if __name__ == "__main__":
    main()
