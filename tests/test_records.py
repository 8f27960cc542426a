"""A round record's account of who was left out (excluded, attempts, restarts) survives
every way records travel: result files (JSON, CSV), records.jsonl, and WatchJob's
RoundReport; files written before these fields existed still read."""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path

import pytest

from codedgd.services.errors import ConfigError
from codedgd.services.machine import Machine
from codedgd.services.messages import record_from_pb, record_to_pb
from codedgd.services.records import RoundRecord, read_results, write_results


def _record() -> RoundRecord:
    return RoundRecord(
        round=3,
        wall_seconds=1.0,
        round_seconds=0.5,
        wait_seconds=0.4,
        decode_seconds=0.01,
        compute_seconds_max=0.1,
        loss=0.3,
        metric=0.9,
        metric_name="auc",
        workers_used=(0, 1, 3),
        exact=True,
        decode_residual=0.0,
        bytes_up=10,
        bytes_down=20,
        uploads=2,
        computations=4,
        cancelled=1,
        late_dropped=0,
        excluded={2: "left out by worker 0: slower than the 2 siblings it decoded"},
        attempts=2,
        restarts=("attempt 0: worker 2 silent: worker 3 waited 7.5 s for its data",),
        ready_seconds={0: 0.25, 1: 0.5, 3: 0.125},
        left_out_seconds={2: 0.5},
        holders={1: "m1#12"},
        topology="tree",
        machines={1: Machine("8f83af78dc4aea2b", 2)},
        coordinator_machine=Machine("8f83af78dc4aea2b", 2),
    )


def test_excluded_attempts_and_restarts_survive_json_csv_and_the_wire(tmp_path: Path) -> None:
    r = _record()
    write_results(tmp_path / "r.json", {"job": {}}, [r], {})
    back = read_results(tmp_path / "r.json")[1][0]
    assert (back.excluded, back.attempts, back.restarts) == (r.excluded, 2, r.restarts)
    assert (back.ready_seconds, back.left_out_seconds) == (r.ready_seconds, {2: 0.5})
    assert back.holders == {1: "m1#12"}
    assert back.topology == "tree" and back.peered
    assert back.machines == {1: Machine("8f83af78dc4aea2b", 2)}
    assert back.coordinator_machine == Machine("8f83af78dc4aea2b", 2)
    assert RoundRecord.from_dict(json.loads(json.dumps(r.to_dict()))) == r  # records.jsonl
    assert record_from_pb(record_to_pb(r, "j")) == r
    write_results(tmp_path / "r.csv", {}, [r], {})
    with (tmp_path / "r.csv").open() as fh:
        row = next(csv.DictReader(fh))
    assert RoundRecord.from_dict(row).excluded == r.excluded
    assert RoundRecord.from_dict(row).holders == r.holders
    assert RoundRecord.from_dict(row).machines == r.machines
    assert RoundRecord.from_dict(row).coordinator_machine == r.coordinator_machine
    assert RoundRecord.from_dict(row).topology == "tree"
    assert json.loads(row["restarts"]) == list(r.restarts)


def test_records_of_older_versions_read_with_nobody_excluded_and_one_attempt(
    tmp_path: Path,
) -> None:
    doc = _record().to_dict()
    for key in ("excluded", "attempts", "restarts", "holders", "machines", "coordinator_machine"):
        del doc[key]
    old = RoundRecord.from_dict(doc)
    assert (old.excluded, old.attempts, old.restarts, old.holders) == ({}, 1, (), {})
    assert (old.machines, old.coordinator_machine) == ({}, None)


def test_a_result_file_with_a_garbled_machine_is_refused_by_name(tmp_path: Path) -> None:
    write_results(tmp_path / "r.json", {"job": {}}, [_record()], {})
    doc = json.loads((tmp_path / "r.json").read_text())
    doc["rounds"][0]["machines"] = {"1": "8f83af78dc4aea2b"}  # not {id, cpus}
    (tmp_path / "r.json").write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match="a machine is an object with id and cpus"):
        read_results(tmp_path / "r.json")


def test_a_round_says_whether_its_workers_sent_to_each_other() -> None:
    """Since 2026-12-01 a star's workers send their own times too: the record's topology
    tells its own times from a ring's or tree's. An older file's round has none, and
    held own times only when it was a ring's or tree's."""
    r = _record()
    star = dataclasses.replace(r, topology="star")
    assert not star.peered and star.ready_seconds  # (own times, yet a star's round)
    older = {k: v for k, v in r.to_dict().items() if k != "topology"}
    assert RoundRecord.from_dict(older).peered  # (own times: a tree's, before the field)
    older["ready_seconds"] = {}
    assert not RoundRecord.from_dict(older).peered
    # A value no version writes is not trusted: read as an older file's.
    odd = {**r.to_dict(), "topology": ["star"]}
    assert RoundRecord.from_dict(odd).topology == "" and RoundRecord.from_dict(odd).peered
