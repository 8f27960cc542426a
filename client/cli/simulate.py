"""`codedgd simulate`: a job on the discrete-event simulator (virtual clock, real arithmetic)."""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from typing import Any

from codedgd.client.cli.exits import save_unfinished, sigterm_raises
from codedgd.client.cli.options import EPILOG, add_job_arguments, cores_option, job_from_args
from codedgd.client.results import (
    check_output,
    default_output,
    summarize,
    summary_line,
    write_model,
    write_result_pair,
)
from codedgd.services.errors import JobFailed
from codedgd.services.job import Component
from codedgd.services.job.trained import trained_model
from codedgd.services.records import RoundRecord


def _float_or_inf(text: str) -> float:
    value = float(text)  # accepts "inf"
    if math.isnan(value):
        raise argparse.ArgumentTypeError("not a number")
    return value


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``simulate`` to a subparsers object (``parser.add_subparsers()``)."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "simulate",
        help="simulate a job on a virtual clock (same policies and arithmetic as run)",
        description=(
            "Run a job exactly as `codedgd run` would (same data, partitions, policy, "
            "encoded gradients, optimizer and seeded straggler delays) on a virtual clock: "
            "each worker responds after downlink + compute + straggler delay + uplink "
            "seconds of the cost model below, and arrivals are offered to the policy in "
            "that order until it can decode. Writes the same result files as run "
            "(JSON and CSV). Only the gradients that are used are computed; rounds that "
            "the order of arrivals decides run vectorized (--engine), so n = 10,000 "
            "workers take seconds a thousand rounds. See docs/simulator.md."
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_job_arguments(p)
    p.add_argument("--data-dir", help="directory of the real datasets (default $CODEDGD_DATA_DIR)")
    p.add_argument(
        "--output",
        "-o",
        help="result file (.json; a .csv is written beside it), also written with the "
        "rounds done when the run fails or is interrupted; "
        "default results/sim-<policy>-n<N>-seed<S>-<time>.json",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--engine",
        choices=("auto", "events", "vectorized"),
        default="auto",
        help="events: arrival by arrival, every policy and straggler model; vectorized: "
        "each round in bulk, same results, for star policies that decode from the order "
        "of arrivals (uncoded, ignore-stragglers, erasurehead, frc) with modelled compute "
        "and no crashes; auto (default): vectorized whenever the job allows it",
    )
    c = p.add_argument_group("cost model (virtual seconds)")
    c.add_argument(
        "--compute",
        choices=("model", "measured", "none"),
        default="model",
        help="compute time: model = seconds-per-sample·rows + seconds-per-partition·"
        "partitions of the worker (default); measured = the wall time of its real "
        "gradient computation here (computes every contacted worker); none = 0",
    )
    c.add_argument(
        "--seconds-per-sample",
        type=float,
        help="compute seconds per training row (default: calibrated on this machine "
        "by timing the model's gradient)",
    )
    c.add_argument(
        "--seconds-per-partition",
        type=float,
        help="fixed compute seconds per partition held (default: calibrated)",
    )
    c.add_argument(
        "--latency",
        type=float,
        default=0.0002,
        help="one-way latency of every coordinator↔worker link, seconds (default 0.0002)",
    )
    c.add_argument(
        "--bandwidth",
        type=_float_or_inf,
        default=1.0e9,
        help="bandwidth of every worker's own link, bytes/s; inf = free (default 1e9)",
    )
    c.add_argument(
        "--ingress-bandwidth",
        type=_float_or_inf,
        help="shared bandwidth into the coordinator, bytes/s: results are received one "
        "at a time, first come first served (default unlimited)",
    )
    c.add_argument(
        "--egress-bandwidth",
        type=_float_or_inf,
        help="shared bandwidth out of the coordinator, bytes/s: the n copies of θ leave "
        "one after another (default unlimited)",
    )
    c.add_argument(
        "--burst",
        type=float,
        default=0.0,
        metavar="BYTES",
        help="every NIC's token bucket, bytes each way (tc tbf's burst, a cloud NIC's "
        "burst allowance), full before the first round and refilled at its rate between "
        "rounds: what it holds goes at once, the rest at its rate (default 0: none)",
    )
    c.add_argument(
        "--sharing",
        choices=["fifo", "fair"],
        default="fifo",
        help="how messages share a node's link: one after another (fifo, the default) or "
        "all in flight at once, as TCP flows do (fair)",
    )
    c.add_argument(
        "--cores",
        type=cores_option,
        help="every process on ONE machine of this many cores ('local': this machine's), "
        "as `codedgd run` runs them: the workers' compute shares the cores, the "
        "coordinator handles its messages one at a time, and a ring's or tree's workers "
        "pay each hop's CPU at both ends (default: a machine per worker)",
    )
    c.add_argument(
        "--decode-seconds",
        type=float,
        help="decode time per round, seconds (default: the measured time of the policy's decode)",
    )
    c.add_argument(
        "--round-overhead",
        type=float,
        default=0.0,
        help="coordinator seconds per round for serialization and the step (default 0)",
    )
    c.add_argument(
        "--ideal",
        action="store_true",
        help="no compute, communication or decode time: only the straggler delays "
        "(the setting of the closed forms in services/sim/closed_forms.py); "
        "overrides the flags above",
    )
    t = p.add_argument_group("replaying a recorded run")
    t.add_argument(
        "--trace-from-results",
        metavar="RESULTS.json",
        help="make a delay trace from the per-worker response times in a result file of "
        "`codedgd run` (or simulate) and use it as the straggler model (cycled)",
    )
    t.add_argument(
        "--trace-kind",
        choices=("excess", "response"),
        default="excess",
        help="excess (default): response − compute, replayed on top of this cost model's "
        "compute; response: the whole response time (use with --ideal)",
    )
    t.add_argument(
        "--trace-out",
        metavar="TRACE.json",
        help="where to write that trace (.json or .csv; default beside --output)",
    )
    p.set_defaults(func=cmd_simulate)
    return p


def cost_from_args(args: argparse.Namespace) -> Any:
    from codedgd.services.sim.cost import CostModel

    if args.ideal:
        return CostModel.ideal()
    return CostModel(
        compute=args.compute,
        seconds_per_sample=args.seconds_per_sample,
        seconds_per_partition=args.seconds_per_partition,
        latency_seconds=args.latency,
        bandwidth_bytes_per_second=args.bandwidth,
        ingress_bandwidth_bytes_per_second=args.ingress_bandwidth,
        egress_bandwidth_bytes_per_second=args.egress_bandwidth,
        burst_bytes=args.burst,
        decode_seconds=args.decode_seconds,
        round_overhead_seconds=args.round_overhead,
        sharing=args.sharing,
        cores=args.cores,
    )


def cmd_simulate(args: argparse.Namespace) -> int:
    from codedgd.client.progress import Progress
    from codedgd.services.sim.engines import make_simulator
    from codedgd.services.sim.trace import trace_from_results, write_trace
    from codedgd.services.sim.vectorized import VectorizedSimulator

    config = job_from_args(args)
    cost = cost_from_args(args)
    out = Path(args.output) if args.output else default_output(config, prefix="sim-")
    check_output(out)  # before simulating, not after it
    if args.trace_from_results:
        table = trace_from_results(args.trace_from_results, kind=args.trace_kind)
        trace_path = (
            Path(args.trace_out) if args.trace_out else out.with_name(out.stem + "-trace.json")
        )
        write_trace(trace_path, table, kind=args.trace_kind, source=str(args.trace_from_results))
        print(f"trace: {trace_path} ({len(table)} rounds, kind {args.trace_kind})")
        config = config.replace(
            stragglers=Component("trace", {"path": str(trace_path.resolve()), "cycle": True})
        )
    started = time.time()
    sim = make_simulator(config, cost, engine=args.engine, data_dir=args.data_dir)
    progress = Progress(config.rounds, enabled=not args.no_progress)
    records: list[RoundRecord] = []  # kept as they come: a failed run's rounds are saved too

    def on_record(record: RoundRecord) -> None:
        records.append(record)
        progress.update(record)

    try:
        with sigterm_raises():
            result = sim.run(on_record=on_record)
    except (JobFailed, KeyboardInterrupt) as exc:
        progress.close()
        if not records:
            raise
        calibration = vars(sim.calibration) if sim.calibration else None
        partial = {"cost": sim.cost.to_dict(), "calibration": calibration}
        job_doc = {**config.to_dict(), "job_id": "", "simulation": partial}
        return save_unfinished("simulate", exc, out, job_doc, records, config, started)
    finally:
        progress.close()
    summary = summarize(result.records, time.time() - started, config)
    summary["gradients_computed"] = result.gradients_computed
    summary["gradients_skipped"] = result.gradients_skipped
    simulation: dict[str, Any] = {
        "cost": result.cost.to_dict(),
        "calibration": vars(result.calibration) if result.calibration else None,
    }
    job_doc = {**config.to_dict(), "job_id": result.job_id, "simulation": simulation}
    json_path, csv_path = write_result_pair(out, job_doc, result.records, summary)
    print(summary_line(summary) + " (simulated time)")
    print(
        f"simulated in {result.elapsed_seconds:.1f} s "
        f"({'vectorized' if isinstance(sim, VectorizedSimulator) else 'event'} engine); "
        f"{result.gradients_computed} worker gradients used, "
        f"{result.gradients_skipped} skipped (cancelled)"
    )
    print(f"results: {json_path} and {csv_path}")
    saved = trained_model(config, result.theta, result.records, result.features)
    model = write_model(out, saved)
    print(f"model: {model}")
    return 0
