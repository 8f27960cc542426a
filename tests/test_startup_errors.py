"""Starting a coordinator, a worker or `codedgd run` wrongly costs one line, and leaves
nothing half-started.

Each case came from a review that ran the commands as a user would: a --listen address
in use, malformed or not this host's, a TLS key that is not the certificate's, a client
certificate without its key (gRPC aborted the process), a metrics port out of range or
in use (bound after gRPC started, whose server then printed "Exception ignored in
Server.__del__" at exit), a worker log that could not be opened, a Ctrl-C landing in the
clean-up, and `codedgd run` exposing its metrics on every interface.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from codedgd.client.cli import main
from codedgd.client.local import run_local
from codedgd.services.coordinator.server import CoordinatorServer
from codedgd.services.coordinator.service import CoordinatorService
from codedgd.services.errors import ConfigError
from codedgd.services.job import Component, JobConfig
from codedgd.services.security import Security
from tests.e2e.test_security import _make_ca_and_cert

ROOT = Path(__file__).resolve().parent.parent
SYNTH = Component("synthetic", {"rows": 200, "dim": 4})
NOT_THIS_HOST = "192.0.2.1"  # TEST-NET-1 (RFC 5737): documentation only, on no host


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_is_free(port: int) -> bool:
    """Whether a listener can bind 127.0.0.1:port (gRPC's socket is gone)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


@contextlib.contextmanager
def busy_port() -> Iterator[int]:
    """A port another process (this test) listens on, on every interface."""
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        s.listen()
        yield int(s.getsockname()[1])


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("certs")
    ca, cert, key = _make_ca_and_cert(tmp)
    junk = tmp / "junk.txt"
    junk.write_text("not a certificate\n")
    return {"ca": ca, "ca.key": tmp / "ca.key", "cert": cert, "key": key, "junk": junk}


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "codedgd.client.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def assert_one_clean_error(stderr: str) -> None:
    assert "Traceback" not in stderr, stderr
    assert "Exception ignored" not in stderr, stderr


async def start_must_fail(address: str, **kwargs: Any) -> str:
    """CoordinatorServer.start's ConfigError message (stopping it if it started after all)."""
    try:
        server = await CoordinatorServer.start(address, **kwargs)
    except ConfigError as exc:
        return str(exc)
    await server.stop(0)
    pytest.fail(f"started on {address} (port {server.port})")


# ---------------------------------------------------------------- --listen


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("busy", "is already in use by another process; choose another --listen"),
        (f"{NOT_THIS_HOST}:50051", f"{NOT_THIS_HOST} is not an address of this host"),
        ("garbage", "'garbage' is malformed: expected HOST:PORT"),
        ("127.0.0.1:5OO51", "the port '5OO51' is not a number"),
        ("::1:50051", "an IPv6 address needs brackets, e.g. [::1]:50051"),
    ],
    ids=["in-use", "not-this-host", "no-port", "port-not-a-number", "ipv6-no-brackets"],
)
def test_a_listen_address_that_cannot_be_bound_is_one_line(
    address: str, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with busy_port() as port:
        if address == "busy":
            address = f"127.0.0.1:{port}"
        code = main(["coordinator", "--listen", address])
    err = capsys.readouterr().err
    assert code == 2
    assert "codedgd coordinator: error: " in err and expected in err, err
    if "choose another --listen" in expected or "not an address" in expected:
        assert f"cannot listen on {address}" in err
    assert "Traceback" not in err


async def test_a_port_out_of_range_is_refused_not_wrapped_around() -> None:
    # gRPC bound 127.0.0.1:99999 as port 34463 (99999 mod 65536) and said it listened on 99999.
    message = await start_must_fail("127.0.0.1:99999")
    assert "port 99999 is out of range 0..65535; choose another --listen" in message


# ---------------------------------------------------------------- TLS, coordinator


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        (("cert", "ca.key", None), "is not the private key of --tls-cert"),
        (("junk", "key", None), "is not a PEM certificate"),
        (("cert", "junk", None), "is not a PEM private key"),
        (("key", "cert", None), "did you swap --tls-cert and --tls-key?"),
        (("cert", "key", "junk"), "--tls-ca"),
    ],
    ids=["not-a-pair", "cert-not-pem", "key-not-pem", "swapped", "ca-not-pem"],
)
def test_tls_files_that_cannot_serve_are_named(
    certs: dict[str, Path],
    files: tuple[str | None, str | None, str | None],
    expected: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["coordinator", "--listen", "127.0.0.1:0"]
    for flag, name in zip(("--tls-cert", "--tls-key", "--tls-ca"), files, strict=True):
        if name is not None:
            args += [flag, str(certs[name])]
    code = main(args)
    err = capsys.readouterr().err
    assert code == 2
    assert "codedgd coordinator: error: " in err and expected in err, err
    assert "Traceback" not in err


async def test_requiring_client_certificates_without_tls_is_refused(
    certs: dict[str, Path],
) -> None:
    # It served plaintext to anyone, ignoring --tls-ca.
    message = await start_must_fail("127.0.0.1:0", security=Security(tls_ca=certs["ca"]))
    assert "--tls-ca (require client certificates) needs TLS" in message


async def test_without_cryptography_a_tls_bind_failure_names_the_likely_cause(
    certs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "cryptography", None)  # the pair cannot be checked
    security = Security(tls_cert=certs["cert"], tls_key=certs["ca.key"])
    message = await start_must_fail("127.0.0.1:0", security=security)
    assert "cannot listen on 127.0.0.1:0" in message
    assert "--tls-cert and --tls-key not being a matching PEM certificate" in message


# ---------------------------------------------------------------- TLS, clients and workers


@pytest.mark.parametrize("command", ["status", "worker"])
@pytest.mark.parametrize(("given", "missing"), [("cert", "key"), ("key", "cert")])
def test_a_client_certificate_without_its_key_is_refused_not_aborted(
    certs: dict[str, Path], command: str, given: str, missing: str
) -> None:
    # gRPC aborted the process: "Check failed: private_key != nullptr", exit 134.
    args = [command, "--coordinator", "127.0.0.1:1", "--tls-ca", str(certs["ca"])]
    args += [f"--tls-{given}", str(certs[given])]
    if command == "worker":
        args.append("--no-reconnect")
    proc = run_cli(*args)
    assert proc.returncode == 2, proc.stderr
    assert f"codedgd {command}: error: mutual TLS needs both --tls-cert and --tls-key" in (
        proc.stderr
    )
    assert f"--tls-{given} is set but --tls-{missing} is not" in proc.stderr
    assert_one_clean_error(proc.stderr)


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"tls_ca": "junk"}, "--tls-ca"),
        ({"tls_ca": "ca", "tls_cert": "cert", "tls_key": "ca.key"}, "do not form a pair"),
    ],
    ids=["ca-not-pem", "not-a-pair"],
)
async def test_client_tls_files_are_checked_before_dialing(
    certs: dict[str, Path], files: dict[str, str], expected: str
) -> None:
    # Both only ever showed as "cannot reach the coordinator ... security handshaker".
    security = Security(**{k: certs[v] for k, v in files.items()})
    channel = None
    with pytest.raises(ConfigError, match=expected):
        channel = security.channel("127.0.0.1:1")
    if channel is not None:
        await channel.close()


