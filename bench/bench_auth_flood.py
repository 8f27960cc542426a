"""What a flood of large calls costs a coordinator that requires a token.

A coordinator runs as its own process with ``--token``; a client fires ``--calls``
concurrent ``SubmitJob`` calls, ``--waves`` times over, each with a body of
``--mib`` MiB, and the table gives the coordinator's peak resident memory
(VmHWM) growth and the wall time for:

* ``unauthenticated``: no token. The interceptor refuses on the headers and
  never reads the body (codedgd.services.security.refusal);
* ``authenticated``: the right token and a body of the same size that is not a
  valid request. gRPC reads each message whole before the handler parses it: this
  is what reading a body costs, and the ceiling the receive limit
  (codedgd.services.wire.MAX_MESSAGE_BYTES) puts on it.

A body over the receive limit is refused by gRPC with RESOURCE_EXHAUSTED from
its length prefix; the second row uses a body just under the limit.

    python -m bench.bench_auth_flood
    python -m bench.bench_auth_flood --calls 64 --mib 60
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc

from codedgd.services.wire import MAX_MESSAGE_BYTES

METHOD = "/codedgd.v1.Coordinator/SubmitJob"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/{pid}/status")


def _reset_peak(pid: int) -> None:
    # Writing 5 to clear_refs resets VmHWM to the current RSS (Linux >= 4.0).
    Path(f"/proc/{pid}/clear_refs").write_text("5")


async def _flood(
    target: str, token: str | None, calls: int, waves: int, size: int
) -> dict[str, int]:
    body = b"\xff" * size  # not a valid SubmitJobRequest
    metadata = (("authorization", f"Bearer {token}"),) if token else None
    codes: collections.Counter[str] = collections.Counter()
    options = [("grpc.max_send_message_length", size + (1 << 20))]
    async with grpc.aio.insecure_channel(target, options=options) as channel:
        stub = channel.unary_unary(METHOD)

        async def one() -> None:
            try:
                await stub(body, metadata=metadata, timeout=120)
                codes["OK"] += 1
            except grpc.aio.AioRpcError as exc:
                codes[exc.code().name] += 1

        for _ in range(waves):
            await asyncio.gather(*(one() for _ in range(calls)))
    return dict(codes)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--calls", type=int, default=32, help="concurrent calls per wave")
    p.add_argument("--waves", type=int, default=4)
    p.add_argument(
        "--mib", type=float, default=60.0, help="body size of the unauthenticated calls (MiB)"
    )
    args = p.parse_args()
    port = _free_port()
    target = f"127.0.0.1:{port}"
    token = "bench-token"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "codedgd.client",
            "coordinator",
            "--listen",
            target,
            "--token",
            token,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise SystemExit("the coordinator did not start") from None
                time.sleep(0.2)
        time.sleep(1.0)
        under_limit = MAX_MESSAGE_BYTES - (1 << 16)
        rows = [
            ("unauthenticated", None, int(args.mib * (1 << 20))),
            ("authenticated", token, under_limit),
        ]
        print(
            f"coordinator pid {proc.pid}: {args.waves} waves x {args.calls} concurrent calls; "
            f"receive limit {MAX_MESSAGE_BYTES / (1 << 20):.0f} MiB"
        )
        print(
            f"{'caller':<16} {'body MiB':>9} {'RSS before':>11} {'peak growth':>12} "
            f"{'wall s':>7}  answers"
        )
        for name, tok, size in rows:
            _reset_peak(proc.pid)
            before = _kib(proc.pid, "VmRSS")
            start = time.perf_counter()
            codes = asyncio.run(_flood(target, tok, args.calls, args.waves, size))
            wall = time.perf_counter() - start
            peak = _kib(proc.pid, "VmHWM")
            print(
                f"{name:<16} {size / (1 << 20):>9.1f} {before / 1024:>8.0f} MiB "
                f"{(peak - before) / 1024:>8.1f} MiB {wall:>7.2f}  {codes}"
            )
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
