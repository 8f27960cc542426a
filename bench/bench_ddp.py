"""Time to a held-out accuracy on Fashion-MNIST: codedgd's policies against PyTorch DDP.

One machine, 8 workers, the same network (``--model mlp`` or ``cnn``), the same global
batch (``--batch`` rows of each of the 8 partitions a round; DDP: each rank's batch is its
share of the same rows, averaged by all_reduce), the same step size and the same injected
delays: each worker, each round, sleeps an i.i.d. exponential delay of mean ``--delay``
seconds after computing (codedgd's ``exponential`` straggler model; each DDP rank sleeps
the same seeded draws before its all_reduce, so DDP waits for its slowest rank as every
synchronous all-reduce does). Time is training wall-clock, evaluation excluded, to the
first evaluation at or above ``--target`` accuracy on the 10,000 test images.

codedgd runs real worker processes (``codedgd.client.local.run_local``); DDP runs
``torch.distributed`` with the gloo backend over loopback, ``DistributedDataParallel``
around the same module. torch is needed (``pip install torch``), and Fashion-MNIST's IDX
files (``apt-get install dataset-fashion-mnist``).

    python -m bench.bench_ddp --model mlp --delay 0 --target 0.80
    python -m bench.bench_ddp --model mlp --delay 0.1 --target 0.80
    python -m bench.bench_ddp --model cnn --delay 0.1 --target 0.75 --rounds 600
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import socket
import subprocess
import sys
import time
from typing import Any

from codedgd.client.local import run_local
from codedgd.services.job import Component, JobConfig

N = 8
POLICIES: dict[str, Component] = {
    "uncoded": Component("uncoded"),
    "ignore-stragglers s=2": Component("ignore-stragglers", {"s": 2}),
    "erasurehead r=2 K=4": Component("erasurehead", {"r": 2, "K": 4}),
    "frc s=1": Component("frc", {"s": 1}),
    "cyclic s=1": Component("cyclic", {"s": 1}),
    "ring-allreduce": Component("ring-allreduce"),
    # N = m + ... + m^L workers: at n = 8 the only tree is one level of 8 (the cyclic code
    # with its decode at the coordinator, results sent over the peer plane's framing).
    "codedreduce m=8 L=1 s=1": Component("codedreduce", {"fanout": 8, "levels": 1, "s": 1}),
}

# One DDP rank: the same network and data as codedgd's workers, its share of each round's
# batch, the same seeded exponential delays, timing with evaluation excluded.
DDP_RANK = r"""
import json, math, sys, time
import numpy as np, torch, torch.distributed as dist
from codedgd.services.data.idx import load_fashion_mnist
from codedgd.services.models import create_model, initial_theta
from codedgd.services.stragglers import create_straggler_model
rank, n, port, args = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n)
ds = load_fashion_mnist(seed=args["seed"])
model = create_model(args["model"], args["options"])
theta0 = initial_theta(model, ds.dim, args["seed"])
net = model.module(theta0, ds.dim)
ddp = torch.nn.parallel.DistributedDataParallel(net)
opt = torch.optim.SGD(ddp.parameters(), lr=args["lr"])
shard = np.array_split(np.random.default_rng(args["seed"]).permutation(ds.n_train), n)[rank]
X = torch.tensor(ds.X_train[shard], dtype=model._dtype)
y = torch.tensor(ds.y_train[shard], dtype=torch.long)
delays = create_straggler_model("exponential", {"mean": args["delay"]}, seed=args["seed"],
                                n_workers=n) if args["delay"] > 0 else None
rng = np.random.default_rng([args["seed"], rank])
batch = args["batch"]
wall, out = 0.0, []
dist.barrier()
for t in range(args["rounds"]):
    start = time.perf_counter()
    rows = torch.tensor(rng.choice(X.shape[0], size=batch, replace=False))
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(ddp(X[rows]), y[rows])
    if delays is not None:
        time.sleep(delays.delay(rank, t, 0.0, 1.0 / n))
    loss.backward()          # DDP all-reduces (averages) the gradients here: the sync
    opt.step()
    wall += time.perf_counter() - start
    if (t + 1) % args["eval_every"] == 0 or t + 1 == args["rounds"]:
        stop = torch.tensor([0])
        if rank == 0:        # evaluation, outside the timed steps
            theta = torch.nn.utils.parameters_to_vector(net.parameters()).detach().double()
            acc = model.metric(theta.numpy(), ds.X_test, ds.y_test)
            out.append([t, wall, acc])
            stop[0] = int(acc >= args["target"])
        dist.broadcast(stop, 0)  # every rank waits for it: the next step starts together
        if int(stop):
            break
