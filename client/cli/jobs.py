"""`codedgd submit`, `watch`, `status` and `cancel`: a running coordinator's jobs."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import time
from pathlib import Path
from typing import Any

from codedgd.client.cli.options import (
    DEFAULT_ADDRESS,
    EPILOG,
    add_job_arguments,
    add_security_arguments,
    job_from_args,
    security_from_args,
)
from codedgd.client.results import check_output, summarize, write_model, write_result_pair
from codedgd.services.errors import JobFailed
from codedgd.services.job import JobConfig
from codedgd.services.records import RoundRecord

# How often the progress bar asks what a job waits for, until its first round (seconds).
WAITING_POLL_SECONDS = 1.0


def add_parsers(sub: Any) -> None:
    helptext = "submit a job to a running coordinator"
    p = sub.add_parser("submit", help=helptext, description=helptext, epilog=EPILOG)
    p.add_argument("--coordinator", default=DEFAULT_ADDRESS, help="host:port")
    add_job_arguments(p)
    p.add_argument("--watch", "-w", action="store_true", help="follow the job's rounds")
    p.add_argument(
        "--output",
        "-o",
        help="follow the job and write its rounds to this result file (.json; a .csv "
        "is written beside it)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar while following")
    p.add_argument(
        "--json",
        action="store_true",
        help="with --watch or -o: JSON lines on stdout for scripts (the job id, one per "
        "round, then the outcome)",
    )
    add_security_arguments(p, server=False)
    p.set_defaults(func=cmd_submit)

    p = sub.add_parser(
        "watch",
        help="follow a job's rounds",
        description="Follow a job's rounds on a running coordinator, from its first "
        "round (those done are sent at once) until the job ends, then print how it ended "
        "(state, rounds, training time, final loss and metric, result file). Until the "
        "first round the progress bar shows what the job waits for. Ctrl-C stops "
        "watching, not the job.",
        epilog=EPILOG,
    )
    p.add_argument("job_id")
    p.add_argument("--coordinator", default=DEFAULT_ADDRESS, help="host:port")
    p.add_argument(
        "--output",
        "-o",
        help="write the rounds to this result file (.json; a .csv is written beside it)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--json",
        action="store_true",
        help="JSON lines on stdout for scripts: one per round, then one with the outcome "
        "(state, rounds, seconds, final loss and metric, result files)",
    )
    add_security_arguments(p, server=False)
    p.set_defaults(func=cmd_watch)

    p = sub.add_parser(
        "status",
        help="jobs and workers of a coordinator",
        description="The workers connected to a coordinator and its jobs (or one job): "
        "state, rounds done, last loss, what a job waits for, uploads and computations, "
        "error.",
        epilog=EPILOG,
    )
    p.add_argument("job_id", nargs="?")
    p.add_argument(
        "--json", action="store_true", help="print one JSON object (for scripts) instead"
    )
    p.add_argument("--coordinator", default=DEFAULT_ADDRESS, help="host:port")
    add_security_arguments(p, server=False)
    p.set_defaults(func=cmd_status)

    p = sub.add_parser(
        "cancel",
        help="cancel a job",
        description="Cancel a queued or running job. Its watchers get the rounds done "
        "and the error 'cancelled by a client'.",
        epilog=EPILOG,
    )
    p.add_argument("job_id")
    p.add_argument("--coordinator", default=DEFAULT_ADDRESS, help="host:port")
    add_security_arguments(p, server=False)
    p.set_defaults(func=cmd_cancel)


def client_from_args(args: argparse.Namespace) -> Any:
    from codedgd.client.api import Client

    return Client(args.coordinator, security_from_args(args))


def cmd_submit(args: argparse.Namespace) -> int:
    config = job_from_args(args)
    output = Path(args.output) if args.output else None
    if output is not None:
        check_output(output)

    async def main() -> int:
        async with client_from_args(args) as client:
            job_id = await client.submit(config)
            following = bool(args.watch or output)
            if args.json and following:
                print(json.dumps({"event": "submitted", "job_id": job_id}), flush=True)
            else:
                print(job_id, flush=True)
            if following:
                return await watch_job(
                    client,
                    job_id,
                    config.rounds,
                    output,
                    config,
                    progress=not args.no_progress,
                    as_json=args.json,
                )
        return 0

    return asyncio.run(main())


def cmd_watch(args: argparse.Namespace) -> int:
    output = Path(args.output) if args.output else None
    if output is not None:
        check_output(output)

    async def main() -> int:
        async with client_from_args(args) as client:
            status = await client.status(args.job_id)
            rounds = status.jobs[0].rounds if status.jobs else 0
            return await watch_job(
                client,
                args.job_id,
                rounds,
                output,
                None,
                progress=not args.no_progress,
                as_json=args.json,
            )

    return asyncio.run(main())


async def watch_job(
    client: Any,
    job_id: str,
    rounds: int,
    output: Path | None,
    config: JobConfig | None,
    *,
    progress: bool,
    as_json: bool = False,
) -> int:
    """Follow a job's rounds; with ``output``, write them (and how the job ended) there.

    Ends with a line saying how the job ended (``as_json``: a JSON line, after one per
    round). Until its first round, the progress bar shows what the job waits for."""
    from codedgd.client.progress import Progress

    bar = Progress(rounds, enabled=progress)
    records: list[RoundRecord] = []
    started = time.time()
    error: str | None = None
    state = "unknown"  # how the job ended, as far as the watch knows ("unknown": cut short)
    files: dict[str, str] = {}
    waiting = asyncio.create_task(_show_waiting(client, job_id, bar))
    try:
        async for record in client.watch(job_id):
            if not waiting.done():
                waiting.cancel()
            records.append(record)
            bar.update(record)
            if as_json:
                print(json.dumps({"event": "round", **_clean(record.to_dict())}), flush=True)
        state = "done"
    except JobFailed as exc:
        error = str(exc)
        state = await _final_state(client, job_id)
        raise
    except (KeyboardInterrupt, asyncio.CancelledError):
        error = "interrupted (only the watch stopped: the job runs on)"
        raise
    except BaseException as exc:  # the coordinator went away, or anything else: say so
        error = f"the watch was cut short after {len(records)} round(s): {exc}"
        raise
    finally:
        waiting.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await waiting
        bar.close()
        summary = summarize(records, time.time() - started, config)
        if error is not None:
            summary["error"] = error
        if output is not None:
            job_doc = config.to_dict() if config else {}
            json_path, csv_path = write_result_pair(
                output, {**job_doc, "job_id": job_id}, records, summary
            )
            files.update(results=str(json_path), results_csv=str(csv_path))
            if not as_json:
                print(f"results: {json_path} and {csv_path}")
        if output is not None and records and error is None:
            model = write_model(output, await client.model(job_id))
            files["model"] = str(model)
            if not as_json:
                print(f"model: {model}")
        # A script always gets its last line; a person gets it when the job ended (a
        # watch cut short has said why on stderr).
        if as_json or state != "unknown":
            _print_outcome(job_id, state, rounds, summary, files, as_json)
    return 0


def _clean(d: dict[str, Any]) -> dict[str, Any]:
    """JSON values only: NaN and infinities become None."""
    return {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in d.items()}


async def _show_waiting(client: Any, job_id: str, bar: Any) -> None:
    """Until the first round: the job's state, or what it waits for, on the progress bar."""
    while True:
        with contextlib.suppress(Exception):  # the watch itself reports a lost coordinator
            status = await client.status(job_id)
            if status.jobs:
                job = status.jobs[0]
                bar.status(job.detail or job.state)
        await asyncio.sleep(WAITING_POLL_SECONDS)


