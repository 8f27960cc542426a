"""The data plane: how a round's θ reaches the workers and their results come back.

The round loop (:mod:`.rounds`) decides *whom* a round needs (the policy's
``begin_round``) and *when* it can decode (``offer``); a :class:`DataPlane` decides *how*
the bytes travel. The plan names its topology (``Plan.topology``), and
:func:`data_plane` builds the plane registered under that name, so a new topology is a
new class in :data:`DATA_PLANES`, not a branch in the round loop.

- :class:`StarPlane`: the coordinator sends θ_t to every contacted worker and each sends
  its result straight back (the parameter-server star).
- :class:`RingPlane`: the coordinator sends worker i segment i of θ_t; the workers
  all-gather it, reduce-scatter their messages among themselves, and each sends back the
  segment of the sum it holds (:mod:`codedgd.services.worker.ring`).
- :class:`TreePlane`: the coordinator sends θ_t to the level-1 workers, which pass it
  down; partial sums come back up the tree, and the coordinator hears level 1 only
  (:mod:`codedgd.services.worker.tree`).

A worker-to-worker plane cannot hand one newcomer θ_t mid-round (its peers have moved
on without it), so a round that waits for a replacement is started again, as a new
*attempt*, once the replacement has joined (:attr:`DataPlane.restarts`); messages of an
older attempt are dropped like those of an older round.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

import numpy as np

from codedgd.services.compute.ring import segments
from codedgd.services.coordinator.places import Places
from codedgd.services.errors import ConfigError
from codedgd.services.policies.base import Plan
from codedgd.services.proto import codedgd_pb2 as pb
from codedgd.services.wire import THETA_DATA, chunks, framed


class DataPlane(Protocol):
    """How one job's rounds move θ out and results in (one instance per job)."""

    name: str
    restarts: bool  # a replacement the round waits for restarts it (a new attempt)
    peered: bool  # workers wait for each other's data (and report silent peers)

    def send_theta(
        self,
        t: int,
        point: np.ndarray,
        params: Mapping[str, float],
        workers: Sequence[int],
        attempt: int = 0,
        deadline: float = 0.0,
    ) -> int:
        """Start round t: θ_t (with the policy's ``params``) to ``workers``; bytes sent.
        ``deadline``: how long workers wait for a peer before reporting it silent."""
        ...

    def send_theta_to(self, worker: int) -> int:
        """The running round's θ_t to ``worker``, which joined mid-round; bytes sent."""
        ...

    def reporters(self, workers: Sequence[int]) -> set[int]:
        """Of a round's ``workers``, those whose results reach the coordinator."""
        ...

    def computing(self, workers: Sequence[int], lost: set[int]) -> int:
        """How many workers compute a round whose θ_t goes to ``workers``: they, and in a
        tree every worker below them that θ_t reaches past the ``lost``."""
        ...

    def unreachable(self, lost: set[int]) -> set[int]:
        """The reporters whose results cannot come this round with ``lost`` gone."""
        ...

    def contributors(
        self, used: Sequence[int], below: Mapping[int, Sequence[int]]
    ) -> tuple[int, ...]:
        """Every worker whose message is in the decoded estimate: the reporters ``used``
        and the workers each reported below it (``Result.contributors``)."""
        ...

    def left_out_bounds(self, ready: Mapping[int, float], used: Sequence[int]) -> dict[int, float]:
        """Lower bounds on the own times of the workers the round left out, from the
        own times (``ready``: WorkerTiming) of those ``used`` (a tree's leaves only)."""
        ...

    def cancel(self, t: int, workers: Iterable[int]) -> None:
        """Tell ``workers`` their result for round t is no longer wanted."""
        ...

    def peers(self, worker: int) -> set[int]:
        """The workers ``worker`` exchanges messages with (whose failure it may report)."""
        ...

    def left_out(self, worker: int, used: set[int]) -> str:
        """Why ``worker``, not a reporter, is not among the ``used`` (in words)."""
        ...

    def theta_source(self, worker: int) -> int:
        """Who passes θ_t to ``worker``: a worker's index, or −1 for the coordinator."""
        ...


