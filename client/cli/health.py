"""`codedgd health`: the probe that container healthchecks run.

    codedgd health                         the coordinator at --coordinator (127.0.0.1:50051)
    codedgd health --worker                this machine's worker, through its metrics port

A coordinator serves the standard ``grpc.health.v1.Health`` service (open even when a
token is required, so an orchestrator needs no secret to probe it); the probe calls
``Check`` and is healthy when the answer is SERVING. A worker serves no gRPC (it dials
out), so ``--worker`` reads the worker's own Prometheus endpoint on 127.0.0.1:--metrics-port
and is healthy while ``codedgd_worker_connected`` is 1: its stream to the coordinator is open.
When the worker's endpoint is protected, the probe takes the worker's own flags (and so, in
a container, the same CODEDGD_METRICS_* variables): HTTPS with --metrics-tls-cert (not
verified: the probe only ever dials this machine's loopback), that certificate and key as
its client certificate when --metrics-tls-ca requires one, and the --metrics-basic-auth-file
credentials.

Exit status 0 when healthy, 1 when not (Docker's HEALTHCHECK convention), 2 for a usage
error. One line on stdout says what was seen. Like every command, each flag reads its
default from CODEDGD_<FLAG> (so inside a worker container CODEDGD_METRICS_PORT is already
the right port).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import ssl
import sys
import urllib.error
import urllib.request
from typing import Any

from codedgd.client.cli.options import apply_env_defaults, check_env
from codedgd.services.errors import CodedGDError, ConfigError

DEFAULT_COORDINATOR = "127.0.0.1:50051"
DEFAULT_WORKER_METRICS_PORT = 9101
HEALTHY, UNHEALTHY = 0, 1


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``health`` subcommand to the CLI's subparsers (``sub.add_parser`` object)."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "health",
        help="probe a coordinator (gRPC health service) or a worker (exit 0 if healthy)",
        description="Container healthcheck: probe a coordinator through the standard "
        "grpc.health.v1 service, or with --worker this machine's worker through its metrics "
        "endpoint. Exit status 0 when healthy, 1 when not.",
        epilog="Every --flag-name also reads its default from CODEDGD_FLAG_NAME.",
    )
    p.add_argument(
        "--coordinator",
        default=DEFAULT_COORDINATOR,
        help=f"coordinator host:port to probe (default {DEFAULT_COORDINATOR})",
    )
    p.add_argument(
        "--service",
        default="",
        help='health service name to ask about (default "": the whole server; '
        "codedgd.v1.Coordinator also works)",
    )
    p.add_argument(
        "--timeout", type=float, default=3.0, help="seconds before giving up (default 3)"
    )
    p.add_argument(
        "--worker",
        action="store_true",
        help="probe the worker on this machine through 127.0.0.1:--metrics-port instead",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=DEFAULT_WORKER_METRICS_PORT,
        help=f"the worker's metrics port, with --worker (default {DEFAULT_WORKER_METRICS_PORT})",
    )
    m = p.add_argument_group("the worker's metrics endpoint, with --worker (its own flags)")
    m.add_argument("--metrics-tls-cert", metavar="PEM", help="the endpoint serves HTTPS")
    m.add_argument("--metrics-tls-key", metavar="PEM", help="key of --metrics-tls-cert")
    m.add_argument(
        "--metrics-tls-ca",
        metavar="PEM",
        help="the endpoint requires client certificates: present --metrics-tls-cert/-key",
    )
    m.add_argument(
        "--metrics-basic-auth-file", metavar="FILE", help="user:password to send (basic auth)"
    )
    g = p.add_argument_group("security (coordinator probe; the same flags as other commands)")
    g.add_argument(
        "--token",
        help="a token to send (default $CODEDGD_TOKEN; the health service needs none, so "
        "any role's token, or none, probes it)",
    )
    g.add_argument("--token-file", help="read that token from this file")
    g.add_argument("--tls-ca", help="verify the coordinator's TLS certificate with this CA")
    g.add_argument("--tls-cert", help="client certificate, when the coordinator requires mTLS")
    g.add_argument("--tls-key", help="private key of --tls-cert (PEM)")
    g.add_argument("--tls-server-name", help="name to verify in the coordinator's certificate")
    p.set_defaults(func=cmd_health)
    return p


async def coordinator_status(
    address: str, *, service: str = "", timeout: float = 3.0, security: Any = None
) -> str:
    """The serving status the coordinator's health service reports, e.g. ``"SERVING"``.

    Raises ``grpc.aio.AioRpcError`` when the coordinator cannot be reached in time.
    """
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from codedgd.services.security import Security

    channel = (security or Security()).channel(address)
    try:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))
    finally:
        await channel.close(grace=None)


def worker_connected(
    port: int,
    *,
    host: str = "127.0.0.1",
    timeout: float = 3.0,
    context: ssl.SSLContext | None = None,
    credentials: bytes | None = None,
) -> bool | None:
    """Whether the worker serving metrics on ``host:port`` has its coordinator stream open.

    ``context``: dial HTTPS with it; ``credentials``: b"user:password" for basic auth.
    None when the endpoint does not report ``codedgd_worker_connected`` (not a worker).
    Raises OSError when nothing answers.
    """
    from prometheus_client.parser import text_string_to_metric_families

    url = f"{'https' if context is not None else 'http'}://{host}:{port}/metrics"
    request = urllib.request.Request(url)
    if credentials is not None:
        request.add_header("Authorization", "Basic " + base64.b64encode(credentials).decode())
    with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
        text = response.read().decode("utf-8", "replace")
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "codedgd_worker_connected":
                return sample.value >= 1.0
    return None


def cmd_health(args: argparse.Namespace) -> int:
    if args.worker:
        return _probe_worker(args.metrics_port, args.timeout, *_metrics_client(args))
    return _probe_coordinator(args)


def _metrics_client(args: argparse.Namespace) -> tuple[ssl.SSLContext | None, bytes | None]:
    """How to dial the worker's own endpoint: its flags, read as a client would."""
    from codedgd.services.metrics_endpoint import read_basic_auth

    context = None
    if args.metrics_tls_cert:
        # Loopback only: the probe checks liveness, and the worker's certificate names
        # the host others dial, rarely 127.0.0.1.
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        if args.metrics_tls_ca:
            try:
                context.load_cert_chain(args.metrics_tls_cert, args.metrics_tls_key)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(
                    f"cannot use --metrics-tls-cert {args.metrics_tls_cert} with "
                    f"--metrics-tls-key {args.metrics_tls_key} as the probe's client "
                    f"certificate: {exc}"
                ) from None
    credentials = None
    if args.metrics_basic_auth_file:
        credentials = read_basic_auth(args.metrics_basic_auth_file)
    return context, credentials


