"""Serving the coordinator: the gRPC server, health service and metrics endpoint.

The Connect handler is registered by hand rather than through the generated
``add_CoordinatorServicer_to_server`` so its response serializer can pass
through bytes: θ_t is serialized once per round and the same bytes are written
to every worker's stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc import aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import start_http_server

from services.coordinator.metrics import CoordinatorMetrics
from services.coordinator.service import CoordinatorService
from services.framing import frame_reader, to_wire
from services.proto import codedgd_pb2 as pb
from services.security import Security
from services.wire import SERVER_OPTIONS, WORKER_TENSOR_PATHS

log = logging.getLogger("codedgd.coordinator")
SERVICE_NAME = "codedgd.v1.Coordinator"


# Results' gradient bytes stay views of the received frame (services.framing).
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
            "SubmitJob": grpc.unary_unary_rpc_method_handler(
                service.SubmitJob,
                request_deserializer=pb.SubmitJobRequest.FromString,
                response_serializer=to_wire,
            ),
            "WatchJob": grpc.unary_stream_rpc_method_handler(
                service.WatchJob,
                request_deserializer=pb.JobRef.FromString,
                response_serializer=to_wire,
            ),
            "GetStatus": grpc.unary_unary_rpc_method_handler(
                service.GetStatus,
                request_deserializer=pb.StatusRequest.FromString,
                response_serializer=to_wire,
            ),
            "CancelJob": grpc.unary_unary_rpc_method_handler(
                service.CancelJob,
                request_deserializer=pb.JobRef.FromString,
                response_serializer=to_wire,
            ),
        },
    )


@dataclass
class CoordinatorServer:
    """A running coordinator: ``await CoordinatorServer.start(...)``, then ``stop()``."""

    server: aio.Server
    service: CoordinatorService
    port: int
    health: health.aio.HealthServicer
    metrics_port: int | None = None
    _closers: list[Any] = field(default_factory=list)

    @staticmethod
    async def start(
        address: str = "127.0.0.1:50051",
        *,
        security: Security | None = None,
        metrics_port: int | None = None,
        data_dir: str | None = None,
        assign_timeout: float = 120.0,
    ) -> CoordinatorServer:
        security = security or Security()
        metrics = CoordinatorMetrics()
        service = CoordinatorService(
            metrics=metrics, data_dir=data_dir, assign_timeout=assign_timeout
        )
        server = aio.server(options=list(SERVER_OPTIONS), interceptors=security.interceptors())
        server.add_generic_rpc_handlers((_handlers(service),))
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        port = security.add_port(server, address)
        await server.start()
        service.start()
        await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        await health_servicer.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
        closers: list[Any] = []
        bound_metrics: int | None = None
        if metrics_port is not None:
            http_server, _thread = start_http_server(metrics_port, registry=metrics.registry)
            closers.append(http_server)
            bound_metrics = http_server.server_address[1]
        log.info("coordinator listening on %s (port %d)", address, port)
        return CoordinatorServer(server, service, port, health_servicer, bound_metrics, closers)

    async def stop(self, grace: float = 2.0) -> None:
        await self.health.enter_graceful_shutdown()
        await self.service.stop()
        await self.server.stop(grace)
        for closer in self._closers:
            closer.shutdown()
            closer.server_close()

    async def wait(self) -> None:
        await self.server.wait_for_termination()


async def serve_forever(server: CoordinatorServer) -> None:
    """Serve until SIGTERM/SIGINT, then shut down gracefully (workers are told to leave)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("shutting down")
    await server.stop()
