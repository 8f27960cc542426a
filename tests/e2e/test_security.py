"""Only holders of the token (and, with TLS, of the CA-signed certificate) join."""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from codedgd.client.api import Client, CoordinatorUnavailable
from codedgd.services.coordinator.server import CoordinatorServer
from codedgd.services.errors import CodedGDError
from codedgd.services.job import Component, JobConfig
from codedgd.services.security import Security
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
