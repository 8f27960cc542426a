"""HTTPS, client certificates and basic auth on the Prometheus endpoints.

Every check is a real HTTP(S) request against a served endpoint: a scraper without the
password gets 401 (with the challenge that makes it retry with credentials), the right
one gets the metrics, HTTPS verifies against the CA, plain HTTP to the HTTPS port and a
client without a certificate under --metrics-tls-ca get nothing. Bad files stop the
command at start with one line naming the flag.
"""

from __future__ import annotations

import base64
import contextlib
import os
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from codedgd.client.cli import build_parser, main
from codedgd.client.cli.options import apply_env_defaults, check_env
from codedgd.services.coordinator.metrics import CoordinatorMetrics
from codedgd.services.coordinator.server import CoordinatorServer
from codedgd.services.errors import ConfigError
from codedgd.services.metrics_endpoint import MetricsSecurity, serve_metrics
from tests.e2e.test_security import _make_ca_and_cert

ROOT = Path(__file__).resolve().parent.parent
USER, PASSWORD = "prometheus", "s3cret: with spaces"
KNOWN_METRIC = "codedgd_workers_connected"  # a coordinator gauge, served before any job


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("metrics-certs")
    ca, cert, key = _make_ca_and_cert(tmp)
    encrypted = tmp / "encrypted.key"
    subprocess.run(
        [
            "openssl",
            "pkey",
            "-in",
            str(key),
            "-aes256",
            "-passout",
            "pass:x",
            "-out",
            str(encrypted),
        ],
        check=True,
        capture_output=True,
    )
    auth = tmp / "auth"
    auth.write_text(f"{USER}:{PASSWORD}\n")
    junk = tmp / "junk.txt"
    junk.write_text("not a certificate\n")
    return {
        "ca": ca,
        "other_key": tmp / "ca.key",  # a key, but not server.pem's
        "cert": cert,
        "key": key,
        "encrypted": encrypted,
        "auth": auth,
        "junk": junk,
        "missing": tmp / "missing.pem",
    }


@contextlib.contextmanager
def served(security: MetricsSecurity, address: str = "127.0.0.1") -> Iterator[int]:
    """A coordinator's metrics registry served with ``security``: its port."""
    server = serve_metrics(CoordinatorMetrics().registry, 0, address, security=security)
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def get(
    url: str, *, authorization: str | None = None, context: ssl.SSLContext | None = None
) -> tuple[int, dict[str, str], str]:
    """Status, headers and body of a GET (an HTTP error status is an answer too)."""
    request = urllib.request.Request(url)
    if authorization is not None:
        request.add_header("Authorization", authorization)
    try:
        with urllib.request.urlopen(request, timeout=5, context=context) as response:
            return response.status, dict(response.headers), response.read().decode()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, dict(exc.headers), exc.read().decode()


def client_context(ca: Path, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca))
    if cert is not None:
        context.load_cert_chain(cert, key)
    return context


# ---------------------------------------------------------------- basic auth


@pytest.fixture
def auth_only(files: dict[str, Path]) -> Iterator[int]:
    with served(MetricsSecurity.from_options(basic_auth_file=files["auth"])) as port:
        yield port


def test_without_credentials_the_answer_is_401_with_a_basic_challenge(auth_only: int) -> None:
    status, headers, body = get(f"http://127.0.0.1:{auth_only}/metrics")
    assert status == 401
    assert headers["WWW-Authenticate"].startswith("Basic realm=")
    assert KNOWN_METRIC not in body


@pytest.mark.parametrize(
    "authorization",
    [
        basic(USER, "wrong"),
        basic("someone", PASSWORD),
        basic(USER, PASSWORD[:-1]),
        f"Bearer {PASSWORD}",
        "Basic not-base64!",
        "Basic",
    ],
    ids=["wrong-password", "wrong-user", "password-prefix", "not-basic", "garbled", "empty"],
)
def test_wrong_credentials_are_401(auth_only: int, authorization: str) -> None:
    status, headers, body = get(
        f"http://127.0.0.1:{auth_only}/metrics", authorization=authorization
    )
    assert status == 401
    assert "WWW-Authenticate" in headers
    assert KNOWN_METRIC not in body


