"""Authentication and TLS for every gRPC endpoint of codedgd.

* A shared token: clients and workers send ``authorization: Bearer <token>``
  metadata; the coordinator refuses any other call with UNAUTHENTICATED (the
  standard health service stays open so orchestrators can probe liveness).
* TLS: the coordinator serves with a certificate and key; clients and workers
  verify it with a CA bundle. Optional mutual TLS: the coordinator also requires
  a client certificate signed by its CA.

Without a token the coordinator accepts anyone who can reach its port: fine on
loopback and inside a private compose network, never on a shared network. The
CLI warns when it serves on a non-loopback address without a token.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from grpc import aio

from services.errors import ConfigError

TOKEN_ENV = "CODEDGD_TOKEN"
OPEN_METHODS = frozenset({"/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch"})


@dataclass(frozen=True)
class Security:
    """How to authenticate and encrypt: shared by servers and clients."""

    token: str | None = None
    tls_cert: Path | None = None  # server: its certificate; client (mTLS): its certificate
    tls_key: Path | None = None
    tls_ca: Path | None = None  # client: CA that signed the server; server: require client certs
    tls_server_name: str | None = None  # client: override the name checked in the certificate

    @staticmethod
    def from_options(
        token: str | None = None,
        token_file: str | Path | None = None,
        tls_cert: str | Path | None = None,
        tls_key: str | Path | None = None,
        tls_ca: str | Path | None = None,
        tls_server_name: str | None = None,
    ) -> Security:
        if token_file:
            try:
                token = Path(token_file).read_text().strip()
            except OSError as exc:
                raise ConfigError(
                    f"cannot read the token file {token_file}: {exc.strerror}"
                ) from None
        if token is None:
            token = os.environ.get(TOKEN_ENV) or None
        if token is not None and not token:
            token = None
        for label, path in (("--tls-cert", tls_cert), ("--tls-key", tls_key), ("--tls-ca", tls_ca)):
            if path is not None and not Path(path).is_file():
                raise ConfigError(f"{label} {path}: no such file")
        return Security(
            token=token,
            tls_cert=Path(tls_cert) if tls_cert else None,
            tls_key=Path(tls_key) if tls_key else None,
            tls_ca=Path(tls_ca) if tls_ca else None,
            tls_server_name=tls_server_name,
        )

    # ------------------------------------------------------------ clients

    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()

    def channel(self, target: str, options: Any = ()) -> aio.Channel:
        """An aio channel to ``target``: TLS when a CA is configured, plaintext otherwise."""
        opts = list(options)
        if self.tls_ca is None:
            return aio.insecure_channel(target, options=opts)
        cert = self.tls_cert.read_bytes() if self.tls_cert else None
        key = self.tls_key.read_bytes() if self.tls_key else None
        creds = grpc.ssl_channel_credentials(
            root_certificates=self.tls_ca.read_bytes(), private_key=key, certificate_chain=cert
        )
        if self.tls_server_name:
            opts.append(("grpc.ssl_target_name_override", self.tls_server_name))
        return aio.secure_channel(target, creds, options=opts)

    # ------------------------------------------------------------ servers

    def add_port(self, server: aio.Server, address: str) -> int:
        """Bind ``address`` with TLS when a certificate is configured; return the port."""
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("TLS needs both --tls-cert and --tls-key")
        if self.tls_cert is None or self.tls_key is None:
            port = int(server.add_insecure_port(address))
        else:
            creds = grpc.ssl_server_credentials(
                [(self.tls_key.read_bytes(), self.tls_cert.read_bytes())],
                root_certificates=self.tls_ca.read_bytes() if self.tls_ca else None,
                require_client_auth=self.tls_ca is not None,
            )
            port = int(server.add_secure_port(address, creds))
        if port == 0:
            raise ConfigError(f"cannot listen on {address}: the address is in use or invalid")
        return port

    def interceptors(self) -> list[aio.ServerInterceptor]:
        return [TokenInterceptor(self.token)] if self.token else []


class TokenInterceptor(aio.ServerInterceptor):  # type: ignore[misc]
    """Refuses calls without the right bearer token (constant-time comparison)."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        if handler_call_details.method in OPEN_METHODS:
            return await continuation(handler_call_details)
        given = dict(handler_call_details.invocation_metadata or ()).get("authorization", "")
        if isinstance(given, str) and hmac.compare_digest(given.encode(), self._expected):
            return await continuation(handler_call_details)
        return _deny(handler_call_details)


def _deny(details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
    message = (
        "missing or wrong token: pass --token (or set CODEDGD_TOKEN) with the coordinator's token"
    )

    async def unary(request: Any, context: aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    async def streaming(request: Any, context: aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)
        yield None  # pragma: no cover - abort raises

    method = details.method.rsplit("/", 1)[-1]
    if method in ("Connect",):
        return grpc.stream_stream_rpc_method_handler(streaming)
    if method in ("WatchJob",):
        return grpc.unary_stream_rpc_method_handler(streaming)
    return grpc.unary_unary_rpc_method_handler(unary)