class StarPlane:
    """Coordinator ↔ each worker: θ_t out to every contacted worker, each result back.

    θ_t is serialized once per round into ``RoundStart`` frames (the policy's parameters
    in the first); the same bytes are queued to every contacted worker's stream, and kept
    for a newcomer that joins mid-round.
    """

    name = "star"
    restarts = False
    peered = False

    def __init__(self, job_id: str, places: Places, chunk_bytes: int, plan: Plan) -> None:
        self.job_id = job_id
        self.places = places
        self.chunk_bytes = chunk_bytes
        self._frames: list[bytes] = []
        self._frame_bytes = 0

    def peers(self, worker: int) -> set[int]:
        return set()  # workers of a star talk to the coordinator only

    def left_out(self, worker: int, used: set[int]) -> str:
        return "not asked to compute this round"  # every worker of a star is a reporter

    def theta_source(self, worker: int) -> int:
        return -1

    def send_theta(
        self,
        t: int,
        point: np.ndarray,
        params: Mapping[str, float],
        workers: Sequence[int],
        attempt: int = 0,
        deadline: float = 0.0,
    ) -> int:
        frames = theta_frames(self.job_id, t, point, params, self.chunk_bytes, attempt=attempt)
        self._frames = frames
        self._frame_bytes = sum(len(f) for f in frames)
        for w in workers:
            session = self.places[w]
            for frame in frames:
                session.send(frame)
        return self._frame_bytes * len(workers)

    def send_theta_to(self, worker: int) -> int:
        session = self.places[worker]
        for frame in self._frames:
            session.send(frame)
        return self._frame_bytes

    def reporters(self, workers: Sequence[int]) -> set[int]:
        return set(workers)

    def computing(self, workers: Sequence[int], lost: set[int]) -> int:
        return len(workers)

    def unreachable(self, lost: set[int]) -> set[int]:
        return set(lost)

    def contributors(
        self, used: Sequence[int], below: Mapping[int, Sequence[int]]
    ) -> tuple[int, ...]:
        return tuple(sorted(used))

    def left_out_bounds(self, ready: Mapping[int, float], used: Sequence[int]) -> dict[int, float]:
        return {}  # no one is left out by another worker: the star's arrivals time everyone

    def cancel(self, t: int, workers: Iterable[int]) -> None:
        cancel_frames(self.places, self.job_id, t, workers)


class RingPlane:
    """Segments of θ_t out, one per worker; the segment of the sum each holds back."""

    name = "ring"
    restarts = True
    peered = True

    def __init__(self, job_id: str, places: Places, chunk_bytes: int, plan: Plan) -> None:
        self.job_id = job_id
        self.places = places
        self.chunk_bytes = chunk_bytes
        self.n = plan.n_workers

    def peers(self, worker: int) -> set[int]:
        return {(worker - 1) % self.n, (worker + 1) % self.n} - {worker}

    def left_out(self, worker: int, used: set[int]) -> str:
        return "not asked to compute this round"  # every member of a ring is a reporter

    def theta_source(self, worker: int) -> int:
        return -1  # every member gets its segment of θ_t from the coordinator

    def send_theta(
        self,
        t: int,
        point: np.ndarray,
        params: Mapping[str, float],
        workers: Sequence[int],
        attempt: int = 0,
        deadline: float = 0.0,
    ) -> int:
        bounds = segments(int(point.shape[0]), self.n)
        sent = 0
        for w in workers:
            lo, hi = bounds[w]
            frames = theta_frames(
                self.job_id,
                t,
                point[lo:hi],
                params,
                self.chunk_bytes,
                attempt=attempt,
                segment=(w, self.n),
                deadline=deadline,
            )
            for frame in frames:
                self.places[w].send(frame)
            sent += sum(len(f) for f in frames)
        return sent

    def send_theta_to(self, worker: int) -> int:
        raise AssertionError("a ring round restarts for a newcomer (restarts = True)")

    def reporters(self, workers: Sequence[int]) -> set[int]:
        return set(workers)

    def computing(self, workers: Sequence[int], lost: set[int]) -> int:
        return len(workers)

    def unreachable(self, lost: set[int]) -> set[int]:
        return set(range(self.n)) if lost else set()  # every segment passes every worker

    def contributors(
        self, used: Sequence[int], below: Mapping[int, Sequence[int]]
    ) -> tuple[int, ...]:
        return tuple(sorted(used))

    def left_out_bounds(self, ready: Mapping[int, float], used: Sequence[int]) -> dict[int, float]:
        return {}  # every member is in every sum

    def cancel(self, t: int, workers: Iterable[int]) -> None:
        cancel_frames(self.places, self.job_id, t, workers)


