"""Checkpoints and the state directory: whole or refused, and the previous one used."""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from codedgd.services.coordinator.state import StateDir
from codedgd.services.job import Component, JobConfig
from codedgd.services.job.checkpoint import (
    Checkpoint,
    CheckpointError,
    read_checkpoint,
    write_checkpoint,
)
from codedgd.services.job.descent import Descent
from codedgd.services.job.prepare import prepare
from codedgd.services.policies import create
from codedgd.services.policies.base import JobContext, Policy
from codedgd.services.records import RoundRecord
from tests.sim.test_report import rec

STATE = {
    "optimizer": {"t": 7, "x": np.arange(5.0), "y": np.arange(5.0) * 2},
    "steps": 7,
    "start_loss": 0.69,
    "last_loss": float("nan"),
    "policy": {"has": np.array([True, False]), "moves": [0.5, 0.25], "previous": None},
}


def _same(a: object, b: object) -> bool:
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, float) and np.isnan(a):
        return isinstance(b, float) and np.isnan(b)
    return a == b


def test_a_checkpoint_reads_back_as_written(tmp_path: Path) -> None:
    path = write_checkpoint(tmp_path / "c.npz", Checkpoint("job1", 6, STATE))
    back = read_checkpoint(path)
    assert back.job_id == "job1" and back.round == 6 and _same(back.state, STATE)


def test_a_cut_or_damaged_checkpoint_is_refused_naming_the_problem(tmp_path: Path) -> None:
    path = write_checkpoint(tmp_path / "c.npz", Checkpoint("job1", 6, STATE))
    whole = path.read_bytes()
    cut = tmp_path / "cut.npz"
    cut.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(CheckpointError, match="cut short or damaged"):
        read_checkpoint(cut)
    # A flipped byte fails the zip's CRC; an array replaced by a well-formed other one
    # (a file pieced together from two checkpoints) fails the SHA-256 of the meta.
    start = whole.index(np.arange(5.0).tobytes())
    flipped = tmp_path / "flipped.npz"
    flipped.write_bytes(whole[:start] + bytes([whole[start] ^ 1]) + whole[start + 1 :])
    with pytest.raises(CheckpointError, match="cut short or damaged"):
        read_checkpoint(flipped)
    with np.load(path) as npz:
        entries = {k: npz[k] for k in npz.files}
    entries["a0"] = entries["a0"] + 1.0
    pieced = tmp_path / "pieced.npz"
    np.savez(pieced, **entries)
    with pytest.raises(CheckpointError, match="SHA-256"):
        read_checkpoint(pieced)
    with pytest.raises(CheckpointError, match="does not exist"):
        read_checkpoint(tmp_path / "none.npz")


def _record(t: int) -> RoundRecord:
    return rec(t, t + 1.0, 1.0, 1.0 / (t + 1), 0.5)


def test_a_damaged_last_checkpoint_falls_back_to_the_previous_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    state = StateDir(tmp_path)
    store = state.job("job1")
    config = JobConfig(workers=2, rounds=20)
    store.save_job(0, config, "running")
    for t in range(10):
        store.append_record(_record(t))
        if t in (4, 8):
            store.checkpoint(Checkpoint("job1", t, STATE))
    store.close()
    store.checkpoint_path.write_bytes(store.checkpoint_path.read_bytes()[:100])
    with caplog.at_level(logging.WARNING):
        (job,) = state.load()
    assert job.checkpoint is not None and job.checkpoint.round == 4
    assert [r.round for r in job.records] == [0, 1, 2, 3, 4]  # the rounds it resumes after
    assert "cut short or damaged" in caplog.text and "previous checkpoint" in caplog.text


def test_a_records_file_cut_mid_line_keeps_the_rounds_before_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    state = StateDir(tmp_path)
    store = state.job("job1")
    store.save_job(0, JobConfig(workers=2, rounds=20), "done")
    for t in range(3):
        store.append_record(_record(t))
    store.close()
    path = store.path / "records.jsonl"
    path.write_text(path.read_text() + json.dumps(_record(3).to_dict())[:20])
    with caplog.at_level(logging.WARNING):
        (job,) = state.load()
    assert [r.round for r in job.records] == [0, 1, 2]
    assert "cut short at line 4" in caplog.text


def test_an_unusable_state_dir_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(Exception, match="cannot use --state-dir"):
        StateDir(blocker / "state")


def test_a_lazy_policys_memory_survives_a_checkpoint_exactly() -> None:
    """lag-ps after some rounds, its state written and read into a fresh instance: the
    next rounds pick and aggregate the same, bit for bit."""
    n, dim = 4, 3

    def fresh() -> Policy:
        policy = create("lag-ps", {"D": 2, "xi": 1.0})
        policy.plan(n, n)
        policy.bind(JobContext(n_rows=40, step_size=0.1, smoothness=lambda parts: 1.0))
        return policy

    def play(policy: Policy, rounds: range, seed: int) -> list[np.ndarray]:
        out = []
        r = np.random.default_rng(seed)
        for t in rounds:
            spec = policy.begin_round(t, r.standard_normal(dim))
            for w in spec.workers:
                policy.offer(w, r.standard_normal(dim))
            out.append(policy.decode().gradient)
        return out

    a = fresh()
    play(a, range(5), 1)
    b = fresh()
    b.load_state(read_back(a.state()))
    later_a, later_b = play(a, range(5, 12), 2), play(b, range(5, 12), 2)
    assert all(np.array_equal(x, y) for x, y in zip(later_a, later_b, strict=True))


def read_back(state: dict[str, Any]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as d:
        path = write_checkpoint(Path(d) / "c.npz", Checkpoint("j", 0, state))
        return read_checkpoint(path).state


def test_a_descent_resumes_where_its_state_was_taken() -> None:
    config = JobConfig(
        workers=2,
        rounds=10,
        data=Component("synthetic", {"rows": 100, "dim": 4}),
        optimizer={"lr": 0.1, "nesterov": True},
    )
    prepared = prepare(config, None)
    a = Descent(config, prepared)
    grads = np.random.default_rng(0).standard_normal((10, prepared.dataset.dim))
    for g in grads[:4]:
        a.step(g, a.point())
    b = Descent(config, prepare(config, None))
    b.load_state(read_back(a.state()))
    for g in grads[4:]:
        a.step(g, a.point())
        b.step(g, b.point())
    assert np.array_equal(a.theta, b.theta) and a.steps == b.steps == 10
