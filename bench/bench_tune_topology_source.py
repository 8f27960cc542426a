"""Does `codedgd tune` pick as well from a ring's or tree's run as from a star's?

A ring's or tree's run records each worker's own time from θ to its message
(``ready_seconds``), not arrivals at the coordinator; tune fits those and charges every
candidate the stated links. This bench checks that such a source leads where a star
source does. For each scenario of bench_tune (n = 12 by default: a tree of fanout 3 and
2 levels; ``--n`` another size with a tree of 2 levels or more, its sources' tree the
regular one of fewest levels where there is one: n = 30 is fanout 5, 2 levels; else
the one whose coordinator has most children: n = 16 is 4 × (1 + 3)),
the same cluster (delays and the links of bench_tune's cost model: 1 ms, 1 GB/s) runs
one source job of each kind for ``--source-rounds`` rounds: uncoded (the star), tree
(s = 0: every worker's time reaches the coordinator), codedreduce (s = 1: a parent
leaves out its slowest child: a leaf's time is then censored at its used sibling's, an
inner node's not observed, its subtree replayed as the slowest of its group; with
``--unconditioned`` as anyone's, as until commit f7458fe) and ring-allreduce.
tune fits each and ranks every candidate, the topologies included, over the same stated
link. The exhaustive search runs every candidate under the scenario's true delays and
links. Reported per source: tune's pick, its true time over the best true time (goal
<= 1.10, as bench_tune's), and over tune's ten best-ranked candidates how far its
predicted times are from their true ones (predicted / true, lowest and highest).

A congested coordinator: ``--dim``, ``--bandwidth`` and ``--coordinator-bandwidth`` (its
NIC, shared by all its messages, in the sources' cluster and the exhaustive search, and
told to tune, which then takes θ's queue out of a star source's arrivals); with
``--unmodelled-coordinator`` tune is told it is unlimited, its model until that commit.

    python -m bench.bench_tune_topology_source
    python -m bench.bench_tune_topology_source --scenario pareto --scenario few-slow
    python -m bench.bench_tune_topology_source --n 30
    python -m bench.bench_tune_topology_source --n 16 --source codedreduce --unconditioned
    python -m bench.bench_tune_topology_source --n 16 --dim 500 --bandwidth 25e3 \
        --coordinator-bandwidth 25e3 --source uncoded --source tree
"""

from __future__ import annotations

import argparse
import math
import time
from typing import Any

import numpy as np

from bench.bench_tune import SCENARIOS, cost_for
from codedgd.services.codes.tree import shapes
from codedgd.services.job import Component, JobConfig
from codedgd.services.sim.engines import simulate
from codedgd.services.stragglers import create_straggler_model
from codedgd.services.tuning import Link, fit_delays, observe, search
from codedgd.services.tuning.search import TOPOLOGIES, source_tree, tree_options

SOURCE_NAMES = ("uncoded", "tree", "codedreduce", "ring-allreduce")


def sources(n: int) -> dict[str, Component]:
    """The source runs at n: the star, the tree (s = 0) and codedreduce (s = 1) on the
    tree of n workers of two or more levels, the regular one of fewest levels where
    there is one (12: fanout 3, 2 levels), else the one whose coordinator has the most
    children (16: 4 × (1 + 3)), and the ring."""
    deep = [shape for shape in shapes(n) if shape[2] >= 2]
    if not deep:
        raise SystemExit(f"--n {n}: no tree of 2 levels or more has n workers")
    options = tree_options(min(deep, key=lambda shape: (shape[0] != shape[1], shape[2])))
    return {
        "uncoded": Component("uncoded", {}),
        "tree": Component("tree", options),
        "codedreduce": Component("codedreduce", {**options, "s": 1}),
        "ring-allreduce": Component("ring-allreduce", {}),
    }


