"""Authentication, roles and TLS for every gRPC endpoint of codedgd.

Three credentials, each opening one thing (docs/security.md):

* The **worker token** opens ``Connect``, a worker's stream, and nothing else.
* The **operator token** opens the client methods (SubmitJob, WatchJob, GetStatus,
  CancelJob, GetModel), and not ``Connect``.
* The **peer credential** of a job, issued by the coordinator with the assignment, opens
  the ``Peer`` service of that job's workers (:mod:`codedgd.services.worker.peers`); no
  token opens it, and it opens nothing on the coordinator.

Clients and workers send their token as ``authorization: Bearer <token>`` metadata. A
coordinator given ``--token`` alone (single-token mode, as before roles existed) lets that
one token open both roles. A token the coordinator does not know is refused with
UNAUTHENTICATED, a known token of the wrong role with PERMISSION_DENIED naming the token
needed, both on the call's headers before its body is read. The standard health service
stays open so orchestrators can probe liveness.

TLS: the coordinator serves with a certificate and key; clients and workers verify it
with a CA bundle. Optional mutual TLS: the coordinator also requires a client
certificate signed by its CA, and a certificate whose subject names a role
(``OU=worker`` or ``OU=operator``, as ``deploy/ec2/make-certs.sh`` issues them) is limited
to that role as well. Certificates expiring within 14 days are warned about when first
loaded; an expired one is a ConfigError.

Without a token the coordinator accepts anyone who can reach its port: fine on
loopback and inside a private compose network, never on a shared network. The
CLI warns when it serves on a non-loopback address without a token.
"""

from __future__ import annotations

import hashlib
import hmac
import inspect
import logging
import os
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import grpc
from grpc import aio

from codedgd.services.address import bind_failure, check_target
from codedgd.services.errors import ConfigError

log = logging.getLogger("codedgd.security")

TOKEN_ENV = "CODEDGD_TOKEN"
# Open without a token: health, and server reflection (the API's schema only, public in
# protos/); v1 reflection, not served, answers UNIMPLEMENTED so clients use v1alpha.
OPEN_METHODS = frozenset(
    {
        "/grpc.health.v1.Health/Check",
        "/grpc.health.v1.Health/Watch",
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
    }
)

Role = Literal["worker", "operator"]
ROLES: tuple[Role, ...] = ("worker", "operator")
COORDINATOR_PREFIX = "/codedgd.v1.Coordinator/"
# The worker's one method; every other method of the Coordinator service is an operator's.
WORKER_METHODS = frozenset({COORDINATOR_PREFIX + "Connect"})
ROLE_TOKEN_FLAGS: dict[Role, str] = {
    "worker": "--worker-token-file",
    "operator": "--operator-token-file",
}
_WHOSE: dict[Role, str] = {"worker": "a worker's", "operator": "an operator's"}
_AN: dict[Role, str] = {"worker": "a worker", "operator": "an operator"}
# A certificate expiring this soon is warned about when it is first loaded.
EXPIRY_WARNING = timedelta(days=14)

_CERT_BLOCK = re.compile(rb"-----BEGIN (?:X509 |TRUSTED )?CERTIFICATE-----")
_KEY_BLOCK = re.compile(rb"-----BEGIN (?:(RSA|EC|DSA|ENCRYPTED) )?PRIVATE KEY-----")


def required_role(method: str) -> Role | None:
    """The role a method of the coordinator needs (None: any token, e.g. another service)."""
    if method in WORKER_METHODS:
        return "worker"
    if method.startswith(COORDINATOR_PREFIX):
        return "operator"
    return None


