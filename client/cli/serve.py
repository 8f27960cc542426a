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
        "--records-in-memory",
        type=int,
        default=1000,
        metavar="N",
        help="keep the last N round records of each job in memory; older ones stay on disk "
        "(the job's records.jsonl under --state-dir, else a temporary directory removed "
        "at shutdown) and are read back for watch (default 1000)",
    )
    _add_chunk_argument(p, "θ")
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
    p.add_argument(
        "--extra-delay",
        metavar="SECONDS",
        type=float,
        default=0.0,
        help="TEST INSTRUMENT: wait this many seconds more every round before sending "
        "(a Cancel ends the wait), on top of the job's straggler delay: a slower machine, "
        "whichever place it holds, where --stragglers delays places. Never for training.",
    )
    _add_chunk_argument(p, "its results and peer pushes")
    p.add_argument(
        "--peer-fault",
        metavar="KIND:ROUND",
        help="TEST INSTRUMENT: misbehave towards this worker's peers in ring and tree jobs "
        "from round ROUND on, to try their defences: silent (send them nothing while "
        "staying connected: a hung peer) or shape (push tensors one value short). Never "
        "for training.",
    )
    add_security_arguments(p, server=False)
    p.set_defaults(func=cmd_worker)


def _add_chunk_argument(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument(
        "--chunk-bytes",
        type=int,
        metavar="N",
        help=f"cut {what} into messages of at most N bytes (4096 to 4128768, the default: "
        "a chunk and its envelope stay under gRPC's default 4 MiB limit; "
        "bench/bench_chunks.py measures the choice)",
    )


def _add_metrics_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("metrics (Prometheus endpoint)")
    g.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port")
    g.add_argument(
        "--metrics-address",
        default="127.0.0.1",
        help="address the metrics endpoint binds (default 127.0.0.1: this host only; "
        "0.0.0.0 for a Prometheus elsewhere, as the compose file and EC2 layout set; the "
        "endpoint has no authentication unless --metrics-basic-auth-file or "
        "--metrics-tls-ca is given)",
    )
    g.add_argument(
        "--metrics-tls-cert",
        metavar="PEM",
        help="serve the metrics endpoint over HTTPS with this certificate (needs "
        "--metrics-tls-key; default: plain HTTP)",
    )
    g.add_argument(
        "--metrics-tls-key", metavar="PEM", help="unencrypted private key of --metrics-tls-cert"
    )
    g.add_argument(
        "--metrics-tls-ca",
        metavar="PEM",
        help="with HTTPS, accept only scrapers presenting a client certificate signed by "
        "this CA (mutual TLS)",
    )
    g.add_argument(
        "--metrics-basic-auth-file",
        metavar="FILE",
        help="require HTTP basic auth: FILE holds one line user:password; a request "
        "without them gets 401 (over plain HTTP the password crosses the network in "
        "clear: add --metrics-tls-cert off this host)",
    )


def _metrics_security(args: argparse.Namespace) -> Any:
    """The metrics endpoint's HTTPS and basic auth, every file read and checked.

    A --metrics-tls-* or --metrics-basic-auth-file without --metrics-port is refused: it
    would protect nothing, and whoever set it believes the endpoint is protected.
    """
    from codedgd.services.errors import ConfigError
    from codedgd.services.metrics_endpoint import METRICS_SECURITY_OPTIONS, MetricsSecurity

    given = [o for o in METRICS_SECURITY_OPTIONS if getattr(args, o[2:].replace("-", "_"))]
    if given and args.metrics_port is None:
        raise ConfigError(
            f"{given[0]} needs --metrics-port: no metrics endpoint is served without it; "
            f"add --metrics-port or drop {given[0]}"
        )
    return MetricsSecurity.from_options(
        tls_cert=args.metrics_tls_cert,
        tls_key=args.metrics_tls_key,
        tls_ca=args.metrics_tls_ca,
        basic_auth_file=args.metrics_basic_auth_file,
    )


def cmd_coordinator(args: argparse.Namespace) -> int:
    from codedgd.services.address import UNIX_PREFIXES, parse_address
    from codedgd.services.coordinator.server import CoordinatorServer, serve_forever

    security = security_from_args(args)
    # A malformed --listen is refused before the warning below speaks of it.
    host = "" if args.listen.startswith(UNIX_PREFIXES) else parse_address(args.listen)[0]
    tokens = security.token is not None or security.role_tokens
    if not tokens and host not in ("", "127.0.0.1", "localhost", "::1"):
        logging.getLogger("codedgd").warning(
            "serving on %s without a token: anyone who reaches this port can join or submit "
            "jobs. Set --worker-token-file and --operator-token-file (and TLS) outside a "
            "private network.",
            args.listen,
        )
    for role in security.closed_roles():
        logging.getLogger("codedgd").warning(
            "no %s token (--%s-token-file): no %s can %s",
            role,
            role,
            role,
            "connect" if role == "worker" else "submit, watch or cancel jobs",
        )
    job = job_from_args(args) if (args.config or args.run_default_job) else None

    async def main() -> None:
        server = await CoordinatorServer.start(
            args.listen,
            security=security,
            metrics_port=args.metrics_port,
            metrics_address=args.metrics_address,
            metrics_security=_metrics_security(args),
            data_dir=args.data_dir,
            assign_timeout=args.assign_timeout,
            state_dir=args.state_dir,
            checkpoint_every=args.checkpoint_every,
            worker_timeout=args.worker_timeout,
            records_in_memory=args.records_in_memory,
            chunk_bytes=args.chunk_bytes,
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
    from codedgd.services.worker.peer_faults import PeerFault

    options = WorkerOptions(
        coordinator=args.coordinator,
        security=security_from_args(args),
        data_dir=Path(args.data_dir) if args.data_dir else None,
        reconnect=not args.no_reconnect,
        peer_listen=args.peer_listen,
        peer_address=args.peer_address,
        peer_tls_server_name=args.peer_tls_server_name,
        corrupt=Corruption.parse(args.corrupt) if args.corrupt else None,
        peer_fault=PeerFault.parse(args.peer_fault) if args.peer_fault else None,
        extra_delay=args.extra_delay,
        **({"chunk_bytes": args.chunk_bytes} if args.chunk_bytes is not None else {}),
        **({"name": args.name} if args.name else {}),
    )
    metrics_security = _metrics_security(args)

    async def main() -> None:
        agent = WorkerAgent(options)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, agent.stop)
        if args.metrics_port is not None:
            from codedgd.services.worker.metrics import serve_worker_metrics

            serve_worker_metrics(
                agent, args.metrics_port, args.metrics_address, security=metrics_security
            )
        await agent.run()

    asyncio.run(main())
    return 0