class TreePlane:
    """θ_t to level 1 (the workers pass it down); level 1's partial sums back."""

    name = "tree"
    restarts = True
    peered = True

    def __init__(self, job_id: str, places: Places, chunk_bytes: int, plan: Plan) -> None:
        assert plan.topology.tree is not None
        self.job_id = job_id
        self.places = places
        self.chunk_bytes = chunk_bytes
        self.tree = plan.topology.tree
        self._frames: list[bytes] = []

    def send_theta(
        self,
        t: int,
        point: np.ndarray,
        params: Mapping[str, float],
        workers: Sequence[int],
        attempt: int = 0,
        deadline: float = 0.0,
    ) -> int:
        frames = theta_frames(
            self.job_id, t, point, params, self.chunk_bytes, attempt=attempt, deadline=deadline
        )
        for w in workers:
            for frame in frames:
                self.places[w].send(frame)
        return sum(len(f) for f in frames) * len(workers)

    def send_theta_to(self, worker: int) -> int:
        raise AssertionError("a tree round restarts for a newcomer (restarts = True)")

    def peers(self, worker: int) -> set[int]:
        parent = self.tree.parent(worker)
        return set(self.tree.children(worker)) | ({parent} if parent >= 0 else set())

    def left_out(self, worker: int, used: set[int]) -> str:
        parent = self.tree.parent(worker)
        if parent in used:
            return (
                f"left out by worker {parent}: slower than the "
                f"{self.tree.fanout - self.tree.s} siblings it decoded"
            )
        return f"below worker {parent}, which the round did without"

    def theta_source(self, worker: int) -> int:
        return self.tree.parent(worker)

    def reporters(self, workers: Sequence[int]) -> set[int]:
        return set(self.tree.children(-1)) & set(workers)

    def computing(self, workers: Sequence[int], lost: set[int]) -> int:
        tree = self.tree

        def reached(worker: int) -> int:
            return 0 if worker in lost else 1 + sum(reached(c) for c in tree.children(worker))

        return sum(reached(w) for w in workers)

    def unreachable(self, lost: set[int]) -> set[int]:
        """Level-1 workers that cannot report: lost, or their subtree cannot decode (a
        group with more than s of its members unable to send)."""
        tree, needed = self.tree, self.tree.fanout - self.tree.s

        def can_send(worker: int) -> bool:
            if worker in lost:
                return False
            kids = tree.children(worker)
            return not kids or sum(can_send(c) for c in kids) >= needed

        return {w for w in tree.children(-1) if not can_send(w)}

    def contributors(
        self, used: Sequence[int], below: Mapping[int, Sequence[int]]
    ) -> tuple[int, ...]:
        out = set(used)
        for w in used:
            out.update(below.get(w, ()))
        return tuple(sorted(out))

    def left_out_bounds(self, ready: Mapping[int, float], used: Sequence[int]) -> dict[int, float]:
        return self.tree.left_out_bounds(ready, set(used))

    def cancel(self, t: int, workers: Iterable[int]) -> None:
        cancel_frames(self.places, self.job_id, t, workers)


def cancel_frames(places: Places, job_id: str, t: int, workers: Iterable[int]) -> None:
    """Cancel{t} to each of ``workers``."""
    cancel = pb.CoordinatorMessage(cancel=pb.Cancel(job_id=job_id, round=t)).SerializeToString()
    for w in workers:
        places[w].send(cancel)


def theta_frames(
    job_id: str,
    t: int,
    point: np.ndarray,
    params: Mapping[str, float],
    chunk_bytes: int,
    *,
    attempt: int = 0,
    segment: tuple[int, int] | None = None,
    deadline: float = 0.0,
) -> list[bytes]:
    """θ_t (or ``segment`` = (q, n): θ_t's segment q of n) as serialized ``RoundStart``
    frames, one per chunk (``params`` and the peer ``deadline`` in the first)."""
    frames = []
    for c in chunks("theta", point, chunk_bytes):
        message = pb.CoordinatorMessage()
        start = message.round
        start.job_id = job_id
        start.round = t
        start.attempt = attempt
        if segment is not None:
            start.segment, start.segments = segment
        if c.index == 0:
            start.params.update(params)
            start.peer_deadline_seconds = deadline
        c.fill(start.theta, with_data=False)
        frames.append(framed(message, THETA_DATA, c.data))
    return frames


# Topology kind (Plan.topology.kind) → the plane that carries it.
DATA_PLANES: Mapping[str, Callable[[str, Places, int, Plan], DataPlane]] = {
    StarPlane.name: StarPlane,
    RingPlane.name: RingPlane,
    TreePlane.name: TreePlane,
}


def check_topology(topology: str, policy: str) -> None:
    """Refuse (at submit) a policy whose topology this coordinator cannot carry."""
    if topology not in DATA_PLANES:
        raise ConfigError(
            f"policy {policy!r} sends gradients over a {topology} of workers, which this "
            f"coordinator cannot carry yet (it carries: {', '.join(sorted(DATA_PLANES))}); "
            f"`codedgd simulate --policy {policy}` runs it on the simulator"
        )


def data_plane(plan: Plan, job_id: str, places: Places, chunk_bytes: int) -> DataPlane:
    """The data plane for a plan's topology."""
    topology = plan.topology.kind
    factory = DATA_PLANES.get(topology)
    if factory is None:
        raise ConfigError(
            f"the plan asks for topology {topology!r}, which this coordinator cannot carry "
            f"(it knows {', '.join(sorted(DATA_PLANES))}): upgrade the coordinator"
        )
    return factory(job_id, places, chunk_bytes, plan)