def test_the_right_credentials_get_the_metrics(auth_only: int) -> None:
    url = f"http://127.0.0.1:{auth_only}/metrics"
    status, _headers, body = get(url, authorization=basic(USER, PASSWORD))
    assert status == 200
    assert KNOWN_METRIC in body
    # the scheme name is case-insensitive (RFC 7617)
    lower = "basic " + basic(USER, PASSWORD).split(" ", 1)[1]
    assert get(url, authorization=lower)[0] == 200


def test_a_refused_request_is_answered_without_reading_its_body(auth_only: int) -> None:
    # Announces a 1 GB body and sends none: a server that read it would hang here.
    with socket.create_connection(("127.0.0.1", auth_only), timeout=5) as sock:
        sock.sendall(b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000\r\n\r\n")
        reply = b""
        while chunk := sock.recv(4096):
            reply += chunk
    status_line = reply.split(b"\r\n", 1)[0]
    assert status_line.startswith(b"HTTP/1.") and b" 401 " in status_line, reply


# ---------------------------------------------------------------- HTTPS


@pytest.fixture
def https(files: dict[str, Path]) -> Iterator[int]:
    security = MetricsSecurity.from_options(
        tls_cert=files["cert"], tls_key=files["key"], basic_auth_file=files["auth"]
    )
    assert security.scheme == "https"
    with served(security) as port:
        yield port


def test_https_verified_by_the_ca_serves_the_metrics(https: int, files: dict[str, Path]) -> None:
    context = client_context(files["ca"])
    for host in ("127.0.0.1", "localhost"):  # both names are in the certificate
        url = f"https://{host}:{https}/metrics"
        assert get(url, context=context)[0] == 401  # basic auth still applies
        status, _headers, body = get(url, authorization=basic(USER, PASSWORD), context=context)
        assert status == 200
        assert KNOWN_METRIC in body


def test_https_is_not_trusted_without_the_ca(https: int) -> None:
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        get(f"https://127.0.0.1:{https}/metrics", context=ssl.create_default_context())


def test_plain_http_to_the_https_port_gets_nothing_and_the_endpoint_keeps_serving(
    https: int, files: dict[str, Path]
) -> None:
    with pytest.raises(OSError):  # the server hangs up: no HTTP answer at all
        get(f"http://127.0.0.1:{https}/metrics", authorization=basic(USER, PASSWORD))
    url = f"https://127.0.0.1:{https}/metrics"
    context = client_context(files["ca"])
    assert get(url, authorization=basic(USER, PASSWORD), context=context)[0] == 200


def test_a_client_that_stalls_its_handshake_does_not_block_others(
    https: int, files: dict[str, Path]
) -> None:
    # prometheus_client's own HTTPS server handshakes in its accept loop: one silent
    # connection there stalls every scrape.
    with socket.create_connection(("127.0.0.1", https), timeout=5):
        context = client_context(files["ca"])
        started = time.monotonic()
        url = f"https://127.0.0.1:{https}/metrics"
        assert get(url, authorization=basic(USER, PASSWORD), context=context)[0] == 200
        assert time.monotonic() - started < 3


# ---------------------------------------------------------------- client certificates


@pytest.fixture
def mutual(files: dict[str, Path]) -> Iterator[int]:
    security = MetricsSecurity.from_options(
        tls_cert=files["cert"], tls_key=files["key"], tls_ca=files["ca"]
    )
    with served(security) as port:
        yield port


def test_with_a_ca_a_client_without_a_certificate_is_refused(
    mutual: int, files: dict[str, Path]
) -> None:
    with pytest.raises(OSError):  # ssl.SSLError / URLError / a reset: no answer
        get(f"https://127.0.0.1:{mutual}/metrics", context=client_context(files["ca"]))


def test_with_a_ca_a_client_certificate_it_signed_is_served(
    mutual: int, files: dict[str, Path]
) -> None:
    # server.pem is signed by the test CA, so it serves as a client certificate too.
    context = client_context(files["ca"], files["cert"], files["key"])
    status, _headers, body = get(f"https://127.0.0.1:{mutual}/metrics", context=context)
    assert status == 200
    assert KNOWN_METRIC in body


# ---------------------------------------------------------------- bad files and flags


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"tls_cert": "missing", "tls_key": "key"}, "--metrics-tls-cert {missing}: no such file"),
        ({"tls_cert": "cert", "tls_key": "missing"}, "--metrics-tls-key {missing}: no such file"),
        (
            {"tls_cert": "cert", "tls_key": "key", "tls_ca": "missing"},
            "--metrics-tls-ca {missing}: no such file",
        ),
        ({"tls_cert": "cert"}, "--metrics-tls-cert is set but --metrics-tls-key is not"),
        ({"tls_key": "key"}, "--metrics-tls-key is set but --metrics-tls-cert is not"),
        ({"tls_ca": "ca"}, "--metrics-tls-ca (require client certificates) needs HTTPS"),
        ({"tls_cert": "junk", "tls_key": "key"}, "--metrics-tls-cert {junk} is not a PEM cert"),
        (
            {"tls_cert": "key", "tls_key": "cert"},
            "did you swap --metrics-tls-cert and --metrics-tls-key?",
        ),
        (
            {"tls_cert": "cert", "tls_key": "other_key"},
            "--metrics-tls-key {other_key} is not the private key of --metrics-tls-cert {cert}",
        ),
        (
            {"tls_cert": "cert", "tls_key": "encrypted"},
            "--metrics-tls-key {encrypted} is encrypted with a passphrase",
        ),
        (
            {"tls_cert": "cert", "tls_key": "key", "tls_ca": "junk"},
            "--metrics-tls-ca {junk} is not a PEM certificate",
        ),
        ({"basic_auth_file": "missing"}, "--metrics-basic-auth-file {missing}: no such file"),
    ],
    ids=[
        "cert-missing",
        "key-missing",
        "ca-missing",
        "cert-without-key",
        "key-without-cert",
        "ca-without-https",
        "cert-not-pem",
        "swapped",
        "not-a-pair",
        "encrypted-key",
        "ca-not-pem",
        "auth-file-missing",
    ],
)
def test_bad_files_are_a_config_error_naming_the_flag(
    files: dict[str, Path], options: dict[str, str], expected: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        MetricsSecurity.from_options(**{k: files[v] for k, v in options.items()})
    message = str(caught.value)
    assert expected.format(**files) in message, message
    assert " --tls-" not in message  # the gRPC flags are not the ones at fault


@pytest.mark.parametrize(
    "content",
    ["", "\n", "hunter2\n", ":hunter2\n", "hunter2:\n", "u:hunter2\nu:hunter3\n"],
    ids=["empty", "blank", "no-colon", "no-user", "no-password", "two-lines"],
)
def test_a_malformed_auth_file_is_named_without_quoting_it(tmp_path: Path, content: str) -> None:
    path = tmp_path / "auth"
    path.write_text(content)
    with pytest.raises(ConfigError, match=r"--metrics-basic-auth-file .* is malformed") as caught:
        MetricsSecurity.from_options(basic_auth_file=path)
    assert "hunter" not in str(caught.value)


def test_an_unreadable_auth_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "auth"  # a directory: unreadable as a file, also for root (CI)
    path.mkdir()
    with pytest.raises(ConfigError, match="cannot read --metrics-basic-auth-file"):
        MetricsSecurity.from_options(basic_auth_file=path)


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "codedgd.client.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_a_worker_with_a_missing_auth_file_stops_with_one_line() -> None:
    proc = run_cli(
        "worker", "--no-reconnect", "--metrics-port", "0", "--metrics-basic-auth-file", "missing"
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "--metrics-basic-auth-file missing: no such file" in lines[0]
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("command", ["coordinator", "worker"])
def test_a_metrics_security_flag_without_metrics_port_is_refused(
    command: str, files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    args = [command, "--metrics-basic-auth-file", str(files["auth"])]
    args += ["--listen", "127.0.0.1:0"] if command == "coordinator" else ["--no-reconnect"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "--metrics-basic-auth-file needs --metrics-port" in err, err
    assert "Traceback" not in err


def test_a_coordinator_with_a_certificate_but_no_key_stops_with_one_line(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["coordinator", "--listen", "127.0.0.1:0", "--metrics-port", "0"]
    assert main([*args, "--metrics-tls-cert", str(files["cert"])]) == 2
    err = capsys.readouterr().err
    assert "--metrics-tls-cert is set but --metrics-tls-key is not" in err, err
    assert "Traceback" not in err


def test_the_flags_read_their_environment_variables(files: dict[str, Path]) -> None:
    env = {
        "CODEDGD_METRICS_TLS_CERT": str(files["cert"]),
        "CODEDGD_METRICS_TLS_KEY": str(files["key"]),
        "CODEDGD_METRICS_TLS_CA": str(files["ca"]),
        "CODEDGD_METRICS_BASIC_AUTH_FILE": str(files["auth"]),
    }
    for command in ("coordinator", "worker"):
        parser = build_parser()
        errors = apply_env_defaults(parser, env)
        args = parser.parse_args([command])
        check_env(errors, command)
        assert args.metrics_tls_cert == str(files["cert"])
        assert args.metrics_tls_key == str(files["key"])
        assert args.metrics_tls_ca == str(files["ca"])
        assert args.metrics_basic_auth_file == str(files["auth"])


# ---------------------------------------------------------------- the services


async def test_the_coordinator_serves_its_metrics_with_https_and_basic_auth(
    files: dict[str, Path],
) -> None:
    security = MetricsSecurity.from_options(
        tls_cert=files["cert"], tls_key=files["key"], basic_auth_file=files["auth"]
    )
    server = await CoordinatorServer.start("127.0.0.1:0", metrics_port=0, metrics_security=security)
    try:
        url = f"https://127.0.0.1:{server.metrics_port}/metrics"
        context = client_context(files["ca"])
        assert get(url, context=context)[0] == 401
        status, _headers, body = get(url, authorization=basic(USER, PASSWORD), context=context)
        assert status == 200 and KNOWN_METRIC in body
    finally:
        await server.stop(0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_worker_configured_by_environment_serves_https_with_basic_auth(
    files: dict[str, Path],
) -> None:
    """The container way: every setting from CODEDGD_<FLAG>, a real worker process."""
    port = _free_port()
    env = {
        **os.environ,
        "CODEDGD_METRICS_PORT": str(port),
        "CODEDGD_METRICS_TLS_CERT": str(files["cert"]),
        "CODEDGD_METRICS_TLS_KEY": str(files["key"]),
        "CODEDGD_METRICS_BASIC_AUTH_FILE": str(files["auth"]),
        "CODEDGD_COORDINATOR": f"127.0.0.1:{_free_port()}",  # nobody there: it keeps retrying
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "codedgd.client.cli", "worker"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"https://127.0.0.1:{port}/metrics"
    context = client_context(files["ca"])
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                status, _headers, body = get(
                    url, authorization=basic(USER, PASSWORD), context=context
                )
                break
            except OSError:
                assert proc.poll() is None, proc.communicate()[1]
                assert time.monotonic() < deadline, "the worker never served its metrics"
                time.sleep(0.2)
        assert status == 200 and "codedgd_worker_connected 0.0" in body
        assert get(url, context=context)[0] == 401
        # The container healthcheck, from the same environment: it reads the endpoint
        # (the worker is up but has no coordinator); without the settings it cannot.
        probe = run_cli("health", "--worker", env=env)
        assert probe.returncode == 1
        assert "the worker is not connected to its coordinator" in probe.stdout
        bare = {k: v for k, v in env.items() if not k.startswith("CODEDGD_METRICS_TLS")}
        probe = run_cli("health", "--worker", env=bare)
        assert "no worker metrics" in probe.stdout and "Traceback" not in probe.stderr
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


@pytest.mark.skipif(not socket.has_ipv6, reason="no IPv6")
def test_an_ipv6_metrics_address_is_served(files: dict[str, Path]) -> None:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback")
    with served(MetricsSecurity.from_options(basic_auth_file=files["auth"]), "::1") as port:
        status, _headers, body = get(
            f"http://[::1]:{port}/metrics", authorization=basic(USER, PASSWORD)
        )
    assert status == 200 and KNOWN_METRIC in body
