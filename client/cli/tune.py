"""`codedgd tune`: the best policy for this cluster, from a finished run's own delays."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from codedgd.client.cli.options import (
    DEFAULT_ADDRESS,
    EPILOG,
    add_security_arguments,
    cores_option,
    security_from_args,
)
from codedgd.services.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Sequence

    import numpy as np

    from codedgd.services.job import JobConfig
    from codedgd.services.records import RoundRecord
    from codedgd.services.tuning import Link, LinkFit, Observations


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``tune`` to a subparsers object."""
    from codedgd.services.policies.auto import GROUP_POLICIES
    from codedgd.services.tuning.search import HOLD, SEARCHED, TOPOLOGIES

    p: argparse.ArgumentParser = subparsers.add_parser(
        "tune",
        help="pick the policy for your cluster from a finished run's delays",
        description=(
            "Read a result file of `codedgd run` (or `simulate`, or `submit -o`): each "
            "worker's compute seconds and its delay beyond compute in every round "
            "(a cancelled worker's is censored: slower than when its Cancel went). Fit the "
            "delays "
            "(shifted exponential and Pareto, by maximum likelihood with the censored "
            "values; Kolmogorov-Smirnov distance to the data) and each worker's speed, then "
            "simulate every candidate policy and parameter valid for the job's n (uncoded, "
            "ignore-stragglers, frc, cyclic, erasurehead, the lazy lag-ps, g-lag and lagc, "
            "and hetero for a mixed pool) on the same data, model and seed, replaying "
            "resampled rounds of the recorded delays, and print the candidates ranked by "
            "predicted time to the target loss (where the "
            f"loss gets there and stays there for {HOLD} rounds, or first gets there for an "
            "exact or lazy rule whose replays all take the same path; median and range over "
            "--repeats replays), with their compute, upload and data "
            "replication. With --link-latency and --link-bandwidth (the links between "
            "workers, which a run's delays do not measure), or with --probe-links (which "
            "measures them on the live pool), the worker-to-worker topologies "
            "(ring-allreduce, tree, codedreduce) are searched too; a run of one of those "
            "is fitted from its workers' own times, which hold no network time, and needs "
            "them (every candidate then pays the links). The coordinator's NIC is one "
            "link too, at the links' rate unless --coordinator-bandwidth says otherwise: "
            "a star's messages queue on it (a star run's arrivals lose θ's queue, which "
            "every star candidate's rounds put back). "
            "--write saves the winner as a job file for `codedgd run --config`; "
            "--write-auto saves one of `auto` started at the group size of the best "
            "candidate it can run, with each worker's slowness as its prior and its typical "
            "workers' delay law as its tail. "
            "With --probe JOB.toml it first runs a short uncoded job on the live pool "
            "(--coordinator) and tunes on that. With --lr it searches the step size too. "
            "See docs/tuning.md."
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "results",
        nargs="?",
        metavar="RESULTS.json",
        help="the finished run's result file (or --probe: run a short job first)",
    )
    probe = p.add_argument_group("probing the live pool instead (a short uncoded job)")
    probe.add_argument(
        "--probe",
        metavar="JOB.toml",
        help="submit this job to --coordinator as uncoded for --probe-rounds rounds, save "
        "its rounds (per-worker timings included) to --probe-output, and tune on them",
    )
    probe.add_argument(
        "--probe-rounds", type=int, default=30, help="rounds of the probe job (default 30)"
    )
    probe.add_argument(
        "--probe-output",
        metavar="PROBE.json",
        default="probe.json",
        help="where the probe's result file goes (default ./probe.json)",
    )
    probe.add_argument(
        "--probe-links",
        action="store_true",
        help="measure the links between workers on the live pool (--coordinator), for the "
        "topologies: uncoded jobs of one worker, with 8 kB, 500 kB (unless --link-burst is "
        "given) and 2 MB messages, 20 rounds each (their result files beside "
        "--probe-output); the fitted latency, bandwidth and burst stand for --link-latency, "
        "--link-bandwidth and --link-burst. With a result file or --probe",
    )
    probe.add_argument("--coordinator", default=DEFAULT_ADDRESS, help="host:port")
    add_security_arguments(p, server=False)
    p.add_argument(
        "--trace",
        metavar="TRACE.json",
        help="take the delays from this recorded trace instead of the result file's rounds: "
        "seconds beyond compute, as .json (a list of rounds, each a list of per-worker "
        'delays, or {"delays": that}) or .csv (the header round,worker,delay, a row per '
        "worker and round)",
    )
    target = p.add_mutually_exclusive_group()
    target.add_argument(
        "--target-loss",
        type=float,
        help="training loss to reach (default: the run's target_loss, with --probe "
        "JOB.toml's, else the loss the run ended at)",
    )
    target.add_argument(
        "--target-gap",
        type=float,
        metavar="EPS",
        help="reach F <= F*(1 + EPS), F* the optimal loss of the problem (solved once by "
        "L-BFGS and cached): 0.01 is a loose target, 1e-4 a tight one that approximate "
        "codes may never reach",
    )
    p.add_argument(
        "--rounds",
        type=int,
        help="most rounds a candidate may take (default: twice the run's rounds; with "
        "--probe, at least JOB.toml's)",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="seeded replays per candidate, for the interval (default 3)",
    )
    p.add_argument(
        "--source-draws",
        type=int,
        default=0,
        metavar="N",
        help="predict the --top candidates again on N other sources the cluster could "
        "have given (the run's rounds drawn with replacement, the delays' law refitted): "
        "the range of those predictions shows how much the one run's luck moves them, "
        "which the replays' range does not (a heavy tail over few rounds); N x --top x "
        "--repeats more simulations (default 0: none)",
    )
    p.add_argument(
        "--jobs",
        "-j",
        type=int,
        default=0,
        help="candidates simulated at once, each in a process of its own (default 0: as "
        "many as the CPUs this process may use; 1: one after another, in this process)",
    )
    p.add_argument(
        "--policy",
        action="append",
        choices=SEARCHED + TOPOLOGIES,
        help="search only these policies (repeatable; default all of them: the star "
        "policies, and the topologies too with --link-latency and --link-bandwidth or "
        "--probe-links)",
    )
    link = p.add_argument_group(
        "the links between workers (searches ring-allreduce, tree and codedreduce too)"
    )
    link.add_argument(
        "--link-latency",
        type=float,
        metavar="SECONDS",
        help="one hop's latency between two workers (a run's delays do not measure it)",
    )
    link.add_argument(
        "--link-bandwidth",
        type=float,
        metavar="BYTES_PER_S",
        help="one worker's link bandwidth, bytes/s (inf: free); give both or neither",
    )
    link.add_argument(
        "--coordinator-bandwidth",
        type=float,
        metavar="BYTES_PER_S",
        help="the coordinator's NIC, bytes/s each way, shared by every message it sends or "
        "receives: a star's n copies of θ and n gradients queue on it, a tree's root hears "
        "only its children (default: as fast as a worker's link, measured or stated; inf: "
        "unlimited)",
    )
    link.add_argument(
        "--link-burst",
        type=float,
        metavar="BYTES",
        help="every NIC's token bucket, bytes each way (tc tbf's burst, a cloud NIC's "
        "burst allowance): what a NIC's bucket holds goes at once, the rest at its rate, "
        "and it refills at its rate. Default: measured by --probe-links (a third, medium "
        "probe: a burst between its small and medium messages, 8-500 kB), else 0 (none). "
        "Stated, --probe-links puts only what is beyond it down to the bandwidth",
    )
    link.add_argument(
        "--coordinator-sharing",
        choices=["fair", "fifo"],
        help="how the coordinator's NIC carries its messages: side by side, each of n "
        "copies of θ after n copies' time (fair: TCP flows, as `codedgd run` sends them), "
        "or one after another in worker order (fifo: `codedgd simulate`'s default "
        "--sharing). Default: a simulated run's own (its result file says), else fair. "
        "The candidates' simulated rounds share every NIC so (a tree parent's too), and "
        "a star run read by its arrivals has each worker's wait for θ taken out so",
    )
    link.add_argument(
        "--star-times",
        choices=["own", "arrivals"],
        help="what times a star run's workers by (default: own, when the links are known "
        "and its workers sent their own times; else arrivals): own, each worker's time "
        "from θ to its result ready, sent with its result since 2026-12-01, no network in "
        "it, so every candidate pays the links; arrivals, when its result reached the "
        "coordinator, network and the NIC's queue in it (--coordinator-sharing)",
    )
    link.add_argument(
        "--cores",
        type=_cores,
        metavar="CORES",
        help="the pool's processes (the coordinator and every worker) share ONE machine of "
        "this many cores ('local': this one's), as `codedgd run` or a bench of network "
        "namespaces runs them: every candidate that pays the links pays each message's CPU "
        "at both ends too, on those cores (the simulator's --cores model; a ring's or "
        "tree's hops: bench/bench_host_cpu.py --peer). 'none': a machine per process. "
        "Default: as the run's records say (each worker names its machine, since "
        "2026-12-01): one machine's cores when the coordinator and every worker ran on "
        "the same one and the links are known, else a machine per process",
    )
    p.add_argument(
        "--lr",
        action="append",
        metavar="LR",
        help="run every candidate at these step sizes (repeatable: a number, auto = 1/L, or "
        "F/L, e.g. 0.5/L; default: the run's own only); --write and --write-auto write the "
        "chosen one's",
    )
    p.add_argument("--top", type=int, default=8, help="candidates to print (default 8)")
    p.add_argument(
        "--write",
        metavar="JOB.toml",
        help="write the winner as a job file: the run's job (with --probe, JOB.toml) with "
        "the winner's policy",
    )
    p.add_argument(
        "--write-auto",
        metavar="JOB.toml",
        help="write a job file of --policy auto that starts at the group size r of the best "
        f"candidate auto can run ({', '.join(GROUP_POLICIES)}) and adapts from there, "
        "with each worker's slowness on the run as its prior (for workers it has not heard) "
        "and its typical workers' delay law as its tail (for the delays it cancels)",
    )
    p.add_argument(
        "--fit-figure",
        metavar="FIT.png",
        help="plot the delays' distribution and the fitted families (needs codedgd[report])",
    )
    p.add_argument("--json", action="store_true", help="print the whole outcome as JSON")
    p.add_argument("--data-dir", help="directory of the real datasets (default $CODEDGD_DATA_DIR)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_tune)
    return p


def cmd_tune(args: argparse.Namespace) -> int:
    import numpy as np

    from codedgd.services.job import JobConfig
    from codedgd.services.policies.auto import GROUP_POLICIES
    from codedgd.services.records import read_result_file
    from codedgd.services.stragglers.fitted import NOTHING_TO_FIT
    from codedgd.services.stragglers.models import load_trace
    from codedgd.services.tuning import (
        MIN_TAIL_SHAPE,
        SEARCHED,
        Link,
        auto_prior_names,
        auto_start,
        fit_delays,
        observe,
        observe_trace,
        search,
        source_tree,
        step_sizes,
    )
    from codedgd.services.tuning.search import HOLD, TOPOLOGIES

    for flag, value in (
        ("--repeats", args.repeats),
        ("--rounds", args.rounds),
        ("--top", args.top),
    ):
        if value is not None and value < 1:
            raise ConfigError(f"{flag} must be >= 1, got {value}")
    if args.source_draws < 0:
        raise ConfigError(f"--source-draws must be >= 0 (0: none), got {args.source_draws}")
    if args.jobs < 0:
        raise ConfigError("--jobs must be >= 0 (0: one process per CPU)")
    if (args.results is None) == (args.probe is None):
        raise ConfigError("give a result file, or --probe JOB.toml (not both)")
    if args.probe_links and args.link_latency is not None:
        raise ConfigError(
            "give --probe-links (measure the links) or --link-latency and --link-bandwidth "
            "(state them), not both"
        )
    if (args.link_latency is None) != (args.link_bandwidth is None):
        raise ConfigError(
            "give both --link-latency and --link-bandwidth (the links between workers), or neither"
        )
    if args.coordinator_bandwidth is not None and not args.coordinator_bandwidth > 0:
        raise ConfigError(
            "--coordinator-bandwidth must be bytes/s > 0 (inf: unlimited), got "
            f"{args.coordinator_bandwidth}"
        )
    if args.coordinator_bandwidth is not None and not (
        args.link_latency is not None or args.probe_links
    ):
        raise ConfigError(
            "--coordinator-bandwidth goes with the links it is part of: give "
            "--link-latency and --link-bandwidth too, or --probe-links"
        )
    if args.link_burst is not None and not (
        math.isfinite(args.link_burst) and args.link_burst >= 0
    ):
        raise ConfigError(f"--link-burst must be a number of bytes >= 0, got {args.link_burst}")
    if args.cores not in (None, "none") and not (args.link_latency is not None or args.probe_links):
        raise ConfigError(
            "--cores charges each message's CPU where the candidates pay the links: give "
            "--link-latency and --link-bandwidth too, or --probe-links"
        )
    if args.link_burst and not (args.link_latency is not None or args.probe_links):
        raise ConfigError(
            "--link-burst goes with the links it is part of: give --link-latency and "
            "--link-bandwidth too, or --probe-links"
        )
    link = (
        Link(
            args.link_latency,
            args.link_bandwidth,
            args.coordinator_bandwidth,
            burst_bytes=args.link_burst or 0.0,
        )
        if args.link_latency is not None
        else None
    )
    _check_outputs(args)
    if args.write_auto and args.policy and not set(args.policy) & set(GROUP_POLICIES):
        raise ConfigError(
            f"--write-auto starts auto at the group size of a candidate it can run "
            f"({', '.join(GROUP_POLICIES)}), and --policy searches none of them: add one "
            f"(--policy {GROUP_POLICIES[0]})"
        )
    if (
        args.write
        and args.write_auto
        and Path(args.write).resolve() == Path(args.write_auto).resolve()
    ):
        raise ConfigError(
            f"--write and --write-auto both name {args.write}: the second would overwrite the "
            "first; give two file names"
        )
    steps = step_sizes(args.lr or [])  # (a typo named now, not after the probe)
    if args.probe is not None:
        _check_probe_target(args)  # (an unreachable target named before the probe runs)
        args.results = _probe(args)
    job_doc, summary, records = read_result_file(args.results)  # (read before the links)
    if args.coordinator_sharing is None:
        # A simulated run's NIC shared its messages as its cost model says (recorded).
        simulated = job_doc.get("simulation")
        cost = simulated.get("cost") if isinstance(simulated, dict) else None
        shared = cost.get("sharing") if isinstance(cost, dict) else None
        args.coordinator_sharing = shared if shared in ("fair", "fifo") else "fair"
    fitted_link = _probe_links(args) if args.probe_links else None
    if fitted_link is not None:
        link = dataclasses.replace(
            fitted_link.link, coordinator_bandwidth_bytes_per_second=args.coordinator_bandwidth
        )
    failed = summary.get("error")
    if failed:
        print(
            f"codedgd tune: note: {args.results} is of a run that failed after "
            f"{len(records)} recorded round(s) ({failed}): those rounds are fitted; the "
            "round it failed in, and the workers it waited for there, are in none of them",
            file=sys.stderr,
        )
    try:
        source = JobConfig.from_dict({k: v for k, v in job_doc.items() if k in _SECTIONS})
    except ConfigError as exc:
        raise ConfigError(f"{args.results} holds no job this version can read: {exc}") from None
    n = source.workers
    cores_from = _pool_cores(args, records, n, link)
    # What a written job is made from: the job itself. A probe's result file holds the
    # probe (uncoded, --probe-rounds rounds, no target); the user's job is JOB.toml.
    job = JobConfig.from_toml(args.probe) if args.probe is not None else source
    # A ring's workers report when the whole ring is done (each its round's slowest), a
    # tree's only through their parents: the arrivals are the topology's, not a worker's.
    # Since 2026-11-30 every worker's own times come along (RoundRecord.ready_seconds);
    # they hold no network time, which the stated links then stand for.
    peered = source.policy.name in TOPOLOGIES and not args.trace
    if args.star_times is not None and (peered or args.trace):
        what = "--trace's delays" if args.trace else f"a {source.policy.name} run's own times"
        raise ConfigError(
            f"--star-times says how to read a star run's workers; {what} are read one way "
            "only: leave it out"
        )
    star_own = not peered and _star_own(args, records, link)
    own_times = peered or star_own
    if link is not None and link.burst_bytes and not own_times and args.link_burst is None:
        # Measured, not asked for: the arrivals reading goes on without it.
        print(
            f"codedgd tune: note: the links burst ({link.burst_bytes / 1e3:.4g} kB, "
            "measured), but a star run read by its arrivals holds the queue the "
            "coordinator's bucket shaped, which tune does not take out with a burst: the "
            "candidates are charged none (read the run by its workers' own times to use it)",
            file=sys.stderr,
        )
        if fitted_link is not None:  # (its latency and rate read as bursting none)
            fitted_link = dataclasses.replace(fitted_link, burst="unused")
            link = dataclasses.replace(
                fitted_link.without_burst(),
                coordinator_bandwidth_bytes_per_second=args.coordinator_bandwidth,
            )
        else:
            link = dataclasses.replace(link, burst_bytes=0.0)
    if link is not None and link.burst_bytes and not own_times:
        raise ConfigError(
            "--link-burst charges every NIC a token bucket, and a star run's arrivals "
            "(--star-times arrivals, --trace, or a run whose workers sent no own times) "
            "hold the queue its coordinator's bucket shaped, which tune does not take out "
            "with a burst: read the run by its workers' own times, or leave --link-burst out"
        )
    if peered and not all(r.ready_seconds for r in records if r.response_seconds):
        raise ConfigError(
            f"{args.results} is a run of {source.policy.name} recorded without its workers' "
            "own times (by a version before 2026-11-30, or workers that send no "
            "WorkerTiming): its arrivals are the topology's, not "
            "a worker's. Run it again with this version, tune from a run where the "
            "coordinator hears every worker (uncoded, say, on the same pool), probe the "
            "pool (--probe JOB.toml --coordinator HOST:PORT), or give a delay trace (--trace)"
        )
    if own_times and link is None:
        raise ConfigError(
            f"{args.results} is a run of {source.policy.name}: its timings are its workers' "
            "own and hold no network time, so tune charges every candidate the links: "
            "state them (--link-latency SECONDS --link-bandwidth BYTES_PER_S; say 0.0002 "
            "1.25e9 for a 10 Gb/s network), or measure them on the pool (--probe-links "
            "--coordinator HOST:PORT)"
        )
    # A star's arrivals at a congested coordinator hold each worker's place among θ's
    # copies: taken out (and put back in every star candidate's own rounds).
    egress = (
        link.coordinator_rate
        if link is not None and not own_times and math.isfinite(link.coordinator_rate)
        else None
    )
    obs = observe(
        records,
        n,
        tree=source_tree(source.policy),
        coordinator_egress=egress,
        coordinator_sharing=args.coordinator_sharing,
        star_times="own" if star_own else "arrivals",
    )
    went_without: dict[str, int] = {}  # (a trace: its holes say nothing of who was slow)
    if args.trace:
        obs = dataclasses.replace(
            observe_trace(load_trace(Path(args.trace)), n, obs.median_compute()),
            coordinator_sharing=args.coordinator_sharing,
        )
    else:
        if source.policy.name == "codedreduce":
            _note_unobserved(args.results, obs.excess)
        went_without = _went_without(args.results, obs)
        if link is not None and not own_times:
            _note_coordinator_queue(args.results, records, link, args.coordinator_sharing)
    hops_searched = not args.policy or bool(set(args.policy) & set(TOPOLOGIES))
    if args.cores is not None and (own_times or hops_searched):  # (who shares compute)
        _note_shared_compute(args.results, records, obs.median_compute(), args.cores)
    try:
        fit = fit_delays(obs)
    except ConfigError as exc:
        if star_own and not failed and str(exc).startswith(NOTHING_TO_FIT):
            raise ConfigError(
                f"{NOTHING_TO_FIT}: read by its workers' own times, {args.results} shows no "
                "straggling at all (a simulated run without a straggler model), and the "
                "network tune charges by the links is in none of them; tune from its "
                "arrivals (--star-times arrivals)"
            ) from None
        if not (failed and str(exc).startswith(NOTHING_TO_FIT)):
            raise
        raise ConfigError(
            f"{NOTHING_TO_FIT}, and the run failed ({failed}): a worker that hung there is "
            "in none of its recorded delays. Tune from a run that finished (a longer "
            "--round-timeout, or a probe: --probe JOB.toml)"
        ) from None
    target = args.target_loss
    what, fix = "--target-loss", "give a lower --target-loss"
    optimal = None
    if args.target_gap is not None:
        from codedgd.services.job.optimum import job_optimum

        optimal = job_optimum(source, args.data_dir)
        target = optimal.target(args.target_gap)
        what, fix = f"the target of --target-gap {args.target_gap:g}", "give a smaller --target-gap"
    if target is None and job.target_loss is not None:
        target = job.target_loss
        what = f"the job's target_loss ({args.probe or args.results})"
    if target is None:
        losses = [r.loss for r in records if math.isfinite(r.loss)]
        if not losses:
            raise ConfigError(f"{args.results} records no loss: give --target-loss")
        target = losses[-1]
        what = "the run's last loss (the target when none is given)"
        fix = ""  # (refused: the run made no progress)
    if not math.isfinite(target):
        raise ConfigError(f"--target-loss must be a finite number, got {target!r}")
    _check_target(job, records, target, what, fix)
    rounds = args.rounds or max(2 * len(records), job.rounds if args.probe else 1)
    slowness = obs.slowness()  # compute and persistent delay, at the run's load
    load_slowness = obs.load_slowness()  # what of it grows with load: what the replay scales
    slow = [(w, float(slowness[w])) for w in np.argsort(-slowness) if slowness[w] >= 1.5]
    if not args.json:
        n_values, n_cens = fit.values.size, int(fit.censored.sum())
        print(
            f"delays beyond compute: {n_values} values of {obs.rounds} rounds "
            f"({n_cens} censored: "
            + ("leaves a parent left out)" if peered else "cancelled workers)")
        )
        if star_own:
            print(
                f"  a {source.policy.name} run: each worker's own time from θ to its result, "
                "less its compute (sent with its result; a cancelled one: censored at its "
                "cancel less the round's longest network time); no network time or queue "
                "on the coordinator's NIC, so every candidate pays the links"
            )
        elif own_times:
            print(
                f"  a {source.policy.name} run: each worker's own time from θ to its message, "
                "less its compute (a leaf a parent left out: censored at its used siblings' "
                "longest); no network time, so every candidate pays the stated links"
            )
        for i, f in enumerate(fit.fits):
            print(f"  {'best fit ' if i == 0 and not f.why_not else 'also     '}{f.describe()}")
        if n_cens and fit.tail is not fit.best:
            print(
                f"  censored delays are drawn beyond their bounds from the {fit.tail.family}: "
                "the best fit has an infinite mean (a Pareto of shape <= "
                f"{MIN_TAIL_SHAPE:g}), which the censored data cannot support"
            )
        # A slowness is in units of the typical worker's compute (its compute and its
        # persistent extra delay, both taken to grow with load): with a compute of
        # microseconds a few milliseconds of extra delay are a thousandfold, so the
        # seconds they add are shown too.
        typical = obs.worker_compute() / np.maximum(obs.speed(), 1e-12)
        shown = (
            ", ".join(
                f"worker {w} {s:.3g}x, +{(s - 1.0) * typical[w]:.3g} s ({load_slowness[w]:.3g}x)"
                for w, s in slow[:8]
            )
            or "none"
        )
        print(
            f"compute: median {obs.median_compute():.4g} s a round; workers whose compute "
            "and persistent extra delay take 1.5x or more the typical worker's compute, at "
            "the run's load (that multiple, and the seconds a round it adds; in brackets, "
            f"the multiple that grows with the load a candidate gives them): {shown}"
        )
        why = (
            f" (within {args.target_gap:g} of the optimum F* = {optimal.loss:.6g})"
            if optimal is not None
            else ""
        )
        print(f"target loss {target:.6g}{why}; up to {rounds} rounds, {args.repeats} replays each")
        if steps:
            print(f"step sizes: {', '.join(map(str, steps))} (each candidate at each)")
        else:
            own = job.optimizer.get("lr", "auto")
            print(f"step size: the run's own, {own} (--lr 1/L --lr 2/L … searches others too)")
    if args.fit_figure:
        _figure(fit, Path(args.fit_figure))
    bar = _bar(args)
    try:
        outcomes = search(
            source,
            obs,
            fit.tail,
            target_loss=target,
            rounds=rounds,
            repeats=args.repeats,
            policies=args.policy or SEARCHED,
            data_dir=args.data_dir,
            on_step=bar,
            link=link,
            jobs=args.jobs,
            steps=steps,
            draws=args.source_draws,
            drawn_top=args.top,
            network_in_delays=not own_times,
            cores=args.cores,
        )
    finally:
        bar.close()
    # Whose slowness a prior entry is: a straggler model's delays follow the places (it
    # draws by worker index), a real pool's follow the machines, named in the records.
    by_machine = source.stragglers.name == "none" and not args.trace
    names = auto_prior_names(records, n, str(args.results)) if by_machine else []
    started = auto_start(outcomes, obs, names)
    tied = _tied(outcomes)
    if args.json:
        doc = {
            "source": str(args.results),
            "target_loss": target,
            "optimal_loss": optimal.loss if optimal is not None else None,
            "rounds": rounds,
            "fits": [f.to_dict() for f in fit.fits],
            "tail": fit.tail.family,  # what censored values are drawn from (Fit.tail)
            # "own": fitted from the workers' own times (a ring's or tree's run, or a
            # star's with the links known: no network time in them, every candidate paid
            # the links); "arrivals": a star's arrivals (--star-times).
            "timings": "own" if own_times else "arrivals",
            # how the coordinator's NIC shared its messages (--coordinator-sharing)
            "coordinator_sharing": args.coordinator_sharing,
            # the one machine's cores the pool shared (null: a machine each), and who
            # said so: "stated" (--cores), "run" (the run's records: every process on one
            # machine), null (--cores none, or the records name no one machine)
            "cores": args.cores,
            "cores_from": cores_from,
            # the links topology candidates paid: measured (--probe-links), or stated
            # (null bandwidths: unlimited)
            "link": (
                {**(fitted_link.to_dict() if fitted_link is not None else {}), **link.to_dict()}
                if link is not None
                else None
            ),
            "slowness": [float(s) for s in slowness],
            "load_slowness": [float(s) for s in load_slowness],
            # workers the run did without (left out, cancelled) for more rounds in a row
            # than chance gives: worker → that many rounds (the stderr note's)
            "went_without": went_without,
            "candidates": [o.to_dict() for o in outcomes],
            # the labels of the best and of those the prediction cannot tell from it
            # (within TIE of its time, or inside its replays' range); [] when none
            "tied": [o.label for o in tied] if len(tied) > 1 else [],
            # auto's start (--write-auto): the group size of the best candidate it can run
            "auto_start": (
                {"policy": started[0].to_dict(), "from": started[1].label, "lr": started[1].lr}
                if started is not None
                else None
            ),
        }
        print(json.dumps(doc, indent=1, allow_nan=False))
    else:
        _table(outcomes[: args.top], len(outcomes))
    if len(tied) > 1:
        gap = tied[-1].predicted / tied[0].predicted - 1.0
        print(
            f"codedgd tune: note: the top {len(tied)} ({'; '.join(o.label for o in tied)}) "
            f"are predicted within {100 * gap:.2g} % of each other, or inside the best's "
            "replays' range: the model does not tell which is faster on the cluster (on "
            "real processes its predictions have been 0.9-1.2x their real times, "
            "docs/tuning.md), so the first is written; a short run of each tells",
            file=sys.stderr,
        )
    winner = outcomes[0] if outcomes and outcomes[0].reached else None
    if winner is None:
        if outcomes and all(o.error for o in outcomes):
            fix = (
                "every candidate failed (the table says why); where the loss diverged, "
                "a smaller --lr"
            )
        elif args.target_gap is not None:
            fix = "raise --rounds, or give a looser --target-gap"
        else:
            fix = "raise --rounds, or give a higher --target-loss"
        print(
            f"codedgd tune: no candidate reached loss {target:.6g} (and stayed there for "
            f"{HOLD} rounds) within {rounds} rounds: {fix}",
            file=sys.stderr,
        )
        return 1
    # How to run a written job: on this machine, or on the pool the probe ran on.
    runner = (
        f"codedgd submit --coordinator {args.coordinator} [the same --token/--tls options] --config"
        if args.probe is not None
        else "codedgd run --config"
    )
    if args.write_auto and started is None:  # (before --write: all the files asked, or none)
        raise ConfigError(
            f"--write-auto: no candidate auto can run ({', '.join(GROUP_POLICIES)}) reached "
            "the target: search them (--policy), or write the winner with --write"
        )
    if args.write:
        _write(
            args.write,
            _at(job, winner, steps).replace(policy=winner.policy),
            args.results,
            winner.label,
        )
        if not args.json:
            print(f"wrote {args.write} ({winner.label}); run it: {runner} {args.write}")
    if args.write_auto and started is not None:
        policy, origin = started
        _write(
            args.write_auto,
            _at(job, origin, steps).replace(policy=policy),
            args.results,
            f"auto starting at r={policy.options['r']}, the group size of {origin.label}"
            + ("; prior: each worker's slowness on this run" if "prior" in policy.options else "")
            + ("; tail: its typical workers' delays" if "tail" in policy.options else ""),
            "--write-auto",
        )
        if not args.json:
            rank = outcomes.index(origin) + 1
            print(
                f"wrote {args.write_auto} (auto starting at r={policy.options['r']}, the group "
                f"size of {origin.label}, rank {rank}); run it: {runner} {args.write_auto}"
            )
            if rank > 1:
                print(
                    f"  (auto cannot run the winner, {winner.label}: it adapts only groups of "
                    "r workers sharing r partitions; --write writes the winner itself)"
                )
            prior = policy.options.get("prior")
            if "prior_names" in policy.options:
                print(
                    "  (its prior follows the machines by name, wherever they connect: "
                    f"{policy.options['prior_names']})"
                )
            elif prior:
                if args.trace:
                    why = "the delays are the trace's, by place"
                elif not by_machine:
                    why = "the run's delays were its straggler model's, drawn by place"
                else:
                    why = "the run's file names no worker (a version before 2026-11-30's)"
                print(f"  (its prior is by place: {why})")
            unknown = [w for w, v in enumerate(prior.split(",")) if not v] if prior else []
            if unknown:
                print(
                    f"  (its prior, each worker's slowness on this run, does not know workers "
                    f"{unknown}: the run did not wait for them in half the rounds that asked them)"
                )
            elif not prior:
                print(
                    "  (no prior: the run waited for no worker in half the rounds that asked "
                    "it, or a slowness it measured is not finite)"
                )
    return 0


def _at(job: Any, outcome: Any, steps: list[Any]) -> Any:
    """``job`` (a JobConfig) to be written for ``outcome``: at its step size when the
    search tried several (else the job's own), with the partitions its policy makes."""
    optimizer = {**job.optimizer, "lr": outcome.lr} if steps else job.optimizer
    return job.replace(partitions=0, optimizer=optimizer)


FIGURE_TYPES = (".png", ".pdf", ".svg")
"""What --fit-figure writes, by the file name's suffix."""


def _check_outputs(args: argparse.Namespace) -> None:
    """Refuse, before the probe and the search (minutes lost otherwise), a file tune is to
    write that it could not write, or that is one it reads (the run's own record would
    be lost). A missing directory is made."""
    from codedgd.client.results import check_writable, result_paths

    reads: dict[Path, str] = {}
    if args.results:
        for path in result_paths(Path(args.results)):
            reads[path.resolve()] = f"the run's results ({args.results})"
    if args.probe:
        reads[Path(args.probe).resolve()] = "the --probe job file"
    if args.probe or args.probe_links:
        reads[Path(args.probe_output).resolve()] = "--probe-output"
        stem = Path(args.probe_output)
        for size in ("small", "large"):
            reads[stem.with_name(f"{stem.stem}.link-{size}.json").resolve()] = "a link probe's file"
    if args.trace:
        reads[Path(args.trace).resolve()] = "the --trace file"
    for flag, path, what in (
        ("--write", args.write, "the job file"),
        ("--write-auto", args.write_auto, "the job file"),
        ("--fit-figure", args.fit_figure, "the figure"),
    ):
        if path is None:
            continue
        if Path(path).is_dir():
            example = "fit.png" if flag == "--fit-figure" else "job.toml"
            raise ConfigError(
                f"{flag} {path} is a directory: give a file name, e.g. {path}/{example}"
            )
        if Path(path).resolve() in reads:
            raise ConfigError(
                f"{flag} {path} is {reads[Path(path).resolve()]}, which tune reads or "
                "writes: it would be overwritten; give another file name"
            )
        if flag == "--fit-figure" and Path(path).suffix.lower() not in FIGURE_TYPES:
            raise ConfigError(
                f"--fit-figure {path}: the file's type is taken from its name; end it in "
                f"{', '.join(FIGURE_TYPES)} (e.g. fit.png)"
            )
        check_writable(Path(path), what, flag)


def _write(path: str, job: Any, source: str, why: str = "", flag: str = "--write") -> None:
    """Save ``job`` (a JobConfig) as a TOML job file, saying where it came from."""
    import tomli_w

    from codedgd.services.tuning import label

    said = why or label(job.policy)
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(
            f"# written by codedgd tune from {source}: {said}\n"
            + tomli_w.dumps(_toml_ready(job.to_dict())),
            encoding="utf-8",
        )
    except OSError as exc:
        raise ConfigError(
            f"cannot write the job file to {path}: {exc.strerror or exc}; choose another {flag}"
        ) from None


_SECTIONS = ("job", "data", "model", "policy", "optimizer", "stragglers")
UNOBSERVED_NOTE = 0.1  # of a topology run's worker-rounds not observed: said so above this
COORDINATOR_QUEUE_NOTE = 0.1  # of a star run's median round on the coordinator's NIC: said


def _note_unobserved(path: str, excess: np.ndarray) -> None:
    """Say so when many of a codedreduce run's worker-rounds went unobserved: a parent
    (the coordinator included) does without its slowest children, and the times of an
    inner node left out and of everyone below it never come."""
    import numpy as np

    missing, total = int(np.isnan(excess).sum()), int(excess.size)
    if missing > UNOBSERVED_NOTE * total:
        print(
            f"codedgd tune: note: {missing} of the {total} worker-rounds of {path} "
            f"({missing / total:.0%}) were not observed: the subtrees its codedreduce tree "
            "did without, each the slowest of its group that round. tune draws them from "
            "each worker's other rounds, kept only where the subtree comes out slower than "
            "the ones used, which is a guess; a run of tree, ring-allreduce or uncoded on "
            "the same pool observes every worker",
            file=sys.stderr,
        )


def _note_coordinator_queue(
    path: str, records: Sequence[RoundRecord], link: Link, sharing: str
) -> None:
    """Say so when, at the links, the coordinator's NIC took a good part of a star run's
    rounds: its arrivals then hold the queue, each worker's place in it as part of its
    delay, and a worker late in it looks like a slower machine."""
    import numpy as np

    rate = link.coordinator_rate
    timed = [r for r in records if r.response_seconds and r.round_seconds > 0]
    if not timed or not math.isfinite(rate):
        return
    # (full duplex: θ going out and gradients coming in share no side; the busier one)
    queue = float(np.median([max(r.bytes_down, r.bytes_up) / rate for r in timed]))
    round_s = float(np.median([r.round_seconds for r in timed]))
    if queue > COORDINATOR_QUEUE_NOTE * round_s:
        print(
            f"codedgd tune: note: at the links, the coordinator's NIC "
            f"({rate / 1e6:.4g} MB/s each way) needs {queue:.3g} s a round to send θ to "
            f"the workers or take their gradients in, against {path}'s median round of "
            f"{round_s:.3g} s. A star run's "
            "arrivals hold that queue as part of each worker's delay. tune takes θ's "
            "part out and puts it back in every star candidate's own rounds, taking the "
            + (
                "copies to have gone side by side (--coordinator-sharing fair: each "
                "worker's wait the same)"
                if sharing == "fair"
                else "copies to have gone one after another in worker order "
                "(--coordinator-sharing fifo: a later worker waited longer)"
            )
            + "; if they went otherwise, the workers it took the wrong wait from look "
            "faster or slower than they are. The gradients' part, which follows who was "
            "ready first, stays in the delays. A run of tree or ring-allreduce on the same "
            "pool times every worker without it (its workers' own times)",
            file=sys.stderr,
        )


def _star_own(args: argparse.Namespace, records: Sequence[RoundRecord], link: Link | None) -> bool:
    """Whether a star run is read by its workers' own times (--star-times): by default
    when the links are known (the network they leave out is then charged) and every
    worker that answered sent them."""
    timed = [r for r in records if r.response_seconds]
    sent = bool(timed) and all(set(r.response_seconds) <= set(r.ready_seconds) for r in timed)
    if args.star_times == "arrivals" or args.trace:
        return False
    if args.star_times == "own":
        if link is None:
            raise ConfigError(
                "--star-times own leaves the network out of the delays, and every "
                "candidate pays it over the links: state them (--link-latency SECONDS "
                "--link-bandwidth BYTES_PER_S) or measure them (--probe-links)"
            )
        if not sent:
            raise ConfigError(
                f"{args.results} holds no own times of its star workers (they are sent "
                "with every result since 2026-12-01; workers of older versions or other "
                "implementations may send none): give --star-times arrivals"
            )
        return True
    return link is not None and sent


def _went_without(path: str, obs: Observations) -> dict[str, int]:
    """The workers a run did without (left out or cancelled) for more rounds in a row
    than chance gives (:meth:`Observations.chance_stretch`), each with its longest such
    stretch, named in a note: persistently slow there, by how much the run does not say."""
    stretch, chance = obs.unanswered_stretch(), obs.chance_stretch()
    long = [int(w) for w in range(obs.n_workers) if stretch[w] >= chance[w]]
    if long:
        low, high = min(int(chance[w]) for w in long), max(int(chance[w]) for w in long)
        limit = f"{low}" if low == high else f"{low}-{high} (by level)"
        print(
            f"codedgd tune: note: {path} went without workers {long} for up to "
            f"{max(int(stretch[w]) for w in long)} rounds in a row (each time left out or "
            "cancelled as among the slowest of its group, or below a worker that was; "
            f"equal workers go without for fewer than {limit} in 19 runs of 20): how "
            "slow they were then is not in the run, only that they came later than those "
            "used, so tune may take them for faster than they were; a run that waits for "
            "every worker (uncoded, tree, ring-allreduce) on the same pool measures them",
            file=sys.stderr,
        )
    return {str(w): int(stretch[w]) for w in long}


def _probe(args: argparse.Namespace) -> str:
    """Run the probe job on the live pool; the path of its result file."""
    import asyncio

    from codedgd.services.job import Component, JobConfig
    from codedgd.services.records import write_results

    if args.probe_rounds < 5:
        raise ConfigError("--probe-rounds must be >= 5 (fitting needs five timed rounds)")
    config = JobConfig.from_toml(args.probe).replace(
        policy=Component("uncoded", {}), rounds=args.probe_rounds, target_loss=None
    )
    out = Path(args.probe_output)
    [(records, doc)] = asyncio.run(_on_pool(args, [(config, "probe job")]))
    write_results(out, doc, records, {"rounds": len(records)})
    print(f"probe results: {out}", file=sys.stderr)
    return str(out)


async def _on_pool(
    args: argparse.Namespace, jobs: list[tuple[JobConfig, str]]
) -> list[tuple[list[RoundRecord], dict[str, Any]]]:
    """Run each job on the pool at --coordinator, one after another: its records and
    its result file's job document. Refused, with the counts, on a pool too small."""
    from codedgd.client.api import Client

    out = []
    async with Client(args.coordinator, security_from_args(args)) as client:
        status = await client.status()
        need = max(config.workers for config, _ in jobs)
        if status.workers_connected < need:
            raise ConfigError(
                f"the pool at {args.coordinator} has {status.workers_connected} worker(s) "
                f"connected but the {jobs[0][1]} needs {need}: start more workers, or "
                "probe with a job of fewer"
            )
        for config, what in jobs:
            job_id = await client.submit(config)
            print(
                f"{what} {job_id}: {config.workers} worker(s), {config.rounds} rounds, uncoded",
                file=sys.stderr,
            )
            records = [record async for record in client.watch(job_id)]
            out.append((records, {**config.to_dict(), "job_id": job_id}))
    return out


def _cores(text: str) -> float | str:
    """--cores: a number, 'local', or 'none' (a machine per process)."""
    return "none" if text == "none" else cores_option(text, also="'none'")


def _pool_cores(
    args: argparse.Namespace, records: Sequence[RoundRecord], n: int, link: Link | None
) -> str | None:
    """Settle ``args.cores`` (a number of cores, or None: a machine per process) from
    --cores or, unstated, the machines the run's records name; who said so (JSON's
    ``cores_from``)."""
    from codedgd.services.tuning.pool import pool_of

    if args.cores == "none":
        args.cores = None
        return None
    if args.cores is not None:
        return "stated"
    pool = pool_of(records, n)
    one = pool.one
    if one is None:
        if pool.known and pool.machines < n + 1:
            print(
                f"codedgd tune: note: {pool.describe()} ({args.results}'s records): some "
                "share a machine's cores, which tune models only for a pool on one machine "
                "(--cores); each process is taken to have a machine of its own",
                file=sys.stderr,
            )
        return None
    if not one.cpus:
        return None
    if link is None:
        print(
            f"codedgd tune: note: {pool.describe()} ({args.results}'s records), so their "
            "messages cost CPU on the shared cores; with the links known (--probe-links, or "
            "--link-latency and --link-bandwidth) tune charges every candidate that CPU "
            f"(as --cores {one.cpus})",
            file=sys.stderr,
        )
        return None
    args.cores = float(one.cpus)
    print(
        f"codedgd tune: note: {pool.describe()} ({args.results}'s records): every "
        f"candidate pays each message's CPU at both ends on those cores (as --cores "
        f"{one.cpus}; --cores none takes a machine per process)",
        file=sys.stderr,
    )
    return "run"


def _note_shared_compute(
    results: str, records: Sequence[RoundRecord], compute: float, cores: float
) -> None:
    """--cores shares the candidates' compute on the cores; a run on that machine timed
    its workers' compute shared already. Say so where compute is much of a round."""
    import statistics

    rounds = [r.round_seconds for r in records if math.isfinite(r.round_seconds)]
    typical = statistics.median(rounds) if rounds else math.nan
    if not compute > 0.1 * typical:
        return
    print(
        f"codedgd tune: note: --cores {cores:g} shares every candidate's compute on the "
        f"cores, and {results}'s workers timed theirs (a median of {compute:.3g} s, against "
        f"a median round of {typical:.3g} s) on that machine, shared "
        "already: the compute is charged its sharing twice. --cores is for pools whose "
        "compute is small beside their messages' CPU; otherwise --cores none",
        file=sys.stderr,
    )


def _probe_links(args: argparse.Namespace) -> LinkFit:
    """Measure the links on the pool (--probe-links): the probe jobs of
    :mod:`codedgd.services.tuning.links` (the medium one when the burst is not stated),
    their result files beside --probe-output."""
    import asyncio

    from codedgd.services.records import write_results
    from codedgd.services.tuning import fit_link, link_probe_job
    from codedgd.services.tuning.links import LARGE_DIM, MEDIUM_DIM, SMALL_DIM, burst_pause

    jobs = [
        (link_probe_job(SMALL_DIM), "link probe (8 kB messages)"),
        (link_probe_job(LARGE_DIM), "link probe (2 MB messages)"),
    ]
    runs = asyncio.run(_on_pool(args, jobs))
    sizes = ["small", "large"]
    medium = None
    if args.link_burst is None:
        # A burst to measure: the medium messages too, after a pause each round long
        # enough for every NIC's bucket to refill (at the two sizes' bandwidth).
        pause = burst_pause(fit_link(runs[0][0], runs[1][0], burst=0.0).link)
        what = f"link probe (500 kB messages, {pause:.3g} s pause a round)"
        runs += asyncio.run(_on_pool(args, [(link_probe_job(MEDIUM_DIM, pause=pause), what)]))
        sizes.append("medium")
        medium = runs[2][0]
    stem = Path(args.probe_output)
    for (records, doc), size in zip(runs, sizes, strict=True):
        path = stem.with_name(f"{stem.stem}.link-{size}.json")
        write_results(path, doc, records, {"rounds": len(records)})
        print(f"link probe results: {path}", file=sys.stderr)
    fitted = fit_link(runs[0][0], runs[1][0], burst=args.link_burst, medium=medium)
    print(f"links measured: {fitted.describe()}", file=sys.stderr)
    return fitted


def _toml_ready(doc: dict[str, Any]) -> dict[str, Any]:
    """The job document without None values (TOML has no null)."""
    return {
        k: _toml_ready(v) if isinstance(v, dict) else v for k, v in doc.items() if v is not None
    }


# Candidates predicted within this fraction of the best's time are a tie (_tied).
TIE = 0.03


def _tied(outcomes: Sequence[Any]) -> list[Any]:
    """The best candidate and the next ones the prediction cannot tell from it: each
    within TIE of the best's predicted time, or starting inside the range of the best's
    replays (those that reached the target; none if the best did not)."""
    if not outcomes or not outcomes[0].reached or not math.isfinite(outcomes[0].predicted):
        return []
    best = outcomes[0]
    tied = [best]
    for o in outcomes[1:]:
        if o.error or not o.reached or not math.isfinite(o.predicted):
            break
        if o.predicted > best.predicted * (1 + TIE) and o.interval[0] > best.interval[1]:
            break
        tied.append(o)
    return tied


def _table(outcomes: list[Any], total: int) -> None:
    import numpy as np

    print(f"\ntop {len(outcomes)} of {total} candidates (simulated, this cluster's delays):")
    # With --source-draws: the range of its predictions on other draws of the source.
    drawn = any(o.drawn for o in outcomes)
    print(
        "| rank | policy | time to target (s) | range (s) | "
        + ("over source draws (s) | " if drawn else "")
        + "reached | rounds | round (s) | computations/round | MB up/round | replication "
        "| exact |"
    )
    print("|---:|---|---:|---:|" + ("---:|" if drawn else "") + "---:|" * 6 + "---|")
    for i, o in enumerate(outcomes, start=1):
        if o.error:
            blank = "| " * (9 if drawn else 8)
            print(f"| {i} | {o.label} | failed: {_cut(o.error)} {blank}|")
            continue
        lo, hi = o.interval
        finite_rounds = [r for r in o.rounds if math.isfinite(r)]
        rounds = f"{np.median(finite_rounds):.0f}" if finite_rounds else "-"
        d = o.to_dict()
        over = ""
        if drawn:
            span = o.source_interval
            over = f"{_range(span[0], span[1])} | " if span is not None else "- | "
        print(
            f"| {i} | {o.label} | {_s(o.predicted)} | {_range(lo, hi)} | {over}"
            f"{o.reached}/{len(o.times)} | {rounds} | {d['mean_round_seconds']:.4g} | "
            f"{d['computations_per_round']:.1f} | {d['bytes_up_per_round'] / 1e6:.3g} | "
            f"{o.replication:.2g}x | {'yes' if o.exact else 'no'} |"
        )


def _s(seconds: float) -> str:
    return f"{seconds:.3g}" if math.isfinite(seconds) else "not reached"


def _range(lo: float, hi: float) -> str:
    """A range of seconds; "-" where no replay reached the target."""
    return "-" if not math.isfinite(lo) else f"{_s(lo)}-{_s(hi)}"


def _cut(text: str, width: int = 160) -> str:
    """``text`` up to ``width`` characters, cut at a word."""
    if len(text) <= width:
        return text
    return text[:width].rsplit(" ", 1)[0] + " …"


class _Progress:
    def __init__(self, bar: Any) -> None:
        self._bar = bar

    def __call__(self, what: str) -> None:
        if self._bar is not None:
            self._bar.set_postfix_str(what, refresh=False)
            self._bar.update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def _bar(args: argparse.Namespace) -> _Progress:
    if args.no_progress or args.json or not sys.stderr.isatty():
        return _Progress(None)
    from tqdm import tqdm

    return _Progress(tqdm(desc="tune", unit="sim", file=sys.stderr, leave=False))


def _check_probe_target(args: argparse.Namespace) -> None:
    """With --probe: a target its job's model can never reach, refused before the probe."""
    from codedgd.services.job import JobConfig
    from codedgd.services.models import check_target_loss

    planned = JobConfig.from_toml(args.probe)
    if args.target_loss is not None:
        check_target_loss(planned.model.name, args.target_loss, "--target-loss")
    elif args.target_gap is None and planned.target_loss is not None:
        what = f"the job's target_loss ({args.probe})"
        check_target_loss(planned.model.name, planned.target_loss, what)


def _check_target(
    job: JobConfig, records: list[RoundRecord], target: float, what: str, fix: str
) -> None:
    """A target (``what``) below what the model's objective can be is refused. One at or
    above the loss the run had after its first round is reached by every candidate
    within a few rounds, so the ranking says little beyond whose rounds are fastest: a
    stated target is kept with a note naming ``fix``; the run's own last loss (no target
    stated, ``fix`` empty) there means the run made no progress, and is refused."""
    from codedgd.services.models import check_target_loss

    check_target_loss(job.model.name, target, what)
    first = next((r for r in records if math.isfinite(r.loss)), None)
    if first is None or target < first.loss:
        return
    where = (
        f"{what} is {target:.6g}, at or above the loss the run had after round "
        f"{first.round} ({first.loss:.6g})"
    )
    if not fix:
        raise ConfigError(
            f"{where}: the run made no progress, and its loss is no target. Give "
            "--target-loss, or tune from a run that made progress"
        )
    print(
        f"codedgd tune: note: {where}: every candidate reaches it within a few rounds, and "
        f"the ranking says little beyond whose rounds are fastest ({fix} to rank the "
        "descent)",
        file=sys.stderr,
    )


def _figure(fit: Any, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("--fit-figure needs matplotlib: pip install 'codedgd[report]'") from None
    import numpy as np
    from scipy import stats

    exact = fit.values[~fit.censored]
    km = stats.ecdf(stats.CensoredData(uncensored=exact, right=fit.values[fit.censored]))
    grid = np.unique(exact)
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ax.step(grid, km.cdf.evaluate(grid), where="post", color="black", label="data (Kaplan-Meier)")
    xs = np.linspace(0.0, float(grid.max()) * 1.05, 400)
    for f, style in zip(fit.fits, ("-", "--"), strict=False):
        if not f.why_not:
            ax.plot(xs, f.cdf(xs), style, label=f.describe())
    ax.set_xlabel("delay beyond compute (s)")
    ax.set_ylabel("P(delay <= x)")
    ax.set_title("Delays of the recorded run and the fitted families", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"fit figure: {path}")