async def _final_state(client: Any, job_id: str) -> str:
    """The state a job ended in (failed, diverged, cancelled...), if the coordinator says."""
    try:
        status = await client.status(job_id)
    except Exception:
        return "failed"
    return status.jobs[0].state if status.jobs else "failed"


def _print_outcome(
    job_id: str,
    state: str,
    rounds: int,
    summary: dict[str, Any],
    files: dict[str, str],
    as_json: bool,
) -> None:
    """The watch's last line: how the job ended, its rounds, time, final loss, files."""
    if as_json:
        doc = {"event": "end", "job_id": job_id, "state": state, **_clean(summary), **files}
        print(json.dumps(doc), flush=True)
        return
    done = summary["rounds"]
    line = f"job {job_id} {state}: {done}"
    line += f"/{rounds} rounds" if rounds and done != rounds else " rounds"
    line += f" in {summary['training_seconds']:.2f} s"
    if summary["final_loss"] is not None:
        line += f", loss {summary['final_loss']:.6g}"
    metric = summary["final_metric"]
    if metric is not None and not math.isnan(metric):
        line += f", {summary['metric_name']} {metric:.4g}"
    if "results" in files:
        line += f", results {files['results']}"
    print(line, flush=True)


def cmd_status(args: argparse.Namespace) -> int:
    async def main() -> int:
        async with client_from_args(args) as client:
            st = await client.status(args.job_id or "")
        if args.json:
            print(json.dumps(st.to_dict()))
            return 0
        print(f"workers connected: {st.workers_connected}")
        for name in st.workers:
            print(f"  {name}")
        for j in st.jobs:
            line = f"job {j.job_id}: {j.state}, {j.rounds_done}/{j.rounds} rounds done"
            if j.detail:
                line += f" ({j.detail})"
            if not math.isnan(j.loss):
                line += f", loss {j.loss:.6g}"
            if j.computations:
                line += f", {j.uploads} uploads of {j.computations} computations"
            if j.error:
                line += f", error: {j.error}"
            print(line)
        return 0

    return asyncio.run(main())


def cmd_cancel(args: argparse.Namespace) -> int:
    async def main() -> int:
        async with client_from_args(args) as client:
            ok = await client.cancel(args.job_id)
        print("cancelled" if ok else "the job had already finished")
        return 0

    return asyncio.run(main())
