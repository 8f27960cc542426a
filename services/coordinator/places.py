"""A job's places: which connected worker session holds each index of the plan.

Index i of a plan (its partitions, its coefficients) is a *place*; the session that holds
it is the worker the round loop talks to as worker i. A place is *lost* when its holder
disconnects, fails or is thrown out; a newcomer may then *take* it (see
:mod:`.replacement`). A session the job lost, or one that failed to join, is *retired*:
it is never taken back, and what it still sends is never used.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

from codedgd.services.coordinator.sessions import WorkerSession
from codedgd.services.proto import codedgd_pb2 as pb


@dataclass
class Places:
    """The holders of a job's places and what is known about lost ones."""

    job_id: str
    holders: list[WorkerSession] = field(default_factory=list)
    lost: set[int] = field(default_factory=set)
    retired: set[int] = field(default_factory=set)  # ids of sessions this job lost
    # Names of workers thrown out for corrupt results (the norm guard, a coded vote):
    # never handed a place of this job again, also when they reconnect.
    banned: set[str] = field(default_factory=set)
    candidates: dict[int, WorkerSession] = field(default_factory=dict)  # index → joining
    acks: dict[int, asyncio.Future[str]] = field(default_factory=dict)  # index → error text
    vacant: set[int] = field(default_factory=set)  # lost places the running round wants
    vacancy: asyncio.Event = field(default_factory=asyncio.Event)  # set while any is lost

    def __len__(self) -> int:
        return len(self.holders)

    def __getitem__(self, index: int) -> WorkerSession:
        return self.holders[index]

    def holds(self, index: int, session: WorkerSession) -> bool:
        """Is ``session`` the holder of place ``index`` now?"""
        return 0 <= index < len(self.holders) and self.holders[index] is session

    def take_all(self, sessions: Sequence[WorkerSession]) -> None:
        """Give place i to ``sessions[i]`` (the job's start), each awaiting its ack."""
        self.holders = list(sessions)
        loop = asyncio.get_running_loop()
        for index, session in enumerate(self.holders):
            session.job_id = self.job_id
            session.index = index
            self.acks[index] = loop.create_future()

    def ack(self, session: WorkerSession, job_id: str, error: str) -> None:
        """An AssignmentAck: resolves the place's pending ack if ``session`` may give it."""
        index = session.index
        holder = self.holders[index] if 0 <= index < len(self.holders) else None
        joining = self.candidates.get(index)
        if session is not (joining if joining is not None else holder):
            return  # while a newcomer joins at the index, only its ack counts
        future = self.acks.get(index)
        if future is not None and not future.done() and job_id == self.job_id:
            future.set_result(error)

    def answer_ack(self, index: int, error: str) -> None:
        """Resolve place ``index``'s pending ack with an error (its session went away)."""
        future = self.acks.get(index)
        if future is not None and not future.done():
            future.set_result(error)

    def mark_lost(self, session: WorkerSession) -> bool:
        """Record that ``session`` is gone; True if it held a place not already lost.

        A newcomer lost before it acknowledged leaves its place vacant (its pending
        ack answers at once); a session that holds no place changes nothing.
        """
        index = session.index
        if self.candidates.get(index) is session:
            return False
        if index < 0 or index in self.lost or not self.holds(index, session):
            return False
        self.lost.add(index)
        self.retired.add(session.id)
        self.vacancy.set()
        return True

    def swap_in(self, index: int, session: WorkerSession) -> None:
        """Newcomer ``session`` acknowledged: it now holds lost place ``index``."""
        self.detach(self.holders[index], "lost")  # if still connected, it lets go
        self.holders[index] = session
        self.lost.discard(index)

    def detach(self, session: WorkerSession, reason: str) -> None:
        """Tell a worker this job is over for it (JobEnd) and free its session."""
        session.send(pb.CoordinatorMessage(job_end=pb.JobEnd(job_id=self.job_id, reason=reason)))
        session.job_id, session.index = None, -1

    def release(self, reason: str) -> None:
        """The job ended: every holder is freed with ``reason``."""
        for session in self.holders:
            self.detach(session, reason)

    def lost_labels(self) -> list[str]:
        return [self.holders[w].label for w in sorted(self.lost)]
