"""An unauthenticated flood leaves the coordinator's memory where it was.

The coordinator runs as its own process with a token; a hundred calls without it,
each with a 60 MiB body, arrive at once. Before the token was checked ahead of the
body, each body was read whole (2.9 GB peak for 128 such calls, docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import grpc
import pytest

from codedgd.client.api import Client
from codedgd.services.security import Security
from tests.conftest import CoordinatorProcess

pytestmark = pytest.mark.slow

CALLS = 100
BODY = 60 << 20
# What a refused call still costs is its stream's HTTP/2 flow-control window: data gRPC
# accepts before the refusal resets the stream. gRPC grows the windows with the link's
# measured bandwidth-delay product (BDP probing; with it off the flood costs ~16 KiB), so
# the cost depends on the machine: 17-26 MiB here, 63 MiB once on a CI machine. Reading
# the bodies costs CALLS x BODY (6000 MiB); the bound is 2 % of that.
BOUND_KIB = CALLS * BODY // 50 // 1024


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"{field} missing from /proc/{pid}/status")


async def test_a_hundred_unauthenticated_60_mib_calls_cost_the_coordinator_no_memory() -> None:
    coordinator = CoordinatorProcess(extra=("--token", "s3cret"))
    try:
        await asyncio.to_thread(coordinator.start)
        assert coordinator.proc is not None
        pid = coordinator.proc.pid
        Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS
        idle = _status_kib(pid, "VmRSS")
        body = b"\0" * BODY
        options = [("grpc.max_send_message_length", BODY + (1 << 20))]
        async with grpc.aio.insecure_channel(coordinator.target, options=options) as channel:
            submit = channel.unary_unary("/codedgd.v1.Coordinator/SubmitJob")
            results = await asyncio.gather(
                *(submit(body, timeout=120) for _ in range(CALLS)), return_exceptions=True
            )
        codes = [r.code() if isinstance(r, grpc.aio.AioRpcError) else r for r in results]
        # Each is refused. Under load gRPC can reset a refused stream whose body is still
        # being sent before its UNAUTHENTICATED status arrives: the client then sees
        # INTERNAL (see test_a_refusal_garbled_by_grpc_is_asked_again); never a success.
        assert set(codes) <= {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.INTERNAL}, codes
        assert grpc.StatusCode.UNAUTHENTICATED in codes
        peak = _status_kib(pid, "VmHWM")
        assert peak - idle < BOUND_KIB, f"the flood grew the coordinator by {peak - idle} KiB"
        # And it still serves the token's holders.
        async with Client(coordinator.target, Security(token="s3cret")) as client:
            assert (await client.status()).jobs == ()
        assert coordinator.proc.poll() is None
    finally:
        if coordinator.proc is not None:
            coordinator.signal(signal.SIGTERM)
