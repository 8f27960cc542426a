"""The baseline of bench_transport.py: a minimal grpc.aio program moving the same bytes.

A server with one bidirectional bytes stream per worker (no protobuf, no
checks): each round it writes θ (ℓ float64, in chunks of the same size codedgd
uses) to every worker, each worker answers with ℓ float64 in the same chunks,
and the server waits for all n answers. Same message limits as codedgd.

    python bench/raw_grpc.py worker --port P --dim L   (a worker process)
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import AsyncIterator

import grpc
from grpc import aio

from codedgd.services.allocator import keep_freed_memory
from codedgd.services.wire import DEFAULT_CHUNK_BYTES, GRPC_OPTIONS, SERVER_OPTIONS

METHOD = "/raw.Bench/Connect"


def _chunks(nbytes: int, chunk: int = DEFAULT_CHUNK_BYTES) -> list[int]:
    sizes = [chunk] * (nbytes // chunk)
    if nbytes % chunk or not sizes:
        sizes.append(nbytes % chunk)
    return sizes


class RawServer:
    def __init__(self, n: int, dim: int) -> None:
        self.n = n
        self.nbytes = dim * 8
        self.outboxes: list[asyncio.Queue[bytes | None]] = []
        self.inbox: asyncio.Queue[int] = asyncio.Queue()
        self.ready = asyncio.Event()

    async def connect(
        self, requests: AsyncIterator[bytes], context: aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        box: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.outboxes.append(box)
        if len(self.outboxes) == self.n:
            self.ready.set()
        expected = len(_chunks(self.nbytes))

        async def read() -> None:
            got = 0
            async for _ in requests:
                got += 1
                if got == expected:
                    got = 0
                    self.inbox.put_nowait(1)

        reader = asyncio.create_task(read())
        try:
            while (item := await box.get()) is not None:
                yield item
        finally:
            reader.cancel()

    def close(self) -> None:
        """End every worker's stream (the workers then exit)."""
        for box in self.outboxes:
            box.put_nowait(None)

    async def round(self) -> None:
        payload = [b"\x00" * size for size in _chunks(self.nbytes)]  # one "serialization"
        for box in self.outboxes:
            for part in payload:
                box.put_nowait(part)
        for _ in range(self.n):
            await self.inbox.get()


async def serve(n: int, dim: int) -> tuple[aio.Server, RawServer, int]:
    raw = RawServer(n, dim)
    server = aio.server(options=list(SERVER_OPTIONS))
    handler = grpc.method_handlers_generic_handler(
        "raw.Bench", {"Connect": grpc.stream_stream_rpc_method_handler(raw.connect)}
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, raw, port


async def worker(port: int, dim: int) -> None:
    nbytes = dim * 8
    sizes = _chunks(nbytes)
    replies: asyncio.Queue[bytes | None] = asyncio.Queue()

    async def requests() -> AsyncIterator[bytes]:
        while True:
            item = await replies.get()
            if item is None:
                return
            yield item

    async with aio.insecure_channel(f"127.0.0.1:{port}", options=list(GRPC_OPTIONS)) as ch:
        call = ch.stream_stream(METHOD)(requests())
        got = 0
        async for _ in call:
            got += 1
            if got == len(sizes):
                got = 0
                for size in sizes:
                    replies.put_nowait(b"\x01" * size)


async def timed_rounds(raw: RawServer, rounds: int) -> float:
    """Seconds per round over ``rounds`` rounds (warm up first)."""
    start = time.perf_counter()
    for _ in range(rounds):
        await raw.round()
    return (time.perf_counter() - start) / rounds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("role", choices=["worker"])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--dim", type=int, required=True)
    a = p.parse_args()
    keep_freed_memory()  # as codedgd's processes do (unless CODEDGD_MALLOC_TUNING=0)
    asyncio.run(worker(a.port, a.dim))


if __name__ == "__main__":
    main()
