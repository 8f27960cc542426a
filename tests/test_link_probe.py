"""Fitting the links between workers from two probe jobs (``tune --probe-links``)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest

from codedgd.services.errors import ConfigError
from codedgd.services.records import RoundRecord
from codedgd.services.sim import CostModel, simulate
from codedgd.services.tuning import fit_link, link_probe_job
from codedgd.services.tuning.links import (
    LARGE_DIM,
    MEDIUM_DIM,
    SKIPPED_ROUNDS,
    SMALL_DIM,
    burst_pause,
)
from tests.test_tune import _cli


def _probe(
    dim: int,
    latency: float,
    bandwidth: float,
    rounds: int = 20,
    seed: int = 0,
    burst: float = 0.0,
) -> list[RoundRecord]:
    """A probe's rounds on one worker whose link has ``latency`` a hop and ``bandwidth``:
    θ (dim float64s) down, the gradient up, around a compute of about a millisecond, with
    a jitter of up to 20 % of the wire time on top."""
    rng = np.random.default_rng([seed, dim])
    nbytes = 8 * dim + 64
    wire = 2 * latency + 2 * max(nbytes - burst, 0) / bandwidth  # (each hop: its bucket first)
    out = []
    for t in range(rounds):
        compute = 0.001 * (1 + rng.random())
        trip = wire * (1 + 0.2 * rng.random())
        if t < SKIPPED_ROUNDS:  # the first rounds warm up: far slower, and not timed
            trip *= 50
        out.append(
            RoundRecord(
                round=t,
                wall_seconds=float(t + 1),
                round_seconds=compute + trip,
                wait_seconds=compute + trip,
                decode_seconds=0.0,
                compute_seconds_max=compute,
                loss=math.nan,
                metric=math.nan,
                metric_name="auc",
                workers_used=(0,),
                exact=True,
                decode_residual=0.0,
                bytes_up=nbytes,
                bytes_down=nbytes,
                uploads=1,
                computations=1,
                cancelled=0,
                late_dropped=0,
                response_seconds={0: compute + trip},
                worker_compute_seconds={0: compute},
            )
        )
    return out


@pytest.mark.parametrize(
    ("latency", "bandwidth"), [(0.0002, 1.25e9), (0.001, 25e6), (0.0005, 2.5e8)]
)
def test_the_probes_give_back_the_links_latency_and_bandwidth(
    latency: float, bandwidth: float
) -> None:
    fitted = fit_link(_probe(SMALL_DIM, latency, bandwidth), _probe(LARGE_DIM, latency, bandwidth))
    # The jitter (0-20 % of the wire time, a median of about 10 %) is taken as link time.
    assert fitted.link.bandwidth_bytes_per_second == pytest.approx(bandwidth / 1.1, rel=0.05)
    assert fitted.link.latency_seconds == pytest.approx(latency * 1.1, rel=0.1)
    assert fitted.trips == 20 - SKIPPED_ROUNDS
    assert fitted.small_bytes == 2 * (8 * SMALL_DIM + 64)
    text = fitted.describe()
    assert "a hop" in text and "MB/s" in text


def test_links_that_burst_are_fitted_beyond_the_stated_burst() -> None:
    """A token bucket of 256 kB (tc tbf's burst) on 2.5 MB/s links of 0.4 ms: the small
    probe's 8 kB messages go at once, the large one's 2 MB beyond the bucket at the rate.
    Not told of the burst, the fit has the small messages beat the bandwidth line and
    calls the latency 0, the rate too high; told, it gives both back."""
    latency, bandwidth, burst = 0.0004, 2.5e6, 256e3
    small = _probe(SMALL_DIM, latency, bandwidth, burst=burst)
    large = _probe(LARGE_DIM, latency, bandwidth, burst=burst)
    blind = fit_link(small, large)
    assert blind.link.latency_seconds == 0.0
    assert blind.link.bandwidth_bytes_per_second > 1.05 * bandwidth / 1.1
    told = fit_link(small, large, burst=burst)
    assert told.link.bandwidth_bytes_per_second == pytest.approx(bandwidth / 1.1, rel=0.05)
    assert told.link.latency_seconds == pytest.approx(latency * 1.1, rel=0.1)
    assert told.link.burst_bytes == burst and told.to_dict()["burst_bytes"] == burst
    assert "beyond a burst of 256 kB" in told.describe()


def test_a_burst_is_measured_from_the_medium_probe() -> None:
    """The same links, with a third probe of 500 kB messages: beyond the bucket, they
    take less than the line through the small and the large ones, by what the bucket
    saves. The fit gives the burst back, and the latency and the rate with it."""
    latency, bandwidth, burst = 0.0004, 2.5e6, 256e3
    small, medium, large = (
        _probe(dim, latency, bandwidth, burst=burst) for dim in (SMALL_DIM, MEDIUM_DIM, LARGE_DIM)
    )
    fitted = fit_link(small, large, medium=medium)
    assert fitted.burst == "measured"
    assert fitted.link.burst_bytes == pytest.approx(burst, rel=0.1)
    assert fitted.link.bandwidth_bytes_per_second == pytest.approx(bandwidth / 1.1, rel=0.05)
    assert fitted.link.latency_seconds == pytest.approx(latency * 1.1, rel=0.1)
    assert "(measured)" in fitted.describe()
    doc = fitted.to_dict()
    assert doc["burst"] == "measured" and doc["medium_bytes"] == 2 * (8 * MEDIUM_DIM + 64)
    # A stated burst is taken as stated.
    stated = fit_link(small, large, burst=100e3, medium=medium)
    assert stated.link.burst_bytes == 100e3 and stated.burst == "stated"


@pytest.mark.parametrize(
    ("latency", "bandwidth"), [(0.0002, 1.25e9), (0.001, 25e6), (0.0004, 2.5e6)]
)
def test_links_that_do_not_burst_are_fitted_none(latency: float, bandwidth: float) -> None:
    """The medium messages on the line, but for the jitter: no burst, the two-size fit."""
    small, medium, large = (
        _probe(dim, latency, bandwidth, seed=3) for dim in (SMALL_DIM, MEDIUM_DIM, LARGE_DIM)
    )
    fitted = fit_link(small, large, medium=medium)
    assert fitted.burst == "none" and fitted.link.burst_bytes == 0.0
    assert fitted.link == fit_link(small, large).link


def test_a_burst_beyond_the_medium_messages_is_said_not_measured() -> None:
    """A bucket of 1 MB holds the medium messages whole: they take the small ones' time,
    and these sizes cannot tell the burst from the rate. None is fitted, and it is said."""
    small, medium, large = (
        _probe(dim, 0.0004, 2.5e6, burst=1e6) for dim in (SMALL_DIM, MEDIUM_DIM, LARGE_DIM)
    )
    fitted = fit_link(small, large, medium=medium)
    assert fitted.burst == "beyond" and fitted.link.burst_bytes == 0.0
    assert "--link-burst" in fitted.describe()
    with pytest.raises(ConfigError, match="not between"):
        fit_link(small, large, medium=large)


def _simulated_probes(
    latency: float, bandwidth: float, burst: float
) -> tuple[list[RoundRecord], list[RoundRecord], list[RoundRecord]]:
    """The three probes as ``--probe-links`` runs them, on the simulator: one worker and
    the coordinator, every NIC of ``bandwidth`` and a bucket of ``burst`` that carries
    from round to round, the medium probe pausing each round at the two sizes' fit."""
    cost = CostModel(
        compute="none",
        decode_seconds=0.0,
        latency_seconds=latency,
        bandwidth_bytes_per_second=bandwidth,
        ingress_bandwidth_bytes_per_second=bandwidth,
        egress_bandwidth_bytes_per_second=bandwidth,
        burst_bytes=burst,
    )
    small, large = (list(simulate(link_probe_job(d), cost).records) for d in (SMALL_DIM, LARGE_DIM))
    pause = burst_pause(fit_link(small, large, burst=0.0).link)
    medium = list(simulate(link_probe_job(MEDIUM_DIM, pause=pause), cost).records)
    return small, medium, large


@pytest.mark.parametrize(("bandwidth", "burst"), [(2.5e6, 262144.0), (2.5e6, 350e3), (25e6, 4e5)])
def test_the_burst_of_a_bucket_that_carries_over_is_measured(
    bandwidth: float, burst: float
) -> None:
    """Buckets refill only while idle: the medium probe's pause lets every side refill,
    and the fit gives the burst back (without it, rounds back to back leave a bucket of
    350 kB holding 150 kB when the next medium message comes)."""
    small, medium, large = _simulated_probes(0.0004, bandwidth, burst)
    fitted = fit_link(small, large, medium=medium)
    assert fitted.burst == "measured"
    assert fitted.link.burst_bytes == pytest.approx(burst, rel=0.01)
    assert fitted.link.bandwidth_bytes_per_second == pytest.approx(bandwidth, rel=0.01)
    assert fitted.link.latency_seconds == pytest.approx(0.0004, rel=0.05)
    # Read as bursting none, the two sizes' line (what an arrivals reading is charged).
    plain = fitted.without_burst()
    assert plain.burst_bytes == 0.0 and plain == fit_link(small, large, burst=0.0).link


def test_a_bucket_beyond_the_medium_messages_is_said_not_measured_on_the_simulator() -> None:
    small, medium, large = _simulated_probes(0.0004, 2.5e6, 1e6)
    fitted = fit_link(small, large, medium=medium)
    assert fitted.burst == "beyond" and fitted.link.burst_bytes == 0.0
    small, medium, large = _simulated_probes(0.0004, 2.5e6, 0.0)
    assert fit_link(small, large, medium=medium).burst == "none"


def test_links_too_fast_for_the_probes_are_free_and_said_to_be() -> None:
    # The large messages took no longer than the small ones: no bandwidth to measure.
    small = _probe(SMALL_DIM, 0.0004, 1e15)
    large = [
        dataclasses.replace(r, bytes_up=8 * LARGE_DIM, bytes_down=8 * LARGE_DIM) for r in small
    ]
    fitted = fit_link(small, large)
    assert math.isinf(fitted.link.bandwidth_bytes_per_second)
    assert fitted.link.latency_seconds == pytest.approx(0.0004 * 1.1, rel=0.1)
    assert "free (inf)" in fitted.describe()
    assert fitted.to_dict()["bandwidth_bytes_per_second"] is None  # (JSON has no inf)


def test_bad_probe_records_are_refused_naming_the_problem() -> None:
    good = _probe(SMALL_DIM, 0.0002, 1.25e9)
    large = _probe(LARGE_DIM, 0.0002, 1.25e9)
    with pytest.raises(ConfigError, match=r"small probe timed 3 round trip\(s\).*at least 5"):
        fit_link(good[: SKIPPED_ROUNDS + 3], large)
    with pytest.raises(ConfigError, match="give the small one first"):
        fit_link(large, good)
    broken = [dataclasses.replace(r, response_seconds={0: math.inf}) for r in large]
    with pytest.raises(ConfigError, match="large probe's records hold non-finite"):
        fit_link(good, broken)


def test_a_probe_job_is_one_worker_uncoded_with_messages_of_its_size() -> None:
    job = link_probe_job(LARGE_DIM)
    assert job.workers == 1 and job.policy.name == "uncoded"
    assert job.data.options["dim"] == LARGE_DIM and job.stragglers.name == "none"


def test_probe_links_and_stated_links_are_not_both_taken(tmp_path: Path) -> None:
    done = _cli(
        "tune", "x.json", "--probe-links", "--link-latency", "0.001", "--link-bandwidth", "1e9",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2
    assert "--probe-links" in done.stderr and "not both" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_missing_result_file_is_named_before_the_links_are_probed(tmp_path: Path) -> None:
    # (No coordinator listens on port 1: had the probe come first, the error would be
    # that one, after a probe a user waits for.)
    done = _cli("tune", "gone.json", "--probe-links", "--coordinator", "127.0.0.1:1", cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "result file gone.json does not exist" in done.stderr
