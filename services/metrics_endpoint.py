"""The Prometheus endpoints of the coordinator and the worker: HTTP(S), basic auth.

prometheus_client serves plain HTTP, or HTTPS whose handshake runs in the accepting
thread (one client that connects and says nothing stalls every scrape), and has no
authentication. This module serves prometheus_client's WSGI app itself: a thread per
connection, the TLS handshake in that thread under a timeout, optional client
certificates, and HTTP basic auth checked from the request's headers alone.

Its TLS file checks are those of the gRPC endpoint (:mod:`codedgd.services.security`),
renamed to the metrics flags. It lives apart from :mod:`codedgd.services.address` because
``security`` imports ``address``: importing ``security`` there would be an import cycle.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hmac
import logging
import re
import socket
import ssl
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

from prometheus_client import CollectorRegistry, make_wsgi_app

from codedgd.services.address import bind_reason, check_metrics_port
from codedgd.services.errors import ConfigError
from codedgd.services.security import _check_pair, _check_pem, _read

log = logging.getLogger("codedgd.metrics")

TLS_CERT, TLS_KEY, TLS_CA = "--metrics-tls-cert", "--metrics-tls-key", "--metrics-tls-ca"
BASIC_AUTH_FILE = "--metrics-basic-auth-file"
METRICS_SECURITY_OPTIONS = (TLS_CERT, TLS_KEY, TLS_CA, BASIC_AUTH_FILE)

# Seconds a client may take for its TLS handshake, and then for each read or write of its
# request: longer than Prometheus' default scrape timeout (10 s), short enough that idle
# connections do not pile up threads.
CLIENT_TIMEOUT = 15.0
REALM = "codedgd metrics"
_LOOPBACK = {"127.0.0.1", "localhost", "::1"}
_GRPC_FLAG = re.compile(r"(?<!\S)--tls-(cert|key|ca)\b")


# ---------------------------------------------------------------- configuration


@dataclass(frozen=True)
class MetricsSecurity:
    """How a metrics endpoint is protected: HTTPS (``ssl_context``), basic auth, or neither.

    Build it with :meth:`from_options`, which reads and checks every file first: a
    mistake is a :class:`ConfigError` before anything is bound.
    """

    ssl_context: ssl.SSLContext | None = None
    credentials: bytes | None = None  # b"user:password" (UTF-8), as a client sends it

    @property
    def scheme(self) -> str:
        return "https" if self.ssl_context is not None else "http"

    @staticmethod
    def from_options(
        *,
        tls_cert: str | Path | None = None,
        tls_key: str | Path | None = None,
        tls_ca: str | Path | None = None,
        basic_auth_file: str | Path | None = None,
    ) -> MetricsSecurity:
        """The endpoint's protection from the ``--metrics-*`` flags' values, all checked."""
        return MetricsSecurity(
            ssl_context=tls_context(tls_cert, tls_key, tls_ca),
            credentials=read_basic_auth(basic_auth_file) if basic_auth_file else None,
        )


def tls_context(
    cert: str | Path | None, key: str | Path | None, ca: str | Path | None
) -> ssl.SSLContext | None:
    """The server TLS context of ``cert`` and ``key`` (None without them), checked.

    With ``ca``, clients must present a certificate it signed.
    """
    if not (cert or key):
        if ca:
            raise ConfigError(
                f"{TLS_CA} (require client certificates) needs HTTPS: give {TLS_CERT} and "
                f"{TLS_KEY} too, or drop {TLS_CA}"
            )
        return None
    if not (cert and key):
        given, missing = (TLS_CERT, TLS_KEY) if cert else (TLS_KEY, TLS_CERT)
        raise ConfigError(
            f"{given} is set but {missing} is not: HTTPS on the metrics endpoint needs the "
            "certificate and its private key together (or neither)"
        )
    paths = {TLS_CERT: Path(cert), TLS_KEY: Path(key)}
    if ca:
        paths[TLS_CA] = Path(ca)
    for option, path in paths.items():
        _must_exist(path, option)
    _check_files(paths[TLS_CERT], paths[TLS_KEY], paths.get(TLS_CA))
    return _load_context(paths[TLS_CERT], paths[TLS_KEY], paths.get(TLS_CA))


def _must_exist(path: Path, option: str) -> None:
    if not path.is_file():
        raise ConfigError(f"{option} {path}: no such file; give the path of a PEM file")


def _check_files(cert: Path, key: Path, ca: Path | None) -> None:
    """PEM certificate, unencrypted PEM key, a pair, a PEM CA: the gRPC endpoint's checks."""
    with _named_as_metrics_flags():
        if ca is not None:
            _check_pem(_read(ca, "--tls-ca"), "--tls-ca", ca, want="cert")
        cert_pem, key_pem = _read(cert, "--tls-cert"), _read(key, "--tls-key")
        _check_pem(cert_pem, "--tls-cert", cert, want="cert")
        _check_pem(key_pem, "--tls-key", key, want="key")
        _check_pair(cert_pem, key_pem, cert, key)


