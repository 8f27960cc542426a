"""Only holders of the token (and, with TLS, of the CA-signed certificate) join."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from codedgd.client.api import Client, CoordinatorUnavailable
from codedgd.services.coordinator.server import CoordinatorServer
from codedgd.services.errors import CodedGDError
from codedgd.services.job import Component, JobConfig
from codedgd.services.proto import codedgd_pb2 as pb
from codedgd.services.security import Security, TokenInterceptor
from codedgd.services.wire import MAX_MESSAGE_BYTES
from codedgd.services.worker.agent import Rejected, WorkerAgent, WorkerOptions
from tests.conftest import WorkerProcesses

SYNTH = Component("synthetic", {"rows": 400, "dim": 5})


async def test_token_is_required_for_clients_and_workers(
    worker_processes: WorkerProcesses,
) -> None:
    server = await CoordinatorServer.start("127.0.0.1:0", security=Security(token="s3cret"))
    target = f"127.0.0.1:{server.port}"
    try:
        for token in (None, "wrong"):
            async with Client(target, Security(token=token)) as client:
                with pytest.raises(CodedGDError, match="token"):
                    await client.status()
            agent = WorkerAgent(
                WorkerOptions(coordinator=target, security=Security(token=token), reconnect=False)
            )
            with pytest.raises(Rejected, match="token"):
                await agent.run()
        assert len(server.service.sessions) == 0
        worker_processes.start(server.port, 1, token="s3cret")
        async with Client(target, Security(token="s3cret")) as client:
            job_id = await client.submit(JobConfig(workers=1, rounds=2, data=SYNTH))
            assert len([r async for r in client.watch(job_id)]) == 2
    finally:
        await server.stop(0)


def _make_ca_and_cert(tmp: Path) -> tuple[Path, Path, Path]:
    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=tmp)

    run(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=codedgd-test-ca",
    )
    run(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=localhost",
    )
    (tmp / "ext.cnf").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    run(
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
    )
    return tmp / "ca.pem", tmp / "server.pem", tmp / "server.key"


async def test_tls_with_token(tmp_path: Path, worker_processes: WorkerProcesses) -> None:
    ca, cert, key = _make_ca_and_cert(tmp_path)
    server = await CoordinatorServer.start(
        "127.0.0.1:0", security=Security(token="t", tls_cert=cert, tls_key=key)
    )
    target = f"localhost:{server.port}"
    try:
        # A plaintext client cannot talk to a TLS coordinator.
        async with Client(target, Security(token="t")) as client:
            with pytest.raises(CoordinatorUnavailable):
                await client.status()
        worker_processes.start(server.port, 1, token="t", extra=("--tls-ca", str(ca)))
        async with Client(target, Security(token="t", tls_ca=ca)) as client:
            job_id = await client.submit(JobConfig(workers=1, rounds=2, data=SYNTH))
            assert len([r async for r in client.watch(job_id)]) == 2
    finally:
        await server.stop(0)


async def test_a_refusal_garbled_by_grpc_is_asked_again() -> None:
    """Under load gRPC can end a refused stream with INTERNAL before UNAUTHENTICATED
    arrives; a worker without reconnect tries a stream that got no answer again."""
    calls = 0

    async def connect(requests: object, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        nonlocal calls
        calls += 1
        if calls == 1:
            await context.abort(grpc.StatusCode.INTERNAL, "Internal error from Core")
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong token")
        yield b""  # pragma: no cover - abort raises

    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "codedgd.v1.Coordinator",
                {"Connect": grpc.stream_stream_rpc_method_handler(connect)},
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        agent = WorkerAgent(WorkerOptions(coordinator=f"127.0.0.1:{port}", reconnect=False))
        with pytest.raises(Rejected, match="token"):
            await agent.run()
        assert calls == 2
    finally:
        await server.stop(0)


class _Details(grpc.HandlerCallDetails):  # type: ignore[misc]
    def __init__(self, method: str, metadata: tuple[tuple[str, str], ...]) -> None:
        self.method = method
        self.invocation_metadata = metadata


class _Aborted(Exception):
    pass


class _Context:
    def __init__(self) -> None:
        self.status: tuple[grpc.StatusCode, str] | None = None

    async def abort(self, code: grpc.StatusCode, message: str) -> None:
        self.status = (code, message)
        raise _Aborted


@pytest.mark.parametrize("method", ["Connect", "SubmitJob", "WatchJob", "GetStatus", "GetModel"])
async def test_a_call_without_the_token_is_refused_before_its_body_is_read(method: str) -> None:
    """gRPC reads a unary request whole before its handler runs: the refusal must take
    the request as a stream it never touches, whatever the method's shape."""
    interceptor = TokenInterceptor("s3cret")
    reached = []

    async def continuation(details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        reached.append(details.method)
        raise AssertionError("a refused call reached the service")

    read = 0

    async def body() -> AsyncIterator[bytes]:
        nonlocal read
        read += 1
        yield b"\0" * 1024

    for metadata in ((), (("authorization", "Bearer wrong"),), (("authorization", "s3cret"),)):
        handler = await interceptor.intercept_service(
            continuation, _Details(f"/codedgd.v1.Coordinator/{method}", metadata)
        )
        assert handler.request_streaming and handler.response_streaming
        assert handler.request_deserializer is None
        context = _Context()
        with pytest.raises(_Aborted):
            await anext(handler.stream_stream(body(), context))
        assert context.status is not None
        assert context.status[0] == grpc.StatusCode.UNAUTHENTICATED
        assert "--token" in context.status[1]
    assert read == 0 and reached == []

    # The right token goes through; the health service is open to anyone.
    async def passed(details: grpc.HandlerCallDetails) -> str:
        return "service"

    good = (("authorization", "Bearer s3cret"),)
    assert await interceptor.intercept_service(passed, _Details("/x/Y", good)) == "service"
    health = _Details("/grpc.health.v1.Health/Check", ())
    assert await interceptor.intercept_service(passed, health) == "service"


async def test_large_unauthenticated_calls_are_refused_and_the_coordinator_keeps_serving() -> None:
    server = await CoordinatorServer.start("127.0.0.1:0", security=Security(token="s3cret"))
    target = f"127.0.0.1:{server.port}"
    options = [("grpc.max_send_message_length", 128 << 20)]
    try:
        async with grpc.aio.insecure_channel(target, options=options) as channel:
            submit = channel.unary_unary("/codedgd.v1.Coordinator/SubmitJob")
            # Bodies past the receive limit, which the refusal never reads: still UNAUTHENTICATED.
            results = await asyncio.gather(
                *(submit(b"\0" * (60 << 20)) for _ in range(8)), return_exceptions=True
            )
            assert all(isinstance(r, grpc.aio.AioRpcError) for r in results)
            codes = {r.code() for r in results if isinstance(r, grpc.aio.AioRpcError)}
            assert codes == {grpc.StatusCode.UNAUTHENTICATED}
            # With the token, a body past the limit is refused by its length alone.
            good = (("authorization", "Bearer s3cret"),)
            with pytest.raises(grpc.aio.AioRpcError) as too_big:
                await submit(b"\0" * (MAX_MESSAGE_BYTES + 1024), metadata=good)
            assert too_big.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        async with Client(target, Security(token="s3cret")) as client:
            assert (await client.status()).jobs == ()
    finally:
        await server.stop(0)


@pytest.mark.parametrize(
    ("method", "kind"),
    [
        ("SubmitJob", "SubmitJobRequest"),
        ("GetStatus", "StatusRequest"),
        ("CancelJob", "JobRef"),
        ("WatchJob", "JobRef"),
        ("GetModel", "JobRef"),
    ],
)
async def test_a_request_that_does_not_parse_is_invalid_argument_naming_its_type(
    method: str, kind: str
) -> None:
    server = await CoordinatorServer.start("127.0.0.1:0")
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            path = f"/codedgd.v1.Coordinator/{method}"
            with pytest.raises(grpc.aio.AioRpcError) as info:
                if method in ("WatchJob", "GetModel"):
                    async for _ in channel.unary_stream(path)(b"\xff" * 64):
                        pass
                else:
                    await channel.unary_unary(path)(b"\xff" * 64)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"codedgd.v1.{kind}" in (info.value.details() or "")
        assert "codedgd.proto" in (info.value.details() or "")
    finally:
        await server.stop(0)


@pytest.mark.parametrize(
    ("method", "kind", "size"),
    [
        ("SubmitJob", "SubmitJobRequest", (1 << 20) + 1),
        ("GetStatus", "StatusRequest", (16 << 10) + 1),
        ("CancelJob", "JobRef", (16 << 10) + 1),
        ("WatchJob", "JobRef", 4 << 20),
        ("GetModel", "JobRef", (16 << 10) + 1),
    ],
)
async def test_a_request_over_its_methods_limit_is_refused_unparsed(
    method: str, kind: str, size: int
) -> None:
    """Job submission and status calls are small: a body past the method's limit (a valid
    message, a long job id) is RESOURCE_EXHAUSTED naming the limit, never parsed, and
    the coordinator goes on serving."""
    server = await CoordinatorServer.start("127.0.0.1:0")
    try:
        async with grpc.aio.insecure_channel(
            f"127.0.0.1:{server.port}", options=[("grpc.max_send_message_length", 8 << 20)]
        ) as channel:
            path = f"/codedgd.v1.Coordinator/{method}"
            body = (
                pb.SubmitJobRequest(job_json="x" * size)
                if kind == "SubmitJobRequest"
                else pb.JobRef(job_id="x" * size)
            ).SerializeToString()
            with pytest.raises(grpc.aio.AioRpcError) as info:
                if method in ("WatchJob", "GetModel"):
                    async for _ in channel.unary_stream(path)(body):
                        pass
                else:
                    await channel.unary_unary(path)(body)
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert f"codedgd.v1.{kind} of {len(body)} bytes is over its limit" in (
                info.value.details() or ""
            )
            status = await channel.unary_unary(
                "/codedgd.v1.Coordinator/GetStatus",
                response_deserializer=pb.StatusResponse.FromString,
            )(pb.StatusRequest().SerializeToString())
            assert status.workers_connected == 0
    finally:
        await server.stop(0)
