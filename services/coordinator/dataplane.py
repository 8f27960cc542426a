"""The data plane: how a round's θ reaches the workers and their results come back.

The round loop (:mod:`.rounds`) decides *whom* a round needs (the policy's
``begin_round``) and *when* it can decode (``offer``); a :class:`DataPlane` decides *how*
the bytes travel. The plan names its topology (``Plan.topology``), and
:func:`data_plane` builds the plane registered under that name, so a new topology is a
new class in :data:`DATA_PLANES`, not a branch in the round loop.

Today there is one: :class:`StarPlane`, where the coordinator sends θ_t to every
contacted worker and each sends its result straight back (the parameter-server star).
Worker-to-worker topologies (a ring, a tree of workers) change only this: they send θ_t
to the workers that start its forwarding, and name which workers report to the
coordinator (:meth:`DataPlane.reporters`); the round loop, the inbox and the policies
stay as they are.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

import numpy as np

from codedgd.services.coordinator.places import Places
from codedgd.services.errors import ConfigError
from codedgd.services.proto import codedgd_pb2 as pb
from codedgd.services.wire import THETA_DATA, chunks, framed


class DataPlane(Protocol):
    """How one job's rounds move θ out and results in (one instance per job)."""

    name: str

    def send_theta(
        self, t: int, point: np.ndarray, params: Mapping[str, float], workers: Sequence[int]
    ) -> int:
        """Start round t: θ_t (with the policy's ``params``) to ``workers``; bytes sent."""
        ...

    def send_theta_to(self, worker: int) -> int:
        """The running round's θ_t to ``worker``, which joined mid-round; bytes sent."""
        ...

    def reporters(self, workers: Sequence[int]) -> set[int]:
        """Of a round's ``workers``, those whose results reach the coordinator."""
        ...

    def cancel(self, t: int, workers: Iterable[int]) -> None:
        """Tell ``workers`` their result for round t is no longer wanted."""
        ...


class StarPlane:
    """Coordinator ↔ each worker: θ_t out to every contacted worker, each result back.

    θ_t is serialized once per round into ``RoundStart`` frames (the policy's parameters
    in the first); the same bytes are queued to every contacted worker's stream, and kept
    for a newcomer that joins mid-round.
    """

    name = "star"

    def __init__(self, job_id: str, places: Places, chunk_bytes: int) -> None:
        self.job_id = job_id
        self.places = places
        self.chunk_bytes = chunk_bytes
        self._frames: list[bytes] = []
        self._frame_bytes = 0

    def send_theta(
        self, t: int, point: np.ndarray, params: Mapping[str, float], workers: Sequence[int]
    ) -> int:
        frames = theta_frames(self.job_id, t, point, params, self.chunk_bytes)
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

    def cancel(self, t: int, workers: Iterable[int]) -> None:
        cancel = pb.CoordinatorMessage(
            cancel=pb.Cancel(job_id=self.job_id, round=t)
        ).SerializeToString()
        for w in workers:
            self.places[w].send(cancel)


def theta_frames(
    job_id: str, t: int, point: np.ndarray, params: Mapping[str, float], chunk_bytes: int
) -> list[bytes]:
    """θ_t as serialized ``RoundStart`` frames, one per chunk (``params`` in the first)."""
    frames = []
    for c in chunks("theta", point, chunk_bytes):
        message = pb.CoordinatorMessage()
        start = message.round
        start.job_id = job_id
        start.round = t
        if c.index == 0:
            start.params.update(params)
        c.fill(start.theta, with_data=False)
        frames.append(framed(message, THETA_DATA, c.data))
    return frames


# Topology kind (Plan.topology.kind) → the plane that carries it.
DATA_PLANES: Mapping[str, Callable[[str, Places, int], DataPlane]] = {
    StarPlane.name: StarPlane,
}


def check_topology(topology: str, policy: str) -> None:
    """Refuse (at submit) a policy whose topology this coordinator cannot carry."""
    if topology not in DATA_PLANES:
        raise ConfigError(
            f"policy {policy!r} sends gradients over a {topology} of workers, which this "
            f"coordinator cannot carry yet (it carries: {', '.join(sorted(DATA_PLANES))}); "
            f"`codedgd simulate --policy {policy}` runs it on the simulator"
        )


def data_plane(topology: str, job_id: str, places: Places, chunk_bytes: int) -> DataPlane:
    """The data plane for a plan's topology."""
    factory = DATA_PLANES.get(topology)
    if factory is None:
        raise ConfigError(
            f"the plan asks for topology {topology!r}, which this coordinator cannot carry "
            f"(it knows {', '.join(sorted(DATA_PLANES))}): upgrade the coordinator"
        )
    return factory(job_id, places, chunk_bytes)