@contextlib.contextmanager
def _named_as_metrics_flags() -> Iterator[None]:
    """Rename the flags in security.py's messages: they name --tls-cert, --tls-key and
    --tls-ca (and gRPC) whatever label they are given."""
    try:
        yield
    except ConfigError as exc:
        message = _GRPC_FLAG.sub(r"--metrics-tls-\1", str(exc)).replace("gRPC", "codedgd")
        raise ConfigError(message) from None


def _load_context(cert: Path, key: Path, ca: Path | None) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        # An empty passphrase: an encrypted key fails here instead of prompting on a tty.
        context.load_cert_chain(cert, key, password=b"")
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(
            f"cannot serve HTTPS with {TLS_CERT} {cert} and {TLS_KEY} {key}: "
            f"{exc.strerror or exc}; give a PEM certificate and its unencrypted private key"
        ) from None
    if ca is not None:
        try:
            context.load_verify_locations(cafile=ca)
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(
                f"cannot use {TLS_CA} {ca}: {exc.strerror or exc}; give the PEM certificate "
                "of the CA that signs the scrapers' client certificates"
            ) from None
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def read_basic_auth(path: str | Path) -> bytes:
    """The ``user:password`` of a basic-auth file, as the bytes a client sends.

    The file holds one line (surrounding whitespace and newlines are dropped, as for
    --token-file); the user ends at the first colon (RFC 7617), the password may hold
    colons. Messages never quote the file's content.
    """
    path = Path(path)
    if not path.exists():
        raise ConfigError(
            f"{BASIC_AUTH_FILE} {path}: no such file; give a file holding one user:password line"
        )
    try:
        line = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigError(f"cannot read {BASIC_AUTH_FILE} {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{BASIC_AUTH_FILE} {path} is not UTF-8 text") from None
    user, colon, password = line.partition(":")
    if "\n" in line or not colon or not user or not password:
        raise ConfigError(
            f"{BASIC_AUTH_FILE} {path} is malformed: expected exactly one line user:password "
            "(a user without a colon, a non-empty password)"
        )
    return line.encode("utf-8")


# ---------------------------------------------------------------- basic auth


