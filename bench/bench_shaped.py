"""Topologies on bandwidth-limited links: network namespaces shaped with tc tbf.

A switch namespace with a bridge; the coordinator (10.78.0.1) and 12 workers
(10.78.0.11-22), each in its own namespace with a veth into the bridge, every link shaped
by a tbf qdisc in both directions (``--rate``): a NIC per host, the coordinator's like the
workers'. The coordinator and the workers are codedgd's own processes (workers with the
Peer service on their address). For each delay regime, five policies run one after
another on the same processes: the star's ``uncoded``, the best flat code at s = 1
(``cyclic``), ``ring-allreduce``, ``tree`` (fanout 3, 2 levels) and ``codedreduce``
(fanout 3, 2 levels, s = 1); then the simulator runs the same jobs on its link model with
the same rate (and compute calibrated on this machine), so the two can be compared.

Regimes: no injected delay; i.i.d. exponential delays of mean ``--delay`` (at least twice
a worker's full-data compute time, a gradient over every training row timed on this
machine as the simulator calibrates it); one random worker a round delayed by three times
``--delay`` (so at least 2.5 times that compute time). ``--policies`` adds the
communication-efficient star codes at the same s (group-mds and polynomial, s = 1, m = 2:
half-length messages).

``--sweep M1,M2,...`` runs the exponential regime at each mean instead, for the five
topology policies, and plots round time against the delay mean (real and simulated), so
the crossovers show (``--figure``; the numbers go to ``--out``).

``--data amazon`` trains on the real dataset (ℓ = 241,915) instead, and reports each
exact policy's time to a target loss: the loss gradient descent reaches at round
``--target-round`` (every exact policy follows the same θ, so they reach it at the same
round; the time it takes them differs).

Needs root (ip netns, tc). Nothing leaves the namespaces it makes; they are deleted at
the end (also on Ctrl-C).

    sudo python -m bench.bench_shaped                      # 200mbit, ℓ = 250,000 (2 MB)
    sudo python -m bench.bench_shaped --rate 100mbit --rounds 8
    sudo python -m bench.bench_shaped --policies uncoded,cyclic,group-mds,polynomial
    sudo python -m bench.bench_shaped --sweep 0,0.25,0.5,1,2 --rounds 6
    sudo CODEDGD_DATA_DIR=../shared/datasets python -m bench.bench_shaped --data amazon \
        --rounds 30 --target-round 25 --delay 0.5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from codedgd.services.job import Component, JobConfig

ROOT = Path(__file__).resolve().parent.parent
SUBNET = "10.78.0"
COORDINATOR_IP = f"{SUBNET}.1"
N = 12
WORKER_IPS = [f"{SUBNET}.{11 + i}" for i in range(N)]
# name → (label, policy)
ALL_POLICIES = {
    "uncoded": ("uncoded (star)", Component("uncoded")),
    "cyclic": ("cyclic s=1", Component("cyclic", {"s": 1})),
    "group-mds": ("group-mds s=1 m=2", Component("group-mds", {"s": 1, "m": 2})),
    "polynomial": ("polynomial s=1 m=2", Component("polynomial", {"s": 1, "m": 2})),
    "ring": ("ring-allreduce", Component("ring-allreduce")),
    "tree": ("tree 3x2", Component("tree", {"fanout": 3, "levels": 2})),
    "codedreduce": (
        "codedreduce 3x2 s=1",
        Component("codedreduce", {"fanout": 3, "levels": 2, "s": 1}),
    ),
}
TOPOLOGY_POLICIES = "uncoded,cyclic,ring,tree,codedreduce"
POLICIES = tuple(ALL_POLICIES[name] for name in TOPOLOGY_POLICIES.split(","))


def run(*args: str, check: bool = True) -> str:
    return subprocess.run(args, check=check, capture_output=True, text=True).stdout


def parse_rate(rate: str) -> float:
    """tc's rate ("200mbit") in bytes per second."""
    units = {"kbit": 1e3 / 8, "mbit": 1e6 / 8, "gbit": 1e9 / 8}
    for suffix, scale in units.items():
        if rate.endswith(suffix):
            return float(rate[: -len(suffix)]) * scale
    raise SystemExit(f"--rate {rate!r}: give kbit, mbit or gbit (tc's units)")


@dataclass
class Hosts:
    prefix: str
    namespaces: list[str]

    @property
    def coordinator(self) -> str:
        return f"{self.prefix}-c"

    def worker(self, i: int) -> str:
        return f"{self.prefix}-w{i}"


