"""What a worker sends the coordinator about its rounds, and the totals it keeps."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from codedgd.services.compute.gradient import CancelFlag
from codedgd.services.proto import codedgd_pb2 as pb
from codedgd.services.wire import RESULT_DATA, chunks, framed


@dataclass
class WorkerStats:
    """A worker's running totals (read by its Prometheus endpoint at scrape time)."""

    rounds_computed: int = 0
    rounds_cancelled: int = 0
    compute_seconds_total: float = 0.0
    delay_seconds_total: float = 0.0
    bytes_sent_total: int = 0
    uploads_skipped: int = 0
    crashes: int = 0
    # Worker-to-worker traffic, by the role this worker had ("ring", "tree level 2", ...).
    peers: dict[str, PeerTotals] = field(default_factory=dict)
    # Peers' chunks of an older round or attempt, dropped (the call goes on). Refused
    # calls are counted by the peer server (PeerServer.refused, .rejected).
    peer_chunks_stale: int = 0

    def role(self, name: str) -> PeerTotals:
        """The totals of ``name``, made on first use."""
        totals = self.peers.get(name)
        if totals is None:
            totals = self.peers[name] = PeerTotals()
        return totals


@dataclass
class PeerTotals:
    """A worker's exchanges with its peers in one role."""

    bytes_sent: int = 0  # to peers (θ passed on, partial sums, cancels)
    bytes_received: int = 0  # from peers
    wait_seconds: float = 0.0  # blocked on peers' data after its own part was ready
    children_cancelled: int = 0  # a tree node's children told to stop (slower than F)


@dataclass(frozen=True)
class Upload:
    """A result's frames, made one at a time as the stream takes them.

    Once the round is cancelled (a Cancel, or θ of a newer round), the chunks not
    yet taken are never framed or sent: the coordinator no longer wants them and
    drops a partial result with its round. A slow worker's upload thus stops
    costing bandwidth the moment the round decodes without it. (Framing late was
    also meant to keep the bytes in cache for gRPC's copy; repeated A/B runs show
    no CPU difference, see docs/benchmarks.md.)
    """

    job_id: str
    round: int
    payload: np.ndarray
    compute_seconds: float
    delay_seconds: float
    cancel: CancelFlag
    chunk_bytes: int
    on_sent: Callable[[int], None]
    attempt: int = 0
    segment: int = 0  # ring: the segment of the sum the payload is
    contributors: tuple[int, ...] = ()  # tree: the workers below whose messages are in it
    timings: tuple[pb.WorkerTiming, ...] = ()  # own times (a tree's: and those below)

    def __iter__(self) -> Iterator[bytes]:
        for c in chunks("gradient", self.payload, self.chunk_bytes):
            if self.cancel.is_set():
                return
            message = pb.WorkerMessage()
            out = message.result
            out.job_id = self.job_id
            out.round = self.round
            out.attempt = self.attempt
            out.segment = self.segment
            if c.index == 0:
                out.compute_seconds = self.compute_seconds
                out.delay_seconds = self.delay_seconds
                out.contributors.extend(self.contributors)
                out.timings.extend(self.timings)
            c.fill(out.payload, with_data=False)
            self.on_sent(len(c.data))
            yield framed(message, RESULT_DATA, c.data)  # the one copy of the payload


Outgoing = pb.WorkerMessage | bytes | Upload
