"""What a crashed worker costs each policy: the same seeded job with and without a crash.

The ``crash`` straggler model takes ``--count`` seeded workers down when θ of round
``--start`` reaches them and brings each back ``--restart`` seconds later as a new
worker; the job waits up to ``--replace-timeout`` seconds for it when it cannot decode
without it. For each policy the job runs twice, without and with the crash, and the
table gives the training time of both, the difference, the rounds after the crash that
went on without a crashed place (not every place was sent θ), and the relative
difference of the final θ between the two runs (rounding only, for an exact policy).

By default the runs are simulated (``codedgd simulate``'s engine, its default cost model
with the compute constants calibrated on this machine and decoding taken as free, so
that the two runs differ by the crash alone: the times are virtual seconds); ``--real``
runs them as worker OS processes instead, exactly as ``codedgd run`` does (wall seconds).

With ``--spares K`` the job keeps K idle workers standing by (``job.spares``): a lost
place goes to one of them at once, so a worker that never comes back (``--restart -1``)
costs only the spare's join.

    python -m bench.bench_crash
    python -m bench.bench_crash --real --workers 6 --rounds 40
    python -m bench.bench_crash --restart -1 --spares 2
"""

from __future__ import annotations

import argparse
import asyncio
import logging

import numpy as np

from bench.bench_policies import label, parse_policy
from codedgd.services.job import Component, JobConfig
from codedgd.services.records import RoundRecord
from codedgd.services.sim import CostModel, Simulator
from codedgd.services.stragglers import create_straggler_model

DEFAULT_POLICIES = ["uncoded", "ignore-stragglers:s=2", "frc:s=1", "cyclic:s=2"]


def run(config: JobConfig, real: bool) -> tuple[list[RoundRecord], np.ndarray]:
    if real:
        from codedgd.client.local import run_local

        result = asyncio.run(run_local(config))
        assert result.theta is not None
        return list(result.records), np.asarray(result.theta)
    sim = Simulator(config, CostModel(decode_seconds=0.0)).run()
    return list(sim.records), sim.theta


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--rounds", type=int, default=60)
    p.add_argument("--count", type=int, default=2, help="workers that crash")
    p.add_argument("--start", type=int, default=10, help="the round they crash in")
    p.add_argument("--restart", type=float, default=2.0, help="seconds until they are back")
    p.add_argument("--replace-timeout", type=float, default=60.0)
    p.add_argument("--spares", type=int, default=0, help="idle workers standing by")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--policy", action="append", help=f"name:key=value,... (default {DEFAULT_POLICIES})"
    )
    p.add_argument("--real", action="store_true", help="worker OS processes, not simulated")
    a = p.parse_args()
    logging.getLogger("codedgd").setLevel(logging.ERROR)  # "waiting for a replacement"
    crash = Component("crash", {"count": a.count, "start": a.start, "restart": a.restart})
    down = create_straggler_model("crash", crash.options, seed=a.seed, n_workers=a.workers)
    print(
        f"n = {a.workers}, {a.rounds} rounds; workers {list(down.failed)} crash in round "
        f"{a.start}, "
        + ("never back" if a.restart < 0 else f"back {a.restart:g} s later")
        + f"; {a.spares} spare(s); replace_timeout {a.replace_timeout:g} s; "
        + ("real processes (wall seconds)" if a.real else "simulated (virtual seconds)")
    )
    print(
        "| policy | time, no crash | time, crash | extra | rounds without a crashed place "
        "| rel. θ difference |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for policy in map(parse_policy, a.policy or DEFAULT_POLICIES):
        base = JobConfig(
            workers=a.workers,
            rounds=a.rounds,
            seed=a.seed,
            policy=policy,
            replace_timeout=a.replace_timeout,
            spares=a.spares,
        )
        calm, calm_theta = run(base, a.real)
        hit, hit_theta = run(base.replace(stragglers=crash), a.real)
        without = sum(1 for r in hit[a.start + 1 :] if r.computations < a.workers)
        diff = float(np.linalg.norm(hit_theta - calm_theta) / np.linalg.norm(calm_theta))
        t0, t1 = calm[-1].wall_seconds, hit[-1].wall_seconds
        print(
            f"| {label(policy)} | {t0:.3f} | {t1:.3f} | {t1 - t0:+.3f} | {without} | {diff:.1e} |"
        )


if __name__ == "__main__":
    main()
