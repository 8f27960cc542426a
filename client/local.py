"""`codedgd run`: a coordinator and N worker processes on this machine, one job.

The coordinator runs in this process on an ephemeral loopback port with a fresh
random worker token, so no other process on the machine can join (and none can submit:
the job is submitted in-process, no operator token exists); the workers are
separate OS processes (``python -m codedgd.client.cli worker``), exactly as on a cluster,
each limited to one BLAS thread so n workers share the cores fairly.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import BinaryIO

from codedgd.services import allocator
from codedgd.services.coordinator.server import CoordinatorServer, uninterrupted
from codedgd.services.errors import ConfigError, Diverged, JobFailed
from codedgd.services.job import JobConfig
from codedgd.services.records import RoundRecord
from codedgd.services.security import TOKEN_ENV, Security

SINGLE_THREAD_ENV = {
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "NUMEXPR_NUM_THREADS": "1",
}


# `codedgd run` serves everything on loopback only: its coordinator, and its metrics.
LOOPBACK = "127.0.0.1"


def open_worker_log(path: str) -> BinaryIO:
    """The --worker-log file, opened for appending before anything starts."""
    try:
        return open(path, "ab")  # closed by run_local
    except OSError as exc:
        raise ConfigError(
            f"cannot write the worker log {path}: {exc.strerror or exc}; "
            "choose another --worker-log"
        ) from None


def worker_environment(environ: Mapping[str, str], token: str) -> dict[str, str]:
    """The environment of the worker processes `codedgd run` starts.

    Workers get every setting as an argument: a CODEDGD_* variable meant for the
    coordinator (a metrics port, say) must not leak into them. The malloc switch is a
    property of every process, not a flag, so it passes through.
    """
    env = {k: v for k, v in environ.items() if not k.startswith("CODEDGD_") or k == allocator.ENV}
    env.update(SINGLE_THREAD_ENV)
    env[TOKEN_ENV] = token
    return env


@dataclass(frozen=True)
class LocalRun:
    job_id: str
    state: str
    error: str
    records: tuple[RoundRecord, ...]
    theta: list[float] | None
    features: int | None = None  # the data's columns (a network's θ does not tell)


async def run_local(
    config: JobConfig,
    *,
    data_dir: str | None = None,
    on_record: Callable[[RoundRecord], None] | None = None,
    on_status: Callable[[str], None] | None = None,
    on_submitted: Callable[[str], None] | None = None,
    metrics_port: int | None = None,
    worker_log: str | None = None,
    startup_timeout: float = 120.0,
    log_format: str = "text",
) -> LocalRun:
    """Run one job locally and return its records; raises JobFailed if the job fails.

    Whatever ends it (the job, an error, Ctrl-C or a cancellation), the coordinator is
    stopped and the worker processes are reaped before this returns.
    """
    token = secrets.token_hex(16)
    # The workers' token only: this process submits in-process, so no gRPC client
    # (not even one holding this token) may submit, watch or cancel.
    security = Security(worker_token=token)
    log_file = open_worker_log(worker_log) if worker_log else None
    server: CoordinatorServer | None = None
    procs: list[asyncio.subprocess.Process] = []
    try:
        server = await CoordinatorServer.start(
            f"{LOOPBACK}:0",
            security=security,
            metrics_port=metrics_port,
            metrics_address=LOOPBACK,
            data_dir=data_dir,
            assign_timeout=startup_timeout,
        )
        job = server.service.submit(config)
        if on_submitted is not None:
            on_submitted(job.id)
        job.on_record = on_record
        env = worker_environment(os.environ, token)
        sink = log_file if log_file is not None else asyncio.subprocess.DEVNULL
        # The first n to connect take the job; the spares stay idle until a place is lost.
        for i in range(config.workers + config.spares):
            args = [
                sys.executable,
                "-m",
                "codedgd.client.cli",
                "worker",
                "--coordinator",
                f"{LOOPBACK}:{server.port}",
                "--name",
                f"local-{i}",
                "--no-reconnect",
                "--peer-listen",  # for ring and tree jobs: peers on loopback
                f"{LOOPBACK}:0",
            ]
            if data_dir:
                args += ["--data-dir", data_dir]
            args += ["--log-format", log_format]  # the worker log as the run's own
            procs.append(
                await asyncio.create_subprocess_exec(
                    *args, env=env, stdin=asyncio.subprocess.DEVNULL, stdout=sink, stderr=sink
                )
            )
        if on_status is not None:
            spares = f" and {config.spares} spare(s)" if config.spares else ""
            on_status(f"started {config.workers} worker processes{spares}")
        while not job.finished:
            # asyncio.wait, not wait_for: Python 3.11's wait_for returns the result when
            # a Ctrl-C's cancellation lands as the change completes (rounds take
            # milliseconds), and the job would run on.
            change = asyncio.ensure_future(job.wait_change())
            try:
                await asyncio.wait({change}, timeout=1.0)
            finally:
                change.cancel()
            dead = [i for i, p in enumerate(procs) if p.returncode not in (None, 0)]
            if dead and job.state in ("queued", "assigning"):
                # A worker that dies before the job starts never joins: fail fast.
                job.error = (
                    f"worker process(es) {dead} exited with code "
                    f"{procs[dead[0]].returncode} before the job started"
                    + (f"; see {worker_log}" if worker_log else "; rerun with --worker-log FILE")
                )
                server.service.cancel(job.id)
        theta = job.theta.tolist() if job.theta is not None else None
        result = LocalRun(job.id, job.state, job.error, tuple(job.records), theta, job.features)
    finally:
        # To the end even if a second Ctrl-C or a SIGTERM cancels us meanwhile: a server
        # left running prints a traceback at exit, and workers would be left behind.
        await uninterrupted(_shut_down(server, procs, log_file))
    if result.state == "diverged":
        raise Diverged(f"job {result.job_id} diverged: {result.error}")
    if result.state != "done":
        raise JobFailed(f"job {result.job_id} {result.state}: {result.error}")
    return result


async def _shut_down(
    server: CoordinatorServer | None,
    procs: list[asyncio.subprocess.Process],
    log_file: BinaryIO | None,
) -> None:
    """Stop the coordinator (workers are told to leave), reap the workers, close the log."""
    try:
        if server is not None:
            await server.stop()
    finally:
        try:
            for p in procs:
                try:
                    await asyncio.wait_for(p.wait(), timeout=10)
                except TimeoutError:
                    with contextlib.suppress(ProcessLookupError):
                        p.kill()
                    await p.wait()
        finally:
            if log_file is not None:
                log_file.close()
