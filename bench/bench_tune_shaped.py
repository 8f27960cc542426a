"""Does `codedgd tune` pick well on real processes behind a congested coordinator?

bench_shaped's hosts (a coordinator and 12 workers, each in a network namespace of its
own, every NIC shaped by a tbf qdisc at ``--rate`` in both directions, the coordinator's
like the workers'), codedgd's own processes, and a job whose θ is ``--dim`` values: a
star's twelve copies of θ and twelve gradients a round queue on the coordinator's NIC.

``codedgd tune --probe JOB.toml --probe-links`` runs in the coordinator's namespace as a
user runs it: a probe job of uncoded, then the three link probes, which measure tbf's
burst (since 2026-12-01); every process here runs on this one machine, which their
records name, so it charges each message's CPU at both ends on its cores (since
2026-12-01, later). Then tune reads the same probe again (the links refitted from its
link probes): as if each process had a machine of its own (``--cores none``, the
default before the records named machines); told tbf's burst and the cores
(``--link-burst``, ``--cores local``); and as it read it before 2026-12-01 (by its
arrivals, θ's queue taken out as side by side, links of two sizes and no burst, a
machine each: ``--star-times arrivals --cores none``). (Before 2026-11-30 tune took the
coordinator as unlimited: ``--star-times arrivals --coordinator-bandwidth inf``.) Then
tune's top candidates of each, uncoded, ring-allreduce and the tree run for real on the
same processes to the same target (the uncoded simulation's loss at round
``--target-round``), ``--repeats`` times each, and each candidate's predicted time is
set against its real one.

Needs root (ip netns, tc). Nothing leaves the namespaces it makes; they are deleted at
the end (also on Ctrl-C).

    sudo python -m bench.bench_tune_shaped                 # 20mbit, θ of 5,000 values
    sudo python -m bench.bench_tune_shaped --rate 50mbit --repeats 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import tomli_w

from bench.bench_shaped import (
    COORDINATOR_IP,
    ROOT,
    N,
    build,
    parse_rate,
    real_rounds,
    start,
    teardown,
    time_to_target,
)
from codedgd.services.job import Component, JobConfig

# tc's "256kb" (kibibytes): the burst bench_shaped gives every tbf qdisc.
BURST = 256 * 1024
MODELS = {
    "own times, burst measured, the run's machine (default)": [],
    "own times, burst measured, a machine each": ["--cores", "none"],
    "own times, burst and cores stated": ["--link-burst", str(BURST), "--cores", "local"],
    "arrivals, fair (before)": ["--star-times", "arrivals", "--cores", "none"],
}


def job(args: argparse.Namespace, policy: Component, rounds: int) -> JobConfig:
    return JobConfig(
        workers=N,
        rounds=rounds,
        seed=4,
        data=Component("synthetic", {"rows": 100 * N, "dim": args.dim}),
        policy=policy,
        stragglers=Component("exponential", {"mean": args.delay}),
        round_timeout=600,
    )


def target_loss(args: argparse.Namespace) -> float:
    """The uncoded job's loss at round ``--target-round`` on the simulator (every exact
    policy follows the same θ, so the same round reaches it)."""
    from codedgd.services.sim import CostModel, simulate

    config = job(args, Component("uncoded"), args.target_round + 1)
    return float(simulate(config, CostModel.ideal()).records[args.target_round].loss)


def tune(hosts: Any, work: Path, target: float, extra: list[str], probe: Path | None) -> dict:
    """tune's JSON: on a new probe (``probe`` None) or on the kept one."""
    cli = [sys.executable, "-m", "codedgd.client.cli", "tune"]
    if probe is None:
        source = ["--probe", str(work / "job.toml"), "--probe-rounds", "30", "--probe-output",
                  str(work / "probe.json"), "--probe-links"]  # fmt: skip
    else:
        # The links fitted again from the first run's link probes, with this model's burst.
        from codedgd.services.records import read_result_file
        from codedgd.services.tuning import fit_link

        small, medium, large = (read_result_file(work / f"probe.link-{size}.json")[2]
                                for size in ("small", "medium", "large"))  # fmt: skip
        if "--link-burst" in extra:  # (stated)
            burst = float(extra[extra.index("--link-burst") + 1])
            link = fit_link(list(small), list(large), burst=burst).link
        elif "--star-times" in extra:  # (as before 2026-12-01: two sizes, no burst)
            link = fit_link(list(small), list(large), burst=0.0).link
        else:  # (measured, as --probe-links does by default)
            link = fit_link(list(small), list(large), medium=list(medium)).link
            extra = [*extra, "--link-burst", str(link.burst_bytes)]
        bandwidth = link.bandwidth_bytes_per_second
        source = [str(probe), "--link-latency", str(link.latency_seconds),
                  "--link-bandwidth", str(bandwidth)]  # fmt: skip
    done = subprocess.run(
        ["ip", "netns", "exec", hosts.coordinator, *cli, *source,
         "--coordinator", f"{COORDINATOR_IP}:50051", "--target-loss", repr(target),
         "--rounds", "200", "--repeats", "2", "--json", "--no-progress", *extra],
        capture_output=True, text=True, cwd=ROOT, timeout=1800,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"tune {extra}: {done.stderr.strip()[-3000:]}")
    said = ("note:", "links measured")
    notes = [line for line in done.stderr.splitlines() if any(w in line for w in said)]
    for line in notes:
        print(f"    {line[:300]}", file=sys.stderr)
    doc: dict = json.loads(done.stdout)
    return doc