@dataclass(frozen=True)
class Security:
    """How to authenticate and encrypt: shared by servers and clients.

    ``token`` is, for a client or worker, the token it sends; for a coordinator, the
    single-mode token that opens both roles. ``worker_token`` and ``operator_token`` are
    the coordinator's role tokens: each opens its role only.
    """

    token: str | None = None
    tls_cert: Path | None = None  # server: its certificate; client (mTLS): its certificate
    tls_key: Path | None = None
    tls_ca: Path | None = None  # client: CA that signed the server; server: require client certs
    tls_server_name: str | None = None  # client: override the name checked in the certificate
    worker_token: str | None = None  # coordinator: opens Connect only
    operator_token: str | None = None  # coordinator: opens the client methods only

    @staticmethod
    def from_options(
        token: str | None = None,
        token_file: str | Path | None = None,
        tls_cert: str | Path | None = None,
        tls_key: str | Path | None = None,
        tls_ca: str | Path | None = None,
        tls_server_name: str | None = None,
        *,
        worker_token: str | None = None,
        worker_token_file: str | Path | None = None,
        operator_token: str | None = None,
        operator_token_file: str | Path | None = None,
    ) -> Security:
        token = _token(token, token_file, "token file")
        if token is None:
            token = os.environ.get(TOKEN_ENV) or None
        for label, path in (("--tls-cert", tls_cert), ("--tls-key", tls_key), ("--tls-ca", tls_ca)):
            if path is not None and not Path(path).is_file():
                raise ConfigError(f"{label} {path}: no such file")
        return Security(
            token=token,
            tls_cert=Path(tls_cert) if tls_cert else None,
            tls_key=Path(tls_key) if tls_key else None,
            tls_ca=Path(tls_ca) if tls_ca else None,
            tls_server_name=tls_server_name,
            worker_token=_token(worker_token, worker_token_file, "--worker-token-file"),
            operator_token=_token(operator_token, operator_token_file, "--operator-token-file"),
        )

    @property
    def role_tokens(self) -> bool:
        """Whether this coordinator separates roles (a worker or an operator token is set)."""
        return self.worker_token is not None or self.operator_token is not None

    def closed_roles(self) -> list[Role]:
        """Roles no configured token opens, when tokens are required at all."""
        if self.token is not None or not self.role_tokens:
            return []
        return [r for r in ROLES if getattr(self, f"{r}_token") is None]

    # ------------------------------------------------------------ clients

    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()

    def channel(self, target: str, options: Any = ()) -> aio.Channel:
        """An aio channel to ``target``: TLS when a CA is configured, plaintext otherwise."""
        opts = list(options)
        check_target(target)
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
        self._check_distinct_tokens()
        self._check_files()

    def _check_distinct_tokens(self) -> None:
        """Two roles given the same token would not be separated: refuse it."""
        given = [
            (flag, value)
            for flag, value in (
                ("--token", self.token),
                ("--worker-token", self.worker_token),
                ("--operator-token", self.operator_token),
            )
            if value is not None
        ]
        for i, (flag, value) in enumerate(given):
            for other, other_value in given[i + 1 :]:
                if hmac.compare_digest(value.encode(), other_value.encode()):
                    raise ConfigError(
                        f"{flag} and {other} (or their -file forms) are the same token, so "
                        "the roles are not separated; give each role its own token "
                        "(deploy/ec2/make-certs.sh writes worker.token and operator.token)"
                    )

    def _check_files(self) -> None:
        if self.tls_ca is not None:
            ca = _read(self.tls_ca, "--tls-ca")
            _check_pem(ca, "--tls-ca", self.tls_ca, want="cert")
            check_expiry(ca, "--tls-ca", self.tls_ca, bundle=True)
        if self.tls_cert is not None and self.tls_key is not None:
            cert = _read(self.tls_cert, "--tls-cert")
            key = _read(self.tls_key, "--tls-key")
            _check_pem(cert, "--tls-cert", self.tls_cert, want="cert")
            _check_pem(key, "--tls-key", self.tls_key, want="key")
            _check_pair(cert, key, self.tls_cert, self.tls_key)
            check_expiry(cert, "--tls-cert", self.tls_cert, bundle=False)

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
        """The coordinator's checks: tokens and their roles (on the headers), then the
        role of the client certificate (with mutual TLS)."""
        chain: list[aio.ServerInterceptor] = []
        if self.token is not None or self.role_tokens:
            chain.append(
                TokenInterceptor(self.token, worker=self.worker_token, operator=self.operator_token)
            )
        if self.tls_ca is not None and self.tls_cert is not None:
            chain.append(CertificateRoleInterceptor())
        return chain


def _token(value: str | None, path: str | Path | None, what: str) -> str | None:
    """A token given inline or in a file (the file wins); an empty inline one is none."""
    if path:
        try:
            value = Path(path).read_text().strip()
        except OSError as exc:
            raise ConfigError(f"cannot read the {what} {path}: {exc.strerror}") from None
        if not value:
            raise ConfigError(f"the {what} {path} is empty: write the token into it")
    return value or None


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


_expiry_checked: set[bytes] = set()  # digests of certificate files already checked


