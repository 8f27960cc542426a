"""Listen addresses: HOST:PORT checked before anything binds them, and why a bind failed.

gRPC's own answer to a bad address is a bare "failed to bind" (or, for a port above
65535, a silent wrap-around), and Python's HTTP server (the Prometheus endpoints) an
OverflowError or a bare errno; these checks name the cause and the fix.
"""

from __future__ import annotations

import errno
import socket

from codedgd.services.errors import ConfigError

UNIX_PREFIXES = ("unix:", "unix-abstract:")
_EXAMPLES = "e.g. 0.0.0.0:50051, 127.0.0.1:50051 or [::]:50051"


def parse_address(address: str, option: str = "--listen") -> tuple[str, int]:
    """The host (IPv6 without its brackets) and port of ``HOST:PORT``, checked.

    gRPC accepts some malformed addresses silently: ``127.0.0.1:99999`` binds
    port 99999 mod 65536 (34463).
    """
    host, sep, port_text = address.rpartition(":")
    if not sep or not host or not port_text:
        raise ConfigError(f"{option} {address!r} is malformed: expected HOST:PORT, {_EXAMPLES}")
    if not (port_text.isascii() and port_text.isdigit()):
        raise ConfigError(
            f"{option} {address!r}: the port {port_text!r} is not a number; "
            f"expected HOST:PORT, {_EXAMPLES}"
        )
    port = int(port_text)
    if port > 65535:
        raise ConfigError(
            f"{option} {address}: port {port} is out of range 0..65535; choose another {option}"
        )
    if host.startswith("[") or host.endswith("]"):
        if not (host.startswith("[") and host.endswith("]") and len(host) > 2):
            raise ConfigError(f"{option} {address!r} is malformed: expected HOST:PORT, {_EXAMPLES}")
        host = host[1:-1]
    elif ":" in host:
        raise ConfigError(
            f"{option} {address!r}: an IPv6 address needs brackets, e.g. [{host}]:{port}"
        )
    return host, port


DEFAULT_PORT = 50051  # what `codedgd coordinator` listens on unless told otherwise


def check_target(target: str, option: str = "--coordinator") -> None:
    """A coordinator address a client dials must name its port: gRPC would quietly try
    443 for ``localhost``. Targets with a scheme (``unix:``, ``dns:///``...) pass as they are."""
    if (
        "/" in target
        or target.startswith(UNIX_PREFIXES)
        or target.startswith(("dns:", "ipv4:", "ipv6:"))
    ):
        return
    bracketed = target.startswith("[") and target.endswith("]")
    if target and (bracketed or ":" not in target):
        raise ConfigError(
            f"{option} {target!r} has no port: a coordinator listens on {DEFAULT_PORT} unless "
            f"started with another --listen; use {target}:{DEFAULT_PORT}"
        )


def probe_bind(host: str, port: int) -> str | None:
    """Bind ``host:port`` with a plain socket and let it go: why that fails, or None.

    gRPC only says "failed to bind" (and logs the cause to stderr); the operating
    system says why.
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError):
        return f"{host!r} is not an address of this host, nor a name that resolves"
    errors: list[OSError] = []
    for family, kind, proto, _name, sockaddr in infos:
        try:
            with socket.socket(family, kind, proto) as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC does
                sock.bind(sockaddr)
        except OSError as exc:
            errors.append(exc)
    if not errors:
        return None
    if len(errors) < len(infos) and not {e.errno for e in errors} & _PORT_ERRORS:
        return None  # bound on some of the name's addresses (say IPv4 but not IPv6), as gRPC
    return bind_reason(errors, host, port)


_PORT_ERRORS = {errno.EADDRINUSE, errno.EACCES}


def bind_reason(errors: list[OSError], host: str, port: int) -> str:
    """Why binding ``host:port`` failed with these errors, in a user's words."""
    codes = {exc.errno for exc in errors}
    if errno.EADDRINUSE in codes:
        return f"port {port} is already in use by another process"
    if errno.EACCES in codes:
        return (
            f"permission denied for port {port} (ports below 1024 need root or "
            "CAP_NET_BIND_SERVICE)"
        )
    if codes & {errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT}:
        return f"{host} is not an address of this host"
    return errors[0].strerror or str(errors[0])


def check_bindable(address: str) -> None:
    """Refuse, before anything is bound, an address gRPC would fail (or silently wrap) on."""
    if address.startswith(UNIX_PREFIXES):
        return
    host, port = parse_address(address)
    reason = probe_bind(host, port)
    if reason is not None:
        raise ConfigError(f"cannot listen on {address}: {reason}; choose another --listen")


def bind_failure(address: str, *, tls: bool = False) -> str:
    """Why gRPC could not bind ``address``, and what to do: one line for the user."""
    reason = None
    if not address.startswith(UNIX_PREFIXES):
        try:
            reason = probe_bind(*parse_address(address))
        except ConfigError as exc:
            return str(exc)
    if reason is None:
        reason = "gRPC could not bind it"
        if tls:
            reason += (
                " (with TLS on, the usual cause is --tls-cert and --tls-key not being a "
                "matching PEM certificate and private key)"
            )
        else:
            reason += " (is it in use, or not an address of this host?)"
    return f"cannot listen on {address}: {reason}; choose another --listen"


# ---------------------------------------------------------------- Prometheus endpoints


def check_metrics_port(port: int, option: str = "--metrics-port") -> None:
    """A metrics port is 0..65535 (0: any free port); Python's socket would overflow.

    The endpoint itself is served by :mod:`codedgd.services.metrics_endpoint`.
    """
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ConfigError(
            f"{option} {port} is out of range: expected a port number 0..65535 (0: any free port)"
        )
