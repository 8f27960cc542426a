"""Crashed workers that come back, and the lost places they take, on the virtual clock.

The coordinator's rule (:class:`codedgd.services.coordinator.replacement.Replacer` and
``next_place``): a worker that connects while places are lost takes one that no other
newcomer is joining at, one the running round waits for if any, else the lowest, and
holds it once its join (assignment, data, acknowledgement) is done. A newcomer that finds
no open place waits, and takes the next place that is lost. A place taken mid-job has a
holder that never crashes (``Assignment.replacement``). Spare workers (``job.spares``)
are newcomers connected from the start: each takes a place the moment it is lost.

All times are absolute virtual seconds since the job began.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class Newcomers:
    join_seconds: Sequence[float]  # per place: a newcomer's join there (its data's bytes)
    lost: set[int] = field(default_factory=set)  # places with no holder
    joining: dict[int, float] = field(default_factory=dict)  # place → its newcomer has joined
    waiting: list[float] = field(default_factory=list)  # heap: when unplaced newcomers connect
    replaced: set[int] = field(default_factory=set)  # places taken mid-job
    spares: int = 0  # idle workers connected from the start (time 0)

    def __post_init__(self) -> None:
        self.waiting.extend([0.0] * self.spares)
        heapq.heapify(self.waiting)

    def crash(self, place: int, at: float, restart: float) -> None:
        """The holder of ``place`` crashed at ``at``; it connects again ``restart`` later."""
        self.lost.add(place)
        if math.isfinite(restart):
            heapq.heappush(self.waiting, at + restart)

    def take(self, at: float, wanted: set[int]) -> list[int]:
        """Newcomers connected by ``at`` take open places; the places whose join starts now.

        ``wanted``: the lost places the running round waits for (taken first).
        """
        started: list[int] = []
        while self.waiting and self.waiting[0] <= at:
            open_places = self.lost - self.joining.keys()
            if not open_places:
                break  # it waits for the next place lost
            heapq.heappop(self.waiting)
            place = min(open_places & wanted or open_places)
            self.joining[place] = at + self.join_seconds[place]
            started.append(place)
        return started

    def restore(self, place: int) -> None:
        """The newcomer at ``place`` has joined: the place is held again."""
        del self.joining[place]
        self.lost.discard(place)
        self.replaced.add(place)

    def settle(self, now: float) -> list[int]:
        """Between rounds: the connections and joins up to ``now``, in time order.

        Returns the places held again (in the order their newcomers joined).
        """
        restored: list[int] = []
        while True:
            has_open = bool(self.lost - self.joining.keys())
            connect = self.waiting[0] if self.waiting and has_open else math.inf
            joined = min(self.joining.values(), default=math.inf)
            if min(connect, joined) > now:
                return restored
            if connect <= joined:
                self.take(connect, set())
            else:
                place = min(self.joining, key=lambda p: (self.joining[p], p))
                self.restore(place)
                restored.append(place)