# ---------------------------------------------------------------- --metrics-port


@pytest.mark.parametrize("port", ["99999", "-1"])
@pytest.mark.parametrize("command", ["coordinator", "worker"])
def test_a_metrics_port_out_of_range_is_one_line(
    command: str, port: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [command, "--metrics-port", port]
    args += ["--listen", "127.0.0.1:0"] if command == "coordinator" else ["--no-reconnect"]
    code = main(args)
    err = capsys.readouterr().err
    assert code == 2
    assert f"codedgd {command}: error: --metrics-port {port} is out of range" in err, err
    assert "Traceback" not in err


def test_a_worker_metrics_port_in_use_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    with busy_port() as port:
        code = main(["worker", "--metrics-port", str(port), "--no-reconnect"])
    err = capsys.readouterr().err
    assert code == 2
    assert f"cannot serve metrics on 127.0.0.1:{port}: port {port} is already in use" in err, err


async def test_a_metrics_port_in_use_leaves_no_grpc_server_running() -> None:
    listen = free_port()
    with busy_port() as metrics:
        message = await start_must_fail(f"127.0.0.1:{listen}", metrics_port=metrics)
    assert (
        f"cannot serve metrics on 127.0.0.1:{metrics}: port {metrics} is already in use" in message
    )
    assert "choose another --metrics-port" in message
    assert port_is_free(listen)  # the gRPC server was never started (or was stopped)


def test_a_metrics_port_in_use_prints_no_traceback_at_exit() -> None:
    # The gRPC server was started first and never stopped: its __del__ printed
    # "Exception ignored ... RuntimeError: Event loop is closed" after the error.
    with busy_port() as port:
        proc = run_cli("coordinator", "--listen", "127.0.0.1:0", "--metrics-port", str(port))
    assert proc.returncode == 2, proc.stderr
    assert f"metrics on 127.0.0.1:{port}: port {port} is already in use" in proc.stderr
    assert_one_clean_error(proc.stderr)


# ---------------------------------------------------------------- stopping, whatever happens


async def test_a_start_cancelled_half_way_stops_what_it_started(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ports: list[int] = []
    add_port = Security.add_port

    def spy(self: Security, server: Any, address: str) -> int:
        ports.append(add_port(self, server, address))
        return ports[-1]

    def ctrl_c(self: CoordinatorService) -> None:  # a Ctrl-C landing right after bind
        raise asyncio.CancelledError

    monkeypatch.setattr(Security, "add_port", spy)
    monkeypatch.setattr(CoordinatorService, "start", ctrl_c)
    metrics = free_port()
    with pytest.raises(asyncio.CancelledError):
        await CoordinatorServer.start("127.0.0.1:0", metrics_port=metrics)
    assert ports and port_is_free(ports[0])
    assert port_is_free(metrics)


async def test_a_stop_interrupted_half_way_still_stops_serving() -> None:
    server = await CoordinatorServer.start("127.0.0.1:0")
    service_stop = server.service.stop

    async def interrupted(reason: str = "") -> None:  # a second Ctrl-C / SIGTERM lands here
        raise asyncio.CancelledError

    server.service.stop = interrupted  # type: ignore[method-assign]
    with pytest.raises(asyncio.CancelledError):
        await server.stop(0)
    assert port_is_free(server.port)
    await service_stop()
    await server.stop(0)  # a second stop does nothing


# ---------------------------------------------------------------- codedgd run


async def test_an_unwritable_worker_log_is_refused_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[str] = []
    start = CoordinatorServer.start

    async def spy(address: str, **kwargs: Any) -> CoordinatorServer:
        started.append(address)
        return await start(address, **kwargs)

    monkeypatch.setattr(CoordinatorServer, "start", spy)
    path = tmp_path / "missing" / "workers.log"
    with pytest.raises(ConfigError, match=f"cannot write the worker log {path}: No such file"):
        await run_local(JobConfig(workers=1, rounds=1, data=SYNTH), worker_log=str(path))
    assert started == []


def test_run_with_an_unwritable_worker_log_prints_no_traceback(tmp_path: Path) -> None:
    path = tmp_path / "missing" / "workers.log"
    proc = run_cli(
        *("run", "-n", "1", "-r", "1", "--no-progress", "-o", str(tmp_path / "r.json")),
        *("--worker-log", str(path)),
    )
    assert proc.returncode == 2, proc.stderr
    assert f"codedgd run: error: cannot write the worker log {path}" in proc.stderr
    assert "choose another --worker-log" in proc.stderr
    assert_one_clean_error(proc.stderr)


async def test_run_stops_its_coordinator_when_cancelled_again_during_clean_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ctrl-C, then a second cancellation (SIGTERM, another Ctrl-C) while it shuts down."""
    ports: list[int] = []
    add_port = Security.add_port
    stop = CoordinatorServer.stop

    def spy(self: Security, server: Any, address: str) -> int:
        ports.append(add_port(self, server, address))
        return ports[-1]

    async def slow_stop(self: CoordinatorServer, grace: float = 2.0) -> None:
        await asyncio.sleep(0.5)  # the second cancellation lands here
        await stop(self, 0)

    monkeypatch.setattr(Security, "add_port", spy)
    monkeypatch.setattr(CoordinatorServer, "stop", slow_stop)
    loop = asyncio.get_running_loop()

    def ctrl_c_soon(status: str) -> None:  # the workers have started
        loop.call_later(0.3, task.cancel)

    config = JobConfig(workers=1, rounds=10**6, data=SYNTH)
    task = asyncio.ensure_future(run_local(config, on_status=ctrl_c_soon))
    while not task.done() and not task.cancelling():
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.2)  # in slow_stop now
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert ports and port_is_free(ports[0])


def _listeners(port: int) -> set[str]:
    """Local addresses (hex, as /proc/net/tcp* shows them) listening on ``port``."""
    found = set()
    for name in ("tcp", "tcp6"):
        with contextlib.suppress(FileNotFoundError):
            for line in Path(f"/proc/net/{name}").read_text().splitlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                addr, hex_port = local.split(":")
                if state == "0A" and int(hex_port, 16) == port:
                    found.add(addr)
    return found


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc/net/tcp")
async def test_run_serves_its_metrics_on_loopback_only() -> None:
    # Its coordinator listens on 127.0.0.1 only; its metrics were on 0.0.0.0.
    port = free_port()
    seen: list[set[str]] = []
    await run_local(
        JobConfig(workers=1, rounds=2, data=SYNTH),
        metrics_port=port,
        on_status=lambda _: seen.append(_listeners(port)),
    )
    assert seen == [{"0100007F"}]  # 127.0.0.1


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc/net/tcp")
@pytest.mark.parametrize(("address", "expected"), [(None, {"0100007F"}), ("0.0.0.0", {"00000000"})])
async def test_the_metrics_endpoint_binds_loopback_unless_told_otherwise(
    address: str | None, expected: set[str]
) -> None:
    """It has no authentication: only --metrics-address opens it to other hosts."""
    port = free_port()
    kwargs = {} if address is None else {"metrics_address": address}
    server = await CoordinatorServer.start("127.0.0.1:0", metrics_port=port, **kwargs)
    try:
        assert _listeners(port) == expected
    finally:
        await server.stop(0)
