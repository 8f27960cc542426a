"""Worker-to-worker links: the Peer service a worker serves, and its links to its peers.

A worker of a ring or tree job pushes θ_t and partial sums to its peers over the
``codedgd.v1.Peer/Push`` stream (one long-lived call per peer and job), framed like every
other tensor (:mod:`codedgd.services.framing`: one copy out, none in). The receiving worker
serves ``Push`` on its ``--peer-listen`` address and tells the coordinator, in Hello, the
address its peers should dial (``--peer-address``).

No one outside the job pushes into it: every call carries the job's peer credential,
issued by the coordinator with the assignment, as ``authorization: Bearer`` metadata, and
the server refuses any other call (UNAUTHENTICATED) before reading a message. With TLS
(a worker given ``--tls-cert`` and ``--tls-key``) peers serve and dial over TLS, verified
with the same ``--tls-ca`` as the coordinator link, and require each other's
certificates (mutual TLS).

:class:`PeerLinks` is the interface the ring and tree code sends through;
:class:`GrpcPeerLinks` is the real one, :class:`LocalPeerLinks` an in-process one for
tests (the same frames, delivered on the event loop, with faults that can be injected).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import Any, Protocol

import grpc
from grpc import aio

from codedgd.services.errors import NotInJob, WireError
from codedgd.services.framing import Frame, frame_reader, to_wire
from codedgd.services.proto import codedgd_pb2 as pb
from codedgd.services.security import Security, refusal
from codedgd.services.wire import GRPC_OPTIONS, PEER_TENSOR_PATHS, SERVER_OPTIONS

log = logging.getLogger("codedgd.worker.peers")
PEER_SERVICE = "codedgd.v1.Peer"
PUSH_METHOD = f"/{PEER_SERVICE}/Push"

# θ and partial sums stay views of the received frame.
peer_frame = frame_reader(pb.PeerData, PEER_TENSOR_PATHS)

# What the ring and tree code is told about a frame from a peer.
Receive = Callable[[pb.PeerData, memoryview | None], None]
# A link to ``peer`` failed: (peer, the address it was dialled at or "" if none, reason).
OnFailure = Callable[[int, str, str], None]
# ``peer`` refused what this worker pushed (its own fault): (peer, reason).
OnRefused = Callable[[int, str], None]
# Status codes by which a peer refuses the pushes themselves, not the link: the sender
# sent what no peer of its job may send (a bad frame, sender, stage, step or shape).
REFUSALS = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED)
# gRPC can end a call the peer refused with INTERNAL ("Internal error from Core") when
# the refusal arrives while frames are still being sent: its status is lost, and the
# refused sender would report the peer's link as failed (and the coordinator release an
# honest peer). Such a failure is reported only if no clean answer from the same peer
# (a refusal on a later call) comes within this many seconds, and never after the same
# peer has refused this worker's pushes (the refusal is the fault, not the link).
AMBIGUOUS_GRACE_SECONDS = 3.0


class PeerLinks(Protocol):
    """Ordered, flow-controlled delivery of frames to a job's peers."""

    def send(self, peer: int, frames: Iterable[bytes]) -> None:
        """Queue frames for ``peer`` (sent in order, after those queued before)."""
        ...

    def update(self, addresses: Mapping[int, str]) -> None:
        """Peers now reached at new addresses (a replacement joined)."""
        ...

    async def close(self) -> None:
        """End every link (the job is over for this worker)."""
        ...


