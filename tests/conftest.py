"""Shared fixtures: an in-process coordinator, worker processes on loopback, and a
coordinator process to kill."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from codedgd.services.coordinator.server import CoordinatorServer
from codedgd.services.security import TOKEN_ENV, Security

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True, scope="session")
def _own_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Solved optima (`report` and `tune` cache them for --target-gap) go to the
    session's own directory, not the user's ~/.cache (a test may set its own)."""
    before = os.environ.get("CODEDGD_CACHE_DIR")
    os.environ["CODEDGD_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))
    yield
    if before is None:
        os.environ.pop("CODEDGD_CACHE_DIR", None)
    else:
        os.environ["CODEDGD_CACHE_DIR"] = before


def require_torch() -> object:
    """torch, for the tests of the neural-network models. The base install is torch-free
    and its suite passes without it (these tests are skipped); CI installs the extra and
    sets CODEDGD_REQUIRE_TORCH=1, so there a missing torch fails instead."""
    if os.environ.get("CODEDGD_REQUIRE_TORCH") == "1":
        import torch

        return torch
    return pytest.importorskip("torch", reason="pip install 'codedgd[torch]'")


def shared_data_dir() -> Path | None:
    env = os.environ.get("CODEDGD_DATA_DIR")
    candidate = Path(env) if env else ROOT.parent / "shared" / "datasets"
    return candidate if candidate.is_dir() else None


@pytest.fixture
def data_dir() -> Path:
    d = shared_data_dir()
    if d is None:
        pytest.skip(
            "real datasets not found: set CODEDGD_DATA_DIR or put shared/datasets "
            "beside the checkout"
        )
    return d


@pytest.fixture
async def coordinator() -> AsyncIterator[CoordinatorServer]:
    server = await CoordinatorServer.start("127.0.0.1:0", assign_timeout=60)
    yield server
    await server.stop(0)


class WorkerProcesses:
    """Worker OS processes (`python -m codedgd.client.cli worker`) attached to a coordinator."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(
        self,
        port: int,
        n: int,
        *,
        token: str | None = None,
        name: str = "w",
        extra: tuple[str, ...] = (),
    ) -> list[subprocess.Popen[bytes]]:
        # CI exports CODEDGD_DATA_DIR for the coordinator; workers get only what a test gives.
        env = {k: v for k, v in os.environ.items() if not k.startswith("CODEDGD_")}
        env.update({"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"})
        if token:
            env[TOKEN_ENV] = token
        new = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "codedgd.client.cli",
                    "worker",
                    "--coordinator",
                    f"127.0.0.1:{port}",
                    "--name",
                    f"{name}{i}",
                    *extra,
                ],
                env=env,
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            for i in range(n)
        ]
        self.procs += new
        return new

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for p in self.procs:
            p.wait(timeout=30)
            if p.stderr is not None:
                p.stderr.close()


@pytest.fixture
def worker_processes() -> Iterator[WorkerProcesses]:
    wp = WorkerProcesses()
    yield wp
    wp.stop()


@pytest.fixture
def open_security() -> Security:
    return Security()


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class CoordinatorProcess:
    """`codedgd coordinator` as its own process (to kill), with metrics and, if given, a
    state directory."""

    def __init__(
        self, state_dir: Path | None = None, every: int = 5, extra: tuple[str, ...] = ()
    ) -> None:
        self.state_dir, self.every, self.extra = state_dir, every, extra
        self.port, self.metrics = _port(), _port()
        self.proc: subprocess.Popen[str] | None = None
        self.logs: list[str] = []

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        args = ["coordinator", "--listen", self.target, "--metrics-port", str(self.metrics)]
        if self.state_dir is not None:
            args += ["--state-dir", str(self.state_dir), "--checkpoint-every", str(self.every)]
        args += self.extra
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "codedgd.client.cli", *args],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                assert self.proc.poll() is None, self.finish()
                assert time.monotonic() < deadline, "the coordinator did not start"
                time.sleep(0.1)

    def round(self) -> float:
        try:
            url = f"http://127.0.0.1:{self.metrics}/metrics"
            with urllib.request.urlopen(url, timeout=2) as r:
                text = r.read().decode()
        except OSError:
            return -1.0
        line = next((x for x in text.splitlines() if x.startswith("codedgd_round ")), "")
        return float(line.split()[1]) if line else -1.0

    def wait_round(self, t: int) -> None:
        deadline = time.monotonic() + 120
        while self.round() < t:
            assert self.proc is not None and self.proc.poll() is None, self.finish()
            assert time.monotonic() < deadline
            time.sleep(0.05)

    def signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)
        self.finish()

    def finish(self) -> str:
        if self.proc is not None:
            try:
                out, _ = self.proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                out, _ = self.proc.communicate()
            self.logs.append(out or "")
            self.proc = None
        return "\n".join(self.logs)
