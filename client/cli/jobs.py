"""`codedgd submit`, `watch`, `status` and `cancel`: a running coordinator's jobs."""

from __future__ import annotations

import argparse
import asyncio
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
    add_security_arguments(p, server=False)
    p.set_defaults(func=cmd_submit)

    p = sub.add_parser(
        "watch",
        help="follow a job's rounds",
        description="Follow a job's rounds on a running coordinator, from its first "
        "round (those done are sent at once) until the job ends. Ctrl-C stops watching, "
        "not the job.",
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
    add_security_arguments(p, server=False)
    p.set_defaults(func=cmd_watch)

    p = sub.add_parser(
        "status",
        help="jobs and workers of a coordinator",
        description="The workers connected to a coordinator and its jobs (or one job): "
        "state, rounds done, last loss, error.",
        epilog=EPILOG,
    )
    p.add_argument("job_id", nargs="?")
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
            print(job_id, flush=True)
            if args.watch or output:
                return await watch_job(
                    client, job_id, config.rounds, output, config, progress=not args.no_progress
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
                client, args.job_id, rounds, output, None, progress=not args.no_progress
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
) -> int:
    """Follow a job's rounds; with ``output``, write them (and how the job ended) there."""
    from codedgd.client.progress import Progress

    bar = Progress(rounds, enabled=progress)
    records: list[RoundRecord] = []
    started = time.time()
    error: str | None = None
    try:
        async for record in client.watch(job_id):
            records.append(record)
            bar.update(record)
    except JobFailed as exc:
        error = str(exc)
        raise
    except (KeyboardInterrupt, asyncio.CancelledError):
        error = "interrupted (only the watch stopped: the job runs on)"
        raise
    except BaseException as exc:  # the coordinator went away, or anything else: say so
        error = f"the watch was cut short after {len(records)} round(s): {exc}"
        raise
    finally:
        bar.close()
        if output is not None:
            summary = summarize(records, time.time() - started, config)
            if error is not None:
                summary["error"] = error
            job_doc = config.to_dict() if config else {}
            json_path, csv_path = write_result_pair(
                output, {**job_doc, "job_id": job_id}, records, summary
            )
            print(f"results: {json_path} and {csv_path}")
    if output is not None and records:
        print(f"model: {write_model(output, await client.model(job_id))}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    async def main() -> int:
        async with client_from_args(args) as client:
            st = await client.status(args.job_id or "")
        print(f"workers connected: {st.workers_connected}")
        for name in st.workers:
            print(f"  {name}")
        for j in st.jobs:
            line = f"job {j.job_id}: {j.state}, {j.rounds_done}/{j.rounds} rounds done"
            if j.state == "assigning":
                line += f" (waiting for idle workers; {st.workers_connected} connected)"
            if not math.isnan(j.loss):
                line += f", loss {j.loss:.6g}"
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
