"""Shared fixtures: an in-process coordinator and worker processes on loopback."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from codedgd.services.coordinator.server import CoordinatorServer
from codedgd.services.security import TOKEN_ENV, Security

ROOT = Path(__file__).resolve().parent.parent


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
