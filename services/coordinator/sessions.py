"""Connected workers: one session per open Connect stream.

A session owns an outbox the stream's writer drains. Messages are either
protobuf objects or bytes already serialized (θ is serialized once per round
and the same bytes are queued for every worker).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from codedgd.services.machine import Machine
from codedgd.services.proto import codedgd_pb2 as pb

Outgoing = pb.CoordinatorMessage | bytes

log = logging.getLogger("codedgd.coordinator")


@dataclass(eq=False)
class WorkerSession:
    """One connected worker."""

    id: int
    name: str
    peer: str
    has_data_dir: bool
    peer_address: str = ""  # where its Peer service listens ("": it serves none)
    machine: Machine = field(default_factory=Machine)  # as its Hello said (unknown: "")
    outbox: asyncio.Queue[Outgoing | None] = field(default_factory=asyncio.Queue)
    connected_at: float = field(default_factory=time.time)
    last_seen: float = field(default_factory=time.monotonic)
    job_id: str | None = None  # the job this worker belongs to, if any
    index: int = -1  # its place in that job's plan
    closed: bool = False
    # Its last heartbeat's progress in a ring or tree job: (job, round, attempt) whose θ
    # it began to receive, and when that heartbeat came (event-loop time).
    progress: tuple[str, int, int] | None = None
    progress_at: float = -math.inf

    def send(self, message: Outgoing) -> None:
        if not self.closed:
            self.outbox.put_nowait(message)

    def close(self) -> None:
        """End the stream after what is queued."""
        if not self.closed:
            self.closed = True
            self.outbox.put_nowait(None)

    @property
    def label(self) -> str:
        return f"worker {self.index} ({self.name})" if self.index >= 0 else f"worker {self.name}"


class Sessions:
    """The registry of connected workers, with a condition to wait for arrivals."""

    def __init__(self, on_change: Callable[[int], None] | None = None) -> None:
        self._sessions: dict[int, WorkerSession] = {}
        self._ids = itertools.count(1)
        self._changed = asyncio.Condition()
        self._on_change = on_change

    def new(
        self,
        name: str,
        peer: str,
        has_data_dir: bool,
        peer_address: str = "",
        machine: Machine | None = None,
    ) -> WorkerSession:
        """Register a worker; a name already connected gets its session id appended."""
        session_id = next(self._ids)
        if any(s.name == name for s in self._sessions.values()):
            log.warning(
                "a worker named %r is already connected; calling the one from %s %r",
                name,
                peer,
                f"{name}#{session_id}",
            )
            name = f"{name}#{session_id}"
        s = WorkerSession(session_id, name, peer, has_data_dir, peer_address, machine or Machine())
        self._sessions[s.id] = s
        self._notify()
        return s

    def remove(self, session: WorkerSession) -> None:
        self._sessions.pop(session.id, None)
        self._notify()

    def all(self) -> list[WorkerSession]:
        return list(self._sessions.values())

    def idle(self) -> list[WorkerSession]:
        return [s for s in self._sessions.values() if s.job_id is None and not s.closed]

    def __len__(self) -> int:
        return len(self._sessions)

    def _notify(self) -> None:
        if self._on_change is not None:
            self._on_change(len(self._sessions))
        asyncio.get_running_loop().create_task(self._wake())

    async def _wake(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def wait_idle(
        self, n: int, timeout: float, on_count: Callable[[int], None] | None = None
    ) -> list[WorkerSession]:
        """Wait until n idle workers are connected; return the n that came first.

        ``on_count`` hears the number of idle workers now and after every arrival or
        departure while this waits (the same number may come more than once)."""

        def enough() -> bool:
            idle = len(self.idle())
            if on_count is not None:
                on_count(idle)
            return idle >= n

        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(enough), timeout=timeout)
        return sorted(self.idle(), key=lambda s: s.id)[:n]

    async def next_idle(self, accept: Callable[[WorkerSession], bool]) -> WorkerSession:
        """Wait for an idle worker that ``accept`` takes; return the first to have connected."""

        def ready() -> list[WorkerSession]:
            return sorted((s for s in self.idle() if accept(s)), key=lambda s: s.id)

        async with self._changed:
            await self._changed.wait_for(lambda: bool(ready()))
        return ready()[0]


def reject(reason: str, *, retry: bool) -> pb.CoordinatorMessage:
    """A Reject: ``retry`` says whether trying again later may succeed (see the .proto)."""
    return pb.CoordinatorMessage(reject=pb.Reject(reason=reason, retry=retry))
