"""Separate roles: a worker token opens Connect only, an operator token the client methods
only, a job's peer credential the Peer service only; make-certs.sh issues a client
certificate per role, and a certificate about to expire is warned about at start-up."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import pytest

from codedgd.client.api import Client
from codedgd.client.cli import build_parser
from codedgd.client.cli.options import apply_env_defaults, security_from_args
from codedgd.services.coordinator.server import CoordinatorServer
from codedgd.services.errors import CodedGDError, ConfigError
from codedgd.services.job import Component, JobConfig
from codedgd.services.security import Security, TokenInterceptor, certificate_roles
from codedgd.services.worker.agent import Rejected, WorkerAgent, WorkerOptions
from codedgd.services.worker.peers import PUSH_METHOD, PeerServer
from tests.conftest import ROOT, WorkerProcesses

SYNTH = Component("synthetic", {"rows": 400, "dim": 5})
ROLES = Security(worker_token="w0rker", operator_token="0perator")
OPERATOR_METHODS = ("SubmitJob", "WatchJob", "GetStatus", "CancelJob", "GetModel")


@pytest.fixture
async def coordinator_with_roles() -> AsyncIterator[CoordinatorServer]:
    server = await CoordinatorServer.start("127.0.0.1:0", security=ROLES)
    yield server
    await server.stop(0)


async def _call(target: str, method: str, token: str) -> grpc.aio.AioRpcError:
    """The error ``method`` ends with when called with ``token`` (an empty body)."""
    path = f"/codedgd.v1.Coordinator/{method}"
    metadata = (("authorization", f"Bearer {token}"),)
    async with grpc.aio.insecure_channel(target) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            if method in ("WatchJob", "GetModel", "Connect"):
                call = (
                    channel.stream_stream(path)(iter(()), metadata=metadata)
                    if method == "Connect"
                    else channel.unary_stream(path)(b"", metadata=metadata)
                )
                async for _ in call:
                    pass
            else:
                await channel.unary_unary(path)(b"", metadata=metadata)
    return info.value


# ---------------------------------------------------------------- tokens


async def test_a_worker_token_opens_no_operator_method(
    coordinator_with_roles: CoordinatorServer,
) -> None:
    target = f"127.0.0.1:{coordinator_with_roles.port}"
    for method in OPERATOR_METHODS:
        error = await _call(target, method, "w0rker")
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED, method
        assert "this token is a worker's" in (error.details() or "")
        assert "needs the operator token" in (error.details() or "")
        assert "--operator-token-file" in (error.details() or "")
    async with Client(target, Security(token="w0rker")) as client:
        for action in (
            client.submit(JobConfig(workers=1, rounds=1, data=SYNTH)),
            client.cancel("job-1"),
            client.status(),
        ):
            with pytest.raises(CodedGDError, match=r"needs the operator token"):
                await action
    assert coordinator_with_roles.service.jobs == {}


async def test_an_operator_token_cannot_connect_as_a_worker(
    coordinator_with_roles: CoordinatorServer,
) -> None:
    target = f"127.0.0.1:{coordinator_with_roles.port}"
    error = await _call(target, "Connect", "0perator")
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "this token is an operator's: Connect needs the worker token" in (error.details() or "")
    agent = WorkerAgent(
        WorkerOptions(coordinator=target, security=Security(token="0perator"), reconnect=False)
    )
    with pytest.raises(Rejected, match="needs the worker token"):
        await agent.run()
    assert len(coordinator_with_roles.service.sessions) == 0
    async with Client(target, Security(token="0perator")) as client:
        assert (await client.status()).workers_connected == 0


async def test_a_wrong_token_is_unauthenticated_naming_the_token_needed(
    coordinator_with_roles: CoordinatorServer,
) -> None:
    target = f"127.0.0.1:{coordinator_with_roles.port}"
    for method, role in (("Connect", "worker"), ("SubmitJob", "operator")):
        error = await _call(target, method, "nobody")
        assert error.code() == grpc.StatusCode.UNAUTHENTICATED
        assert f"needs the {role} token" in (error.details() or "")


async def test_each_token_is_decided_on_the_headers_alone() -> None:
    """Refusals of either kind never read the body (the handler of :func:`refusal`)."""
    interceptor = TokenInterceptor(worker="w0rker", operator="0perator")

    class Details(grpc.HandlerCallDetails):  # type: ignore[misc]
        def __init__(self, method: str, token: str) -> None:
            self.method = f"/codedgd.v1.Coordinator/{method}"
            self.invocation_metadata = (("authorization", f"Bearer {token}"),)

    async def unreachable(details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        raise AssertionError("a refused call reached the service")

    async def passed(details: grpc.HandlerCallDetails) -> str:
        return "service"

    for method, token in (("Connect", "0perator"), ("SubmitJob", "w0rker"), ("Connect", "x")):
        handler = await interceptor.intercept_service(unreachable, Details(method, token))
        assert handler.request_streaming and handler.request_deserializer is None
    for method, token in (("Connect", "w0rker"), ("SubmitJob", "0perator")):
        assert await interceptor.intercept_service(passed, Details(method, token)) == "service"


async def test_single_token_mode_opens_both_roles_alongside_role_tokens(
    worker_processes: WorkerProcesses,
) -> None:
    security = Security(token="b0th", worker_token="w0rker", operator_token="0perator")
    server = await CoordinatorServer.start("127.0.0.1:0", security=security)
    target = f"127.0.0.1:{server.port}"
    try:
        worker_processes.start(server.port, 1, token="b0th", extra=("--no-reconnect",))
        async with Client(target, Security(token="b0th")) as client:
            job_id = await client.submit(JobConfig(workers=1, rounds=2, data=SYNTH))
            assert len([r async for r in client.watch(job_id)]) == 2
    finally:
        await server.stop(0)


def test_two_roles_given_the_same_token_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="are the same token"):
        Security(worker_token="same", operator_token="same").check_server()
    with pytest.raises(ConfigError, match="--token and --worker-token"):
        Security(token="same", worker_token="same").check_server()
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(ConfigError, match="is empty"):
        Security.from_options(worker_token_file=empty)


def test_a_role_without_a_token_is_closed_and_named() -> None:
    assert Security(worker_token="w").closed_roles() == ["operator"]
    assert Security(operator_token="o").closed_roles() == ["worker"]
    assert Security(token="t", worker_token="w").closed_roles() == []
    assert Security().closed_roles() == []


async def test_no_token_opens_the_peer_service_and_no_peer_credential_the_coordinator(
    coordinator_with_roles: CoordinatorServer,
) -> None:
    peer = PeerServer(lambda message, data: None, lambda: ("the-job-credential",), Security())
    port = await peer.start("127.0.0.1:0")
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            for token in ("w0rker", "0perator"):
                push = channel.stream_unary(PUSH_METHOD)
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await push(iter(()), metadata=(("authorization", f"Bearer {token}"),))
                assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert peer.refused == 2
    finally:
        await peer.stop()
    target = f"127.0.0.1:{coordinator_with_roles.port}"
    for method in ("Connect", "SubmitJob"):
        error = await _call(target, method, "the-job-credential")
        assert error.code() == grpc.StatusCode.UNAUTHENTICATED


def test_the_cli_with_the_worker_token_cannot_submit(tmp_path: Path) -> None:
    (tmp_path / "worker.token").write_text("w0rker\n")
    (tmp_path / "operator.token").write_text("0perator\n")

    async def scenario() -> subprocess.CompletedProcess[str]:
        server = await CoordinatorServer.start("127.0.0.1:0", security=ROLES)
        try:
            return await asyncio.to_thread(
                subprocess.run,
                [
                    *(sys.executable, "-m", "codedgd.client.cli", "submit", "-n", "1"),
                    *("--coordinator", f"127.0.0.1:{server.port}"),
                    *("--token-file", str(tmp_path / "worker.token")),
                ],
                capture_output=True,
                text=True,
                timeout=60,
                cwd=ROOT,
            )
        finally:
            await server.stop(0)

    done = asyncio.run(scenario())
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert lines == [
        "codedgd submit: error: this token is a worker's: SubmitJob needs the operator token "
        "(the coordinator's --operator-token-file); pass that one with --token-file"
    ], done.stderr


# ---------------------------------------------------------------- certificates


def _make_certs(out: Path) -> Path:
    subprocess.run(
        [str(ROOT / "deploy" / "ec2" / "make-certs.sh"), str(out), "localhost", "127.0.0.1"],
        check=True,
        capture_output=True,
    )
    return out


def _mtls(certs: Path, role: str, token: str) -> Security:
    return Security(
        token=token,
        tls_ca=certs / "ca.pem",
        tls_cert=certs / f"{role}.pem",
        tls_key=certs / f"{role}.key",
    )


async def test_make_certs_role_certificates_open_their_role_only(
    tmp_path: Path, worker_processes: WorkerProcesses
) -> None:
    certs = _make_certs(tmp_path / "secrets")
    for name in ("worker", "operator"):
        assert (certs / f"{name}.pem").is_file() and (certs / f"{name}.token").is_file()
    assert (certs / "token").read_text() == (certs / "operator.token").read_text()
    worker_token = (certs / "worker.token").read_text().strip()
    operator_token = (certs / "operator.token").read_text().strip()
    server = await CoordinatorServer.start(
        "127.0.0.1:0",
        security=Security.from_options(
            tls_cert=certs / "coordinator.pem",
            tls_key=certs / "coordinator.key",
            tls_ca=certs / "ca.pem",
            worker_token_file=certs / "worker.token",
            operator_token_file=certs / "operator.token",
        ),
    )
    target = f"localhost:{server.port}"
    try:
        # Workers with the worker certificate and token; it also serves their Peer service.
        tls = ("--tls-ca", str(certs / "ca.pem"), "--tls-server-name", "localhost")
        mine = ("--tls-cert", str(certs / "worker.pem"), "--tls-key", str(certs / "worker.key"))
        peers = ("--peer-listen", "127.0.0.1:0", "--peer-tls-server-name")
        worker_processes.start(
            server.port,
            2,
            token=worker_token,
            extra=(*tls, *mine, *peers, "worker.codedgd.internal", "--no-reconnect"),
        )
        async with Client(target, _mtls(certs, "operator", operator_token)) as client:
            config = JobConfig(workers=2, rounds=2, data=SYNTH, policy=Component("ring-allreduce"))
            job_id = await client.submit(config)
            assert len([r async for r in client.watch(job_id)]) == 2
        # A worker certificate cannot submit, even with the operator token.
        async with Client(target, _mtls(certs, "worker", operator_token)) as client:
            with pytest.raises(CodedGDError, match=r"client certificate is a worker's"):
                await client.submit(JobConfig(workers=1, rounds=1, data=SYNTH))
            with pytest.raises(CodedGDError, match=r"needs an operator certificate"):
                await client.status()
        # An operator certificate cannot connect as a worker, even with the worker token.
        agent = WorkerAgent(
            WorkerOptions(
                coordinator=target,
                security=_mtls(certs, "operator", worker_token),
                reconnect=False,
            )
        )
        with pytest.raises(Rejected, match="needs a worker certificate"):
            await agent.run()
    finally:
        await server.stop(0)


def test_a_subject_names_a_role_only_in_its_own_ou() -> None:
    def roles(subject: bytes) -> frozenset[str] | None:
        return certificate_roles({"x509_subject": [subject]})

    assert roles(b"CN=codedgd worker,OU=worker,O=codedgd") == {"worker"}
    assert roles(b"CN=x,OU=operator+OU=other,O=codedgd") == {"operator"}
    assert roles(b"CN=evil\\,OU=operator,O=codedgd") is None  # an escaped comma
    assert roles(b"CN=plain") is None
    assert certificate_roles({}) is None


def _certificate(tmp: Path, name: str, days: float) -> Path:
    """A self-signed CA certificate valid until ``days`` from now (negative: expired)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(days=30))
        .not_valid_after(now + timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    path = tmp / f"{name}.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


async def test_a_certificate_expiring_within_14_days_is_warned_about_at_start_up(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("cryptography")
    ca = _certificate(tmp_path, "soon", days=5)
    expires = (datetime.now(UTC) + timedelta(days=5)).strftime("%Y-%m-%d")
    certs = _make_certs(tmp_path / "secrets")
    security = Security(
        tls_cert=certs / "coordinator.pem", tls_key=certs / "coordinator.key", tls_ca=ca
    )
    with caplog.at_level(logging.WARNING, logger="codedgd.security"):
        server = await CoordinatorServer.start("127.0.0.1:0", security=security)
        await server.stop(0)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings  # once, however often the file is loaded
    assert str(ca) in warnings[0] and expires in warnings[0] and "in 5 days" in warnings[0]


async def test_an_expired_certificate_is_a_config_error_naming_file_and_date(
    tmp_path: Path,
) -> None:
    pytest.importorskip("cryptography")
    ca = _certificate(tmp_path, "old", days=-2)
    expired = (datetime.now(UTC) - timedelta(days=2)).strftime("%Y-%m-%d")
    message = f"--tls-ca {ca}: the CA certificate expired on {expired}"
    with pytest.raises(ConfigError, match=re.escape(message)):
        Security(tls_ca=ca).check_client()
    done = subprocess.run(
        [
            *(sys.executable, "-m", "codedgd.client.cli", "worker", "--no-reconnect"),
            *("--coordinator", "127.0.0.1:1", "--tls-ca", str(ca)),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith(
        f"codedgd worker: error: --tls-ca {ca}: the CA certificate expired on {expired}"
    )
    assert lines[0].endswith("issue a new one (deploy/ec2/make-certs.sh) and restart")


# ---------------------------------------------------------------- deployments


def _security(env: dict[str, str], monkeypatch: pytest.MonkeyPatch, *argv: str) -> Security:
    """The Security a `codedgd ARGV` process builds in environment ``env`` (only)."""
    for name in [k for k in os.environ if k.startswith("CODEDGD_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    parser = build_parser()
    apply_env_defaults(parser, env)
    security: Security = security_from_args(parser.parse_args(list(argv)))
    return security


def test_one_environment_holds_every_roles_token_as_the_compose_file_sets_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    roles = {"CODEDGD_WORKER_TOKEN": "w0rker", "CODEDGD_OPERATOR_TOKEN": "0perator"}
    coordinator = _security({**roles, "CODEDGD_TOKEN": ""}, monkeypatch, "coordinator")
    assert (coordinator.token, coordinator.worker_token) == (None, "w0rker")
    assert coordinator.operator_token == "0perator"
    worker = _security({**roles, "CODEDGD_TOKEN": ""}, monkeypatch, "worker")
    assert worker.token == "w0rker"
    for command in (
        ("submit",),
        ("status",),
        ("cancel", "job-1"),
        ("model", "job-1", "-o", "m.npz"),
    ):
        assert _security(roles, monkeypatch, *command).token == "0perator", command
    # CODEDGD_TOKEN (single-token mode) and a flag win over the role variables.
    assert _security({**roles, "CODEDGD_TOKEN": "b0th"}, monkeypatch, "worker").token == "b0th"
    assert _security(roles, monkeypatch, "status", "--token", "x").token == "x"


async def test_the_ec2_env_files_give_each_role_its_own_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """deploy/ec2's coordinator.env and worker.env over make-certs.sh's files, and the
    operator's `--token-file token` of tests/containers/test_netns.py."""
    certs = _make_certs(tmp_path / "secrets")

    def env_file(name: str) -> dict[str, str]:
        env = {}
        for line in (ROOT / "deploy" / "ec2" / name).read_text().splitlines():
            if line.startswith("CODEDGD_") and "/etc/codedgd/secrets/" in line:
                key, value = line.split("=", 1)
                env[key] = value.replace("/etc/codedgd/secrets/", f"{certs}/")
        return env

    coordinator = _security(env_file("coordinator.env"), monkeypatch, "coordinator")
    worker = _security(env_file("worker.env"), monkeypatch, "worker")
    operator = _security({}, monkeypatch, "status", "--token-file", str(certs / "token"))
    assert worker.token == coordinator.worker_token and worker.token is not None
    assert operator.token == coordinator.operator_token and operator.token is not None
    assert coordinator.token is None and coordinator.tls_cert is not None
    server = await CoordinatorServer.start("127.0.0.1:0", security=coordinator)
    try:
        target = f"127.0.0.1:{server.port}"

        def client(token: str | None) -> Client:
            tls = Security(token=token, tls_ca=certs / "ca.pem", tls_server_name="localhost")
            return Client(target, tls)

        async with client(operator.token) as operator_client:
            assert (await operator_client.status()).jobs == ()
        async with client(worker.token) as worker_client:
            with pytest.raises(CodedGDError, match="this token is a worker's"):
                await worker_client.status()
    finally:
        await server.stop(0)
