"""Delay traces: recorded response times round-trip through files and replay exactly."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from codedgd.services.errors import ConfigError, DataError
from codedgd.services.job import Component, JobConfig
from codedgd.services.records import RoundRecord, read_results, write_results
from codedgd.services.sim import CostModel, simulate
from codedgd.services.sim.trace import (
    TraceDelay,
    load_trace,
    trace_from_records,
    trace_from_results,
    write_trace,
)
from codedgd.services.stragglers import create_straggler_model

SYNTH = Component("synthetic", {"rows": 300, "dim": 6})


def record(t: int, responses: dict[int, float], computes: dict[int, float]) -> RoundRecord:
    return RoundRecord(
        round=t,
        wall_seconds=float(t + 1),
        round_seconds=1.0,
        wait_seconds=max(responses.values()),
        decode_seconds=0.0,
        compute_seconds_max=max(computes.values()),
        loss=math.nan,
        metric=math.nan,
        metric_name="auc",
        workers_used=tuple(sorted(responses)),
        exact=True,
        decode_residual=0.0,
        bytes_up=0,
        bytes_down=0,
        uploads=len(responses),
        computations=3,
        cancelled=3 - len(responses),
        late_dropped=0,
        response_seconds=responses,
        worker_compute_seconds=computes,
    )


def test_round_timings_survive_json_and_csv(tmp_path: Path) -> None:
    r = record(0, {0: 0.5, 2: 0.25}, {0: 0.1, 2: 0.05})
    write_results(tmp_path / "r.json", {"job": {"workers": 3}}, [r], {})
    _, back = read_results(tmp_path / "r.json")
    assert back[0].response_seconds == {0: 0.5, 2: 0.25}
    assert back[0].worker_compute_seconds == {0: 0.1, 2: 0.05}
    write_results(tmp_path / "r.csv", {}, [r], {})
    row = (tmp_path / "r.csv").read_text().splitlines()[1]
    assert '{""0"":0.5,""2"":0.25}' in row  # the JSON object, CSV-quoted
    # Files written before these fields existed still read, with empty timings.
    doc = json.loads((tmp_path / "r.json").read_text())
    for key in ("response_seconds", "worker_compute_seconds"):
        del doc["rounds"][0][key]
    (tmp_path / "old.json").write_text(json.dumps(doc))
    assert read_results(tmp_path / "old.json")[1][0].response_seconds == {}


def test_trace_kinds_and_censored_workers() -> None:
    records = [record(0, {0: 0.5, 2: 0.25}, {0: 0.1, 2: 0.05})]
    response = trace_from_records(records, 3, kind="response")[0]
    assert response[0] == 0.5 and response[2] == 0.25
    # The censored worker 1 is slower than the decoding arrival (wait = 0.5): just above.
    assert response[1] == math.nextafter(0.5, math.inf)
    # excess = response − compute; the censored worker 1 gets about wait − mean compute.
    excess = trace_from_records(records, 3)[0]
    assert excess == pytest.approx([0.4, 0.5 - 0.075, 0.2])
    assert trace_from_records(records, 3, censored="null") == [[0.4, None, 0.2]]
    with pytest.raises(ConfigError, match="kind"):
        trace_from_records(records, 3, kind="bogus")


def test_a_tree_rounds_trace_is_its_workers_own_times() -> None:
    """The reporters' arrivals (worker 0's 0.9 s) are the tree's, not a worker's: the
    trace holds each worker's own time; a leaf left out (3) its bound; an inner node the
    root did without (1) nothing."""
    import dataclasses

    r = dataclasses.replace(
        record(0, {0: 0.9}, {0: 0.1, 2: 0.1, 4: 0.2}),
        ready_seconds={0: 0.3, 2: 0.5, 4: 0.25},
        left_out_seconds={3: 0.5},
    )
    response = trace_from_records([r], 5, kind="response")[0]
    assert response == [0.3, None, 0.5, math.nextafter(0.5, math.inf), 0.25]
    excess = trace_from_records([r], 5)[0]
    assert excess[0] == pytest.approx(0.2) and excess[1] is None
    assert excess[3] == pytest.approx(0.5 - 0.4 / 3)  # the bound less the mean compute
    assert trace_from_records([r], 5, censored="null")[0][3] is None


def test_a_star_rounds_trace_is_its_arrivals_though_its_workers_sent_own_times() -> None:
    """A star worker's own times (sent since 2026-12-01) leave the network out; a trace
    of its run is of the arrivals, network in, as before (kind's meaning)."""
    import dataclasses

    r = dataclasses.replace(
        record(0, {0: 0.9, 1: 0.4}, {0: 0.1, 1: 0.1}),
        ready_seconds={0: 0.3, 1: 0.2},
        topology="star",
    )
    assert trace_from_records([r], 2, kind="response")[0] == [0.9, 0.4]
    peered = dataclasses.replace(r, topology="ring")
    assert trace_from_records([peered], 2, kind="response")[0] == [0.3, 0.2]


@pytest.mark.parametrize("suffix", [".json", ".csv"])
def test_written_traces_are_read_by_the_trace_straggler_model(tmp_path: Path, suffix: str) -> None:
    table = [[0.5, None, 0.25], [0.0, 1.5, 2.0]]
    path = write_trace(tmp_path / f"t{suffix}", table)
    loaded = load_trace(path)
    assert loaded.shape == (2, 3)
    assert math.isnan(loaded[0, 1]) and loaded[1, 2] == 2.0
    model = create_straggler_model("trace", {"path": str(path)}, seed=0, n_workers=3)
    assert isinstance(model, TraceDelay)
    assert model.delay(2, 0, 0.0, 1.0) == 0.25
    with pytest.raises(DataError, match="no delay for worker 1 in round 0"):
        model.delay(1, 0, 0.0, 1.0)


def test_a_recorded_run_replays_to_the_same_clock_and_thetas(tmp_path: Path) -> None:
    """Record a simulated run's responses, replay them as a trace: same rounds, same θ."""
    config = JobConfig(
        workers=5,
        rounds=15,
        seed=2,
        data=SYNTH,
        policy=Component("ignore-stragglers", {"s": 2}),
        stragglers=Component("exponential", {"mean": 0.1}),
    )
    first = simulate(config, CostModel.ideal())
    summary = {"rounds": len(first.records)}
    path = write_results(
        tmp_path / "run.json", {**config.to_dict(), "job_id": "x"}, first.records, summary
    )
    trace = write_trace(tmp_path / "trace.json", trace_from_results(path, kind="response"))
    replay = simulate(
        config.replace(stragglers=Component("trace", {"path": str(trace)})), CostModel.ideal()
    )
    for a, b in zip(first.records, replay.records, strict=True):
        assert a.workers_used == b.workers_used
        assert b.wait_seconds == pytest.approx(a.wait_seconds)
    np.testing.assert_array_equal(first.theta, replay.theta)
