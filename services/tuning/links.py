"""The links between workers, measured on the live pool (``codedgd tune --probe-links``).

A run's delays cannot tell a link's latency from its bandwidth: every message of a star
job has one size. The worker-to-worker topologies (ring-allreduce, tree, codedreduce)
send messages of other sizes, hop after hop, so tune charges them a :class:`Link`, which
the user states or this measures.

Two short jobs run on one worker of the pool, with nothing else on its link: uncoded, on
a few synthetic rows of :data:`SMALL_DIM` and :data:`LARGE_DIM` features, so a round
sends θ down and the gradient up, two messages of about 8 kB or 2 MB each, around a
computation of a few rows. Each round's time beyond the worker's own (its response at
the coordinator less the time from θ complete at the worker to its result ready, which
the worker reports; the compute it reports, from workers that send no own times) is a
round trip: two hops. Their median
at each size gives the line ``2·latency + bytes/bandwidth``: the bandwidth from the
difference of the two, the latency from what the small messages take beyond their bytes.
What a message costs beyond the wire (gRPC, protobuf, Python at both ends) is in them
too, per message in the latency and per byte in the bandwidth, as a worker-to-worker hop
of codedgd pays it; a worker's own times (a ring's or tree's run) hold none of it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from codedgd.services.errors import ConfigError
from codedgd.services.job import Component, JobConfig
from codedgd.services.records import RoundRecord
from codedgd.services.tuning.search import Link

SMALL_DIM = 1_000
"""Features of the small probe: θ and a gradient of 8 kB each."""
LARGE_DIM = 250_000
"""Features of the large probe: θ and a gradient of 2 MB each (gRPC's default limit is
4 MiB a message)."""
LINK_PROBE_ROUNDS = 20
"""Rounds of each probe job; the first :data:`SKIPPED_ROUNDS` are not timed (connections
and buffers warming up)."""
SKIPPED_ROUNDS = 2
MIN_TRIPS = 5
"""Round trips each size needs for its median."""


def link_probe_job(dim: int, rounds: int = LINK_PROBE_ROUNDS, seed: int = 0) -> JobConfig:
    """One of the two probe jobs: one worker, uncoded, 8 synthetic rows of ``dim``
    features, no straggler model, no evaluation."""
    return JobConfig(
        workers=1,
        rounds=rounds,
        seed=seed,
        eval_every=10**9,
        data=Component("synthetic", {"rows": 8, "dim": dim}),
        policy=Component("uncoded", {}),
    )


@dataclass(frozen=True)
class LinkFit:
    """A :class:`Link` fitted from the two probes, and what it was fitted from."""

    link: Link
    small_bytes: float  # bytes of one round trip (θ down, gradient up), small probe
    small_seconds: float  # its median seconds beyond compute
    large_bytes: float
    large_seconds: float
    trips: int  # round trips timed at each size (the fewer of the two)

    def describe(self) -> str:
        bandwidth = self.link.bandwidth_bytes_per_second
        shown = "free (inf)" if math.isinf(bandwidth) else f"{bandwidth / 1e6:.4g} MB/s"
        return (
            f"round trips beyond compute, medians of {self.trips}: "
            f"{self.small_bytes / 1e3:.4g} kB in {self.small_seconds * 1e3:.3g} ms, "
            f"{self.large_bytes / 1e6:.4g} MB in {self.large_seconds * 1e3:.3g} ms: "
            f"latency {self.link.latency_seconds * 1e3:.3g} ms a hop, bandwidth {shown}"
            + (
                f" beyond a burst of {self.link.burst_bytes / 1e3:.4g} kB"
                if self.link.burst_bytes
                else ""
            )
        )

    def to_dict(self) -> dict[str, float]:
        return {
            "latency_seconds": self.link.latency_seconds,
            # JSON has no inf: null is a link too fast for the probes to measure
            "bandwidth_bytes_per_second": (
                self.link.bandwidth_bytes_per_second
                if math.isfinite(self.link.bandwidth_bytes_per_second)
                else None  # type: ignore[dict-item]
            ),
            "burst_bytes": self.link.burst_bytes,  # (stated: what the fit took it to be)
            "small_bytes": self.small_bytes,
            "small_seconds": self.small_seconds,
            "large_bytes": self.large_bytes,
            "large_seconds": self.large_seconds,
            "trips": self.trips,
        }


def round_trips(records: Sequence[RoundRecord], what: str) -> tuple[np.ndarray, float]:
    """(seconds beyond the worker's own of each timed round trip, bytes of one round
    trip) of a probe's rounds. ``what`` names the probe in errors."""
    trips: list[float] = []
    sizes: list[float] = []
    for r in records[SKIPPED_ROUNDS:]:
        if not r.response_seconds or r.computations < 1:
            continue
        sizes.append((r.bytes_down + r.bytes_up) / r.computations)
        for w, seconds in r.response_seconds.items():
            own = r.ready_seconds.get(w, r.worker_compute_seconds.get(w, 0.0))
            trips.append(float(seconds) - float(own))
    values = np.array(trips)
    if values.size < MIN_TRIPS:
        raise ConfigError(
            f"the {what} probe timed {values.size} round trip(s) after its first "
            f"{SKIPPED_ROUNDS} rounds; fitting the link needs at least {MIN_TRIPS}: run it "
            "for more rounds"
        )
    if not (np.all(np.isfinite(values)) and np.all(np.isfinite(sizes))):
        raise ConfigError(f"the {what} probe's records hold non-finite times or sizes")
    return values, float(np.median(sizes))


def fit_link(
    small: Sequence[RoundRecord], large: Sequence[RoundRecord], burst: float = 0.0
) -> LinkFit:
    """The link that the two probes' round trips fit (see the module's text). Where the
    large messages took no longer than the small ones, the bandwidth is beyond what
    messages of this size can measure: free (inf).

    ``burst``: the links' token bucket, bytes each way (stated: two sizes cannot tell it
    from the latency and the rate). Each hop's first ``burst`` bytes then cost nothing
    but the latency, and only the rest is put down to the bandwidth; the small
    messages, within it, time the latency alone."""
    small_trips, small_bytes = round_trips(small, "small")
    large_trips, large_bytes = round_trips(large, "large")
    if not large_bytes > small_bytes:
        raise ConfigError(
            f"the large probe's round trips carried {large_bytes:.0f} bytes, the small one's "
            f"{small_bytes:.0f}: they are not the probes (give the small one first)"
        )
    t_small, t_large = float(np.median(small_trips)), float(np.median(large_trips))
    extra = t_large - t_small
    # (a round trip is two hops of half its bytes, each paced beyond the burst)
    small_paced = 2 * max(small_bytes / 2 - burst, 0.0)
    large_paced = 2 * max(large_bytes / 2 - burst, 0.0)
    bandwidth = (large_paced - small_paced) / extra if extra > 0 else math.inf
    if not bandwidth > 0:  # (the large messages fit in the burst too: nothing paced)
        bandwidth = math.inf
    latency = max(t_small - small_paced / bandwidth, 0.0) / 2.0
    return LinkFit(
        Link(latency, bandwidth, burst_bytes=burst),
        small_bytes,
        t_small,
        large_bytes,
        t_large,
        int(min(small_trips.size, large_trips.size)),
    )