def one(scenario: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    n = args.n
    kinds = sources(n)
    stragglers = SCENARIOS[scenario](n)
    nic = args.coordinator_bandwidth if math.isfinite(args.coordinator_bandwidth) else None
    cost = cost_for(n).replace(
        bandwidth_bytes_per_second=args.bandwidth,
        ingress_bandwidth_bytes_per_second=nic,
        egress_bandwidth_bytes_per_second=nic,
    )
    true_link = Link(cost.latency_seconds, args.bandwidth, args.coordinator_bandwidth)
    # What tune is told: the true links, or (--unmodelled-coordinator) a coordinator that
    # is never the bottleneck, as tune took it until this flag's commit.
    told = Link(
        cost.latency_seconds,
        args.bandwidth,
        math.inf if args.unmodelled_coordinator else args.coordinator_bandwidth,
    )
    job = JobConfig(
        workers=n,
        rounds=args.source_rounds,
        seed=3,
        data=Component("synthetic", {"rows": 200 * n, "dim": args.dim}),
        stragglers=stragglers,
        round_timeout=1e9,
    )
    star = simulate(job.replace(policy=kinds["uncoded"]), cost).records
    target = star[-1].loss  # one target for every source: where the star run ended

    def truth(rep: int) -> Any:
        options = dict(stragglers.options)
        if stragglers.name == "speed-classes":
            options["pool"] = job.seed  # the same slow machines as the sources'
        return create_straggler_model(stragglers.name, options, seed=1000 + rep, n_workers=n)

    base = job.replace(policy=kinds["uncoded"])
    obs = observe(star, n)
    exhaustive = search(
        base,
        obs,
        fit_delays(obs).tail,
        target_loss=target,
        rounds=args.rounds,
        repeats=args.repeats,
        delays=truth,
        cost=cost,
        link=true_link,
        hold=1,
    )
    true_time = {o.label: o.predicted for o in exhaustive}
    best = min(exhaustive, key=lambda o: o.predicted)
    rows = []
    for name in args.source or list(kinds):
        source = job.replace(policy=kinds[name])
        records = star if name == "uncoded" else simulate(source, cost).records
        started = time.perf_counter()
        tree = None if args.unconditioned else source_tree(kinds[name])
        # As tune does: a star's arrivals lose θ's queue on the coordinator's NIC, which
        # every star candidate's rounds put back (none when told it is unlimited).
        star_source = name not in TOPOLOGIES and math.isfinite(told.coordinator_rate)
        egress = told.coordinator_rate if star_source else None
        # (its sources are simulated with the cost model's default: fifo)
        seen = observe(records, n, tree=tree, coordinator_egress=egress, coordinator_sharing="fifo")
        picked = search(
            source,
            seen,
            fit_delays(seen).tail,
            target_loss=target,
            rounds=args.rounds,
            repeats=args.repeats,
            link=told,
            jobs=args.jobs,
            network_in_delays=name not in TOPOLOGIES,
        )
        took = time.perf_counter() - started
        off = [
            o.predicted / true_time[o.label]
            for o in picked[:10]
            if math.isfinite(o.predicted) and math.isfinite(true_time.get(o.label, math.inf))
        ]
        rows.append(
            {
                "scenario": scenario,
                "source": name,
                "pick": picked[0].label,
                "pick_true": true_time.get(picked[0].label, math.inf),
                "best": best.label,
                "best_true": best.predicted,
                "off": (min(off), max(off)) if off else None,
                "observed": (
                    f"{int((~np.isnan(seen.excess)).sum())}/{seen.excess.size} "
                    f"({int(seen.censored.sum())})"
                ),
                "seconds": took,
            }
        )
    return rows


def main() -> None:
    p = argparse.ArgumentParser(
        prog="python -m bench.bench_tune_topology_source",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--scenario", action="append", choices=sorted(SCENARIOS))
    p.add_argument(
        "--n",
        type=int,
        default=12,
        help="workers (any n with a tree of 2 levels or more: 8, 12, 16, 64, ...)",
    )
    p.add_argument("--source", action="append", choices=list(SOURCE_NAMES))
    p.add_argument("--source-rounds", type=int, default=100)
    p.add_argument("--rounds", type=int, default=250, help="most rounds a candidate may take")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--jobs", type=int, default=0, help="tune's processes (0: one per CPU)")
    p.add_argument(
        "--unconditioned",
        action="store_true",
        help="replay a subtree codedreduce left out as until commit f7458fe: each worker's "
        "other rounds, as if anyone's (for comparison)",
    )
    p.add_argument(
        "--dim",
        type=int,
        default=50,
        help="features of the synthetic problem: θ's values, 8 bytes each (default 50)",
    )
    p.add_argument(
        "--bandwidth",
        type=float,
        default=1e9,
        metavar="BYTES_PER_S",
        help="every worker's link (default 1e9, bench_tune's)",
    )
    p.add_argument(
        "--coordinator-bandwidth",
        type=float,
        default=math.inf,
        metavar="BYTES_PER_S",
        help="the coordinator's NIC each way, shared by all its messages, in the sources' "
        "and the exhaustive search's cluster, and told to tune (default inf: unlimited, "
        "bench_tune's)",
    )
    p.add_argument(
        "--unmodelled-coordinator",
        action="store_true",
        help="tell tune the coordinator's NIC is unlimited whatever it is (tune's model "
        "until --coordinator-bandwidth was added)",
    )
    args = p.parse_args()
    sources(args.n)  # (a size without a tree: said now)
    print(
        "| scenario | source run | values (censored) | tune's pick | true (s) | best of "
        "exhaustive | best (s) | pick / best | top 10: predicted / true | tune took (s) |"
    )
    print("|---|---|---:|---|---:|---|---:|---:|---|---:|")
    for scenario in args.scenario or list(SCENARIOS):
        for r in one(scenario, args):
            span = f"{r['off'][0]:.2f}-{r['off'][1]:.2f}" if r["off"] else "-"
            print(
                f"| {scenario} | {r['source']} | {r['observed']} | {r['pick']} | "
                f"{r['pick_true']:.2f} | {r['best']} | {r['best_true']:.2f} | "
                f"{r['pick_true'] / r['best_true']:.2f} | {span} | {r['seconds']:.1f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
