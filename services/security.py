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
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from grpc import aio

from codedgd.services.address import bind_failure
from codedgd.services.errors import ConfigError

TOKEN_ENV = "CODEDGD_TOKEN"
OPEN_METHODS = frozenset({"/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch"})

_CERT_BLOCK = re.compile(rb"-----BEGIN (?:X509 |TRUSTED )?CERTIFICATE-----")
_KEY_BLOCK = re.compile(rb"-----BEGIN (?:(RSA|EC|DSA|ENCRYPTED) )?PRIVATE KEY-----")


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
        self.check_client()
        if self.tls_ca is None:
            return aio.insecure_channel(target, options=opts)
        cert = _read(self.tls_cert, "--tls-cert") if self.tls_cert else None
        key = _read(self.tls_key, "--tls-key") if self.tls_key else None
        creds = grpc.ssl_channel_credentials(
            root_certificates=_read(self.tls_ca, "--tls-ca"),
            private_key=key,
            certificate_chain=cert,
        )
        if self.tls_server_name:
            opts.append(("grpc.ssl_target_name_override", self.tls_server_name))
        return aio.secure_channel(target, creds, options=opts)

    def check_client(self) -> None:
        """Refuse a client/worker TLS setup gRPC would abort on or fail obscurely with.

        A client certificate without its key (or the reverse) makes gRPC abort the whole
        process; a file that is not PEM, or a key that does not belong to the certificate,
        only shows up as "failed to connect".
        """
        if (self.tls_cert is None) != (self.tls_key is None):
            given, missing = (
                ("--tls-cert", "--tls-key") if self.tls_key is None else ("--tls-key", "--tls-cert")
            )
            raise ConfigError(
                f"mutual TLS needs both --tls-cert and --tls-key: {given} is set but {missing} "
                "is not; give the client certificate and its private key together (or neither)"
            )
        self._check_files()

    # ------------------------------------------------------------ servers

    def check_server(self) -> None:
        """Refuse, before anything is bound, a server TLS setup that cannot work."""
        if (self.tls_cert is None) != (self.tls_key is None):
            given, missing = (
                ("--tls-cert", "--tls-key") if self.tls_key is None else ("--tls-key", "--tls-cert")
            )
            raise ConfigError(
                f"TLS needs both --tls-cert and --tls-key: {given} is set but {missing} is not"
            )
        if self.tls_ca is not None and self.tls_cert is None:
            raise ConfigError(
                "--tls-ca (require client certificates) needs TLS: give --tls-cert and --tls-key "
                "too, or drop --tls-ca"
            )
        self._check_files()

    def _check_files(self) -> None:
        if self.tls_ca is not None:
            _check_pem(_read(self.tls_ca, "--tls-ca"), "--tls-ca", self.tls_ca, want="cert")
        if self.tls_cert is not None and self.tls_key is not None:
            cert = _read(self.tls_cert, "--tls-cert")
            key = _read(self.tls_key, "--tls-key")
            _check_pem(cert, "--tls-cert", self.tls_cert, want="cert")
            _check_pem(key, "--tls-key", self.tls_key, want="key")
            _check_pair(cert, key, self.tls_cert, self.tls_key)

    def add_port(self, server: aio.Server, address: str) -> int:
        """Bind ``address`` with TLS when a certificate is configured; return the port."""
        self.check_server()
        tls = self.tls_cert is not None and self.tls_key is not None
        try:
            if self.tls_cert is None or self.tls_key is None:
                port = int(server.add_insecure_port(address))
            else:
                creds = grpc.ssl_server_credentials(
                    [(_read(self.tls_key, "--tls-key"), _read(self.tls_cert, "--tls-cert"))],
                    root_certificates=_read(self.tls_ca, "--tls-ca") if self.tls_ca else None,
                    require_client_auth=self.tls_ca is not None,
                )
                port = int(server.add_secure_port(address, creds))
        except RuntimeError:  # grpcio >= 1.5x: "Failed to bind to address ..."
            port = 0
        if port == 0:
            raise ConfigError(bind_failure(address, tls=tls))
        return port

    def interceptors(self) -> list[aio.ServerInterceptor]:
        return [TokenInterceptor(self.token)] if self.token else []


