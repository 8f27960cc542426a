"""An unauthenticated flood leaves the coordinator's memory where it was.

The coordinator runs as its own process with a token; a hundred calls without it,
each with a 60 MiB body, arrive at once. Before the token was checked ahead of the
body, each body was read whole (2.9 GB peak for 128 such calls, docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from codedgd.client.api import Client
from codedgd.services.security import Security

pytestmark = pytest.mark.slow

CALLS = 100
BODY = 60 << 20
# Well above the ~150 KiB a refused stream costs, far below one body read whole.
BOUND_KIB = 48 * 1024


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"{field} missing from /proc/{pid}/status")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _ready(target: str, token: str) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            async with Client(target, Security(token=token)) as client:
                await client.status()
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def test_a_hundred_unauthenticated_60_mib_calls_cost_the_coordinator_no_memory() -> None:
    port = _free_port()
    target = f"127.0.0.1:{port}"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "codedgd.client",
            "coordinator",
            "--listen",
            target,
            "--token",
            "s3cret",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        await _ready(target, "s3cret")
        Path(f"/proc/{proc.pid}/clear_refs").write_text("5")  # VmHWM := VmRSS
        idle = _status_kib(proc.pid, "VmRSS")
        body = b"\0" * BODY
        options = [("grpc.max_send_message_length", BODY + (1 << 20))]
        async with grpc.aio.insecure_channel(target, options=options) as channel:
            submit = channel.unary_unary("/codedgd.v1.Coordinator/SubmitJob")
            results = await asyncio.gather(
                *(submit(body, timeout=120) for _ in range(CALLS)), return_exceptions=True
            )
        codes = [r.code() if isinstance(r, grpc.aio.AioRpcError) else r for r in results]
        assert codes == [grpc.StatusCode.UNAUTHENTICATED] * CALLS
        peak = _status_kib(proc.pid, "VmHWM")
        assert peak - idle < BOUND_KIB, f"the flood grew the coordinator by {peak - idle} KiB"
        # And it still serves the token's holders.
        async with Client(target, Security(token="s3cret")) as client:
            assert (await client.status()).jobs == ()
        assert proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(10)