def check_expiry(
    data: bytes, label: str, path: Path, *, bundle: bool, now: datetime | None = None
) -> None:
    """Warn about a certificate expiring within 14 days; refuse an expired one.

    ``bundle``: a CA file, usable while any of its certificates is (the latest counts);
    otherwise the first certificate, this process's own, counts. Each file is checked
    once per process (the first load, at start-up), so a process that outlives its
    certificate is not stopped by a later reload. Without the optional ``cryptography``
    package (the ``tls`` extra) nothing is checked.
    """
    digest = hashlib.sha256(data).digest()
    if digest in _expiry_checked:
        return
    expires = _not_after(data, latest=bundle)
    if expires is None:
        _expiry_checked.add(digest)
        return
    now = now or datetime.now(UTC)
    when = expires.strftime("%Y-%m-%d %H:%M UTC")
    what = "CA certificate" if bundle else "certificate"
    if expires <= now:
        raise ConfigError(
            f"{label} {path}: the {what} expired on {when}; issue a new one "
            "(deploy/ec2/make-certs.sh) and restart"
        )
    _expiry_checked.add(digest)
    if expires - now <= EXPIRY_WARNING:
        log.warning(
            "%s %s: the %s expires on %s (%s); issue a new one before then",
            label,
            path,
            what,
            when,
            _in_days(expires - now),
        )


def _in_days(left: timedelta) -> str:
    days = left / timedelta(days=1)
    if days < 1:
        return "in less than a day"
    return f"in {round(days)} day{'' if round(days) == 1 else 's'}"


def _not_after(data: bytes, *, latest: bool) -> datetime | None:
    """When the file's first (or, ``latest``, last-expiring) certificate expires."""
    try:
        from cryptography import x509
    except ImportError:  # pragma: no cover - optional
        log.debug("the cryptography package is not installed: certificate expiry not checked")
        return None
    try:
        certs = x509.load_pem_x509_certificates(data)
    except Exception:  # unparsable here: gRPC decides (best effort only)
        return None
    if latest:
        return max(c.not_valid_after_utc for c in certs)
    return certs[0].not_valid_after_utc


# ---------------------------------------------------------------- roles


class TokenInterceptor(aio.ServerInterceptor):  # type: ignore[misc]
    """Refuses calls without a token that opens their method (constant-time comparison).

    ``token`` opens both roles (single-token mode); ``worker`` opens Connect only,
    ``operator`` the client methods only. An unknown token is UNAUTHENTICATED, a known
    one of the wrong role PERMISSION_DENIED naming the token needed.

    The decision reads only the call's headers. A refused call is answered by a
    handler that takes the request as a stream and never reads it, so an
    unauthenticated peer's body, however large, is not buffered, parsed or
    kept: it costs the server one HTTP/2 stream reset (see :func:`refusal`).
    """

    def __init__(
        self, token: str | None = None, *, worker: str | None = None, operator: str | None = None
    ) -> None:
        entries: list[tuple[bytes, frozenset[Role]]] = []
        if token is not None:
            entries.append((f"Bearer {token}".encode(), frozenset(ROLES)))
        by_role: tuple[tuple[Role, str | None], ...] = (("worker", worker), ("operator", operator))
        for role, value in by_role:
            if value is not None:
                entries.append((f"Bearer {value}".encode(), frozenset({role})))
        self._entries = entries
        self._split = worker is not None or operator is not None

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        method = handler_call_details.method
        if method in OPEN_METHODS:
            return await continuation(handler_call_details)
        given = dict(handler_call_details.invocation_metadata or ()).get("authorization", "")
        roles = self._roles(given)
        needed = required_role(method)
        if roles is None:
            return refusal(grpc.StatusCode.UNAUTHENTICATED, self._unknown(method, needed))
        if needed is not None and needed not in roles:
            return refusal(grpc.StatusCode.PERMISSION_DENIED, wrong_token(method, roles, needed))
        return await continuation(handler_call_details)

    def _roles(self, given: object) -> frozenset[Role] | None:
        """The roles ``given`` opens; None for an unknown token. Every configured token
        is compared, in constant time, whichever matches."""
        given_bytes = given.encode() if isinstance(given, str) else b""
        found: frozenset[Role] | None = None
        for expected, roles in self._entries:
            if hmac.compare_digest(given_bytes, expected):
                found = roles
        return found

    def _unknown(self, method: str, needed: Role | None) -> str:
        if not self._split or needed is None:
            return (
                "missing or wrong token: pass --token (or set CODEDGD_TOKEN) with the "
                "coordinator's token"
            )
        return (
            f"missing or wrong token: {_name(method)} needs the {needed} token (the "
            f"coordinator's {ROLE_TOKEN_FLAGS[needed]}); pass it with --token-file "
            "(or --token, or set CODEDGD_TOKEN)"
        )