def _no_nulls(doc: dict[str, Any]) -> dict[str, Any]:
    """A job document for TOML, which has no null."""
    return {k: _no_nulls(v) if isinstance(v, dict) else v for k, v in doc.items() if v is not None}


def main() -> None:
    p = argparse.ArgumentParser(
        prog="python -m bench.bench_tune_shaped",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--rate", default="20mbit", help="every NIC's rate (tc's units)")
    p.add_argument("--dim", type=int, default=5000, help="θ's values (8 bytes each)")
    p.add_argument("--delay", type=float, default=0.02, help="exponential delays' mean (s)")
    p.add_argument("--target-round", type=int, default=60)
    p.add_argument("--top", type=int, default=3, help="each model's top candidates run")
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()
    parse_rate(args.rate)
    target = target_loss(args)
    started = time.time()
    hosts = build("cgdts", args.rate)
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        try:
            procs = start(hosts, work)
            time.sleep(8)  # every worker connected
            probe_job = job(args, Component("uncoded"), 30).to_dict()
            (work / "job.toml").write_text(tomli_w.dumps(_no_nulls(probe_job)))
            docs: dict[str, dict] = {}
            for name, extra in MODELS.items():
                first = not docs
                doc = tune(hosts, work, target, extra, None if first else work / "probe.json")
                docs[name] = doc
            predicted = {
                name: {c["label"]: c["predicted_seconds"] for c in doc["candidates"]}
                for name, doc in docs.items()
            }
            policies: dict[str, Component] = {}
            for doc in docs.values():
                for c in doc["candidates"][: args.top]:
                    options = {k: v for k, v in c["policy"].items() if k != "name"}
                    policies[c["label"]] = Component(c["policy"]["name"], options)
            for fixed in (
                Component("uncoded"),
                Component("ring-allreduce"),
                Component("tree", {"fanout": 3, "levels": 2}),
            ):
                label = " ".join([fixed.name, *(f"{k}={v}" for k, v in fixed.options.items())])
                policies.setdefault(label, fixed)
            real: dict[str, float | None] = {}
            for label, policy in policies.items():
                times = []
                for _ in range(args.repeats):
                    run_to = job(args, policy, 250).replace(target_loss=target)  # (stops there)
                    rounds = real_rounds(hosts, run_to, work)
                    reached = time_to_target(rounds, target)
                    times.append(reached[0] if reached else float("inf"))
                real[label] = statistics.median(times)
                print(f"  {label}: real {times}", file=sys.stderr, flush=True)
        finally:
            for proc in procs:
                proc.kill()
                proc.wait()
            teardown(hosts)
    links = "; ".join(
        f"{name}: latency {doc['link']['latency_seconds'] * 1e3:.2f} ms, bandwidth "
        f"{(doc['link']['bandwidth_bytes_per_second'] or float('inf')) / 1e6:.3g} MB/s"
        for name, doc in docs.items()
    )
    print(
        f"rate {args.rate}, θ of {args.dim} values, exponential delays of mean "
        f"{args.delay} s, target loss {target:.6g} (uncoded's round {args.target_round}); "
        f"links fitted: {links}\n"
    )
    best = min(v for v in real.values() if v is not None)
    print("| candidate | real (s) | real / best | " + " | ".join(
        f"predicted, {name} (s)" for name in MODELS) + " |")  # fmt: skip
    print("|---|---:|---:|" + "---:|" * len(MODELS))
    for label, seconds in sorted(real.items(), key=lambda kv: kv[1] or float("inf")):
        cells = []
        for name in MODELS:
            value = predicted[name].get(label)
            cells.append("-" if value is None else f"{value:.2f}")
        print(f"| {label} | {seconds:.2f} | {seconds / best:.2f} | " + " | ".join(cells) + " |")
    print()
    for name, doc in docs.items():
        pick = doc["candidates"][0]["label"]
        print(f"- {name}: picks {pick}, real {real[pick]:.2f} s, {real[pick] / best:.2f}x the best")
    print(f"\n({time.time() - started:.0f} s; bench_tune_shaped.py, {time.strftime('%F')})")


if __name__ == "__main__":
    main()