# ---------------------------------------------------------------- TLS files


def _read(path: Path, label: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {label} {path}: {exc.strerror or exc}") from None


def _check_pem(data: bytes, label: str, path: Path, *, want: str) -> None:
    """``data`` holds a PEM certificate (``want="cert"``) or an unencrypted PEM private key."""
    has_cert = _CERT_BLOCK.search(data) is not None
    key = _KEY_BLOCK.search(data)
    if want == "cert" and not has_cert:
        if key is not None:
            hint = "; did you swap --tls-cert and --tls-key?" if label == "--tls-cert" else ""
            raise ConfigError(f"{label} {path} is a private key, not a PEM certificate{hint}")
        raise ConfigError(
            f"{label} {path} is not a PEM certificate (no '-----BEGIN CERTIFICATE-----' "
            "block); give the certificate file in PEM format"
        )
    if want == "key":
        if key is None:
            if has_cert:
                raise ConfigError(
                    f"--tls-key {path} is a certificate, not a PEM private key; "
                    "did you swap --tls-cert and --tls-key?"
                )
            raise ConfigError(
                f"--tls-key {path} is not a PEM private key (no '-----BEGIN PRIVATE KEY-----' "
                "block); give the certificate's private key in PEM format"
            )
        if key.group(1) == b"ENCRYPTED" or b"Proc-Type: 4,ENCRYPTED" in data:
            raise ConfigError(
                f"--tls-key {path} is encrypted with a passphrase, which gRPC cannot use; "
                f"decrypt it (openssl pkey -in {path} -out plain.key)"
            )


def _check_pair(cert: bytes, key: bytes, cert_path: Path, key_path: Path) -> None:
    """The certificate's public key is the key's (checked when ``cryptography`` is installed).

    Files the ``cryptography`` package cannot parse are left to gRPC, which may accept
    what it refuses; without the package, a mismatch shows as a bind failure whose
    message names this cause.
    """
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import serialization
    except ImportError:  # pragma: no cover - optional
        return
    spki = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    try:
        leaf = x509.load_pem_x509_certificates(cert)[0]
        private = serialization.load_pem_private_key(key, password=None)
        match = leaf.public_key().public_bytes(*spki) == private.public_key().public_bytes(*spki)
    except Exception:  # unparsable or unsupported here: gRPC decides (best effort only)
        return
    if not match:
        raise ConfigError(
            f"--tls-key {key_path} is not the private key of --tls-cert {cert_path}: "
            "the certificate and key do not form a pair; give the key the certificate "
            "was issued for"
        )


class TokenInterceptor(aio.ServerInterceptor):  # type: ignore[misc]
    """Refuses calls without the right bearer token (constant-time comparison).

    The decision reads only the call's headers. A refused call is answered by a
    handler that takes the request as a stream and never reads it, so an
    unauthenticated peer's body, however large, is not buffered, parsed or
    kept: it costs the server one HTTP/2 stream reset (see :func:`refusal`).
    """

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
        return refusal(
            grpc.StatusCode.UNAUTHENTICATED,
            "missing or wrong token: pass --token (or set CODEDGD_TOKEN) with the "
            "coordinator's token",
        )


def refusal(code: grpc.StatusCode, message: str) -> grpc.RpcMethodHandler:
    """A handler that ends any call with ``code`` before reading a byte of its request.

    gRPC reads a unary request whole (up to the receive limit) before a unary
    handler runs; a request-streaming handler runs first and reads only what it
    asks for. Every method, unary or not, is a stream on the wire, so this
    stream-stream handler answers any of them: the client sees ``code`` and
    ``message`` whatever the method's declared shape, and the rest of its body is
    discarded by the transport.
    """

    async def refuse(requests: Any, context: aio.ServicerContext) -> Any:
        await context.abort(code, message)
        yield None  # pragma: no cover - abort raises

    return grpc.stream_stream_rpc_method_handler(refuse)
