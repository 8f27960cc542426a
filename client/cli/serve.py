"""`codedgd coordinator` and `codedgd worker`: the two long-running services."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
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
from codedgd.services.errors import CodedGDError


def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "coordinator",
        help="serve a coordinator",
        description="Serve the coordinator: workers dial in, clients submit jobs.",
        epilog=EPILOG,
    )
    p.add_argument(
        "--listen", default="0.0.0.0:50051", help="address to serve gRPC on (default 0.0.0.0:50051)"
    )
    _add_metrics_arguments(p)
    p.add_argument("--data-dir", help="directory of the real datasets (default $CODEDGD_DATA_DIR)")
    p.add_argument(
        "--assign-timeout",
        type=float,
        default=120.0,
        help="seconds a job waits for enough workers (default 120)",
    )
    p.add_argument(
        "--worker-timeout",
        type=float,
        default=15.0,
        metavar="SEC",
        help="drop a worker heard nothing from (not even a heartbeat) for this long: its "
        "place goes to a live worker; workers are asked to heartbeat 3 times as often "
        "(default 15)",
    )
    p.add_argument(
        "--state-dir",
        metavar="DIR",
        help="keep jobs, their round records, checkpoints and trained models here; a "
        "coordinator restarted on the same directory resumes unfinished jobs from their "
        "last checkpoint (default: none, nothing survives a restart)",
    )
    p.add_argument(
        "--checkpoint-every",
        type=int,
        default=10,
        metavar="ROUNDS",
        help="with --state-dir, checkpoint a running job every this many rounds, and at "
        "SIGTERM (default 10)",
    )
    p.add_argument(
        "--run-default-job",
        action="store_true",
        help="submit the job given by the job flags at start (also with --config); with "
        "--state-dir, not when the directory holds an unfinished job (it resumes instead)",
    )
    add_job_arguments(p)
    add_security_arguments(p, server=True)
    p.set_defaults(func=cmd_coordinator)

    p = sub.add_parser(
        "worker",
        help="serve as a worker",
        epilog=EPILOG,
        description="Dial a coordinator and compute the rounds it assigns; "
        "reconnects with backoff (up to 10 s apart) whenever the stream ends, also when the "
        "coordinator shuts down, until the worker is stopped or refused for good "
        "(--no-reconnect: leave when the stream ends).",
    )
    p.add_argument(
        "--coordinator", default=DEFAULT_ADDRESS, help=f"host:port (default {DEFAULT_ADDRESS})"
    )
    p.add_argument("--name", help="worker name shown by the coordinator (default host:pid)")
    p.add_argument(
        "--data-dir", help="directory of the real datasets, when jobs load data on workers"
    )
    _add_metrics_arguments(p)
    p.add_argument(
        "--peer-listen",
        metavar="HOST:PORT",
        help="serve the Peer service here, for jobs whose workers exchange gradients with "
        "each other (ring-allreduce, tree, codedreduce); port 0 picks a free one "
        "(default: none, star jobs only)",
    )
    p.add_argument(
        "--peer-address",
        metavar="HOST:PORT",
        help="the address peers dial to reach --peer-listen (default: its host if it names "
        "one, else this host's address on the route to the coordinator, with the bound port)",
    )
    p.add_argument(
        "--peer-tls-server-name",
        help="the name peers' TLS certificates carry, when it is not their address",
    )
    p.add_argument(
        "--no-reconnect",
        action="store_true",
        help="exit when the stream ends (a stream that fails before the coordinator "
        "answers is tried up to 3 times)",
    )
    p.add_argument(
        "--corrupt",
        metavar="KIND",
        help="TEST INSTRUMENT: send a corrupted result every round, to try the "
        "coordinator's defences (robust policies, the coded vote, --max-norm-ratio): "
        "scale:F (times F), sign (negated) or noise:S (plus N(0, S^2) per coordinate); "
        "star jobs only. Never for training.",
    )
    add_security_arguments(p, server=False)
    p.set_defaults(func=cmd_worker)


def _add_metrics_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port")
    p.add_argument(
        "--metrics-address",
        default="127.0.0.1",
        help="address the metrics endpoint binds (default 127.0.0.1: this host only; "
        "0.0.0.0 for a Prometheus elsewhere, as the compose file and EC2 layout set; the "
        "endpoint has no authentication)",
    )


def cmd_coordinator(args: argparse.Namespace) -> int:
    from codedgd.services.address import UNIX_PREFIXES, parse_address
    from codedgd.services.coordinator.server import CoordinatorServer, serve_forever

    security = security_from_args(args)
    # A malformed --listen is refused before the warning below speaks of it.
    host = "" if args.listen.startswith(UNIX_PREFIXES) else parse_address(args.listen)[0]
    if security.token is None and host not in ("", "127.0.0.1", "localhost", "::1"):
        logging.getLogger("codedgd").warning(
            "serving on %s without a token: anyone who reaches this port can join or submit "
            "jobs. Set --token-file (and TLS) outside a private network.",
            args.listen,
        )
    job = job_from_args(args) if (args.config or args.run_default_job) else None

    async def main() -> None:
        server = await CoordinatorServer.start(
            args.listen,
            security=security,
            metrics_port=args.metrics_port,
            metrics_address=args.metrics_address,
            data_dir=args.data_dir,
            assign_timeout=args.assign_timeout,
            state_dir=args.state_dir,
            checkpoint_every=args.checkpoint_every,
            worker_timeout=args.worker_timeout,
        )
        kept = server.service.jobs
        resuming = [j.id for j in kept.values() if not j.finished]
        if kept:
            print(
                f"state directory {args.state_dir}: {len(kept)} job(s) read back, "
                f"{len(resuming)} to resume" + (f" ({', '.join(resuming)})" if resuming else ""),
                flush=True,
            )
        print(
            f"coordinator listening on {args.listen} (port {server.port})"
            + (f", metrics on :{server.metrics_port}/metrics" if server.metrics_port else ""),
            flush=True,
        )
        if job is not None and not resuming:
            try:
                run = server.service.submit(job)
            except CodedGDError:
                await server.stop()  # a bad job: nothing stays half-started
                raise
            print(f"submitted job {run.id}", flush=True)
        await serve_forever(server)

    asyncio.run(main())
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    from codedgd.services.worker.agent import WorkerAgent, WorkerOptions
    from codedgd.services.worker.corrupt import Corruption

    options = WorkerOptions(
        coordinator=args.coordinator,
        security=security_from_args(args),
        data_dir=Path(args.data_dir) if args.data_dir else None,
        reconnect=not args.no_reconnect,
        peer_listen=args.peer_listen,
        peer_address=args.peer_address,
        peer_tls_server_name=args.peer_tls_server_name,
        corrupt=Corruption.parse(args.corrupt) if args.corrupt else None,
        **({"name": args.name} if args.name else {}),
    )

    async def main() -> None:
        agent = WorkerAgent(options)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, agent.stop)
        if args.metrics_port is not None:
            from codedgd.services.worker.metrics import serve_worker_metrics

            serve_worker_metrics(agent, args.metrics_port, args.metrics_address)
        await agent.run()

    asyncio.run(main())
    return 0
