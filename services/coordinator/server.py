"""Serving the coordinator: the gRPC server, health and reflection services, metrics endpoint.

The handlers are registered by hand rather than through the generated
``add_CoordinatorServicer_to_server``: responses pass through bytes (θ_t is
serialized once per round and the same bytes are written to every worker's
stream), and a request that does not parse gets INVALID_ARGUMENT naming its type.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc
from google.protobuf.message import DecodeError, Message
from grpc import aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection  # type: ignore[import-untyped]

from codedgd.services.address import (
    UNIX_PREFIXES,
    check_bindable,
    check_metrics_port,
    parse_address,
)
from codedgd.services.coordinator.job_run import DEFAULT_CHECKPOINT_EVERY
from codedgd.services.coordinator.metrics import CoordinatorMetrics
from codedgd.services.coordinator.service import DEFAULT_WORKER_TIMEOUT, CoordinatorService
from codedgd.services.coordinator.state import StateDir
from codedgd.services.errors import ConfigError
from codedgd.services.framing import frame_reader, to_wire
from codedgd.services.metrics_endpoint import MetricsSecurity, serve_metrics
from codedgd.services.proto import codedgd_pb2 as pb
from codedgd.services.records import DEFAULT_RECORDS_IN_MEMORY
from codedgd.services.security import Security
from codedgd.services.wire import SERVER_OPTIONS, WORKER_TENSOR_PATHS, check_chunk_bytes

log = logging.getLogger("codedgd.coordinator")
SERVICE_NAME = "codedgd.v1.Coordinator"
# What server reflection lists (its descriptors come from the imported generated code).
REFLECTED_SERVICES = (
    SERVICE_NAME,
    health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
    reflection.SERVICE_NAME,
)
T = TypeVar("T")
M = TypeVar("M", bound=Message)


# Results' gradient bytes stay views of the received frame (codedgd.services.framing).
_worker_frame = frame_reader(pb.WorkerMessage, WORKER_TENSOR_PATHS)


def _handlers(service: CoordinatorService) -> grpc.GenericRpcHandler:
    return grpc.method_handlers_generic_handler(
        SERVICE_NAME,
        {
            "Connect": grpc.stream_stream_rpc_method_handler(
                service.Connect,
                request_deserializer=_worker_frame,
                response_serializer=to_wire,
            ),
            "SubmitJob": _unary(pb.SubmitJobRequest, service.SubmitJob, SUBMIT_LIMIT),
            "WatchJob": _unary_stream(pb.JobRef, service.WatchJob, SMALL_LIMIT),
            "GetStatus": _unary(pb.StatusRequest, service.GetStatus, SMALL_LIMIT),
            "CancelJob": _unary(pb.JobRef, service.CancelJob, SMALL_LIMIT),
            "GetModel": _unary_stream(pb.JobRef, service.GetModel, SMALL_LIMIT),
        },
    )


# Per-method request limits, below the server's receive limit (wire.SERVER_OPTIONS) that
# only a worker's stream of chunked results needs: a job document, a job id.
SUBMIT_LIMIT = 1 << 20
SMALL_LIMIT = 16 << 10


async def _parse(kind: type[M], raw: bytes, context: aio.ServicerContext, limit: int) -> M:
    """``raw`` as a ``kind``; a body that is not one ends the call with INVALID_ARGUMENT,
    one longer than ``limit`` bytes with RESOURCE_EXHAUSTED before it is parsed.

    gRPC's own deserializer hook would turn the parse error into UNKNOWN with a
    Python exception's repr and log a traceback on the server.
    """
    if len(raw) > limit:
        await context.abort(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"a {kind.DESCRIPTOR.full_name} of {len(raw)} bytes is over its limit of {limit} "
            "bytes; only a worker's Connect stream carries large messages (in chunks)",
        )
    try:
        return kind.FromString(raw)
    except DecodeError as exc:
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"the request is not a valid {kind.DESCRIPTOR.full_name} message ({exc}); "
            "build it from protos/codedgd/v1/codedgd.proto",
        )
        raise AssertionError("unreachable") from None  # pragma: no cover - abort raises


def _unary(
    kind: type[M], handle: Callable[[M, aio.ServicerContext], Awaitable[Message]], limit: int
) -> grpc.RpcMethodHandler:
    async def call(raw: bytes, context: aio.ServicerContext) -> Message:
        return await handle(await _parse(kind, raw, context, limit), context)

    return grpc.unary_unary_rpc_method_handler(call, response_serializer=to_wire)


def _unary_stream(
    kind: type[M], handle: Callable[[M, aio.ServicerContext], AsyncIterator[Any]], limit: int
) -> grpc.RpcMethodHandler:
    async def call(raw: bytes, context: aio.ServicerContext) -> AsyncIterator[Any]:
        async for reply in handle(await _parse(kind, raw, context, limit), context):
            yield reply

    return grpc.unary_stream_rpc_method_handler(call, response_serializer=to_wire)


@dataclass
class CoordinatorServer:
    """A running coordinator: ``await CoordinatorServer.start(...)``, then ``stop()``."""

    server: aio.Server
    service: CoordinatorService
    port: int
    health: health.aio.HealthServicer
    metrics_port: int | None = None
    _closers: list[Any] = field(default_factory=list)
    _stopped: bool = field(default=False, init=False)

    @staticmethod
    async def start(
        address: str = "127.0.0.1:50051",
        *,
        security: Security | None = None,
        metrics_port: int | None = None,
        metrics_address: str = "127.0.0.1",
        metrics_security: MetricsSecurity | None = None,
        data_dir: str | None = None,
        assign_timeout: float = 120.0,
        state_dir: str | Path | None = None,
        checkpoint_every: int = DEFAULT_CHECKPOINT_EVERY,
        worker_timeout: float = DEFAULT_WORKER_TIMEOUT,
        records_in_memory: int = DEFAULT_RECORDS_IN_MEMORY,
        chunk_bytes: int | None = None,
    ) -> CoordinatorServer:
        """Bind, start serving and return the coordinator.

        A mistake the user can fix (an address that is malformed, in use or not this
        host's; a metrics port out of range or in use; TLS files that are not a PEM
        certificate and its key) is a ConfigError raised before anything is left
        running: every check comes first, the metrics endpoint is bound before the gRPC
        server starts, and a failure or cancellation part-way stops what was started.
        """
        security = security or Security()
        if chunk_bytes is not None:
            check_chunk_bytes(chunk_bytes)
        security.check_server()  # TLS files: both, PEM, a pair
        check_bindable(address)  # HOST:PORT, port 0..65535, free, an address of this host
        if metrics_port is not None:
            check_metrics_port(metrics_port)
            if (
                metrics_port != 0
                and not address.startswith(UNIX_PREFIXES)
                and parse_address(address)[1] == metrics_port
            ):
                raise ConfigError(
                    f"--metrics-port {metrics_port} is the port of --listen {address}; "
                    "choose another --metrics-port"
                )
        if checkpoint_every < 1:
            raise ConfigError(
                f"--checkpoint-every {checkpoint_every}: give a number of rounds >= 1"
            )
        if not (math.isfinite(worker_timeout) and worker_timeout > 0):
            raise ConfigError(
                f"--worker-timeout {worker_timeout:g}: give the seconds (> 0) after which a "
                "silent worker is dropped"
            )
        if records_in_memory < 1:
            raise ConfigError(
                f"--records-in-memory {records_in_memory}: give the number of round records "
                "(>= 1) to keep in memory per job; older ones are read back from disk"
            )
        state = StateDir(state_dir, records_in_memory) if state_dir is not None else None
        metrics = CoordinatorMetrics()
        closers: list[Any] = []
        bound_metrics: int | None = None
        if metrics_port is not None:
            http_server = serve_metrics(
                metrics.registry, metrics_port, metrics_address, security=metrics_security
            )
            closers.append(http_server)
            bound_metrics = int(http_server.server_address[1])
        service = CoordinatorService(
            metrics=metrics,
            data_dir=data_dir,
            assign_timeout=assign_timeout,
            state_dir=state,
            checkpoint_every=checkpoint_every,
            worker_timeout=worker_timeout,
            records_in_memory=records_in_memory,
            chunk_bytes=chunk_bytes,
        )
        server: aio.Server | None = None
        try:
            server = aio.server(options=list(SERVER_OPTIONS), interceptors=security.interceptors())
            server.add_generic_rpc_handlers((_handlers(service),))
            health_servicer = health.aio.HealthServicer()
            health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
            # grpcurl, Postman and the like list and call the API without the .proto.
            reflection.enable_server_reflection(REFLECTED_SERVICES, server)
            port = security.add_port(server, address)
            await server.start()
            service.start()
            await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
            await health_servicer.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
        except BaseException:
            await uninterrupted(_abandon(server, service, closers))
            raise
        log.info("coordinator listening on %s (port %d)", address, port)
        return CoordinatorServer(server, service, port, health_servicer, bound_metrics, closers)

    async def stop(self, grace: float = 2.0) -> None:
        """Tell workers to leave, stop serving, close the metrics endpoint.

        Every step is taken even if an earlier one fails; a second call does nothing.
        """
        if self._stopped:
            return
        self._stopped = True
        try:
            await self.health.enter_graceful_shutdown()
            await self.service.stop()
        finally:
            try:
                await self.server.stop(grace)
            finally:
                _close_all(self._closers)

    async def wait(self) -> None:
        await self.server.wait_for_termination()


def _close_all(http_servers: list[Any]) -> None:
    for http_server in http_servers:
        http_server.shutdown()
        http_server.server_close()
    http_servers.clear()


async def _abandon(
    server: aio.Server | None, service: CoordinatorService, closers: list[Any]
) -> None:
    """Undo a start that failed part-way (gRPC server, job loop, metrics endpoint)."""
    try:
        if server is not None:
            await server.stop(None)
        await service.stop()
    finally:
        _close_all(closers)


async def uninterrupted(aw: Awaitable[T]) -> T:
    """Await ``aw`` to its end even when the caller is cancelled meanwhile, then re-raise.

    Clean-up that a Ctrl-C (or SIGTERM) cancels half-way leaves a gRPC server running
    into interpreter exit, where its ``__del__`` prints "Exception ignored ... Event loop
    is closed".
    """
    task = asyncio.ensure_future(aw)
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(task)
            break
        except asyncio.CancelledError:
            if task.done():  # cancelled itself (the event loop shutting down)
                raise
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    return result


async def serve_forever(server: CoordinatorServer) -> None:
    """Serve until SIGTERM/SIGINT, then shut down gracefully (workers are told to leave)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
        log.info("shutting down")
    finally:
        await uninterrupted(server.stop())