def require_basic_auth(app: WSGIApplication, credentials: bytes) -> WSGIApplication:
    """``app`` behind HTTP basic auth: anything but ``credentials`` gets 401.

    The decision reads only the Authorization header, never the request body: a refused
    client costs one short response.
    """
    body = f"401 Unauthorized: this endpoint needs the user and password of {BASIC_AUTH_FILE}\n"
    refusal = body.encode()
    headers = [
        ("WWW-Authenticate", f'Basic realm="{REALM}", charset="UTF-8"'),
        ("Content-Type", "text/plain; charset=utf-8"),
        ("Content-Length", str(len(refusal))),
    ]

    def guarded(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        if authorized(environ.get("HTTP_AUTHORIZATION", ""), credentials):
            return app(environ, start_response)
        start_response("401 Unauthorized", list(headers))
        return [refusal]

    return guarded


def authorized(header: str, credentials: bytes) -> bool:
    """Whether an Authorization header carries ``credentials`` (constant-time compare)."""
    scheme, _, encoded = header.strip().partition(" ")
    if scheme.lower() != "basic":
        return False
    try:
        given = base64.b64decode(encoded.strip().encode("ascii"), validate=True)
    except (UnicodeEncodeError, binascii.Error):
        return False
    return hmac.compare_digest(given, credentials)


# ---------------------------------------------------------------- the server


class _QuietHandler(WSGIRequestHandler):
    """One request per connection; no access log on stderr (Prometheus scrapes often)."""

    timeout = CLIENT_TIMEOUT

    def log_message(self, format: str, *args: Any) -> None:
        pass


class MetricsServer(ThreadingMixIn, WSGIServer):
    """A WSGI server with a thread per connection, and TLS when given a context.

    The TLS handshake happens in the connection's thread, bounded by
    :data:`CLIENT_TIMEOUT`: a client that connects and stalls (or speaks plain HTTP to
    the HTTPS port) holds only its own thread, never the accept loop.
    """

    daemon_threads = True  # a stuck client never delays the process's exit

    def __init__(
        self, address: tuple[str, int], family: int, ssl_context: ssl.SSLContext | None
    ) -> None:
        self.address_family = family
        self.ssl_context = ssl_context
        super().__init__(address, _QuietHandler)

    def finish_request(self, request: Any, client_address: Any) -> None:
        if self.ssl_context is None:
            super().finish_request(request, client_address)
            return
        request.settimeout(CLIENT_TIMEOUT)
        try:
            tls = self.ssl_context.wrap_socket(request, server_side=True)
        except OSError as exc:  # plain HTTP, no or a foreign client certificate, a stall
            log.debug("metrics: TLS handshake with %s failed: %s", client_address, exc)
            return
        try:
            super().finish_request(tls, client_address)
        finally:
            self.shutdown_request(tls)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hangs up mid-request is its own business: no traceback on stderr."""
        log.debug("metrics: request from %s failed", client_address, exc_info=True)


def serve_metrics(
    registry: CollectorRegistry,
    port: int,
    address: str = "0.0.0.0",
    option: str = "--metrics-port",
    security: MetricsSecurity | None = None,
) -> MetricsServer:
    """Serve ``registry`` on http(s)://address:port/metrics (a thread); the server.

    Stop it with ``shutdown()`` then ``server_close()``. A port that cannot be bound is a
    :class:`ConfigError` naming the port and why.
    """
    check_metrics_port(port, option)
    security = security or MetricsSecurity()
    app = make_wsgi_app(registry)
    if security.credentials is not None:
        app = require_basic_auth(app, security.credentials)
    try:
        family, sockaddr = _best_family(address, port)
        server = MetricsServer(sockaddr, family, security.ssl_context)
    except OSError as exc:
        reason = bind_reason([exc], address, port)
        raise ConfigError(
            f"cannot serve metrics on {address}:{port}: {reason}; choose another {option}"
        ) from None
    server.set_app(app)
    if security.credentials is not None and security.ssl_context is None:
        _warn_clear_text(address, int(server.server_address[1]))
    threading.Thread(target=server.serve_forever, name="codedgd-metrics", daemon=True).start()
    return server


def _warn_clear_text(address: str, port: int) -> None:
    """Basic auth over plain HTTP beyond this host sends the password in clear text."""
    if address not in _LOOPBACK:
        log.warning(
            "the metrics endpoint on %s:%d takes basic auth over plain HTTP: the password "
            "crosses the network in clear text; add %s and %s",
            address,
            port,
            TLS_CERT,
            TLS_KEY,
        )


def _best_family(address: str, port: int) -> tuple[int, tuple[str, int]]:
    """The socket family and bind address of ``address`` (IPv6 too; a name resolves)."""
    infos = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _kind, _proto, _name, sockaddr = infos[0]
    return int(family), (str(sockaddr[0]), port)
