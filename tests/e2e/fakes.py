"""A hand-written worker client that can misbehave on purpose (bad shapes, old rounds)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence

import numpy as np
from grpc import aio

from codedgd.services.proto import codedgd_pb2 as pb
from codedgd.services.wire import DEFAULT_CHUNK_BYTES, Assembler, tensor_chunks

# Given the round number and θ, return the Result messages to send (or none); bytes
# are sent as they are, as a frame that need not be protobuf at all.
Behaviour = Callable[[int, np.ndarray, pb.Assignment], Sequence[pb.Result | bytes]]


class FakeWorker:
    def __init__(
        self,
        port: int,
        behaviour: Behaviour,
        name: str = "fake",
        metadata: tuple[tuple[str, str], ...] = (),
        acks: bool = True,
        peer_address: str = "",
        machine: pb.Machine | None = None,
    ) -> None:
        self.port = port
        self.machine = machine
        self.acks = acks  # False: take assignments but never acknowledge them
        self.behaviour = behaviour
        self.name = name
        self.peer_address = peer_address
        self.metadata = metadata
        self.out: asyncio.Queue[pb.WorkerMessage | bytes | None] = asyncio.Queue()
        self.received: list[pb.CoordinatorMessage] = []
        self.rejected: str | None = None
        self.assignment: pb.Assignment | None = None
        self.task: asyncio.Task[None] | None = None
        self.error: BaseException | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        self.out.put_nowait(None)
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)

    async def _requests(self) -> AsyncIterator[pb.WorkerMessage | bytes]:
        hello = pb.Hello(
            name=self.name,
            protocol="codedgd.v1",
            peer_address=self.peer_address,
            machine=self.machine,
        )
        yield pb.WorkerMessage(hello=hello)
        while True:
            m = await self.out.get()
            if m is None:
                return
            yield m

    async def _run(self) -> None:
        theta: Assembler | None = None
        rnd = -1
        async with aio.insecure_channel(f"127.0.0.1:{self.port}") as ch:
            connect = ch.stream_stream(
                "/codedgd.v1.Coordinator/Connect",
                request_serializer=_serialize,
                response_deserializer=pb.CoordinatorMessage.FromString,  # plain protobuf
            )
            try:
                async for msg in connect(self._requests(), metadata=self.metadata):
                    self.received.append(msg)
                    kind = msg.WhichOneof("kind")
                    if kind == "reject":
                        self.rejected = msg.reject.reason
                        return
                    if kind == "assignment":
                        self.assignment = msg.assignment
                    elif kind == "assignment_end" and self.acks:
                        self.out.put_nowait(
                            pb.WorkerMessage(
                                ack=pb.AssignmentAck(job_id=msg.assignment_end.job_id, ok=True)
                            )
                        )
                    elif kind == "round":
                        if msg.round.theta.index == 0:
                            theta = Assembler("theta")
                            rnd = int(msg.round.round)
                        assert theta is not None
                        value = theta.add(msg.round.theta)
                        if value is not None and self.assignment is not None:
                            for r in self.behaviour(rnd, value, self.assignment):
                                self.out.put_nowait(
                                    r if isinstance(r, bytes) else pb.WorkerMessage(result=r)
                                )
            except aio.AioRpcError as exc:
                self.error = exc


def _serialize(message: pb.WorkerMessage | bytes) -> bytes:
    return message if isinstance(message, bytes) else message.SerializeToString()


def result(
    job_id: str, round_: int, vector: np.ndarray, chunk_bytes: int = DEFAULT_CHUNK_BYTES
) -> list[pb.Result]:
    return [
        pb.Result(job_id=job_id, round=round_, payload=c, compute_seconds=0.0)
        for c in tensor_chunks("gradient", vector, chunk_bytes)
    ]


async def wait_for(predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not predicate():
        if loop.time() > end:
            raise TimeoutError("condition not reached")
        await asyncio.sleep(0.02)