def _probe_worker(
    port: int, timeout: float, context: ssl.SSLContext | None, credentials: bytes | None
) -> int:
    try:
        connected = worker_connected(
            port, timeout=timeout, context=context, credentials=credentials
        )
    except (OSError, urllib.error.URLError) as exc:
        print(f"unhealthy: no worker metrics on 127.0.0.1:{port} ({exc})")
        return UNHEALTHY
    if connected is None:
        print(f"unhealthy: 127.0.0.1:{port} does not report codedgd_worker_connected")
        return UNHEALTHY
    if not connected:
        print("unhealthy: the worker is not connected to its coordinator")
        return UNHEALTHY
    print("healthy: worker connected to its coordinator")
    return HEALTHY


def _probe_coordinator(args: argparse.Namespace) -> int:
    import grpc

    from codedgd.services.security import Security

    security = Security.from_options(
        token=args.token,
        token_file=args.token_file,
        tls_ca=args.tls_ca,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        tls_server_name=args.tls_server_name,
    )
    try:
        status = asyncio.run(
            coordinator_status(
                args.coordinator, service=args.service, timeout=args.timeout, security=security
            )
        )
    except grpc.aio.AioRpcError as exc:
        print(f"unhealthy: {args.coordinator}: {exc.code().name}: {exc.details()}")
        return UNHEALTHY
    if status != "SERVING":
        print(f"unhealthy: {args.coordinator} reports {status}")
        return UNHEALTHY
    print(f"healthy: {args.coordinator} SERVING")
    return HEALTHY


def main(argv: list[str] | None = None) -> int:
    """``python -m codedgd.client.cli.health``: the same probe without the rest of the CLI."""
    parser = argparse.ArgumentParser(prog="codedgd")
    add_parser(parser.add_subparsers(dest="command", required=True))
    env_errors = apply_env_defaults(parser)
    args = parser.parse_args(["health", *(argv if argv is not None else sys.argv[1:])])
    try:
        check_env(env_errors, "health")
        return int(args.func(args))
    except CodedGDError as exc:  # e.g. a TLS file that is not PEM
        print(f"codedgd health: error: {exc}", file=sys.stderr)
        return UNHEALTHY


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["add_parser", "cmd_health", "coordinator_status", "main", "worker_connected"]