if rank == 0:
    print(json.dumps(out), flush=True)
dist.destroy_process_group()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ddp_time(a: argparse.Namespace) -> tuple[float | None, list[list[float]]]:
    args = {
        "seed": a.seed,
        "model": a.model,
        "options": _options(a),
        "lr": a.lr,
        "delay": a.delay,
        "batch": a.batch,  # a rank's rows: the same global batch as codedgd's 8 x batch
        "rounds": a.rounds,
        "eval_every": a.eval_every,
        "target": a.target,
    }
    port = _free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", DDP_RANK, str(r), str(N), str(port), json.dumps(args)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(N)
    ]
    out, err = procs[0].communicate(timeout=3600)
    for p in procs[1:]:
        p.wait(timeout=600)
    if procs[0].returncode != 0:
        raise SystemExit(f"DDP rank 0 failed:\n{err[-3000:]}")
    evals: list[list[float]] = json.loads(out.strip().splitlines()[-1])
    reached = next((wall for _, wall, acc in evals if acc >= a.target), None)
    return reached, evals


def _options(a: argparse.Namespace) -> dict[str, Any]:
    return {"hidden": a.hidden} if a.model == "mlp" else {}


async def codedgd_time(policy: Component, a: argparse.Namespace) -> tuple[float | None, int]:
    config = JobConfig(
        workers=N,
        rounds=a.rounds,
        seed=a.seed,
        eval_every=a.eval_every,
        data=Component("fashion-mnist"),
        model=Component(a.model, _options(a)),
        policy=policy,
        optimizer={"lr": a.lr},
        batch_size=a.batch,
        stragglers=Component("exponential", {"mean": a.delay}) if a.delay else Component("none"),
        round_timeout=600,
    )
    run = await run_local(config)
    if run.state != "done":
        raise SystemExit(f"{policy.name}: {run.error}")
    for record in run.records:
        if not math.isnan(record.metric) and record.metric >= a.target:
            return record.wall_seconds, record.round + 1
    return None, len(run.records)


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", choices=("mlp", "cnn"), default="mlp")
    p.add_argument("--hidden", type=int, default=128, help="the mlp's hidden units")
    p.add_argument("--delay", type=float, default=0.1, help="Exp delay mean (s); 0: none")
    p.add_argument("--target", type=float, default=0.80, help="held-out accuracy to reach")
    p.add_argument("--batch", type=int, default=32, help="rows of each partition a round")
    p.add_argument("--lr", type=float, default=0.5)
    p.add_argument("--rounds", type=int, default=400, help="rounds of every codedgd run")
    p.add_argument("--eval-every", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--policies", default=",".join(POLICIES), help="comma-separated labels")
    a = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    started = time.time()
    print(
        f"Fashion-MNIST, {a.model}, n = {N}, batch {a.batch} rows per partition "
        f"({N * a.batch} a round), lr {a.lr}, Exp delays of mean {a.delay:g} s; "
        f"training seconds to {a.target:.0%} held-out accuracy\n"
    )
    print("| run | seconds to target | rounds | vs DDP |")
    print("|---|---:|---:|---:|")
    ddp, evals = ddp_time(a)
    steps = next((int(t) + 1 for t, _, acc in evals if acc >= a.target), None)
    print(f"| torch DDP (gloo) | {_fmt(ddp)} | {steps or '—'} | 1.00x |", flush=True)
    for label in a.policies.split(","):
        seconds, rounds = await codedgd_time(POLICIES[label], a)
        ratio = f"{ddp / seconds:.2f}x" if ddp and seconds else "—"
        shown = rounds if seconds is not None else "—"
        print(f"| codedgd {label} | {_fmt(seconds)} | {shown} | {ratio} |", flush=True)
    print(f"\n({time.time() - started:.0f} s; bench_ddp.py, {time.strftime('%F')})")


def _fmt(seconds: float | None) -> str:
    return f"{seconds:.1f}" if seconds is not None else "not reached"


if __name__ == "__main__":
    asyncio.run(main())