class GrpcPeerLinks:
    """One ``Push`` call per peer, opened on first use, over TLS when configured.

    A call that ends in error is a failed link (``on_failure``, naming the peer), unless
    the peer refused the pushes themselves (INVALID_ARGUMENT: malformed, or not what it
    expects from this worker): that is this worker's own fault (``on_refused``).
    """

    def __init__(
        self,
        addresses: Mapping[int, str],
        credential: str,
        security: Security,
        on_failure: OnFailure,
        on_refused: OnRefused | None = None,
    ) -> None:
        self.addresses = dict(addresses)
        self.credential = credential
        self.security = security
        self.on_failure = on_failure
        self.on_refused = on_refused
        self._queues: dict[int, asyncio.Queue[bytes | None]] = {}
        self._calls: dict[int, asyncio.Task[None]] = {}
        self._channels: dict[int, aio.Channel] = {}
        self._closing: set[asyncio.Future[None]] = set()  # channels of dropped links
        self._ambiguous: dict[int, asyncio.TimerHandle] = {}  # INTERNAL, not yet reported
        self._refused_by: set[int] = set()  # peers that refused this worker's pushes

    def send(self, peer: int, frames: Iterable[bytes]) -> None:
        queue = self._queues.get(peer)
        if queue is None:
            queue = self._open(peer)
        for frame in frames:
            queue.put_nowait(frame)

    def _open(self, peer: int) -> asyncio.Queue[bytes | None]:
        address = self.addresses.get(peer, "")
        queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._queues[peer] = queue
        if not address:
            self.on_failure(peer, "", "no address known for this peer")
            return queue
        channel = self.security.channel(address, options=GRPC_OPTIONS)
        self._channels[peer] = channel
        push = channel.stream_unary(
            PUSH_METHOD, request_serializer=to_wire, response_deserializer=pb.PeerAck.FromString
        )

        async def requests() -> AsyncIterator[bytes]:
            while (frame := await queue.get()) is not None:
                yield frame

        metadata = (("authorization", f"Bearer {self.credential}"),)
        self._calls[peer] = asyncio.create_task(
            self._run(peer, address, push(requests(), metadata=metadata))
        )
        return queue

    async def _run(self, peer: int, address: str, call: Any) -> None:
        try:
            await call
        except asyncio.CancelledError:
            call.cancel()
            raise
        except grpc.aio.AioRpcError as exc:
            self._drop(peer)
            if exc.code() in REFUSALS and self.on_refused is not None:
                self._refused_by.add(peer)
                held = self._ambiguous.pop(peer, None)
                if held is not None:
                    held.cancel()  # the garbled end was this refusal: not a failed link
                reason = f"worker {peer} refused this worker's pushes: {exc.details()}"
                log.error("%s", reason)
                self.on_refused(peer, reason)
                return
            reason = (
                f"link to worker {peer} at {address} failed: {exc.code().name}: {exc.details()}"
            )
            log.warning("%s", reason)
            if exc.code() == grpc.StatusCode.INTERNAL and self.on_refused is not None:
                if peer in self._refused_by:
                    return  # it refused this worker's pushes already: that is the fault
                if peer not in self._ambiguous:
                    loop = asyncio.get_running_loop()
                    self._ambiguous[peer] = loop.call_later(
                        AMBIGUOUS_GRACE_SECONDS, self._failed_late, peer, address, reason
                    )
                return
            self.on_failure(peer, address, reason)

    def _failed_late(self, peer: int, address: str, reason: str) -> None:
        """An INTERNAL end that no clean refusal explained: the link failed after all."""
        if self._ambiguous.pop(peer, None) is not None:
            self.on_failure(peer, address, reason)

    def _drop(self, peer: int) -> None:
        self._queues.pop(peer, None)
        self._calls.pop(peer, None)
        channel = self._channels.pop(peer, None)
        if channel is not None:
            closing = asyncio.ensure_future(channel.close(grace=None))
            self._closing.add(closing)
            closing.add_done_callback(self._closing.discard)

    def update(self, addresses: Mapping[int, str]) -> None:
        for peer, address in addresses.items():
            if self.addresses.get(peer) == address:
                continue
            self.addresses[peer] = address
            held = self._ambiguous.pop(peer, None)
            if held is not None:
                held.cancel()  # a doubt about the former holder's link: moot now
            self._refused_by.discard(peer)
            task = self._calls.get(peer)
            if task is not None:
                task.cancel()
            self._drop(peer)

    async def close(self) -> None:
        for held in self._ambiguous.values():
            held.cancel()
        self._ambiguous.clear()
        for queue in self._queues.values():
            queue.put_nowait(None)
        tasks = list(self._calls.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        for channel in self._channels.values():
            await channel.close(grace=None)
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
        self._closing.clear()
        self._queues.clear()
        self._calls.clear()
        self._channels.clear()


class LocalPeerLinks:
    """In-process links for tests: frames are parsed as a server would and delivered to
    the receiving worker's callback on the event loop. ``broken`` peers fail on send; a
    frame the receiver refuses (WireError) ends the link as the server would, and the
    sender hears it (``on_refused``)."""

    def __init__(
        self,
        me: int,
        network: dict[int, Receive],
        on_failure: OnFailure,
        on_refused: OnRefused | None = None,
    ) -> None:
        self.me = me
        self.network = network
        self.on_failure = on_failure
        self.on_refused = on_refused
        self.broken: set[int] = set()
        self.refused: list[tuple[int, str]] = []  # (peer, why) of every refused frame
        self.sent: list[tuple[int, pb.PeerData]] = []  # (to, message) of every frame, in order

    def send(self, peer: int, frames: Iterable[bytes]) -> None:
        loop = asyncio.get_running_loop()
        for raw in frames:
            if peer in self.broken or peer not in self.network:
                loop.call_soon(self.on_failure, peer, "", f"link to worker {peer} failed: injected")
                return
            frame = peer_frame(raw)
            if isinstance(frame, WireError):
                raise frame
            self.sent.append((peer, frame.message))
            loop.call_soon(self._deliver, peer, frame.message, frame.data)

    def _deliver(self, peer: int, message: pb.PeerData, data: memoryview | None) -> None:
        try:
            self.network[peer](message, data)
        except WireError as exc:
            self.refused.append((peer, str(exc)))
            if self.on_refused is not None:
                self.on_refused(peer, f"worker {peer} refused this worker's pushes: {exc}")

    def update(self, addresses: Mapping[int, str]) -> None:
        pass

    async def close(self) -> None:
        pass


class PeerServer:
    """The Peer service of one worker process: it hands each frame to ``receive``.

    ``credentials()`` gives the credentials accepted now (the running job's, or none);
    a call with another is refused before any message is read.
    """

    def __init__(
        self,
        receive: Receive,
        credentials: Callable[[], Iterable[str]],
        security: Security,
    ) -> None:
        self.receive = receive
        self.credentials = credentials
        self.security = security
        self.server: aio.Server | None = None
        self.port = 0
        self.refused = 0  # calls refused for a missing or wrong credential
        self.rejected = 0  # calls ended for a malformed frame

    async def start(self, listen: str) -> int:
        """Bind ``listen`` (TLS when the worker has a certificate); the bound port."""
        server = aio.server(
            options=list(SERVER_OPTIONS), interceptors=[CredentialInterceptor(self)]
        )
        server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    PEER_SERVICE,
                    {
                        "Push": grpc.stream_unary_rpc_method_handler(
                            self._push,
                            request_deserializer=peer_frame,
                            response_serializer=to_wire,
                        )
                    },
                ),
            )
        )
        self.port = self.security.add_port(server, listen)
        await server.start()
        self.server = server
        return self.port

    async def _push(
        self, requests: AsyncIterator[Frame[pb.PeerData] | WireError], context: aio.ServicerContext
    ) -> pb.PeerAck:
        received = 0
        async for frame in requests:
            if isinstance(frame, WireError):
                self.rejected += 1
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(frame))
                raise AssertionError("unreachable")  # pragma: no cover - abort raises
            try:
                self.receive(frame.message, frame.data)
            except NotInJob as exc:  # it left the job (released, or a new one): not a fault
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
            except WireError as exc:
                self.rejected += 1
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            received += 1
        return pb.PeerAck(received=received)

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(grace=None)
            self.server = None


class CredentialInterceptor(aio.ServerInterceptor):  # type: ignore[misc]
    """Refuses a Push without a credential of a job this worker is in (constant time),
    before the call's first message is read."""

    def __init__(self, server: PeerServer) -> None:
        self.server = server

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        given = dict(details.invocation_metadata or ()).get("authorization", "")
        given_bytes = given.encode() if isinstance(given, str) else b""
        ok = False
        for credential in self.server.credentials():
            ok |= hmac.compare_digest(given_bytes, f"Bearer {credential}".encode())
        if ok:
            return await continuation(details)
        self.server.refused += 1
        return refusal(
            grpc.StatusCode.UNAUTHENTICATED,
            "missing or wrong peer credential: only workers of this worker's job may push",
        )