def build(prefix: str, rate: str) -> Hosts:
    hosts = Hosts(prefix, [])
    switch = f"{prefix}-sw"
    run("ip", "netns", "add", switch)
    hosts.namespaces.append(switch)
    run("ip", "-n", switch, "link", "add", "br0", "type", "bridge")
    run("ip", "-n", switch, "link", "set", "br0", "up")
    members = [(hosts.coordinator, "pc", COORDINATOR_IP)]
    members += [(hosts.worker(i), f"pw{i}", a) for i, a in enumerate(WORKER_IPS)]
    for ns, port, address in members:
        run("ip", "netns", "add", ns)
        hosts.namespaces.append(ns)
        run("ip", "-n", switch, "link", "add", port, "type", "veth", "peer", "name", "eth0",
            "netns", ns)  # fmt: skip
        run("ip", "-n", switch, "link", "set", port, "master", "br0", "up")
        run("ip", "-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
        run("ip", "-n", ns, "link", "set", "eth0", "up")
        run("ip", "-n", ns, "link", "set", "lo", "up")
        for where, dev in ((ns, "eth0"), (switch, port)):  # its sending, then its receiving
            run("ip", "netns", "exec", where, "tc", "qdisc", "add", "dev", dev, "root", "tbf",
                "rate", rate, "burst", "256kb", "latency", "200ms")  # fmt: skip
    return hosts


def teardown(hosts: Hosts) -> None:
    for ns in reversed(hosts.namespaces):
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def start(hosts: Hosts, logs: Path) -> list[subprocess.Popen[bytes]]:
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    cli = [sys.executable, "-m", "codedgd.client.cli"]
    procs = []

    def spawn(name: str, ns: str, argv: list[str]) -> None:
        log = (logs / f"{name}.log").open("wb")
        procs.append(
            subprocess.Popen(
                ["ip", "netns", "exec", ns, *argv],
                env=env,
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )

    spawn(
        "coordinator",
        hosts.coordinator,
        [*cli, "coordinator", "--listen", f"{COORDINATOR_IP}:50051", "--assign-timeout", "300"],
    )
    time.sleep(2)
    for i, address in enumerate(WORKER_IPS):
        spawn(
            f"worker{i}",
            hosts.worker(i),
            [
                *cli,
                "worker",
                "--coordinator",
                f"{COORDINATOR_IP}:50051",
                "--name",
                f"w{i}",
                "--peer-listen",
                f"{address}:50052",
            ],
        )
    return procs


def job(policy: Component, stragglers: Component, args: argparse.Namespace) -> JobConfig:
    if args.data == "amazon":  # the real problem, as the papers train it
        return JobConfig(
            workers=N,
            rounds=args.rounds,
            seed=4,
            data=Component("amazon"),
            model=Component("logistic", {"l2": 1e-4}),
            policy=policy,
            stragglers=stragglers,
            round_timeout=600,
        )
    return JobConfig(
        workers=N,
        rounds=args.rounds + args.warmup,
        seed=4,
        eval_every=10**6,
        data=Component(
            "synthetic",
            {"rows": args.rows, "dim": args.dim, "density": args.density, "test_fraction": 0.5},
        ),
        model=Component("logistic", {"l2": 0.0}),
        optimizer={"lr": 1e-3},
        policy=policy,
        stragglers=stragglers,
        round_timeout=600,
    )


# Run in the coordinator's namespace: submit a job (JSON), follow it, keep its rounds.
SUBMIT = r"""
import asyncio, json, math, sys
from codedgd.client import Client, JobConfig
async def follow():
    config = JobConfig.from_json(open(sys.argv[2]).read())
    async with Client(sys.argv[1]) as client:
        job_id = await client.submit(config)
        rounds = [
            [r.round_seconds, r.wall_seconds, None if math.isnan(r.loss) else r.loss]
            async for r in client.watch(job_id)
        ]
    json.dump(rounds, open(sys.argv[3], "w"))
asyncio.run(follow())
"""


def real(hosts: Hosts, config: JobConfig, work: Path, warmup: int) -> float:
    """Mean round seconds of ``config`` on the namespaces (after ``warmup`` rounds)."""
    return statistics.mean(r[0] for r in real_rounds(hosts, config, work)[warmup:])


def real_rounds(hosts: Hosts, config: JobConfig, work: Path) -> list[list[float]]:
    """[round seconds, wall seconds, loss] of every round of ``config`` on the namespaces."""
    doc, out = work / "job.json", work / "rounds.json"
    doc.write_text(config.to_json())
    done = subprocess.run(
        [
            "ip",
            "netns",
            "exec",
            hosts.coordinator,
            sys.executable,
            "-c",
            SUBMIT,
            f"{COORDINATOR_IP}:50051",
            str(doc),
            str(out),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    if done.returncode != 0:
        raise SystemExit(f"{config.policy.name}: {done.stderr.strip()[-2000:]}")
    rounds: list[list[float]] = json.loads(out.read_text())
    return rounds


def simulated(config: JobConfig, rate: float, latency: float, warmup: int, sharing: str) -> float:
    from codedgd.services.sim import CostModel, simulate

    cost = CostModel(
        latency_seconds=latency,
        bandwidth_bytes_per_second=rate,
        ingress_bandwidth_bytes_per_second=rate,
        egress_bandwidth_bytes_per_second=rate,
        sharing=sharing,
    )
    result = simulate(config, cost)
    return statistics.mean(r.round_seconds for r in result.records[warmup:])


def time_to_target(rounds: list[list[float]], target: float) -> tuple[float, int] | None:
    """(wall seconds, round) at which a run's loss first reached ``target``."""
    for t, (_, wall, loss) in enumerate(rounds):
        if loss is not None and loss <= target:
            return wall, t
    return None


def plot_sweep(means: list[float], table: dict[str, dict[str, list[float]]], path: Path) -> None:
    """Round time against the delay mean, one line per policy (real: solid with markers;
    the simulator: dashed): the whole range, and its start where the lines cross."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from codedgd.services.report.plots import MARKERS

    colors = ("#333333", "#2ca02c", "#1f77b4", "#ff7f0e", "#d62728", "#9467bd", "#8c564b")
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.6), gridspec_kw={"width_ratios": [3, 2]})
    for ax, upto in zip(axes, (max(means), 1.0), strict=True):
        shown = [i for i, m in enumerate(means) if m <= upto]
        xs = [means[i] for i in shown]
        for k, (label, cells) in enumerate(table.items()):
            color = colors[k % len(colors)]
            ax.plot(xs, [cells["real"][i] for i in shown], color=color, marker=MARKERS[k],
                    label=label)  # fmt: skip
            ax.plot(xs, [cells["sim"][i] for i in shown], color=color, linestyle="--",
                    alpha=0.55)  # fmt: skip
        ax.set_xlabel("mean of the i.i.d. exponential delay (s)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("mean round time (s)")
    axes[0].set_title("12 workers, every link 200 mbit (solid: real; dashed: simulated)",
                      fontsize=10)  # fmt: skip
    axes[1].set_title("the start, where the lines cross", fontsize=10)
    axes[0].legend(fontsize="small")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=150)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rate", default="200mbit", help="tbf rate of every host's link")
    p.add_argument("--dim", type=int, default=250_000, help="ℓ (a gradient is 8ℓ bytes)")
    p.add_argument("--rows", type=int, default=24_000, help="synthetic rows (half train)")
    p.add_argument("--density", type=float, default=0.001)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--latency", type=float, default=1e-4, help="the simulator's per message")
    p.add_argument(
        "--delay",
        type=float,
        default=0.5,
        help="seconds: the exponential regime's mean, and a third of the slow worker's delay "
        "(default 0.5: comparable to the star's round on these links)",
    )
    p.add_argument(
        "--policies",
        default=None,
        help=f"comma-separated, of {', '.join(ALL_POLICIES)} (default: {TOPOLOGY_POLICIES}; "
        "with --data amazon all of them)",
    )
    p.add_argument(
        "--sweep", default=None, help="comma-separated exponential delay means (seconds)"
    )
    p.add_argument("--figure", default="docs/img/topologies-sweep.png", help="--sweep's plot")
    p.add_argument("--out", default="results/shaped.json", help="the numbers, as JSON")
    p.add_argument("--data", choices=("synthetic", "amazon"), default="synthetic")
    p.add_argument(
        "--target-round",
        type=int,
        default=25,
        help="--data amazon: the target is the loss gradient descent reaches at this round",
    )
    p.add_argument(
        "--replot", action="store_true", help="redraw --figure from --out (a --sweep's JSON)"
    )
    a = p.parse_args()
    if a.replot:
        doc = json.loads(Path(a.out).read_text())
        plot_sweep(doc["means"], doc["rounds"], Path(a.figure))
        return
    if os.geteuid() != 0:
        raise SystemExit("bench_shaped needs root (ip netns, tc)")
    default = ",".join(ALL_POLICIES) if a.data == "amazon" else TOPOLOGY_POLICIES
    names = (a.policies or default).split(",")
    unknown = [n for n in names if n not in ALL_POLICIES]
    if unknown:
        raise SystemExit(f"--policies: unknown {unknown}; choose from {', '.join(ALL_POLICIES)}")
    policies = [ALL_POLICIES[n] for n in names]
    from codedgd.services.sim import Simulator

    # A worker's full-data gradient on this machine, as the simulator calibrates it.
    calibration = Simulator(job(policies[0][1], Component("none"), a)).calibration
    assert calibration is not None
    compute = calibration.full_seconds
    delay = max(a.delay, 2 * compute)  # at least twice the compute, as the regimes ask
    regimes = [
        ("no delay", Component("none")),
        (f"Exp delays, mean {delay:.3g} s", Component("exponential", {"mean": delay})),
        (
            f"1 worker/round +{3 * delay:.3g} s",
            Component("fixed", {"count": 1, "delay": 3 * delay}),
        ),
    ]
    means = [float(x) for x in a.sweep.split(",")] if a.sweep else []
    prefix = f"cdgb{os.getpid() % 10000}"
    rate = parse_rate(a.rate)
    work = Path(tempfile.mkdtemp(prefix="bench-shaped-"))
    hosts = build(prefix, a.rate)
    procs: list[subprocess.Popen[bytes]] = []
    started = time.time()
    try:
        procs = start(hosts, work)
        time.sleep(5)
        dim = 241_915 if a.data == "amazon" else a.dim
        print(
            f"n = {N}, ℓ = {dim:,} ({8 * dim / 1e6:.1f} MB), every link {a.rate}, a "
            f"full-data gradient {compute * 1e3:.0f} ms"
        )
        if a.data == "amazon":
            stragglers = Component("exponential", {"mean": delay}) if a.delay else Component("none")
            results = {}
            for label, policy in policies:
                results[label] = real_rounds(hosts, job(policy, stragglers, a), work)
            reference = results[policies[0][0]]
            target = reference[min(a.target_round, len(reference) - 1)][2]
            print(
                f"\nAmazon, {stragglers.name} delays"
                + (f" (mean {delay:.3g} s)" if a.delay else "")
                + f"; target loss {target:.6g} (gradient descent's at round {a.target_round})\n"
            )
            print("| policy | mean round (s) | time to target (s) | rounds | vs uncoded |")
            print("|---|---:|---:|---:|---:|")
            base = time_to_target(reference, target)
            for label, rounds in results.items():
                reached = time_to_target(rounds, target)
                mean = statistics.mean(r[0] for r in rounds[1:])
                if reached is None:
                    print(f"| {label} | {mean:.3f} | not reached | | |")
                    continue
                ratio = base[0] / reached[0] if base else float("nan")
                print(f"| {label} | {mean:.3f} | {reached[0]:.1f} | {reached[1]} | {ratio:.2f}x |")
            Path(a.out).parent.mkdir(parents=True, exist_ok=True)
            Path(a.out).write_text(json.dumps({"target": target, "rounds": results}, indent=1))
        elif means:
            print("mean round seconds, real / simulated (fair links), by exponential delay mean\n")
            print("| delay mean (s) | " + " | ".join(label for label, _ in policies) + " |")
            print("|---|" + "---:|" * len(policies))
            table: dict[str, dict[str, list[float]]] = {
                label: {"real": [], "sim": []} for label, _ in policies
            }
            for mean in means:
                stragglers = (
                    Component("exponential", {"mean": mean}) if mean > 0 else Component("none")
                )
                cells = []
                for label, policy in policies:
                    config = job(policy, stragglers, a)
                    measured = real(hosts, config, work, a.warmup)
                    fair = simulated(config, rate, a.latency, a.warmup, "fair")
                    table[label]["real"].append(measured)
                    table[label]["sim"].append(fair)
                    cells.append(f"{measured:.3f} / {fair:.3f}")
                print(f"| {mean:g} | " + " | ".join(cells) + " |", flush=True)
            plot_sweep(means, table, Path(a.figure))
            Path(a.out).parent.mkdir(parents=True, exist_ok=True)
            Path(a.out).write_text(json.dumps({"means": means, "rounds": table}, indent=1))
            print(f"\nfigure: {a.figure}")
        else:
            print(
                "mean round seconds: real / simulated with first-in-first-out links / "
                "simulated with fair sharing\n"
            )
            print("| regime | " + " | ".join(name for name, _ in policies) + " |")
            print("|---|" + "---:|" * len(policies))
            for regime, stragglers in regimes:
                cells = []
                for _, policy in policies:
                    config = job(policy, stragglers, a)
                    measured = real(hosts, config, work, a.warmup)
                    fifo = simulated(config, rate, a.latency, a.warmup, "fifo")
                    fair = simulated(config, rate, a.latency, a.warmup, "fair")
                    cells.append(f"{measured:.3f} / {fifo:.3f} / {fair:.3f}")
                print(f"| {regime} | " + " | ".join(cells) + " |", flush=True)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        teardown(hosts)
    took = time.time() - started
    print(f"\n({took:.0f} s; logs in {work}; python -m bench.bench_shaped, {time.strftime('%F')})")


if __name__ == "__main__":
    main()
