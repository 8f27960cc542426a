"""The worker service's connection: dial the coordinator, keep the stream, dispatch.

A worker dials out (so it works behind NAT and in scaled containers) and keeps one
bidirectional stream: Hello, then for each job an Assignment with its data, then rounds.
This module keeps that stream (TLS and token from :class:`~codedgd.services.security.Security`,
heartbeats, one outgoing queue) and hands each message to the job's
:class:`~codedgd.services.worker.rounds.Rounds`, which takes the assignment
(:mod:`.assignment`) and computes the rounds.

The connection is retried with exponential backoff (capped at ``max_backoff``, with
jitter) until the process is stopped: a lost stream, a coordinator that shut down (it
may restart on its state directory) and a refusal for now (``Reject.retry``) all lead to
another try. Only a refusal that would repeat (wrong protocol, a forbidden name, a bad
token) ends the worker. With ``reconnect=False`` (``--no-reconnect``) the worker leaves
when its stream ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import random
import socket
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from codedgd.services.errors import CodedGDError, ConfigError, WireError
from codedgd.services.framing import frame_reader, to_wire
from codedgd.services.machine import this_machine
from codedgd.services.messages import check_peer_address, check_worker_name, machine_to_pb
from codedgd.services.proto import codedgd_pb2 as pb
from codedgd.services.security import Security
from codedgd.services.wire import (
    COORDINATOR_TENSOR_PATHS,
    DEFAULT_CHUNK_BYTES,
    GRPC_OPTIONS,
    check_chunk_bytes,
)
from codedgd.services.worker.corrupt import Corruption
from codedgd.services.worker.peer_faults import PeerFault
from codedgd.services.worker.peers import GrpcPeerLinks, OnFailure, OnRefused, PeerServer
from codedgd.services.worker.rounds import Rounds
from codedgd.services.worker.uploads import Outgoing as RoundOutgoing
from codedgd.services.worker.uploads import Upload, WorkerStats

log = logging.getLogger("codedgd.worker")
PROTOCOL = "codedgd.v1"
CONNECT_METHOD = "/codedgd.v1.Coordinator/Connect"
# Without reconnect: how often a stream that failed before any answer is tried.
FIRST_CONNECT_TRIES = 3


# θ and partition bytes stay views of the received frame (codedgd.services.framing).
_coordinator_frame = frame_reader(pb.CoordinatorMessage, COORDINATOR_TENSOR_PATHS)


class Rejected(CodedGDError):
    """The coordinator refused this worker; retrying would not help."""


class _RetryLater(Exception):
    """The coordinator closed this stream for now (Reject.retry, Shutdown)."""


class CoordinatorLost(CodedGDError):
    """The stream to the coordinator failed and reconnecting is off."""


@dataclass
class WorkerOptions:
    coordinator: str = "127.0.0.1:50051"
    name: str = field(default_factory=lambda: f"{socket.gethostname()[:48]}:{os.getpid()}")
    security: Security = field(default_factory=Security)
    data_dir: Path | None = None
    reconnect: bool = True
    initial_backoff: float = 0.2
    max_backoff: float = 10.0
    heartbeat_seconds: float = 5.0
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    # The Peer service for ring and tree jobs: where it listens (None: no peer service,
    # star jobs only) and the address peers should dial (None: derived, see peer_address).
    peer_listen: str | None = None
    peer_address: str | None = None
    peer_tls_server_name: str | None = None  # the name peers' certificates carry
    corrupt: Corruption | None = None  # a test instrument: lie in every star result
    peer_fault: PeerFault | None = None  # a test instrument: misbehave towards peers
    extra_delay: float = 0.0  # a test instrument: seconds more every round (a slow machine)

    def __post_init__(self) -> None:
        check_chunk_bytes(self.chunk_bytes)
        if (
            isinstance(self.extra_delay, bool)
            or not isinstance(self.extra_delay, int | float)
            or not 0 <= self.extra_delay < math.inf
        ):
            raise ConfigError(
                f"--extra-delay must be a finite number of seconds >= 0, got {self.extra_delay!r}"
            )
        for problem in (
            check_worker_name(self.name),
            check_peer_address(self.peer_address) if self.peer_address else None,
        ):
            if problem is not None:
                raise ConfigError(problem)

    def peer_security(self) -> tuple[Security, Security]:
        """(serving, dialing) security of peer links: TLS when this worker has a certificate
        (--tls-cert/--tls-key), verified with --tls-ca, mutual when a CA is given."""
        sec = self.security
        if sec.tls_cert is None or sec.tls_key is None:
            return Security(), Security()
        serving = Security(tls_cert=sec.tls_cert, tls_key=sec.tls_key, tls_ca=sec.tls_ca)
        dialing = Security(
            tls_cert=sec.tls_cert,
            tls_key=sec.tls_key,
            tls_ca=sec.tls_ca,
            tls_server_name=self.peer_tls_server_name,
        )
        return serving, dialing


Outgoing = RoundOutgoing | None


class WorkerAgent:
    """One worker process's connection to a coordinator."""

    def __init__(self, options: WorkerOptions) -> None:
        self.options = options
        self._stop = asyncio.Event()
        self._out: asyncio.Queue[Outgoing] = asyncio.Queue()
        self.stats = WorkerStats()
        self._peer_serving, self._peer_dialing = options.peer_security()
        self.rounds = Rounds(
            self._send,
            data_dir=options.data_dir,
            chunk_bytes=options.chunk_bytes,
            stats=self.stats,
            links=self._links if options.peer_listen is not None else None,
            corrupt=options.corrupt,
            peer_fault=options.peer_fault,
            extra_delay=options.extra_delay,
        )
        self.peer_server: PeerServer | None = None
        self.advertised = ""  # the peer address told to the coordinator
        self.connected = False
        self._heard = False  # this session has received a message
        self._ever_heard = False  # any session has
        self._restart_after: float | None = None  # set by a crash (straggler model "crash")
        self._heartbeat_seconds = options.heartbeat_seconds
        self._interval_changed = asyncio.Event()

    def _send(self, message: RoundOutgoing) -> None:
        """Queue a message on the current session's stream."""
        self._out.put_nowait(message)

    def _links(
        self,
        addresses: Mapping[int, str],
        credential: str,
        on_failure: OnFailure,
        on_refused: OnRefused,
    ) -> GrpcPeerLinks:
        return GrpcPeerLinks(addresses, credential, self._peer_dialing, on_failure, on_refused)

    async def start_peer_service(self) -> str:
        """Bind the Peer service (``--peer-listen``); the address peers are told to dial.

        A bind that fails (address in use, not this host's) is a ConfigError now, before
        the worker connects.
        """
        listen = self.options.peer_listen
        if listen is None or self.peer_server is not None:
            return self.advertised
        server = PeerServer(self.rounds.peer_data, self.rounds.credentials, self._peer_serving)
        port = await server.start(listen)
        self.peer_server = server
        self.advertised = self.options.peer_address or advertised_address(
            listen, port, self.options.coordinator
        )
        log.info("peer service on %s (peers dial %s)", listen, self.advertised)
        return self.advertised

    def stop(self) -> None:
        """Ask the worker to leave (SIGTERM handler): ends the stream and returns from run()."""
        self._stop.set()
        self._out.put_nowait(None)

    async def run(self) -> None:
        """Connect and serve until Shutdown, stop(), or (without reconnect) a disconnect.

        A crash of the job's straggler model ``crash`` drops the connection; the worker
        connects again after the model's restart seconds (even without reconnect), or
        returns if the model says it never comes back. Without reconnect, a stream that
        fails before the coordinator said anything is tried again a few times: under
        load gRPC can end a refused stream with INTERNAL before its UNAUTHENTICATED
        status arrives, and the next try gets the real answer.
        """
        await self.start_peer_service()
        try:
            await self._connect()
        finally:
            if self.peer_server is not None:
                await self.peer_server.stop()
                self.peer_server = None

    async def _connect(self) -> None:
        backoff = self.options.initial_backoff
        first_tries = FIRST_CONNECT_TRIES
        while not self._stop.is_set():
            started = time.monotonic()
            self._heard = False
            try:
                await self._session()
            except Rejected:
                raise
            except _RetryLater as exc:
                if not self.options.reconnect:
                    raise Rejected(str(exc)) from None
                log.info("%s: reconnecting to %s", exc, self.options.coordinator)
            except grpc.aio.AioRpcError as exc:
                if exc.code() in (
                    grpc.StatusCode.UNAUTHENTICATED,
                    grpc.StatusCode.PERMISSION_DENIED,  # an operator's token
                ):
                    raise Rejected(exc.details() or "unauthenticated") from None
                if self._restart_after is None:
                    if not self.options.reconnect:
                        if self._stop.is_set():
                            return
                        first_tries -= 1
                        if not self._heard and first_tries > 0:
                            log.info(
                                "stream to %s failed before any answer (%s); trying again",
                                self.options.coordinator,
                                exc.code().name,
                            )
                            await asyncio.sleep(backoff * (0.5 + random.random()))
                            continue
                        if not self._ever_heard:
                            raise CoordinatorLost(
                                f"could not reach the coordinator at {self.options.coordinator}"
                                f" ({exc.code().name}: {exc.details()}): is it running there, "
                                "and do --tls-ca and the token match how it serves?"
                            ) from None
                        raise CoordinatorLost(
                            f"lost the coordinator at {self.options.coordinator} "
                            f"({exc.code().name}: {exc.details()})"
                        ) from None
                    log.info(
                        "coordinator %s unavailable (%s); retrying",
                        self.options.coordinator,
                        exc.code().name,
                    )
            else:
                if self._restart_after is None and (
                    not self.options.reconnect or self._stop.is_set()
                ):
                    return
            if self._restart_after is not None:
                if not await self._restart():
                    return
                backoff = self.options.initial_backoff
                continue
            if time.monotonic() - started > 5.0:
                backoff = self.options.initial_backoff  # it had been up: start over
            delay = backoff * (0.5 + random.random())
            backoff = min(backoff * 2, self.options.max_backoff)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stop.wait(), timeout=delay)

    async def _restart(self) -> bool:
        """After a crash: wait the model's restart seconds; False if it never comes back."""
        restart, self._restart_after = self._restart_after, None
        assert restart is not None
        if math.isinf(restart) or self._stop.is_set():
            return False
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._stop.wait(), timeout=restart)
        return not self._stop.is_set()

    async def _session(self) -> None:
        self._out = asyncio.Queue()
        self._out.put_nowait(
            pb.WorkerMessage(
                hello=pb.Hello(
                    name=self.options.name,
                    protocol=PROTOCOL,
                    has_data_dir=self.options.data_dir is not None,
                    peer_address=self.advertised,
                    machine=machine_to_pb(this_machine()),
                )
            )
        )
        channel = self.options.security.channel(self.options.coordinator, options=GRPC_OPTIONS)
        heartbeat = asyncio.create_task(self._heartbeat())
        try:
            connect = channel.stream_stream(
                CONNECT_METHOD,
                request_serializer=to_wire,
                response_deserializer=_coordinator_frame,
            )
            call = connect(self._requests(), metadata=self.options.security.metadata())
            async for frame in call:
                if isinstance(frame, WireError):
                    log.error("dropping the connection: the coordinator sent %s", frame)
                    break
                self.connected = self._heard = self._ever_heard = True
                if not await self._handle(frame.message, frame.data):
                    break
        finally:
            self.connected = False
            heartbeat.cancel()
            self.rounds.drop_job()
            await channel.close(grace=None)

    async def _requests(self) -> AsyncIterator[pb.WorkerMessage | bytes]:
        while True:
            message = await self._out.get()
            if message is None:
                return
            if isinstance(message, Upload):
                for frame in message:  # framed one by one, as gRPC takes them
                    yield frame
            else:
                yield message

    async def _heartbeat(self) -> None:
        while True:
            try:  # the Welcome may ask for a shorter interval: start that one at once
                await asyncio.wait_for(self._interval_changed.wait(), self._heartbeat_seconds)
                self._interval_changed.clear()
                continue
            except TimeoutError:
                pass
            beat = pb.Heartbeat(unix_time=time.time())
            progress = self.rounds.progress()
            if progress is not None:
                beat.job_id, beat.round, beat.attempt = progress
            self._out.put_nowait(pb.WorkerMessage(heartbeat=beat))

    # ------------------------------------------------------------ messages

    async def _handle(self, message: pb.CoordinatorMessage, data: memoryview | None) -> bool:
        """React to one message; ``data`` is its tensor chunk's bytes (services/framing.py)."""
        kind = message.WhichOneof("kind")
        if kind == "welcome":
            welcome = message.welcome
            log.info("connected to %s as %s", self.options.coordinator, welcome.worker_name)
            asked = welcome.heartbeat_seconds
            if asked > 0 and math.isfinite(asked):  # as often as the coordinator asks
                self._heartbeat_seconds = min(self.options.heartbeat_seconds, max(asked, 0.05))
                self._interval_changed.set()
        elif kind == "reject":
            if message.reject.retry:
                raise _RetryLater(f"refused for now: {message.reject.reason}")
            raise Rejected(message.reject.reason)
        elif kind == "assignment":
            self.rounds.start_job(message.assignment)
        elif kind == "data":
            self.rounds.add_data(message.data, data)
        elif kind == "assignment_end":
            await self.rounds.finish_assignment(message.assignment_end.job_id)
        elif kind == "round":
            restart = self.rounds.crash_restart(message.round)
            if restart is not None:
                self._restart_after = restart
                return False  # the connection drops with everything this worker held
            self.rounds.round_chunk(message.round, data)
        elif kind == "peers":
            self.rounds.update_peers(message.peers)
        elif kind == "cancel":
            self.rounds.cancel(message.cancel.job_id, message.cancel.round)
        elif kind == "job_end":
            self.rounds.end_job(message.job_end.job_id)
        elif kind == "shutdown":
            shutdown = message.shutdown
            if not self.options.reconnect:
                log.info("the coordinator shut down (%s): leaving", shutdown.reason)
                self._stop.set()
                self._out.put_nowait(None)
                return False
            raise _RetryLater(
                f"the coordinator shut down ({shutdown.reason})"
                + ("; it keeps its jobs and restarts" if shutdown.restarting else "")
            )
        return True


def advertised_address(listen: str, port: int, coordinator: str) -> str:
    """The address peers dial when --peer-address is not given: the --peer-listen host
    when it names one, else this host's address on the route to the coordinator (what a
    peer on the coordinator's network reaches), with the bound port."""
    from codedgd.services.address import parse_address

    host, _ = parse_address(listen, "--peer-listen")
    if host not in ("", "0.0.0.0", "::"):
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        target, target_port = parse_address(coordinator, "--coordinator")
        family = socket.AF_INET6 if ":" in target else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((target, target_port))  # a route lookup: no packet is sent
            own = str(probe.getsockname()[0])
    except (OSError, CodedGDError):
        own = "127.0.0.1"
    return f"[{own}]:{port}" if ":" in own else f"{own}:{port}"
