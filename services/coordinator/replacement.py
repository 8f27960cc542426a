"""Newcomers take the places of lost workers while a job runs.

A :class:`Replacer` runs beside the rounds. Each idle worker that connects takes a lost
place no other newcomer is joining at yet (one the running round waits for first, else
the lowest), so several places fill at once and a newcomer that never acknowledges holds
up only its own. The newcomer gets the lost worker's assignment and data; once it
acknowledges, it holds that place and the round loop hears of it (:class:`Replaced`). A
worker this job already lost (or one that failed to join) is never taken back.
"""

from __future__ import annotations

import asyncio
import logging

from codedgd.services.coordinator.assignment import Assigner
from codedgd.services.coordinator.inbox import Inbox, Replaced
from codedgd.services.coordinator.metrics import CoordinatorMetrics
from codedgd.services.coordinator.places import Places
from codedgd.services.coordinator.sessions import Sessions, WorkerSession
from codedgd.services.proto import codedgd_pb2 as pb

log = logging.getLogger("codedgd.coordinator")

# How long a job's end waits for its replacer task to let go of a joining newcomer
# (it only has to send JobEnd; the bound keeps a bug there from hanging the job).
REPLACER_EXIT_SECONDS = 5.0


class Replacer:
    """Fills one job's lost places with workers that connect during the job."""

    def __init__(
        self,
        sessions: Sessions,
        places: Places,
        inbox: Inbox,
        assigner: Assigner,
        metrics: CoordinatorMetrics,
    ) -> None:
        self.sessions = sessions
        self.places = places
        self.inbox = inbox
        self.assigner = assigner
        self.metrics = metrics

    async def run(self) -> None:
        """Give each lost place to a worker that connects, until cancelled."""
        places = self.places
        job_json = self.assigner.config.to_json()
        joining: set[asyncio.Task[None]] = set()
        try:
            while True:
                await places.vacancy.wait()
                if not places.lost - places.candidates.keys():
                    places.vacancy.clear()  # set again by a loss or a failed newcomer
                    continue
                session = await self.sessions.next_idle(
                    lambda s: (
                        s.id not in places.retired
                        and s.name not in places.banned
                        and self.assigner.can_take(s)
                    )
                )
                open_places = places.lost - places.candidates.keys()
                if not open_places:
                    continue
                index = next_place(places, open_places)
                session.job_id, session.index = places.job_id, index  # no longer idle
                places.candidates[index] = session
                # With the candidate, so a loss can answer it before the task first runs.
                places.acks[index] = asyncio.get_running_loop().create_future()
                task = asyncio.create_task(self._take_place(index, session, job_json))
                task.add_done_callback(log_crash)
                joining.add(task)
                task.add_done_callback(joining.discard)
        finally:
            for task in joining:
                task.cancel()
            if joining:
                await asyncio.wait(joining)
            for session in list(places.candidates.values()):  # a task cancelled unstarted
                places.detach(session, "not needed")
            places.candidates.clear()

    async def _take_place(self, index: int, session: WorkerSession, job_json: str) -> None:
        """Assign lost place ``index``'s part to newcomer ``session``; on its ack, swap it in."""
        places = self.places
        try:
            while True:
                plan = self.assigner.prepared.plan
                await self.assigner.send(index, session, job_json, replacement=True)
                error = await self.assigner.acknowledged(places.acks[index])
                if error or self.assigner.prepared.plan is plan:
                    break
                # The policy moved to a new plan while it joined (auto's re-assignment
                # skips vacant places): assign it the new one before it takes the place.
                places.acks[index] = asyncio.get_running_loop().create_future()
        except BaseException:  # the job ended (or a bug) while the newcomer joined
            places.detach(session, "not needed")
            raise
        finally:
            places.candidates.pop(index, None)
        if error or session.closed:
            log.warning(
                "job %s: %s cannot take the place of worker %d: %s",
                places.job_id,
                session.label,
                index,
                error or "disconnected",
            )
            places.retired.add(session.id)
            places.detach(session, "not taken")
            places.vacancy.set()  # the place is open again
            return
        places.swap_in(index, session)
        self.inbox.forget(index)  # nothing of the old holder's carries over
        if self.assigner.topology != "star":  # its peers reach it at its address from now
            update = pb.CoordinatorMessage(
                peers=pb.PeerUpdate(
                    job_id=places.job_id,
                    peers=[pb.PeerAddress(index=index, address=session.peer_address)],
                )
            )
            for holder in places.holders:
                if holder is not session:
                    holder.send(update)
        self.metrics.replacements.inc()
        log.info("job %s: %s took the place of lost worker %d", places.job_id, session.label, index)
        self.inbox.put(Replaced(index, session))


def next_place(places: Places, open_places: set[int]) -> int:
    """The place a newcomer takes: one the running round waits for, else the lowest."""
    return min(open_places & places.vacant or open_places)


async def stop_replacer(replacer: asyncio.Task[None]) -> bool:
    """Cancel the replacer and let it release newcomers caught joining (JobEnd).

    Awaited, so that happens before the job's end is published, not by chance of the
    loop's order after it. A cancel of the job landing meanwhile does not cut that
    short; it is reported (True) so a job that was ending well ends cancelled, as the
    client was told, while one already failing keeps its error.
    """
    replacer.cancel()
    try:
        await asyncio.wait([replacer], timeout=REPLACER_EXIT_SECONDS)
    except asyncio.CancelledError:
        await asyncio.wait([replacer], timeout=REPLACER_EXIT_SECONDS)
        return True
    return False


def log_crash(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("replacing lost workers stopped", exc_info=task.exception())
