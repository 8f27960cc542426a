"""The links between workers, measured on the live pool (``codedgd tune --probe-links``).

A run's delays cannot tell a link's latency from its bandwidth: every message of a star
job has one size. The worker-to-worker topologies (ring-allreduce, tree, codedreduce)
send messages of other sizes, hop after hop, so tune charges them a :class:`Link`, which
the user states or this measures.

Short jobs run on one worker of the pool, with nothing else on its link: uncoded, on a
few synthetic rows of :data:`SMALL_DIM`, :data:`MEDIUM_DIM` and :data:`LARGE_DIM`
features, so a round sends θ down and the gradient up, two messages of about 8 kB,
500 kB or 2 MB each, around a computation of a few rows. Each round's time beyond the
worker's own (its response at the coordinator less the time from θ complete at the
worker to its result ready, which the worker reports; the compute it reports, from
workers that send no own times) is a round trip: two hops. Their medians at the small
and the large size give the line ``2·latency + bytes/bandwidth``: the bandwidth from the
difference of the two, the latency from what the small messages take beyond their bytes.
What a message costs beyond the wire (gRPC, protobuf, Python at both ends) is in them
too, per message in the latency and per byte in the bandwidth, as a worker-to-worker hop
of codedgd pays it; a worker's own times (a ring's or tree's run) hold none of it.

A link that bursts (a token bucket: tc's tbf, a cloud NIC's allowance) sends its first
B bytes at once and paces only the rest: the medium messages then take less than the
line through the small and the large ones says. Where they do, by more than the medians'
noise (:data:`BURST_NOISE` standard errors, from their spread) and :data:`BURST_FLOOR`
of the large messages' extra time, the fit puts the bandwidth through the medium and
large ones (both beyond the burst), the latency through the small ones (within it), and
the burst where the medium ones lose what it saves: B = (m − (t_m − t_s)·β) / 2 for
round trips of m bytes. A burst at least as large as a medium message cannot be told
from the rate by these sizes: said so, and none is fitted (state it: ``--link-burst``).
A bucket refills at its rate only while its side is idle, so the medium probe runs
after the other two, its worker waiting :func:`burst_pause` before each answer (twice a
medium message's time at the two-size fit's bandwidth): every side is idle long enough
to refill a burst of up to a medium message before it is used again.
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
MEDIUM_DIM = 62_500
"""Features of the medium probe: θ and a gradient of 500 kB each, beyond the bursts of
shaped links it measures (tc tbf's of 256 KiB, say)."""
BURST_NOISE = 3.0
"""Standard errors of the medians by which the medium messages must beat the line
through the small and the large ones to be taken for a burst."""
BURST_FLOOR = 0.02
"""... and at least this share of the large messages' extra time over the small ones'."""
LINK_PROBE_ROUNDS = 20
"""Rounds of each probe job; the first :data:`SKIPPED_ROUNDS` are not timed (connections
and buffers warming up)."""
SKIPPED_ROUNDS = 2
MIN_TRIPS = 5
"""Round trips each size needs for its median."""


def link_probe_job(
    dim: int, rounds: int = LINK_PROBE_ROUNDS, seed: int = 0, pause: float = 0.0
) -> JobConfig:
    """One of the probe jobs: one worker, uncoded, 8 synthetic rows of ``dim``
    features, no evaluation, and no straggler model, or with ``pause`` > 0 its worker
    waiting that many seconds before each answer (the "fixed" model: its own time, not
    the round trip's)."""
    return JobConfig(
        workers=1,
        rounds=rounds,
        seed=seed,
        eval_every=10**9,
        data=Component("synthetic", {"rows": 8, "dim": dim}),
        policy=Component("uncoded", {}),
        stragglers=(
            Component("fixed", {"count": 1, "delay": pause}) if pause > 0 else Component("none")
        ),
    )


def burst_pause(link: Link) -> float:
    """Seconds the medium probe's worker waits before each answer, so that every NIC
    side the probe uses is idle long enough to refill a burst as large as a medium
    message: twice that message's time at ``link``'s bandwidth (the two-size fit's,
    which a burst makes too high by some tens of %)."""
    bandwidth = link.bandwidth_bytes_per_second
    return 0.0 if math.isinf(bandwidth) else 2.0 * 8 * MEDIUM_DIM / bandwidth


@dataclass(frozen=True)
class LinkFit:
    """A :class:`Link` fitted from the probes, and what it was fitted from."""

    link: Link
    small_bytes: float  # bytes of one round trip (θ down, gradient up), small probe
    small_seconds: float  # its median seconds beyond compute
    large_bytes: float
    large_seconds: float
    trips: int  # round trips timed at each size (the fewest of them)
    medium_bytes: float | None = None  # (the medium probe's, when it ran)
    medium_seconds: float | None = None
    # How the burst was had: "stated", "measured", "none" (none found, or no medium
    # probe to find one), "beyond" (the medium messages fit in it: not measured), or
    # "unused" (measured, but tune read a star run by its arrivals, which it does not
    # charge a burst).
    burst: str = "none"

    def describe(self) -> str:
        bandwidth = self.link.bandwidth_bytes_per_second
        shown = "free (inf)" if math.isinf(bandwidth) else f"{bandwidth / 1e6:.4g} MB/s"
        return (
            f"round trips beyond compute, medians of {self.trips}: "
            f"{self.small_bytes / 1e3:.4g} kB in {self.small_seconds * 1e3:.3g} ms, "
            + (
                f"{self.medium_bytes / 1e6:.4g} MB in {self.medium_seconds * 1e3:.3g} ms, "
                if self.medium_bytes is not None and self.medium_seconds is not None
                else ""
            )
            + f"{self.large_bytes / 1e6:.4g} MB in {self.large_seconds * 1e3:.3g} ms: "
            f"latency {self.link.latency_seconds * 1e3:.3g} ms a hop, bandwidth {shown}"
            + (
                f" beyond a burst of {self.link.burst_bytes / 1e3:.4g} kB ({self.burst})"
                if self.link.burst_bytes
                else ""
            )
            + (
                "; the medium messages fit in a burst too, which these sizes cannot "
                "measure (state it: --link-burst)"
                if self.burst == "beyond"
                else ""
            )
        )

    def without_burst(self) -> Link:
        """The link of the small and large probes alone, read as bursting none."""
        return _line(
            self.small_bytes, self.small_seconds, self.large_bytes, self.large_seconds, 0.0
        )

    def to_dict(self) -> dict[str, float | str | None]:
        return {
            "latency_seconds": self.link.latency_seconds,
            # JSON has no inf: null is a link too fast for the probes to measure
            "bandwidth_bytes_per_second": (
                self.link.bandwidth_bytes_per_second
                if math.isfinite(self.link.bandwidth_bytes_per_second)
                else None
            ),
            "burst_bytes": self.link.burst_bytes,
            "burst": self.burst,  # stated, measured, none, or beyond (LinkFit.burst)
            "small_bytes": self.small_bytes,
            "small_seconds": self.small_seconds,
            "large_bytes": self.large_bytes,
            "large_seconds": self.large_seconds,
            "trips": self.trips,
            "medium_bytes": self.medium_bytes,
            "medium_seconds": self.medium_seconds,
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
    small: Sequence[RoundRecord],
    large: Sequence[RoundRecord],
    burst: float | None = None,
    medium: Sequence[RoundRecord] | None = None,
) -> LinkFit:
    """The link that the probes' round trips fit (see the module's text). Where the
    large messages took no longer than the small ones, the bandwidth is beyond what
    messages of this size can measure: free (inf).

    ``burst``: the links' token bucket, bytes each way, stated. Each hop's first
    ``burst`` bytes then cost nothing but the latency, and only the rest is put down to
    the bandwidth; the small messages, within it, time the latency alone. None: measured
    from the ``medium`` probe's round trips (none without them)."""
    small_trips, small_bytes = round_trips(small, "small")
    large_trips, large_bytes = round_trips(large, "large")
    if not large_bytes > small_bytes:
        raise ConfigError(
            f"the large probe's round trips carried {large_bytes:.0f} bytes, the small one's "
            f"{small_bytes:.0f}: they are not the probes (give the small one first)"
        )
    t_small, t_large = float(np.median(small_trips)), float(np.median(large_trips))
    trips = [small_trips.size, large_trips.size]
    middle: tuple[float, float] | None = None
    how = "stated" if burst else "none"
    if medium is not None:
        medium_trips, medium_bytes = round_trips(medium, "medium")
        if not small_bytes < medium_bytes < large_bytes:
            raise ConfigError(
                f"the medium probe's round trips carried {medium_bytes:.0f} bytes, not "
                f"between the small one's ({small_bytes:.0f}) and the large one's "
                f"({large_bytes:.0f}): they are not the probes"
            )
        trips.append(medium_trips.size)
        middle = (medium_bytes, float(np.median(medium_trips)))
        if burst is None:
            burst, how = _burst(
                (small_bytes, small_trips), (medium_bytes, medium_trips), (large_bytes, large_trips)
            )
    link = _line(small_bytes, t_small, large_bytes, t_large, burst or 0.0)
    return LinkFit(
        link,
        small_bytes,
        t_small,
        large_bytes,
        t_large,
        int(min(trips)),
        medium_bytes=middle[0] if middle else None,
        medium_seconds=middle[1] if middle else None,
        burst=how,
    )


def _line(
    small_bytes: float, t_small: float, large_bytes: float, t_large: float, burst: float
) -> Link:
    """The latency and bandwidth through two sizes' medians, a round trip being two hops
    of half its bytes, each paced beyond ``burst``."""
    extra = t_large - t_small
    small_paced = 2 * max(small_bytes / 2 - burst, 0.0)
    large_paced = 2 * max(large_bytes / 2 - burst, 0.0)
    bandwidth = (large_paced - small_paced) / extra if extra > 0 else math.inf
    if not bandwidth > 0:  # (the large messages fit in the burst too: nothing paced)
        bandwidth = math.inf
    latency = max(t_small - small_paced / bandwidth, 0.0) / 2.0
    return Link(latency, bandwidth, burst_bytes=burst)


def _burst(
    small: tuple[float, np.ndarray],
    medium: tuple[float, np.ndarray],
    large: tuple[float, np.ndarray],
) -> tuple[float, str]:
    """The burst the three probes show (bytes each way a hop), and how it was had."""
    (s, ts), (m, tm), (big, tl) = ((b, np.asarray(t)) for b, t in (small, medium, large))
    t_s, t_m, t_l = (float(np.median(t)) for t in (ts, tm, tl))
    if not t_l > t_s:
        return 0.0, "none"
    on_line = t_s + (m - s) / (big - s) * (t_l - t_s)
    saved = on_line - t_m
    noise = math.sqrt(sum(_median_error(t) ** 2 for t in (ts, tm, tl)))
    threshold = max(BURST_NOISE * noise, BURST_FLOOR * (t_l - t_s))
    if saved <= threshold:
        return 0.0, "none"
    # Both beyond the burst: their difference is all paced. (Within it, the medium ones
    # take no longer than the small ones: the burst is a medium message or more.)
    if not t_l > t_m or t_m - t_s <= threshold:
        return 0.0, "beyond"
    bandwidth = (big - m) / (t_l - t_m)
    burst = (m - (t_m - t_s) * bandwidth) / 2.0
    if not burst > s / 2:  # (no more than the small messages: nothing to tell)
        return 0.0, "none"
    return min(burst, m / 2.0), "measured"


def _median_error(values: np.ndarray) -> float:
    """The standard error of a sample's median, from its spread (1.4826·MAD for σ)."""
    if values.size < 2:
        return 0.0
    mad = float(np.median(np.abs(values - np.median(values))))
    return 1.2533 * 1.4826 * mad / math.sqrt(values.size)
