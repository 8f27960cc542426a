"""`codedgd run`: a coordinator and N worker processes on this machine, one job."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import time
from pathlib import Path
from typing import Any

from codedgd.client.cli.exits import Terminated, save_unfinished
from codedgd.client.cli.options import EPILOG, add_job_arguments, job_from_args
from codedgd.client.results import (
    check_output,
    default_output,
    summarize,
    summary_line,
    write_model,
    write_result_pair,
)
from codedgd.services.errors import JobFailed
from codedgd.services.job.trained import trained_model
from codedgd.services.records import RoundRecord


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "run",
        help="run one job with a coordinator and N local worker processes",
        description="Start a coordinator and N worker processes on this machine, "
        "train, show progress, and write per-round results (JSON and CSV).",
        epilog=EPILOG,
    )
    add_job_arguments(p)
    p.add_argument("--data-dir", help="directory of the real datasets (default $CODEDGD_DATA_DIR)")
    p.add_argument(
        "--output",
        "-o",
        help="result file (.json; a .csv is written beside it), also written with the "
        "rounds done when the job fails or is interrupted; "
        "default results/<policy>-n<N>-seed<S>-<time>.json",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        help="serve the coordinator's Prometheus metrics on 127.0.0.1 at this port",
    )
    p.add_argument("--worker-log", help="append the workers' logs to this file")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    from codedgd.client.local import LocalRun, run_local
    from codedgd.client.progress import Progress

    config = job_from_args(args)
    out = Path(args.output) if args.output else default_output(config)
    check_output(out)  # before training, not after it
    # With -v the coordinator's log says each switch of the policy: not the bar twice.
    progress = Progress(config.rounds, enabled=not args.no_progress, notes=not args.verbose)
    records: list[RoundRecord] = []  # kept as they come: a failed job's rounds are saved too
    outcome_log = logging.getLogger("codedgd.coordinator.outcome")
    outcome_level = outcome_log.level
    if not args.verbose:  # the error below says how the job ended; once is enough
        outcome_log.setLevel(logging.CRITICAL)

    def on_record(record: RoundRecord) -> None:
        records.append(record)
        progress.update(record)

    job_ids: list[str] = []
    terminated = False

    async def main() -> LocalRun:
        # SIGTERM (a container stopped, `kill`) ends the job as Ctrl-C does: the workers
        # stop, and the rounds done are saved.
        task = asyncio.current_task()
        assert task is not None

        def on_sigterm() -> None:
            nonlocal terminated
            terminated = True
            task.cancel()

        with contextlib.suppress(NotImplementedError, RuntimeError):
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, on_sigterm)
        return await run_local(
            config,
            data_dir=args.data_dir,
            on_record=on_record,
            on_status=progress.status,
            on_submitted=job_ids.append,
            metrics_port=args.metrics_port,
            worker_log=args.worker_log,
            log_format=args.log_format,
        )

    started = time.time()
    try:
        try:
            result = asyncio.run(main())
        except asyncio.CancelledError:
            if not terminated:
                raise
            raise Terminated from None
    except (JobFailed, KeyboardInterrupt) as exc:
        progress.close()
        if not records:
            raise
        job_doc = {**config.to_dict(), "job_id": job_ids[0] if job_ids else ""}
        return save_unfinished("run", exc, out, job_doc, records, config, started)
    finally:
        progress.close()
        outcome_log.setLevel(outcome_level)
    summary = summarize(result.records, time.time() - started, config)
    json_path, csv_path = write_result_pair(
        out, {**config.to_dict(), "job_id": result.job_id}, result.records, summary
    )
    print(summary_line(summary))
    print(f"results: {json_path} and {csv_path}")
    if result.theta is not None:
        saved = trained_model(config, result.theta, result.records, result.features)
        model = write_model(out, saved)
        print(f"model: {model}")
    return 0
