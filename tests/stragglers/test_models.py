"""Straggler models: distributions, seeding, trace replay and option errors."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from codedgd.services.errors import ConfigError, DataError
from codedgd.services.stragglers import (
    STRAGGLER_MODELS,
    Crash,
    FailStop,
    FixedDelay,
    StragglerModel,
    crash_restart,
    create_straggler_model,
)

N_WORKERS = 8
ROUNDS = 1500  # 12,000 draws a model: standard errors below 1 % of the mean


def _samples(
    model: StragglerModel, compute: float = 1.0, load: float = 1.0, rounds: int = ROUNDS
) -> np.ndarray:
    return np.array(
        [[model.delay(w, r, compute, load) for w in range(N_WORKERS)] for r in range(rounds)]
    )


def _make(name: str, **options: Any) -> StragglerModel:
    return create_straggler_model(name, options, seed=11, n_workers=N_WORKERS)


def _assert_mean(samples: np.ndarray, expected: float, std: float) -> None:
    # Five standard errors: a false alarm about once in 3.5 million runs.
    tolerance = 5 * std / np.sqrt(samples.size)
    assert abs(samples.mean() - expected) < tolerance, (samples.mean(), expected, tolerance)


def test_none_is_zero() -> None:
    assert np.all(_samples(_make("none"), rounds=10) == 0.0)


def test_exponential_mean() -> None:
    s = _samples(_make("exponential", mean=0.2))
    assert s.min() >= 0
    _assert_mean(s, 0.2, 0.2)


def test_shifted_exponential_scales_with_load() -> None:
    a, lam, load = 0.5, 4.0, 0.25
    s = _samples(_make("shifted-exponential", shift=a, rate=lam), load=load)
    assert s.min() >= a * load
    # T = a·load + Exp(rate λ/load): mean a·load + load/λ, std load/λ
    _assert_mean(s, a * load + load / lam, load / lam)
    assert _make("shifted-exponential").delay(0, 0, 1.0, 0.0) == 0.0


def test_pareto_mean_and_tail() -> None:
    tm, alpha = 0.1, 3.0
    s = _samples(_make("pareto", scale=tm, shape=alpha))
    assert s.min() >= tm
    std = tm * np.sqrt(alpha / ((alpha - 1) ** 2 * (alpha - 2)))
    _assert_mean(s, alpha * tm / (alpha - 1), std)
    p = 2.0**-alpha  # P(T > 2 t_m)
    assert abs(np.mean(s > 2 * tm) - p) < 5 * np.sqrt(p * (1 - p) / s.size)


def test_pareto_by_load_scales_the_same_draws_with_load() -> None:
    plain = _samples(_make("pareto", scale=0.1, shape=3.0), load=0.25, rounds=50)
    scaled = _samples(_make("pareto", scale=0.1, shape=3.0, by_load="true"), load=0.25, rounds=50)
    np.testing.assert_allclose(scaled, 0.25 * plain, rtol=1e-15)


def test_fixed_delays_exactly_count_workers_a_round() -> None:
    s = _samples(_make("fixed", count=3, delay=0.7))
    assert set(np.unique(s)) == {0.0, 0.7}
    assert np.all((s > 0).sum(axis=1) == 3)
    # each worker straggles with probability 3/8
    freq = (s > 0).mean(axis=0)
    assert np.all(np.abs(freq - 3 / 8) < 5 * np.sqrt((3 / 8) * (5 / 8) / ROUNDS))


def test_slowdown_multiplies_compute_time() -> None:
    model = _make("slowdown", count=2, factor=4.0)
    s = _samples(model, compute=0.5)
    assert set(np.unique(s)) == {0.0, 1.5}  # (κ − 1)·compute
    assert np.all((s > 0).sum(axis=1) == 2)
    assert model.delay(0, 0, 0.0, 1.0) == 0.0


@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("exponential", {"mean": 1.0}),
        ("shifted-exponential", {"shift": 1.0, "rate": 2.0}),
        ("pareto", {"scale": 1.0, "shape": 2.5}),
        ("fixed", {"count": 2, "delay": 1.0}),
        ("slowdown", {"count": 2, "factor": 3.0}),
    ],
)
def test_delays_are_a_pure_function_of_seed_round_worker(
    name: str, options: dict[str, Any]
) -> None:
    a = create_straggler_model(name, options, seed=5, n_workers=N_WORKERS)
    b = create_straggler_model(name, options, seed=5, n_workers=N_WORKERS)
    other = create_straggler_model(name, options, seed=6, n_workers=N_WORKERS)
    forward = _samples(a, rounds=20)
    # b asks in another order (backwards, one worker at a time): same values.
    backward = np.array(
        [[b.delay(w, r, 1.0, 1.0) for w in reversed(range(N_WORKERS))] for r in reversed(range(20))]
    )[::-1, ::-1]
    np.testing.assert_array_equal(forward, backward)
    # rounds differ from each other, and another seed gives other delays
    assert len({tuple(row) for row in forward}) > 15
    assert not np.array_equal(forward, _samples(other, rounds=20))


def test_fixed_chosen_workers_are_reported() -> None:
    model = create_straggler_model("fixed", {"count": 2}, seed=1, n_workers=5)
    assert isinstance(model, FixedDelay)
    chosen = model.chosen(7)
    assert len(chosen) == 2
    assert [model.delay(w, 7, 0.0, 1.0) > 0 for w in range(5)] == [w in chosen for w in range(5)]


def test_fail_stop_hangs_the_same_seeded_workers_from_start_on() -> None:
    model = _make("fail-stop", count=3, start=4)
    assert isinstance(model, FailStop)
    delays = _samples(model, rounds=10)
    assert not delays[:4].any()  # before start: everyone answers
    failed = [w for w in range(N_WORKERS) if np.isinf(delays[4:, w]).all()]
    assert failed == list(model.failed) and len(failed) == 3
    others = [w for w in range(N_WORKERS) if w not in failed]
    assert not delays[:, others].any()  # the same workers every round, the rest never
    # Chosen from the seed: the same in every process, and not always the same workers.
    assert _make("fail-stop", count=3).failed == model.failed
    picks = {
        create_straggler_model("fail-stop", {"count": 3}, seed=s, n_workers=N_WORKERS).failed
        for s in range(10)
    }
    assert len(picks) > 1


def test_crash_takes_the_seeded_first_holders_once_and_never_a_replacement() -> None:
    model = _make("crash", count=2, start=3, restart="0.5")
    assert isinstance(model, Crash)
    assert not _samples(model, rounds=10).any()  # it delays no one
    crashing = {
        w
        for w in range(N_WORKERS)
        for t in range(10)
        if crash_restart(model, w, t, replacement=False) is not None
    }
    assert crashing == set(model.failed) and len(crashing) == 2
    for w in model.failed:
        assert crash_restart(model, w, 2, replacement=False) is None  # before start
        assert crash_restart(model, w, 3, replacement=False) == 0.5
        assert crash_restart(model, w, 3, replacement=True) is None  # took the place mid-job
    assert _make("crash", count=2).failed == model.failed  # from the seed alone
    assert _make("crash", count=1).restart == math.inf  # default: never back
    # Every other model never crashes anyone.
    assert crash_restart(_make("fail-stop", count=2), 0, 5, replacement=False) is None


def test_trace_replay_json(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"delays": [[0.1, 0.2], [0.3, None]]}))
    model = create_straggler_model("trace", {"path": str(path)}, seed=0, n_workers=2)
    assert [model.delay(w, 0, 9.0, 1.0) for w in (0, 1)] == [0.1, 0.2]
    assert model.delay(0, 1, 9.0, 1.0) == 0.3
    with pytest.raises(DataError, match="worker 1 in round 1"):
        model.delay(1, 1, 0.0, 1.0)
    with pytest.raises(DataError, match="cycle"):
        model.delay(0, 2, 0.0, 1.0)
    cyc = create_straggler_model("trace", {"path": str(path), "cycle": "true"}, seed=0, n_workers=2)
    assert cyc.delay(1, 2, 0.0, 1.0) == 0.2


def test_trace_replay_csv(tmp_path: Path) -> None:
    path = tmp_path / "trace.csv"
    path.write_text("round,worker,delay\n0,0,0.5\n0,1,0\n1,1,2.5\n")
    model = create_straggler_model("trace", {"path": str(path)}, seed=0, n_workers=2)
    assert model.delay(0, 0, 0.0, 1.0) == 0.5
    assert model.delay(1, 1, 0.0, 1.0) == 2.5
    with pytest.raises(DataError, match="no delay for worker 0 in round 1"):
        model.delay(0, 1, 0.0, 1.0)


@pytest.mark.parametrize(
    ("filename", "text", "error", "match"),
    [
        ("t.json", "[[0.1]]", ConfigError, "records 1 workers"),
        ("t.json", "[[0.1, -1.0]]", DataError, "negative"),
        ("t.json", '{"x": 1}', DataError, "list of rounds"),
        ("t.json", '[[0.1, "slow"]]', DataError, "not seconds"),
        ("t.json", "[[0.1,", DataError, "cannot read"),
        ("t.csv", "r,w,d\n0,0,1\n", DataError, "header"),
        ("t.csv", "round,worker,delay\n0,x,1\n", DataError, "line 2"),
        ("t.txt", "0 0 1", ConfigError, ".json or .csv"),
    ],
)
def test_bad_traces(
    tmp_path: Path, filename: str, text: str, error: type[Exception], match: str
) -> None:
    path = tmp_path / filename
    path.write_text(text)
    with pytest.raises(error, match=match):
        create_straggler_model("trace", {"path": str(path)}, seed=0, n_workers=2)


def test_missing_trace_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        create_straggler_model("trace", {"path": str(tmp_path / "no.json")}, seed=0, n_workers=2)
    with pytest.raises(ConfigError, match="needs the option path"):
        create_straggler_model("trace", {}, seed=0, n_workers=2)


@pytest.mark.parametrize(
    ("name", "options", "match"),
    [
        ("exponentail", {}, "Did you mean exponential"),
        ("gamma", {}, "Valid models: none, exponential"),
        ("exponential", {"rate": 1.0}, "its options: mean"),
        ("none", {"mean": 1.0}, "none"),
        ("exponential", {"mean": -1.0}, "mean must be"),
        ("exponential", {"mean": "slow"}, "mean must be float"),
        ("exponential", {"mean": float("nan")}, "mean"),
        ("shifted-exponential", {"rate": 0.0}, "rate"),
        ("shifted-exponential", {"shift": -0.1}, "shift"),
        ("pareto", {"shape": 0.0}, "shape"),
        ("pareto", {"scale": -1.0}, "scale"),
        ("fixed", {"count": 9}, "0..8"),
        ("fixed", {"count": 1.5}, "count must be int"),
        ("fixed", {"delay": -2.0}, "delay"),
        ("slowdown", {"factor": 0.5}, "factor"),
        ("slowdown", {"count": True}, "count"),
        ("trace", {"path": "x.json", "cycle": "maybe"}, "cycle must be bool"),
        ("fail-stop", {"count": 9}, "0..8"),
        ("fail-stop", {"start": -1}, "start must be a round number >= 0"),
        ("fail-stop", {"start": 1.5}, "start must be int"),
        ("crash", {"count": 9}, "0..8"),
        ("crash", {"start": -1}, "start must be a round number >= 0"),
        ("crash", {"restart": "soon"}, "restart must be float"),
        ("crash", {"restart": "nan"}, "restart must be seconds >= 0, or < 0 for never"),
    ],
)
def test_bad_options(name: str, options: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        create_straggler_model(name, options, seed=0, n_workers=N_WORKERS)


def test_bad_seed_and_workers() -> None:
    with pytest.raises(ConfigError, match="seed"):
        create_straggler_model("exponential", {}, seed=-1, n_workers=2)
    with pytest.raises(ConfigError, match="n_workers"):
        create_straggler_model("exponential", {}, seed=0, n_workers=0)
    model = create_straggler_model("exponential", {}, seed=0, n_workers=2)
    with pytest.raises(ValueError, match="worker 2"):
        model.delay(2, 0, 0.0, 1.0)


def test_string_options_are_coerced_and_help_lists_every_model() -> None:
    model = create_straggler_model("fixed", {"count": "2", "delay": "0.5"}, seed=0, n_workers=4)
    assert sum(model.delay(w, 3, 0.0, 1.0) for w in range(4)) == pytest.approx(1.0)
    assert set(STRAGGLER_MODELS) == {
        "none",
        "exponential",
        "shifted-exponential",
        "pareto",
        "fixed",
        "slowdown",
        "speed-classes",
        "fail-stop",
        "crash",
        "trace",
    }
    for info in STRAGGLER_MODELS.values():
        assert info.description and info.describe()


def test_speed_classes_slow_half_the_pool_at_everything() -> None:
    model = _make("speed-classes", factor=3.0, mean=0.1)
    s = _samples(model, compute=0.5, rounds=200)
    slow = model.slow(0)
    assert slow.sum() == N_WORKERS // 2
    assert all(np.array_equal(model.slow(r), slow) for r in range(200))  # chosen once
    fast_wait = s[:, ~slow]
    _assert_mean(fast_wait, 0.1, 0.1)
    # A slow worker's round is 3 x (compute + its wait): delay 2·compute + 3·e.
    e = _samples(_make("exponential", mean=0.1), compute=0.5, rounds=200)
    np.testing.assert_allclose(s[:, slow], 2 * 0.5 + 3 * e[:, slow])
    np.testing.assert_allclose(s[:, ~slow], e[:, ~slow])


def test_speed_classes_redraw_and_calm_periods() -> None:
    rotating = _make("speed-classes", count=2, factor=5.0, every=50)
    sets = {tuple(np.flatnonzero(rotating.slow(p * 50))) for p in range(8)}
    assert len(sets) > 1 and all(len(s) == 2 for s in sets)
    assert all(np.array_equal(rotating.slow(50), rotating.slow(r)) for r in range(50, 100))
    calm = _make("speed-classes", count=2, factor=5.0, every=50, calm=True)
    assert calm.slow(10).sum() == 2 and calm.slow(60).sum() == 0 and calm.slow(110).sum() == 2
    assert calm.delay(0, 60, 1.0, 1.0) == 0.0
    with pytest.raises(ConfigError, match=r"calm alternates.*every > 0"):
        _make("speed-classes", calm=True)
    with pytest.raises(ConfigError, match="factor must be a finite number >= 1"):
        _make("speed-classes", factor=0.5)


@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("none", {}),
        ("exponential", {"mean": 0.2}),
        ("shifted-exponential", {"shift": 0.5, "rate": 3.0}),
        ("pareto", {"scale": 0.1, "shape": 1.5, "by_load": True}),
        ("fixed", {"count": 3, "delay": 2.0}),
        ("slowdown", {"count": 2, "factor": 4.0}),
        ("fail-stop", {"count": 2, "start": 3}),
        ("speed-classes", {"count": 3, "factor": 2.5, "mean": 0.1, "every": 4, "calm": True}),
    ],
)
def test_a_rounds_delays_at_once_equal_each_workers_delay(name: str, options: dict) -> None:
    from codedgd.services.stragglers import delays_of

    model = _make(name, **options)
    rng = np.random.default_rng(0)
    for r in range(12):
        workers = rng.permutation(N_WORKERS)[: int(rng.integers(1, N_WORKERS + 1))]
        compute = rng.random(len(workers))
        loads = rng.random(len(workers))
        one_by_one = [
            model.delay(int(w), r, float(c), float(ld))
            for w, c, ld in zip(workers, compute, loads, strict=True)
        ]
        np.testing.assert_array_equal(delays_of(model, workers, r, compute, loads), one_by_one)


def test_speed_classes_pool_keeps_the_slow_machines_and_not_the_luck() -> None:
    one = create_straggler_model(
        "speed-classes", {"count": 3, "mean": 0.1, "pool": 7}, seed=1, n_workers=N_WORKERS
    )
    two = create_straggler_model(
        "speed-classes", {"count": 3, "mean": 0.1, "pool": 7}, seed=2, n_workers=N_WORKERS
    )
    assert np.array_equal(one.slow(0), two.slow(0))  # type: ignore[attr-defined]
    assert one.delay(0, 0, 0.0, 1.0) != two.delay(0, 0, 0.0, 1.0)
    own = create_straggler_model("speed-classes", {"count": 3}, seed=7, n_workers=N_WORKERS)
    assert np.array_equal(own.slow(0), one.slow(0))  # type: ignore[attr-defined]