def wrong_token(method: str, roles: Iterable[Role], needed: Role) -> str:
    """The PERMISSION_DENIED message for a known token of another role."""
    held = next(iter(roles))
    return (
        f"this token is {_WHOSE[held]}: {_name(method)} needs the {needed} token (the "
        f"coordinator's {ROLE_TOKEN_FLAGS[needed]}); pass that one with --token-file"
    )


def _name(method: str) -> str:
    return method.rsplit("/", 1)[-1]


class CertificateRoleInterceptor(aio.ServerInterceptor):  # type: ignore[misc]
    """With mutual TLS: a client certificate whose subject names a role (``OU=worker`` or
    ``OU=operator``) opens that role's methods only; one naming none is not limited.

    gRPC shows the certificate to the handler only (``context.auth_context()``), not to
    an interceptor, so this wraps the method's handler: the check runs first in it.
    ``Connect`` is refused before its first message is read; a unary call's body (at
    most the message limit) has been read by then, from a peer that holds a certificate
    of the CA.
    """

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        needed = required_role(handler_call_details.method)
        if handler is None or needed is None:
            return handler
        return _guarded(handler, _certificate_check(handler_call_details.method, needed))


Check = Callable[[aio.ServicerContext], Awaitable[None]]


def _certificate_check(method: str, needed: Role) -> Check:
    async def check(context: aio.ServicerContext) -> None:
        roles = certificate_roles(context.auth_context())
        if roles is not None and needed not in roles:
            held = next(iter(roles))
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"this client certificate is {_WHOSE[held]} (OU={held}): {_name(method)} "
                f"needs {_AN[needed]} certificate (OU={needed}); pass that one with "
                "--tls-cert and --tls-key",
            )

    return check


def certificate_roles(auth: Mapping[str, Iterable[bytes]]) -> frozenset[Role] | None:
    """The roles the peer certificate's subject names as OU (None: it names none)."""
    roles: set[Role] = set()
    for subject in auth.get("x509_subject", ()):
        for key, value in _rdn_attributes(subject.decode("utf-8", "replace")):
            low = value.strip().lower()
            if key.strip().upper() == "OU" and low in ROLES:
                roles.add(low)
    return frozenset(roles) or None


def _rdn_attributes(subject: str) -> list[tuple[str, str]]:
    """``TYPE=value`` pairs of an RFC 2253 subject, splitting on unescaped ``,`` and ``+``."""
    pairs: list[tuple[str, str]] = []
    part: list[str] = []
    escaped = False
    for char in subject + ",":
        if escaped:
            part.append(char)
            escaped = False
        elif char == "\\":
            escaped = True
        elif char in ",+":
            key, _, value = "".join(part).partition("=")
            pairs.append((key, value))
            part = []
        else:
            part.append(char)
    return pairs


def _guarded(handler: grpc.RpcMethodHandler, check: Check) -> grpc.RpcMethodHandler:
    """``handler`` with ``check(context)`` run before its behavior, whatever its shape."""
    kinds = (
        ("unary_unary", grpc.unary_unary_rpc_method_handler),
        ("unary_stream", grpc.unary_stream_rpc_method_handler),
        ("stream_unary", grpc.stream_unary_rpc_method_handler),
        ("stream_stream", grpc.stream_stream_rpc_method_handler),
    )
    for attribute, make in kinds:
        behavior = getattr(handler, attribute)
        if behavior is not None:
            generator = inspect.isasyncgenfunction(behavior)
            return make(
                _stream_first(behavior, check) if generator else _call_first(behavior, check),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
    return handler


def _call_first(behavior: Callable[..., Awaitable[Any]], check: Check) -> Any:
    async def guarded(request: Any, context: aio.ServicerContext) -> Any:
        await check(context)
        return await behavior(request, context)

    return guarded


def _stream_first(behavior: Callable[..., AsyncIterator[Any]], check: Check) -> Any:
    async def guarded(request: Any, context: aio.ServicerContext) -> AsyncIterator[Any]:
        await check(context)
        replies = behavior(request, context)
        try:
            async for reply in replies:
                yield reply
        finally:
            await replies.aclose()  # type: ignore[attr-defined]

    return guarded


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
