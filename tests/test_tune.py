"""`codedgd tune`: fitting a run's delays, replaying them, and picking a policy that wins."""

from __future__ import annotations

import dataclasses
import json
import math
import multiprocessing
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from codedgd.services.codes.tree import TreeShape, shapes
from codedgd.services.errors import ConfigError, JobFailed
from codedgd.services.job import Component, JobConfig
from codedgd.services.job.prepare import prepare
from codedgd.services.policies.auto import group_size
from codedgd.services.records import RoundRecord
from codedgd.services.sim import CostModel, simulate
from codedgd.services.sim.engine import rows_per_round
from codedgd.services.stragglers import StragglerModel, create_straggler_model
from codedgd.services.tuning import (
    MIN_TAIL_SHAPE,
    TOPOLOGIES,
    DelayFit,
    Link,
    Observations,
    Outcome,
    ResampledDelay,
    auto_prior_names,
    auto_start,
    candidates,
    chance_limit,
    fit_delays,
    label,
    observe,
    observe_trace,
    parse_tail,
    redraw,
    search,
    step_sizes,
)
from codedgd.services.tuning.search import searched_trees, star_round_trip


def _censored_sample(draw, rounds: int = 400, n: int = 10, keep: int = 7, seed: int = 0):
    """Observations as a run waiting for the fastest ``keep`` of n would record them."""
    rng = np.random.default_rng(seed)
    excess = draw(rng, (rounds, n))
    censored = np.zeros_like(excess, dtype=bool)
    for i in range(rounds):
        order = np.argsort(excess[i])
        bound = excess[i, order[keep - 1]]
        censored[i, order[keep:]] = True
        excess[i, order[keep:]] = bound
    compute = np.where(censored, np.nan, 0.01)
    return Observations(excess, censored, compute)


def test_censored_exponential_delays_are_fitted_as_such_with_their_true_rate() -> None:
    obs = _censored_sample(lambda rng, shape: 0.1 + rng.exponential(1 / 5.0, shape))
    fit = fit_delays(obs)
    best = fit.best
    assert best.family == "shifted-exponential"
    assert best.params["shift"] == pytest.approx(0.1, abs=0.005)
    assert best.params["rate"] == pytest.approx(5.0, rel=0.08)
    # Ignoring the censoring would have fitted a much faster law.
    exact = obs.excess[~obs.censored]
    assert 1 / np.mean(exact - exact.min()) > 1.3 * 5.0
    assert best.ks < 0.05 < fit.fits[1].ks


def test_heavy_tailed_delays_are_fitted_as_pareto() -> None:
    obs = _censored_sample(lambda rng, shape: 0.05 * (1 + rng.pareto(1.8, shape)))
    best = fit_delays(obs).best
    assert best.family == "pareto"
    assert best.params["shape"] == pytest.approx(1.8, rel=0.1)
    assert best.params["scale"] == pytest.approx(0.05, rel=0.02)


def _first_of_groups_of_4(seed: int, rounds: int = 10, n: int = 16) -> Observations:
    """Exponential delays (mean 0.02 s) as ten rounds of groups of 4 record them: each
    group's first arrival answers, the other three are cancelled at the round's end."""
    rng = np.random.default_rng(seed)
    excess = rng.exponential(0.02, (rounds, n))
    first = excess.reshape(rounds, n // 4, 4).min(axis=2)
    censored = excess > first.repeat(4, axis=1)
    excess = np.where(censored, first.max(axis=1, keepdims=True), excess)
    return Observations(excess, censored, np.where(censored, np.nan, 0.01))


def test_censored_values_are_not_drawn_from_a_pareto_with_an_infinite_mean() -> None:
    fits = [fit_delays(_first_of_groups_of_4(seed)) for seed in range(8)]
    # Three values in four censored: the two families fit the first arrivals alike, and a
    # Pareto from the smallest value up is often the better by KS, at a shape far below 1.
    heavy = [f for f in fits if f.best.family == "pareto"]
    assert heavy and all(f.best.params["shape"] <= MIN_TAIL_SHAPE for f in heavy)
    for fit in fits:
        tail = fit.tail
        assert tail.family == "shifted-exponential" and not tail.why_not
        bound = np.full(20_000, 0.03)
        drawn = tail.tail_beyond(bound, np.random.default_rng(0))
        # Beyond a bound by about the delays' own spread, where the Pareto's median draw
        # is 2^(1/shape) times the bound: thousands of times at these shapes.
        assert np.all(drawn >= bound) and np.median(drawn) < 2 * 0.03
        pareto = next(f for f in fit.fits if f.family == "pareto")
        assert np.median(pareto.tail_beyond(bound, np.random.default_rng(0))) > 100 * 0.03


def test_a_pareto_of_finite_mean_is_drawn_from_when_it_fits_best() -> None:
    obs = _censored_sample(lambda rng, shape: 0.05 * (1 + rng.pareto(1.8, shape)))
    fit = fit_delays(obs)
    assert fit.best.family == "pareto" and fit.tail is fit.best
    # With the other family not fitted, the best is all there is, whatever its shape.
    lone = dataclasses.replace(
        fit,
        fits=(
            DelayFit("pareto", {"scale": 0.01, "shape": 0.3}, 0.05),
            DelayFit("shifted-exponential", {}, math.nan, "no spread above the minimum"),
        ),
    )
    assert lone.tail is lone.best


def test_a_replay_keeps_rounds_whole_and_completes_censored_values_above_their_bound() -> None:
    obs = _censored_sample(lambda rng, shape: 0.1 + rng.exponential(0.2, shape), rounds=30)
    fit = fit_delays(obs)
    replay = ResampledDelay(obs, fit.best, seed=4)
    workers = np.arange(10)
    for t in range(50):
        row = replay.delays(workers, t, np.zeros(10), np.ones(10))
        # Each replayed round is one recorded round, its censored entries drawn above the bound.
        # (Each worker's persistent excess is replayed as slowness instead: none here.)
        base = np.maximum(obs.excess - obs.persistent_excess(), 0.0)
        matches = [
            i
            for i in range(obs.rounds)
            if np.allclose(row[~obs.censored[i]], base[i][~obs.censored[i]])
            and np.all(row[obs.censored[i]] >= base[i][obs.censored[i]])
        ]
        assert matches, t
        assert replay.delay(3, t, 0.0, 1.0) == row[3]
    assert not np.array_equal(
        ResampledDelay(obs, fit.best, seed=1).delays(workers, 0, np.zeros(10), np.ones(10)),
        ResampledDelay(obs, fit.best, seed=2).delays(workers, 0, np.zeros(10), np.ones(10)),
    )


def test_a_slow_worker_stays_slow_in_proportion_to_its_load() -> None:
    rng = np.random.default_rng(3)
    rounds, n = 40, 6
    compute = np.full((rounds, n), 0.01)
    compute[:, 2] = 0.03  # worker 2 computes 3x slower
    excess = rng.exponential(0.01, (rounds, n))
    excess[:, 4] += 0.02  # worker 4 waits 0.02 s more every round: twice its compute
    obs = Observations(excess, np.zeros((rounds, n), dtype=bool), compute)
    slowness = obs.slowness()
    assert slowness[2] == pytest.approx(3.0, rel=0.15)
    assert slowness[4] == pytest.approx(3.0, rel=0.15)
    assert np.all(np.delete(slowness, [2, 4]) < 1.5)
    replay = ResampledDelay(obs, fit_delays(obs).best, seed=0)
    # A slower compute, and a floor 0.02 s higher: all of their slowness grows with load.
    assert obs.load_slowness()[[2, 4]] == pytest.approx(slowness[[2, 4]], rel=0.1)
    for w in (2, 4):
        base = replay.delay(w, 5, 0.0, 1.0)
        grown = (obs.load_slowness()[w] - 1) * 0.5
        assert replay.delay(w, 5, 0.5, 1.0) == pytest.approx(base + grown, rel=0.1)
    # At the recorded load, worker 4's replay is the recorded delay (the same rounds).
    replay_4 = [replay.delay(4, t, 0.01, 1.0) for t in range(200)]
    assert np.median(replay_4) == pytest.approx(np.median(excess[:, 4]), rel=0.25)
    assert min(replay_4) >= 0.02


def _speed_classes_run(
    compute: float, rounds: int = 200, n: int = 8, **options: object
) -> tuple[StragglerModel, Observations]:
    """Half of ``n`` workers 2x slower at everything (a wait e ~ Exp(0.05 s) too), observed
    over ``rounds`` rounds of ``compute`` seconds each: what a run of uncoded records."""
    model = create_straggler_model(
        "speed-classes", {"factor": 2.0, "mean": 0.05, **options}, seed=5, n_workers=n
    )
    workers = np.arange(n)
    excess = np.array(
        [model.delays(workers, t, np.full(n, compute), np.ones(n)) for t in range(rounds)]
    )
    obs = Observations(excess, np.zeros((rounds, n), dtype=bool), np.full((rounds, n), compute))
    return model, obs


def test_a_slower_wait_stays_at_any_load_and_only_the_slower_compute_grows() -> None:
    # Speed classes: a slow worker's delay is (2 − 1)·compute + 2·e. At four times the
    # load only the compute part is four times as long; its wait is as long as before.
    model, obs = _speed_classes_run(compute=0.05)
    slow = model.slow(0)
    assert 0 < int(slow.sum()) < 8
    assert np.all(obs.persistent_excess()[slow] > 0)
    assert np.all(obs.persistent_excess()[~slow] == 0)
    # At the run's load a slow worker takes well over twice a typical one (its wait is
    # twice as long too); the machine itself is twice as slow.
    assert np.all(obs.slowness()[slow] > 2.3)
    assert obs.load_slowness()[slow] == pytest.approx(np.full(int(slow.sum()), 2.0), rel=0.1)
    load = obs.load_excess()
    assert np.all(load[:, ~slow] == 0.0)
    assert np.all((load[:, slow] > 0.0) & (load[:, slow] <= obs.excess[:, slow]))
    # What grows is part of what the run showed, never more.
    assert np.all(obs.load_slowness() <= obs.slowness() + 1e-9)
    replay = ResampledDelay(obs, fit_delays(obs).best, seed=0)
    workers = np.arange(8)

    def mean_delays(delays: StragglerModel | ResampledDelay, load: float) -> np.ndarray:
        compute = np.full(8, 0.05 * load)
        rounds = [delays.delays(workers, t, compute, np.ones(8)) for t in range(400)]
        out: np.ndarray = np.mean(rounds, axis=0)
        return out

    # What four times the load adds (the same rounds at both loads: their luck cancels).
    true = mean_delays(model, 4.0) - mean_delays(model, 1.0)
    replayed = mean_delays(replay, 4.0) - mean_delays(replay, 1.0)
    assert true[slow] == pytest.approx(np.full(int(slow.sum()), 0.15))
    # Taking the whole persistent excess to grow with load, the replay added 0.21-0.29 s.
    assert replayed[slow] == pytest.approx(true[slow], rel=0.15)
    assert replayed[~slow] == pytest.approx(true[~slow], abs=1e-12)
    # At the run's load the replay is the record, waits and all.
    assert mean_delays(replay, 1.0) == pytest.approx(np.mean(obs.excess, axis=0), rel=0.15)


def test_a_wait_far_longer_than_compute_is_not_taken_to_grow_with_load() -> None:
    # Compute of 10 µs under waits of 0.05-0.1 s (real processes on a small job): a slow
    # worker's floor sits higher only as far as its twice-as-wide wait puts it.
    model, obs = _speed_classes_run(compute=1e-5)
    slow = model.slow(0)
    assert np.all(obs.slowness()[slow] > 1000)  # 2x the wait, over 10 µs of compute
    assert obs.load_slowness()[slow] == pytest.approx(np.ones(int(slow.sum())), abs=0.5)
    replay = ResampledDelay(obs, fit_delays(obs).best, seed=0)
    workers = np.arange(8)
    grown = [
        replay.delays(workers, t, np.full(8, 4e-5), np.ones(8))
        - replay.delays(workers, t, np.full(8, 1e-5), np.ones(8))
        for t in range(50)
    ]
    # The truth adds 30 µs; the whole persistent excess growing would add about 0.3 s.
    assert np.max(np.abs(grown)) < 1e-4


@pytest.mark.parametrize(("n", "count"), [(3, 1), (4, 2), (8, 4)])
def test_in_a_small_pool_a_wider_wait_is_not_taken_for_a_slower_machine(n: int, count: int) -> None:
    # Few typical workers say little of chance: the floor's own standard error must. A
    # slow worker (2x at everything) whose compute is 10 µs under waits of 0.05-0.1 s
    # is taken to grow by more than a few times its compute in at most one pool of
    # twenty (a four-standard-error test, itself read from the pool); without the error,
    # in ten to fourteen of them (67-2,121x).
    worst = []
    for seed in range(20):
        model = create_straggler_model(
            "speed-classes",
            {"factor": 2.0, "mean": 0.05, "count": count},
            seed=seed,
            n_workers=n,
        )
        workers = np.arange(n)
        excess = np.array(
            [model.delays(workers, t, np.full(n, 1e-5), np.ones(n)) for t in range(100)]
        )
        obs = Observations(excess, np.zeros((100, n), dtype=bool), np.full((100, n), 1e-5))
        worst.append(float(obs.load_slowness().max()))
    assert sum(w > 5 for w in worst) <= 1, worst


def test_a_worker_slow_in_some_rounds_grows_with_load_in_those_rounds_only() -> None:
    # Slow for rounds 0-49, calm after (alternating straggling). Its floor over the whole
    # run is its calm rounds': read so, its slow rounds would replay as recorded at any load.
    model, obs = _speed_classes_run(compute=0.05, rounds=100, every=50, calm=True)
    slow = model.slow(0)
    assert slow.any() and not model.slow(50).any()
    load = obs.load_excess()
    # (2 − 1)·compute, give or take the least of twenty waits above the floor.
    assert load[:50, slow] == pytest.approx(np.full((50, int(slow.sum())), 0.05), abs=0.012)
    # The first calm rounds can still read as slow where their delays are as long as the
    # slow floor (a fast wait of 0.03-0.05 s is not rare): two of them here, no later ones.
    assert np.count_nonzero(load[50:55]) <= 2
    assert np.all(load[55:, :] == 0.0)
    assert np.all(load[:, ~slow] == 0.0)


def test_the_floor_is_read_only_from_a_worker_answered_often_enough() -> None:
    _, obs = _speed_classes_run(compute=0.05, rounds=60)
    slow = obs.persistent_excess() > 0
    assert np.all(obs.load_slowness()[slow] < obs.slowness()[slow])
    # Cancelled in a third of its rounds, a slow worker's delays are bounds there: all of
    # its persistent excess is taken to grow with load, as before floors were read.
    censored = obs.censored.copy()
    w = int(np.flatnonzero(slow)[0])
    censored[::3, w] = True
    cut = dataclasses.replace(obs, censored=censored)
    assert np.all(cut.load_excess()[:, w] == cut.persistent_excess()[w])
    assert cut.load_slowness()[w] == pytest.approx(cut.slowness()[w])
    # Too few rounds to read a floor from: the same, for every slow worker.
    short = dataclasses.replace(
        obs, excess=obs.excess[:10], censored=obs.censored[:10], compute=obs.compute[:10]
    )
    assert np.all(short.load_excess() == short.persistent_excess()[None, :])


def _record(t: int, responses: dict[int, float], cancelled: int = 0) -> RoundRecord:
    return RoundRecord(
        round=t,
        wall_seconds=float(t + 1),
        round_seconds=1.0,
        wait_seconds=max(responses.values()),
        decode_seconds=0.0,
        compute_seconds_max=0.01,
        loss=1.0,
        metric=0.5,
        metric_name="auc",
        workers_used=tuple(responses),
        exact=True,
        decode_residual=0.0,
        bytes_up=0,
        bytes_down=0,
        uploads=len(responses),
        computations=len(responses) + cancelled,
        cancelled=cancelled,
        late_dropped=0,
        response_seconds=responses,
        worker_compute_seconds={w: 0.01 for w in responses},
    )


def test_a_cancelled_worker_is_censored_at_its_cancel_and_one_not_asked_is_not_seen() -> None:
    # Workers 0-3 answer; worker 4 is cancelled at 0.15 s, when its group was served, and
    # worker 5 when the round decoded (0.4 s); workers 6 and 7 are not asked.
    answers = {0: 0.1, 1: 0.2, 2: 0.3, 3: 0.4}
    rounds = [
        dataclasses.replace(_record(t, answers, cancelled=2), cancelled_seconds={4: 0.15, 5: 0.4})
        for t in range(6)
    ]
    obs = observe(rounds, 6)
    assert np.all(obs.censored[:, 4:]) and not obs.censored[:, :4].any()
    assert obs.excess[:, 4] == pytest.approx(np.full(6, 0.15 - 0.01))
    assert obs.excess[:, 5] == pytest.approx(np.full(6, 0.4 - 0.01))
    with pytest.raises(ConfigError, match=r"workers \[6, 7\] of the job's 8 appear in none"):
        observe(rounds, 8)
    with pytest.raises(ConfigError, match=r"cancelled workers \[9\].*another job"):
        observe([dataclasses.replace(r, cancelled_seconds={9: 0.2}) for r in rounds], 8)
    # A file of a version before cancelled_seconds says only how many were cancelled:
    # every worker that did not answer is taken to be, at the round's decode.
    old = observe([dataclasses.replace(r, cancelled_seconds={}) for r in rounds], 8)
    assert np.all(old.censored[:, 4:])
    assert old.excess[:, 4] == pytest.approx(np.full(6, 0.4 - 0.01))


def test_bad_records_are_refused_naming_what_is_missing() -> None:
    full = {w: 0.1 + 0.01 * w for w in range(4)}
    with pytest.raises(ConfigError, match=r"2 round.*at least 5"):
        observe([_record(0, full), _record(1, full)], 4)
    with pytest.raises(ConfigError, match=r"workers \[4\].*another job"):
        observe([_record(t, {**full, 4: 0.2}) for t in range(6)], 4)
    with pytest.raises(ConfigError, match=r"workers \[4, 5\] of the job's 6"):
        observe([_record(t, full) for t in range(6)], 6)
    with pytest.raises(ConfigError, match="records 3 workers but the job has 4"):
        observe_trace(np.ones((10, 3)), 4, 0.01)
    with pytest.raises(ConfigError, match=r"no delay for workers \[1\]"):
        observe_trace(np.where(np.arange(4) == 1, np.nan, 1.0) * np.ones((10, 4)), 4, 0.01)
    same = [_record(t, {w: 0.1 for w in range(4)}) for t in range(6)]
    with pytest.raises(ConfigError, match="all equal"):
        fit_delays(observe(same, 4))


def test_candidates_are_valid_for_n() -> None:
    names = {c.name for c in candidates(12)}
    assert names == {
        "uncoded", "ignore-stragglers", "frc", "cyclic", "erasurehead", "lag-ps", "g-lag", "lagc"
    }  # fmt: skip
    assert all(12 % (c.options["s"] + 1) == 0 for c in candidates(12, ["frc"]))
    assert all(12 % (c.options["s"] + 1) == 0 for c in candidates(12, ["g-lag"]))
    assert [c.name for c in candidates(7, ["frc", "erasurehead", "g-lag"])] == []  # 7 is prime
    # The lazy ones at the authors' trigger weight and a tenth of it.
    assert {c.options["xi"] for c in candidates(12, ["lag-ps", "g-lag", "lagc"])} == {1.0, 10.0}
    # At the authors' weight, also with the units near their trigger riding along; and
    # groups up to n/2 (at n = 8, groups of 4 were the fastest real g-lag).
    riding = [c for c in candidates(8, ["lag-ps", "g-lag", "lagc"]) if "ride" in c.options]
    assert {(c.name, c.options.get("s"), c.options["xi"], c.options["ride"]) for c in riding} == {
        ("lag-ps", None, 10.0, 0.5), ("g-lag", 1, 10.0, 0.5), ("g-lag", 3, 10.0, 0.5),
        ("lagc", 1, 10.0, 0.5),
    }  # fmt: skip
    # lag-wk saves uploads only, which links that cost nothing cannot show: not searched.
    with pytest.raises(ConfigError, match="cannot search lag-wk"):
        candidates(8, ["lag-wk"])


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CODEDGD_CACHE_DIR": str(cwd / "cache")}
    return subprocess.run(
        [sys.executable, "-m", "codedgd.client.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=600,
        env=env,
    )


def test_tune_says_when_censored_values_are_not_drawn_from_the_best_fit(tmp_path: Path) -> None:
    # A lazy run on groups of 4: three workers in four cancelled, exponential delays, in a
    # result file of a version before cancelled_seconds: each cancelled worker is bounded
    # at the round's decode, and the first arrivals are fitted better by a Pareto of shape
    # far below 1 (this seed).
    source = JobConfig(
        workers=16,
        rounds=20,
        seed=1,
        data=Component("synthetic", {"rows": 1600, "dim": 10}),
        policy=Component("g-lag", {"s": 3}),
        stragglers=Component("exponential", {"mean": 0.02}),
    )
    (tmp_path / "src.toml").write_text(_toml(source))
    done = _cli("simulate", "--config", "src.toml", "-o", "src.json", "--no-progress", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "src.json").read_text())
    for record in result["rounds"]:
        assert record.pop("cancelled_seconds") or not record["cancelled"]
    (tmp_path / "src.json").write_text(json.dumps(result))
    done = _cli(
        "tune", "src.json", "--policy", "uncoded", "--repeats", "1", "--no-progress",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "censored: cancelled workers" in lines[0]
    assert lines[1].startswith("  best fit pareto(") and "shape=0.0" in lines[1]
    assert lines[3].startswith(
        "  censored delays are drawn beyond their bounds from the shifted-exponential"
    )


def test_tune_picks_a_policy_that_beats_the_recorded_one_when_run(tmp_path: Path) -> None:
    # The source: uncoded on 8 workers, two random workers a round 1 s late.
    source = JobConfig(
        workers=8,
        rounds=30,
        seed=2,
        data=Component("synthetic", {"rows": 800, "dim": 10}),
        policy=Component("uncoded", {}),
        stragglers=Component("fixed", {"count": 2, "delay": 1.0}),
    )
    (tmp_path / "src.toml").write_text(_toml(source))
    done = _cli("simulate", "--config", "src.toml", "-o", "src.json", "--no-progress", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    done = _cli(
        "tune", "src.json", "--json", "--write", "best.toml", "--repeats", "2",
        "--write-auto", "jobs/auto.toml", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    ranked = doc["candidates"]
    best, uncoded = ranked[0], next(c for c in ranked if c["label"] == "uncoded")
    assert best["label"] != "uncoded"
    assert best["predicted_seconds"] < 0.6 * uncoded["predicted_seconds"]
    assert doc["fits"][0]["family"] in ("shifted-exponential", "pareto")
    # The written job is the source with the winner's policy, and it really is faster.
    chosen = JobConfig.from_toml(tmp_path / "best.toml")
    assert chosen.policy.name == best["policy"]["name"]
    assert chosen.replace(policy=source.policy) == source.replace(target_loss=None)
    target = doc["target_loss"]
    cost = CostModel.ideal()
    before = simulate(source.replace(target_loss=target, rounds=60), cost).records
    after = simulate(chosen.replace(target_loss=target, rounds=60), cost).records
    assert after[-1].loss <= target
    assert after[-1].wall_seconds < 0.6 * before[-1].wall_seconds
    # --write-auto: the same job with auto, started at the group size of the best-ranked
    # candidate auto can run (here every candidate reached the target).
    sizes = [group_size(c["policy"].pop("name"), c["policy"]) for c in ranked]
    r, origin = next((r, c) for r, c in zip(sizes, ranked, strict=True) if r is not None)
    assert doc["timings"] == "arrivals"  # a star's run: fitted from its arrivals
    # Its prior is the run's slowness of each worker (what tune printed), to 3 digits.
    prior = doc["auto_start"]["policy"].pop("prior")
    assert np.allclose([float(v) for v in prior.split(",")], doc["slowness"], rtol=5e-3)
    # And the law of its typical workers' delays, for the censored ones it draws.
    tail = doc["auto_start"]["policy"].pop("tail")
    law = parse_tail(tail)
    assert law is not None and law.family in ("shifted-exponential", "pareto")
    # What of it grows with load (what the search replays) is never more than all of it.
    assert len(doc["load_slowness"]) == len(doc["slowness"])
    assert all(
        1 <= g <= s + 1e-12 for g, s in zip(doc["load_slowness"], doc["slowness"], strict=True)
    )
    assert doc["auto_start"] == {
        "policy": {"name": "auto", "r": r},
        "from": origin["label"],
        "lr": "auto",  # (the run's own step: no --lr)
    }
    adaptive = JobConfig.from_toml(tmp_path / "jobs" / "auto.toml")  # (jobs/ made for it)
    assert adaptive.policy == Component("auto", {"r": r, "prior": prior, "tail": tail})
    assert adaptive.replace(policy=source.policy) == source.replace(target_loss=None)
    ran = simulate(adaptive.replace(target_loss=target, rounds=60), cost).records
    assert ran[-1].loss <= target


def _outcome(name: str, options: dict[str, object], *times: float) -> Outcome:
    return Outcome(Component(name, options), times=list(times))


def test_auto_starts_at_the_best_candidate_it_can_run_that_reached_the_target() -> None:
    ranked = [
        _outcome("cyclic", {"s": 1}, 1.0, 1.1),  # reached, but not one of auto's rules
        _outcome("g-lag", {"s": 3, "xi": 10.0}, math.inf, math.inf),  # never reached
        _outcome("erasurehead", {"r": 4, "K": 2}, 2.0),
        _outcome("frc", {"s": 1}, 3.0),
    ]
    started = auto_start(ranked)
    assert started is not None
    assert started[0] == Component("auto", {"r": 4}) and started[1] is ranked[2]
    assert auto_start(ranked[:2]) is None
    failed = dataclasses.replace(ranked[2], error="simulation failed")
    assert auto_start([failed, ranked[3]]) == (Component("auto", {"r": 2}), ranked[3])
    # With the run's observations, auto gets each worker's slowness as its prior; a
    # worker the run did not wait for in at least half its rounds gets an empty entry (a
    # cancelled worker's slowness is only a lower bound).
    rounds = 8
    excess = np.tile([0.01, 0.012, 0.5, 0.3], (rounds, 1)) + 0.002 * np.arange(rounds)[:, None]
    censored = np.zeros((rounds, 4), dtype=bool)
    censored[:, 3] = True  # worker 3: cancelled in every round
    censored[: rounds // 2 + 1, 1] = True  # worker 1: in more than half of them
    compute = np.where(censored, np.nan, 0.05)
    obs = Observations(excess, censored, compute)
    started = auto_start(ranked, obs)
    assert started is not None and started[0].options["r"] == 4
    prior = started[0].options["prior"].split(",")
    assert prior[1] == prior[3] == ""
    slowness = np.maximum(obs.slowness(), 1.0)
    assert [float(prior[0]), float(prior[2])] == pytest.approx(slowness[[0, 2]], rel=5e-3)
    assert float(prior[2]) > 5  # (0.5 s late on 0.05 s of compute)
    censored[:] = True  # no worker known: no prior
    assert auto_start(ranked, obs) == (Component("auto", {"r": 4}), ranked[2])


def _small_run(tmp_path: Path, rounds: int) -> None:
    """A finished run to tune on, in tmp_path/s.json: 4 workers, exponential delays."""
    source = JobConfig(
        workers=4,
        rounds=rounds,
        seed=1,
        data=Component("synthetic", {"rows": 400, "dim": 6}),
        stragglers=Component("exponential", {"mean": 0.1}),
    )
    (tmp_path / "src.toml").write_text(_toml(source))
    made = _cli("simulate", "-c", "src.toml", "-o", "s.json", "--no-progress", cwd=tmp_path)
    assert made.returncode == 0, made.stderr


def test_write_auto_from_a_coded_run_leaves_a_cancelled_worker_unknown(tmp_path: Path) -> None:
    # frc s=1 on 4 workers, worker 0 2 s late every round: its partner always answers
    # first and it is cancelled, so the run knows only that it is slower than the round.
    # Its prior entry is empty (not "typical"), and tune says so. (Workers 2 and 3 take
    # turns answering first, so both are known.)
    trace = tmp_path / "slow-one.json"
    rows = [
        [2.0, 0.01 + 0.002 * (t % 3), *((0.012, 0.016) if t % 2 else (0.016, 0.012))]
        for t in range(12)
    ]
    trace.write_text(json.dumps({"delays": rows}))
    source = JobConfig(
        workers=4,
        rounds=12,
        seed=1,
        data=Component("synthetic", {"rows": 400, "dim": 6}),
        policy=Component("frc", {"s": 1}),
        stragglers=Component("trace", {"path": str(trace)}),
    )
    (tmp_path / "src.toml").write_text(_toml(source))
    made = _cli("simulate", "-c", "src.toml", "-o", "s.json", "--no-progress", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    done = _cli(
        "tune", "s.json", "--policy", "frc", "--write-auto", "a.toml", "--no-progress",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "its prior, each worker's slowness on this run, does not know workers [0]" in done.stdout
    options = JobConfig.from_toml(tmp_path / "a.toml").policy.options
    prior = options["prior"].split(",")
    assert prior[0] == "" and all(float(v) >= 1 for v in prior[1:])
    # The slow worker was the trace's place 0, not a machine: the prior stays by place.
    assert "prior_names" not in options
    assert "its prior is by place: the run's delays were its straggler model's" in done.stdout


def test_the_machine_named_for_a_place_is_the_one_that_held_it_longest() -> None:
    base = _record(0, {0: 0.1})
    records = [
        dataclasses.replace(base, round=t, holders=held)
        for t, held in enumerate(
            [{0: "a", 1: "b", 2: "c"}, {}, {}, {}, {1: "d#5"}, {2: "e"}, {}, {}, {}, {}]
        )
    ]
    # b held place 1 four rounds, d (its replacement) six; c and e five each: a tie.
    assert auto_prior_names(records, 3, "run.json") == ["a", "d#5", ""]
    assert auto_prior_names(records[1:4], 3, "run.json") == ["", "", ""]  # none named
    forged = [dataclasses.replace(base, holders={1: "b\nERROR forged"})]
    with pytest.raises(ConfigError, match=r"run.json: round 0 names 'b\\nERROR forged' the"):
        auto_prior_names(forged, 3, "run.json")
    with pytest.raises(ConfigError, match="holder of place 5, which is no worker name"):
        auto_prior_names([dataclasses.replace(base, holders={5: "a"})], 3, "run.json")


def test_write_auto_without_a_candidate_auto_can_run_says_so_and_writes_nothing(
    tmp_path: Path,
) -> None:
    _small_run(tmp_path, 10)  # s.json
    done = _cli(
        "tune", "s.json", "--policy", "cyclic", "--write-auto", "a.toml", "--no-progress",
        cwd=tmp_path,
    )  # fmt: skip
    # None of the policies searched is one auto can start from: refused before the search.
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--write-auto starts auto at the group size of a candidate" in done.stderr
    assert "--policy searches none of them: add one" in done.stderr
    assert "Traceback" not in done.stderr and "candidates" not in done.stdout
    assert not (tmp_path / "a.toml").exists()
    # A job file that cannot be written is refused before the search: a directory, or the
    # same file for both.
    (tmp_path / "jobs").mkdir()
    folder = _cli("tune", "s.json", "--write-auto", "jobs", cwd=tmp_path)
    assert folder.returncode == 2 and "Traceback" not in folder.stderr
    assert "--write-auto jobs is a directory" in folder.stderr
    assert "candidates" not in folder.stdout  # (no search was run)
    twice = _cli("tune", "s.json", "--write", "j.toml", "--write-auto", "./j.toml", cwd=tmp_path)
    assert twice.returncode == 2 and "both name j.toml" in twice.stderr
    assert "candidates" not in twice.stdout and not (tmp_path / "j.toml").exists()
    # With --write too: neither file is written when --write-auto cannot be.
    both = _cli(
        "tune", "s.json", "--policy", "cyclic", "--write", "w.toml", "--write-auto", "a.toml",
        cwd=tmp_path,
    )  # fmt: skip
    assert both.returncode == 2 and not (tmp_path / "w.toml").exists()


def test_tune_aims_at_a_gap_to_the_optimum(tmp_path: Path) -> None:
    _small_run(tmp_path, 12)  # s.json
    done = _cli(
        "tune", "s.json", "--json", "--target-gap", "0.05", "--policy", "uncoded", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["target_loss"] == pytest.approx(doc["optimal_loss"] * 1.05)
    assert [c["label"] for c in doc["candidates"]] == ["uncoded"]
    assert len(list((tmp_path / "cache").glob("optimum-*.json"))) == 1
    both = _cli("tune", "s.json", "--target-gap", "0.05", "--target-loss", "1", cwd=tmp_path)
    assert both.returncode == 2 and "not allowed with argument" in both.stderr


def test_tune_refuses_a_file_that_is_not_a_result_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "x.json").write_text("[1, 2]")
    done = _cli("tune", "x.json", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.startswith("codedgd tune: error:") and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def _toml(config: JobConfig) -> str:
    import tomli_w

    doc = config.to_dict()
    doc["job"] = {k: v for k, v in doc["job"].items() if v is not None}
    return tomli_w.dumps(doc)


def test_outcome_numbers_are_finite_or_null() -> None:
    from codedgd.services.tuning import Outcome

    o = Outcome(Component("uncoded", {}), times=[1.0, math.inf], rounds=[3, math.inf])
    d = o.to_dict()
    assert d["times_seconds"] == [1.0, None]
    assert d["rounds_to_target"] == [3, None]
    assert d["predicted_seconds"] is None  # the median of one hit and one miss: a miss
    assert d["interval_seconds"] == [1.0, None]
    json.dumps(d, allow_nan=False)


def test_speed_aware_candidates_only_for_a_pool_of_unequal_speeds() -> None:
    assert not [c for c in candidates(8, speeds=[1.0] * 8) if c.name == "hetero"]
    mixed = [c for c in candidates(8, speeds=[1, 1, 1, 1, 2, 2, 2, 2]) if c.name == "hetero"]
    assert [c.options["s"] for c in mixed] == [0, 1]
    assert mixed[0].options["speeds"] == "0.5,0.5,0.5,0.5,1,1,1,1"
    assert label(mixed[0]) == "hetero s=0 speeds=0.5,0.5,0.5,0.5,1,1,1,1"
    # At n = 64 the table shows the speeds by their count and range; the job keeps them.
    wide = [c for c in candidates(64, speeds=[1.0] * 32 + [2.0] * 32) if c.name == "hetero"]
    assert label(wide[1]) == "hetero s=1 speeds=[64: 0.5-1]"
    assert wide[1].options["speeds"].count(",") == 63


def test_chance_differences_between_workers_are_not_taken_for_slow_machines() -> None:
    # i.i.d. delays 100x the compute: the workers' medians differ by chance only.
    rng = np.random.default_rng(5)
    excess = rng.exponential(0.1, (40, 8))
    obs = Observations(excess, np.zeros((40, 8), dtype=bool), np.full((40, 8), 0.001))
    assert np.all(obs.persistent_excess() == 0.0)
    assert float(obs.slowness().max()) < 1.25
    assert not [c for c in candidates(8, speeds=1.0 / obs.slowness()) if c.name == "hetero"]


def test_the_slow_worker_limit_grows_with_the_pool_so_64_equal_workers_pass_for_equal() -> None:
    # 40 pools of 64 workers, 100 rounds of i.i.d. delays each: the unluckiest worker of a
    # pool passes a flat three standard errors in most pools, the default limit (3.8 at
    # n = 64) in about one pool in 20; a worker truly half a mean delay slower is found.
    assert [round(chance_limit(n), 1) for n in (8, 16, 64)] == [3.2, 3.4, 3.8]
    rng = np.random.default_rng(11)
    chance, flat, found = 0, 0, 0
    for _ in range(40):
        excess = rng.exponential(0.1, (100, 64))
        obs = Observations(excess, np.zeros(excess.shape, dtype=bool), np.full((100, 64), 1e-3))
        chance += bool(obs.persistent_excess().any())
        flat += bool(dataclasses.replace(obs, chance_sigmas=3.0).persistent_excess().any())
        excess[:, 7] += 0.05
        slow = dataclasses.replace(obs, excess=excess).persistent_excess()
        found += bool(slow[7] > 0 and not np.delete(slow, 7).any())
    assert chance <= 4 < 15 <= flat
    assert found >= 34


def test_a_mini_batch_source_is_costed_on_the_rows_its_rounds_used() -> None:
    # The source computed 0.01 s a round over its samples of 10 rows of each partition
    # (not over the 100 rows each partition holds): a candidate with the same load must
    # be predicted to compute about as long, not 10x less.
    source = JobConfig(
        workers=4,
        rounds=20,
        seed=2,
        data=Component("synthetic", {"rows": 500, "dim": 5, "test_fraction": 0.2}),
        batch_size=10,
    )
    prepared = prepare(source, None)
    assert rows_per_round(prepared, 10).tolist() == [10.0] * 4
    assert rows_per_round(prepared, 0).tolist() == [100.0] * 4
    # Each response: the 0.01 s compute and up to 4 ms of delay beyond it.
    records = [_record(t, {w: 0.01 + 0.002 * ((t + w) % 3) for w in range(4)}) for t in range(20)]
    obs = observe(records, 4)
    tail = fit_delays(obs).best
    [uncoded] = search(
        source, obs, tail, target_loss=-1.0, rounds=5, repeats=1, policies=["uncoded"]
    )
    assert 0.01 <= uncoded.round_seconds[0] <= 0.0145


def test_the_search_tries_every_tree_of_n_workers_with_a_root_fanout_where_it_differs() -> None:
    """(root m₀, fanout m, levels): n = m₀·(1 + m + … + m^(L−1)), m₀ and m >= 2."""
    assert shapes(12) == [(12, 12, 1), (4, 2, 2), (3, 3, 2), (2, 5, 2)]
    assert shapes(14) == [(14, 14, 1), (2, 6, 2), (2, 2, 3)]  # 2 + 4 + 8: regular
    assert shapes(64) == [(64, 64, 1), (16, 3, 2), (8, 7, 2), (4, 15, 2), (2, 31, 2)]
    assert shapes(7) == [(7, 7, 1)]
    every: dict[int, set[tuple[int, int, int]]] = {}
    for root in range(2, 100):
        for fanout in range(2, 100):
            for levels in range(2, 8):
                n = TreeShape(fanout, levels, 0, root=root).n_workers
                if n < 100:
                    every.setdefault(n, set()).add((root, fanout, levels))
    for n in range(2, 100):
        assert set(shapes(n)) == every.get(n, set()) | {(n, n, 1)}, n
    # A pool of many divisors has dozens of trees: the search keeps the four deeper ones
    # of the shortest critical path (m₀ + (L − 1)·m), at 720 of 29 of them.
    assert len(shapes(720)) == 1 + 29
    kept = [shape for shape in searched_trees(720) if shape[2] > 1]
    assert sorted(kept) == [(18, 3, 4), (24, 29, 2), (30, 23, 2), (48, 2, 4)]  # 27, 53, 53, 54
    assert searched_trees(64) == shapes(64)
    labels = [label(c) for c in candidates(12, TOPOLOGIES)]
    assert labels == [
        "ring-allreduce",
        "tree fanout=12 levels=1",
        "tree fanout=2 levels=2 root=4",
        "tree fanout=3 levels=2",
        "tree fanout=5 levels=2 root=2",
        "codedreduce fanout=12 levels=1 s=1",
        "codedreduce fanout=12 levels=1 s=6",
        "codedreduce fanout=2 levels=2 root=4 s=1",
        "codedreduce fanout=3 levels=2 s=1",
        "codedreduce fanout=5 levels=2 root=2 s=1",
    ]


def _source_12() -> tuple[JobConfig, Observations]:
    source = JobConfig(
        workers=12,
        rounds=20,
        seed=4,
        data=Component("synthetic", {"rows": 1200, "dim": 8}),
        stragglers=Component("exponential", {"mean": 0.05}),
    )
    records = simulate(source, CostModel.ideal().replace(compute="model")).records
    return source, observe(records, 12)


def test_topologies_are_searched_over_a_stated_link_and_pay_its_hops() -> None:
    source, obs = _source_12()
    tail = fit_delays(obs).best
    with pytest.raises(ConfigError, match="--link-latency"):
        search(source, obs, tail, target_loss=-1.0, rounds=4, repeats=1, policies=["tree"])

    def by_label(link: Link) -> dict[str, float]:
        out = search(source, obs, tail, target_loss=-1.0, rounds=4, repeats=1, link=link)
        assert not [o.error for o in out if o.error]
        return {o.label: float(np.mean(o.round_seconds)) for o in out}

    free = by_label(Link(0.0, math.inf))
    assert {"ring-allreduce", "codedreduce fanout=3 levels=2 s=1", "frc s=1"} <= set(free)
    # Free links: the ring waits for every worker, as uncoded does, and no longer.
    assert free["ring-allreduce"] == pytest.approx(free["uncoded"], rel=0.05)
    # 50 ms a hop: the ring's 2(n-1) = 22 steps a round cost it over a second; the star
    # policies are unchanged (their network time is in the recorded delays).
    slow = by_label(Link(0.05, math.inf))
    assert slow["ring-allreduce"] > free["ring-allreduce"] + 1.0
    assert slow["uncoded"] == pytest.approx(free["uncoded"], rel=1e-3)  # (decode is timed)
    with pytest.raises(ConfigError, match="latency"):
        Link(-1.0, 1e9)


def test_the_coordinators_nic_queues_a_stars_messages_which_a_tree_spreads() -> None:
    """The coordinator's NIC carries all of a star's n copies of θ and n gradients, one
    after another; a tree's root hears only its children. Over links where one message
    (θ of 8 values, 64 bytes) takes 10 ms, from a run whose delays hold no network time:"""
    source, obs = _source_12()
    tail = fit_delays(obs).best

    def rounds(coordinator: float | None) -> dict[str, float]:
        out = search(
            source, obs, tail, target_loss=-1.0, rounds=4, repeats=1,
            policies=["uncoded", "tree"], link=Link(0.0, 6400.0, coordinator),
            network_in_delays=False,
        )  # fmt: skip
        assert not [o.error for o in out if o.error]
        return {o.label: float(np.mean(o.round_seconds)) for o in out}

    deeper = [
        "tree fanout=2 levels=2 root=4",
        "tree fanout=3 levels=2",
        "tree fanout=5 levels=2 root=2",
    ]
    unlimited, shared, faster = rounds(math.inf), rounds(None), rounds(5 * 6400.0)
    # An unlimited coordinator: the star's n links work at once, and every hop a tree
    # adds is a cost.
    assert all(unlimited["uncoded"] < unlimited[t] for t in deeper), unlimited
    # As fast as a worker's link (the default): twelve messages each way queue on it,
    # and every two-level tree is ahead of the star.
    assert shared["uncoded"] > unlimited["uncoded"] + 0.05, (shared, unlimited)
    assert all(shared[t] < shared["uncoded"] for t in deeper), shared
    # A coordinator five times faster than its workers' links: the star again.
    assert all(faster["uncoded"] < faster[t] for t in deeper), faster
    with pytest.raises(ConfigError, match="coordinator's bandwidth"):
        Link(0.001, 1e9, 0.0)
    assert Link(0.001, 1e9).to_dict()["coordinator_bandwidth_bytes_per_second"] == 1e9
    assert Link(0.001, 1e9, math.inf).to_dict()["coordinator_bandwidth_bytes_per_second"] is None


def test_lazy_candidates_wait_for_fewer_workers_and_are_predicted_as_they_run() -> None:
    # The source: uncoded at n = 12 with exponential delays. g-lag's rounds contact only
    # the groups whose trigger fires and use each one's first arrival: fewer computations
    # and shorter rounds than uncoded's, on the replayed delays as on the true law.
    source, obs = _source_12()
    tail = fit_delays(obs).best
    policies = ["uncoded", "lag-ps", "g-lag"]
    out = {
        o.label: o
        for o in search(
            source, obs, tail, target_loss=-1.0, rounds=30, repeats=2, policies=policies
        )
    }
    assert {"lag-ps xi=1.0", "lag-ps xi=10.0", "g-lag s=1 xi=10.0", "g-lag s=2 xi=10.0"} <= set(out)
    assert not [o.error for o in out.values() if o.error]
    lazy, uncoded = out["g-lag s=1 xi=10.0"], out["uncoded"]
    assert np.mean(lazy.computations) < 12 == np.mean(uncoded.computations)
    assert np.mean(lazy.round_seconds) < 0.8 * np.mean(uncoded.round_seconds)
    assert not lazy.exact  # stale messages: not the exact gradient
    # What the prediction promises, against a run of it on the delays' true law.
    run = source.replace(rounds=30, policy=Component("g-lag", {"s": 1, "xi": 10.0}))
    truth = simulate(run, CostModel.ideal().replace(compute="model")).records
    true_round = float(np.mean([r.round_seconds for r in truth]))
    assert np.mean(lazy.round_seconds) == pytest.approx(true_round, rel=0.3)


def test_every_repeat_of_a_candidate_is_a_job_of_its_own() -> None:
    # On the same delays each time, every repeat of a lazy candidate is the same run: no
    # messages, θ history or finished warm-up carried over from the repeat before.
    source, obs = _source_12()
    tail = fit_delays(obs).best

    def same_delays(rep: int) -> StragglerModel:
        return create_straggler_model("exponential", {"mean": 0.05}, seed=7, n_workers=12)

    (lazy,) = [
        o
        for o in search(
            source, obs, tail, target_loss=-1.0, rounds=30, repeats=3, policies=["g-lag"],
            delays=same_delays, cost=CostModel.ideal(),  # (nothing timed: delays alone)
        )
        if o.label == "g-lag s=1 xi=10.0"
    ]  # fmt: skip
    assert len(set(lazy.computations)) == 1 and len(set(lazy.round_seconds)) == 1, lazy


def test_tune_wants_both_link_flags_or_neither(tmp_path: Path) -> None:
    (tmp_path / "x.json").write_text("{}")
    done = _cli("tune", "x.json", "--link-latency", "0.001", cwd=tmp_path)
    assert done.returncode == 2 and "--link-bandwidth" in done.stderr
    assert "Traceback" not in done.stderr
    # The coordinator's NIC is part of the links: alone it says so; of no bandwidth,
    # before any probe runs.
    done = _cli("tune", "x.json", "--coordinator-bandwidth", "1e9", cwd=tmp_path)
    assert done.returncode == 2 and "give --link-latency and --link-bandwidth too" in done.stderr
    assert "Traceback" not in done.stderr
    done = _cli("tune", "x.json", "--probe-links", "--coordinator-bandwidth", "0", cwd=tmp_path)
    assert done.returncode == 2 and "--coordinator-bandwidth must be bytes/s > 0" in done.stderr


def test_tune_says_when_a_star_runs_arrivals_hold_the_coordinators_queue(
    tmp_path: Path,
) -> None:
    """Six workers, θ of 500 values (4 kB) over 25 kB/s links and a coordinator NIC of
    the same rate: θ's six copies take about a second to leave it, and each worker's
    recorded delay holds its place in that queue. Told those links, tune says so."""
    done = _cli(
        "simulate", "-n", "6", "-r", "5", "--data-opt", "rows=600", "--data-opt", "dim=500",
        "--bandwidth", "25e3", "--ingress-bandwidth", "25e3", "--egress-bandwidth", "25e3",
        "--stragglers", "exponential", "--straggler-opt", "mean=0.05",
        "--no-progress", "-o", "star.json", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    tune = ["tune", "star.json", "--no-progress", "--repeats", "1", "--policy", "uncoded"]
    slow = ["--link-latency", "0.0002", "--link-bandwidth", "25e3"]
    # By default its workers' own times are read: no queue in them, nothing to say.
    done = _cli(*tune, *slow, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "coordinator's NIC" not in done.stderr, done.stderr
    assert "each worker's own time from θ to its result" in done.stdout
    # Read by its arrivals (--star-times arrivals), the queue is in them: said.
    tune += ["--star-times", "arrivals"]
    done = _cli(*tune, *slow, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "the coordinator's NIC (0.025 MB/s each way) needs 0.96 s a round" in done.stderr
    # The run was simulated with fifo copies (simulate's default): its file says so,
    # and tune reads it so unless told otherwise.
    assert "(--coordinator-sharing fifo: a later worker waited longer)" in done.stderr
    done = _cli(*tune, *slow, "--coordinator-sharing", "fair", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "(--coordinator-sharing fair: each worker's wait the same)" in done.stderr
    assert json.loads(done.stdout)["coordinator_sharing"] == "fair"
    # A coordinator said to be unlimited, or links fast enough: nothing to say.
    for links in ([*slow, "--coordinator-bandwidth", "inf"], [*slow[:3], "1.25e9"]):
        done = _cli(*tune, *links, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        assert "coordinator's NIC" not in done.stderr, done.stderr


# Eight equal workers, θ of 500 values (4 kB), exponential delays of mean 5 ms.
EIGHT_EQUAL = JobConfig(
    workers=8,
    rounds=30,
    seed=4,
    data=Component("synthetic", {"rows": 800, "dim": 500}),
    stragglers=Component("exponential", {"mean": 0.005}),
)


def test_thetas_queue_at_the_coordinator_is_a_place_in_it_not_a_slower_machine() -> None:
    """Eight equal workers; θ (500 values, 4 kB) leaves the coordinator's NIC at 400 kB/s,
    a copy every 10 ms in worker order: worker 7's arrivals are 70 ms later than worker
    0's every round. Read as recorded, the last workers are slower machines; with the
    queue taken out, every worker is typical, and a star candidate's replay puts the
    queue back in its own rounds."""
    job = EIGHT_EQUAL
    cost = CostModel.ideal().replace(
        compute="model", seconds_per_sample=1e-5, egress_bandwidth_bytes_per_second=4e5
    )
    records = simulate(job, cost).records
    as_recorded, queue_out = observe(records, 8), observe(records, 8, coordinator_egress=4e5)
    late = np.median(as_recorded.excess, axis=0)
    assert late[7] - late[0] == pytest.approx(0.07, abs=0.01)
    assert as_recorded.load_slowness().max() > 10  # (taken for a far slower machine)
    # Out exactly: what is left is the injected delay (median 0.005·ln 2), no queue.
    assert np.median(queue_out.excess) == pytest.approx(0.005 * math.log(2), abs=0.001)
    assert np.median(queue_out.excess, axis=0).max() < 0.008
    np.testing.assert_array_equal(queue_out.load_slowness(), 1.0)
    assert queue_out.coordinator_egress == 4e5
    assert queue_out.queue_taken is not None
    np.testing.assert_allclose(queue_out.queue_taken[0], 0.01 * np.arange(1, 9))
    # Sent side by side (fair), every copy arrives after all eight copies' time: the
    # same wait for everyone, taken out as such.
    fair = simulate(job, cost.replace(sharing="fair")).records
    side_by_side = observe(fair, 8, coordinator_egress=4e5, coordinator_sharing="fair")
    assert np.median(side_by_side.excess) == pytest.approx(0.005 * math.log(2), abs=0.001)
    assert side_by_side.queue_taken is not None
    np.testing.assert_allclose(side_by_side.queue_taken, 0.08)
    # The copies read as side by side where they went one after another: no one is
    # taken to have waited longer than the round's first answer took in all.
    misread = observe(records, 8, coordinator_egress=4e5, coordinator_sharing="fair")
    assert misread.queue_taken is not None
    first = np.nanmin(as_recorded.excess, axis=1)
    np.testing.assert_allclose(misread.queue_taken.max(axis=1), np.minimum(first, 0.08))
    assert (misread.excess >= 0).all() and (np.nanmin(misread.excess, axis=1) == 0).all()
    [out] = search(
        job, queue_out, fit_delays(queue_out).best, target_loss=-1.0, rounds=10, repeats=1,
        policies=["uncoded"],
    )  # fmt: skip
    true_round = float(np.median([r.round_seconds for r in records]))
    assert float(np.median(out.round_seconds)) == pytest.approx(true_round, rel=0.15)
    with pytest.raises(ConfigError, match="coordinator's egress"):
        observe(records, 8, coordinator_egress=0.0)


def test_a_star_workers_own_times_hold_no_queue_and_every_candidate_pays_the_links() -> None:
    """As above, θ's copies leave the coordinator's NIC one after another (and the
    gradients come in so), but each worker also sends its own time from θ to its result
    ready: read by those, every worker is typical with no model of the queue, and a
    candidate that pays the links (the NIC's queue with them) predicts the round."""
    job = EIGHT_EQUAL
    cost = CostModel.ideal().replace(
        compute="model",
        seconds_per_sample=1e-5,
        egress_bandwidth_bytes_per_second=4e5,
        ingress_bandwidth_bytes_per_second=4e5,
    )
    records = simulate(job, cost).records
    assert all(
        r.topology == "star" and set(r.ready_seconds) == set(r.response_seconds) for r in records
    )
    own = observe(records, 8, star_times="own")
    assert np.median(own.excess) == pytest.approx(0.005 * math.log(2), abs=0.001)
    assert np.median(own.excess, axis=0).max() < 0.008  # (the last in the queue too)
    np.testing.assert_array_equal(own.load_slowness(), 1.0)
    assert own.coordinator_egress is None and own.queue_taken is None
    link = Link(0.0, math.inf, 4e5)
    [out] = search(
        job, own, fit_delays(own).best, target_loss=-1.0, rounds=10, repeats=1,
        policies=["uncoded"], link=link, network_in_delays=False,
    )  # fmt: skip
    true_round = float(np.median([r.round_seconds for r in records]))
    assert float(np.median(out.round_seconds)) == pytest.approx(true_round, rel=0.1)
    # A cancelled worker's bound is its cancel less the round's longest network time.
    r = dataclasses.replace(
        records[0],
        response_seconds={0: 0.5, 1: 0.3},
        ready_seconds={0: 0.2, 1: 0.25},
        worker_compute_seconds={0: 0.1, 1: 0.1},
        cancelled_seconds={2: 0.6},
    )
    bounded = observe([r] * 5, 3, min_rounds=5, star_times="own")
    assert bounded.censored[0].tolist() == [False, False, True]
    np.testing.assert_allclose(bounded.excess[0], [0.1, 0.15, 0.6 - 0.3 - 0.1])
    # Records whose workers sent no own times cannot be read so: said, not guessed.
    bare = [dataclasses.replace(x, ready_seconds={}) for x in records]
    with pytest.raises(ConfigError, match="no own times"):
        observe(bare, 8, star_times="own")


def test_star_times_own_needs_the_links_and_the_workers_own_times(tmp_path: Path) -> None:
    done = _cli(
        "simulate", "-n", "4", "-r", "12", "--data-opt", "rows=400", "--data-opt", "dim=20",
        "--no-progress", "-o", "flat.json", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    tune = ["tune", "flat.json", "--no-progress", "--repeats", "1", "--policy", "uncoded"]
    links = ["--link-latency", "0.001", "--link-bandwidth", "1e8"]
    done = _cli(*tune, *links, cwd=tmp_path)  # (no straggler model: no straggling at all)
    assert done.returncode == 2 and "(--star-times arrivals)" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    tune = _star_run(tmp_path, "star.json")
    done = _cli(*tune, "--star-times", "own", cwd=tmp_path)
    assert done.returncode == 2 and "state them (--link-latency" in done.stderr, done.stderr
    doc = json.loads((tmp_path / "star.json").read_text())
    for r in doc["rounds"]:
        r["ready_seconds"] = {}
    (tmp_path / "old.json").write_text(json.dumps(doc))
    done = _cli(*tune[:1], "old.json", *tune[2:], *links, "--star-times", "own", cwd=tmp_path)
    assert done.returncode == 2 and "give --star-times arrivals" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    # Without the flag, such a file is read by its arrivals, as before.
    done = _cli(*tune[:1], "old.json", *tune[2:], *links, "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["timings"] == "arrivals"
    done = _cli(*tune, *links, "--json", cwd=tmp_path)
    assert json.loads(done.stdout)["timings"] == "own"


def _star_run(tmp_path: Path, name: str, *cost: str) -> list[str]:
    """A simulated star run into ``name`` (4 workers, 12 rounds, exponential delays of
    10 ms; ``cost``: simulate's cost flags), and tune's command on it."""
    done = _cli(
        "simulate", "-n", "4", "-r", "12", "--data-opt", "rows=400", "--data-opt", "dim=20",
        "--stragglers", "exponential", "--straggler-opt", "mean=0.01", *cost,
        "--no-progress", "-o", name, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return ["tune", name, "--no-progress", "--repeats", "1", "--policy", "uncoded"]


def test_a_links_burst_is_stated_with_the_links_and_charged_on_every_nic(tmp_path: Path) -> None:
    tune = _star_run(tmp_path, "star.json")
    done = _cli(*tune, "--link-burst", "65536", cwd=tmp_path)
    assert done.returncode == 2 and "--link-burst goes with the links" in done.stderr
    links = ["--link-latency", "0.001", "--link-bandwidth", "1e6"]
    done = _cli(*tune, *links, "--link-burst", "-1", cwd=tmp_path)
    assert done.returncode == 2 and "--link-burst must be a number of bytes" in done.stderr
    done = _cli(*tune, *links, "--link-burst", "65536", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["link"]["burst_bytes"] == 65536
    # By the arrivals, the coordinator's bucket shaped a queue tune cannot take out.
    done = _cli(*tune, *links, "--link-burst", "65536", "--star-times", "arrivals", cwd=tmp_path)
    assert done.returncode == 2 and "leave --link-burst out" in done.stderr, done.stderr
    done = _cli(*tune, "--trace", "star.json", "--star-times", "own", cwd=tmp_path)
    assert done.returncode == 2 and "--star-times says how to read" in done.stderr
    cost = Link(0.001, 1e6, burst_bytes=65536).charged(CostModel())
    assert cost.burst_bytes == 65536 and cost.egress_bandwidth_bytes_per_second == 1e6


def test_a_pool_on_one_machine_pays_each_messages_cpu_on_its_cores(tmp_path: Path) -> None:
    """--cores: the pool's processes share one machine; every candidate that pays the
    links pays its messages' CPU there too, a ring's 4(n - 1) + 2 hops a worker-round
    most of all."""
    source, obs = _source_12()
    tail = fit_delays(obs).best
    link = Link(0.0, math.inf)

    def ring(cores: float | None) -> float:
        out = search(
            source, obs, tail, target_loss=-1.0, rounds=4, repeats=1,
            policies=["ring-allreduce"], link=link, cores=cores,
        )  # fmt: skip
        assert not [o.error for o in out if o.error]
        return float(np.mean(out[0].round_seconds))

    alone, shared, crowded = ring(None), ring(64.0), ring(1.0)
    # 46 hops in a row of 0.2-0.3 ms at each end: over 10 ms a round more, unshared;
    # 12 workers on one core slow each other further.
    assert shared > alone + 0.01
    assert crowded > shared
    with pytest.raises(ConfigError, match="give the links too"):
        search(source, obs, tail, target_loss=-1.0, rounds=4, repeats=1, cores=2.0)
    tune = _star_run(tmp_path, "star.json")
    done = _cli(*tune, "--cores", "2", cwd=tmp_path)
    assert done.returncode == 2 and "--cores charges each message's CPU" in done.stderr
    links = ["--link-latency", "0.001", "--link-bandwidth", "1e6"]
    done = _cli(*tune, *links, "--cores", "0", cwd=tmp_path)
    assert done.returncode == 2
    assert "cores must be a finite number >= 0.01, 'local' or 'none'" in done.stderr
    done = _cli(*tune, *links, "--cores", "2", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["cores"] == 2.0
    assert "charged its sharing twice" not in done.stderr  # (compute: microseconds)
    # A run whose compute is most of its rounds: its compute, timed on that machine,
    # would be shared on the cores again. Said.
    busy = _star_run(tmp_path, "busy.json", "--seconds-per-sample", "0.001")
    done = _cli(*busy, *links, "--cores", "2", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "charged its sharing twice" in done.stderr, done.stderr


def test_a_run_whose_processes_all_ran_on_one_machine_is_tuned_on_its_cores(
    tmp_path: Path,
) -> None:
    """Each worker names its machine in its Hello and the coordinator records them with
    its own: a run whose processes all said the same machine is tuned as --cores of its
    count, with the links known (a note says so, and how to turn it off); a pool of
    several machines, or one without the links, is told, not charged."""
    tune = _star_run(tmp_path, "star.json")
    doc = json.loads((tmp_path / "star.json").read_text())

    def machines(*ids: str, coordinator: str = "aa") -> list[str]:
        """The run's records, its four workers on machines ``ids`` and the coordinator on
        ``coordinator``, written to a file of its own; tune's command on it."""
        named = dict(doc)
        first = dict(doc["rounds"][0])
        first["machines"] = {str(w): {"id": m, "cpus": 2} for w, m in enumerate(ids)}
        first["coordinator_machine"] = {"id": coordinator, "cpus": 2}
        named["rounds"] = [first, *doc["rounds"][1:]]
        path = tmp_path / f"{''.join(ids)}-{coordinator}.json"
        path.write_text(json.dumps(named))
        return [path.name if a == "star.json" else a for a in tune]

    links = ["--link-latency", "0.001", "--link-bandwidth", "1e6", "--json"]

    def tuned(*args: str) -> tuple[dict[str, Any], str]:
        done = _cli(*args, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout), done.stderr

    one = machines("aa", "aa", "aa", "aa")
    out, said = tuned(*one, *links)
    assert (out["cores"], out["cores_from"]) == (2.0, "run")
    assert out["tied"] == []  # (one candidate searched: no tie to tell)
    assert "ran on one machine (2 cores)" in said and "--cores none" in said
    apart, _ = tuned(*one, *links, "--cores", "none")
    assert (apart["cores"], apart["cores_from"]) == (None, None)
    # On the shared cores each message costs CPU at both ends: slower rounds.
    shared_round = out["candidates"][0]["mean_round_seconds"]
    assert shared_round > apart["candidates"][0]["mean_round_seconds"]
    stated, said = tuned(*one, *links, "--cores", "3")
    assert (stated["cores"], stated["cores_from"]) == (3.0, "stated")
    assert "ran on one machine" not in said
    # Without the links there is nothing to charge the CPU beside: said, not charged.
    done = _cli(*one, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "with the links known" in done.stderr and "(as --cores 2)" in done.stderr
    # Two machines: the model has one shared machine only; each process gets its own.
    out, said = tuned(*machines("aa", "aa", "aa", "bb"), *links)
    assert (out["cores"], out["cores_from"]) == (None, None)
    assert "ran on 2 machines" in said and "some share a machine" in said
    # A machine each, or the simulator's records (which name none): nothing to say.
    for run in (machines("aa", "bb", "cc", "dd", coordinator="ee"), tune):
        out, said = tuned(*run, *links)
        assert out["cores"] is None and "machine" not in said


def test_from_a_star_run_a_trees_hops_replace_the_stars_round_trip() -> None:
    """A star run over 50 ms links: every recorded response holds 0.1 s of round trip.
    A tree of 2 × (1 + 3) pays four hops a round (θ down two levels, the sums up two);
    replayed from the star's delays it pays them instead of the star's round trip, not
    on top of it (which put it 0.1 s a round slower than it runs)."""
    job = JobConfig(
        workers=8,
        rounds=30,
        seed=4,
        data=Component("synthetic", {"rows": 800, "dim": 8}),
        stragglers=Component("exponential", {"mean": 0.02}),
    )
    cost = CostModel.ideal().replace(compute="model", seconds_per_sample=1e-5, latency_seconds=0.05)
    star = simulate(job, cost).records
    tree = simulate(job.replace(policy=Component("tree", {"fanout": 3, "root": 2})), cost)
    obs = observe(star, 8)
    predicted = {
        o.label: float(np.median(o.round_seconds))
        for o in search(
            job, obs, fit_delays(obs).best, target_loss=-1.0, rounds=10, repeats=1,
            policies=["uncoded", "tree"], link=Link(0.05, math.inf),
        )
    }  # fmt: skip
    true_tree = float(np.median([r.round_seconds for r in tree.records]))
    true_star = float(np.median([r.round_seconds for r in star]))
    assert predicted["tree fanout=3 levels=2 root=2"] == pytest.approx(true_tree, rel=0.05)
    assert predicted["uncoded"] == pytest.approx(true_star, rel=0.05)
    # What the star's delays held, per worker and round: two hops of 50 ms.
    trip = star_round_trip(obs, Link(0.05, math.inf), 64)
    np.testing.assert_allclose(trip, 0.1)
    # With θ's queue on the coordinator's NIC (64 bytes at 3,200 bytes/s, 20 ms a copy,
    # the workers' links as fast): the queue taken out and then the round trip, what
    # is left of each response is its compute and injected delay alone.
    slow = cost.replace(bandwidth_bytes_per_second=3200.0, egress_bandwidth_bytes_per_second=3200.0)
    queued = simulate(job, slow).records
    seen = observe(queued, 8, coordinator_egress=3200.0)
    left = seen.less(star_round_trip(seen, Link(0.05, 3200.0), 64))
    assert np.median(left.excess) == pytest.approx(0.02 * math.log(2), abs=0.004)
    assert np.median(left.excess, axis=0).max() < 0.03


def test_a_family_that_could_not_be_fitted_is_null_in_the_json() -> None:
    failed = DelayFit("pareto", {"scale": 0.1, "shape": math.nan}, math.nan, "no tail")
    doc = json.loads(json.dumps(failed.to_dict(), allow_nan=False))
    assert doc == {"family": "pareto", "params": {"scale": 0.1, "shape": None}, "ks": None,
                   "why_not": "no tail"}  # fmt: skip


def test_a_dip_below_the_target_is_not_reaching_it_only_a_stay_is() -> None:
    # An approximate rule near its noise floor: its loss touches the target at round 2
    # and goes back above; from round 4 on it stays there. The search counts round 4
    # (the run stops once the stay is HOLD rounds long), not the dip.
    from codedgd.services.tuning.search import HOLD, _Held, _Reach

    losses = [0.9, 0.6, 0.49, 0.52, 0.5, 0.48, 0.49, 0.47, 0.5, 0.46, 0.45]
    reach = _Reach(target=0.5)
    stopped_at = None
    for t, loss in enumerate(losses):
        record = RoundRecord(
            round=t, wall_seconds=t + 1.0, round_seconds=1.0, wait_seconds=1.0,
            decode_seconds=0.0, compute_seconds_max=0.0, loss=loss, metric=0.5,
            metric_name="auc", workers_used=(), exact=False, decode_residual=0.0, bytes_up=0,
            bytes_down=0, uploads=0, computations=0, cancelled=0, late_dropped=0,
        )  # fmt: skip
        try:
            reach(record)
        except _Held:
            stopped_at = t
            break
    assert reach.hit is not None and reach.hit.round == 4
    assert stopped_at == 4 + HOLD - 1
    # A run whose rounds end while it is still there counts as there; a NaN loss is not.
    short = _Reach(target=0.5)
    for t, loss in enumerate([0.6, 0.4, math.nan, 0.45]):
        short(dataclasses.replace(record, round=t, loss=loss))
    assert short.hit is not None and short.hit.round == 3
    # hold=1 is the first touch (where a job given the target stops): the dip counts.
    touch = _Reach(target=0.5, hold=1)
    with pytest.raises(_Held):
        for t, loss in enumerate(losses):
            touch(dataclasses.replace(record, round=t, loss=loss))
    assert touch.hit is not None and touch.hit.round == 2


def test_a_search_in_several_processes_finds_what_one_process_finds() -> None:
    # Same simulations, so the same outcomes in the same order (a fixed decode time: a
    # timed one is the machine's and varies), with the progress told once per replay.
    source, obs = _source_12()
    tail = fit_delays(obs).best
    cost = CostModel(seconds_per_sample=1e-5, seconds_per_partition=0.0, decode_seconds=1e-4)
    target = simulate(source.replace(policy=Component("frc", {"s": 1})), cost).records[-1].loss
    steps: list[list[str]] = []
    found = []
    for jobs in (1, 2):
        steps.append([])
        found.append(
            search(
                source, obs, tail, target_loss=target, rounds=40, repeats=2, cost=cost,
                policies=["uncoded", "frc", "erasurehead"], jobs=jobs, on_step=steps[-1].append,
            )
        )  # fmt: skip
    one, two = found
    assert [o.to_dict() for o in two] == [o.to_dict() for o in one]
    assert len(one) >= 5 and any(o.reached for o in one) and not any(o.error for o in one)
    assert sorted(steps[1]) == sorted(steps[0]) and len(steps[0]) == 2 * len(one)
    # So do the predictions on redrawn sources (--source-draws), run in the processes too.
    drawn = [
        [
            o.drawn
            for o in search(
                source, obs, tail, target_loss=target, rounds=40, repeats=2, cost=cost,
                policies=["frc"], jobs=jobs, draws=2, drawn_top=2,
            )
        ]
        for jobs in (1, 2)
    ]  # fmt: skip
    assert drawn[0] == drawn[1] and [len(d) for d in drawn[0][:2]] == [2, 2]


def test_tune_refuses_a_negative_number_of_processes(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "codedgd.client.cli", "tune", "x.json", "--jobs", "-1"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert done.returncode == 2 and "--jobs must be >= 0" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_search_process_that_dies_fails_the_search_saying_what_to_do() -> None:
    source, obs = _source_12()
    tail = fit_delays(obs).best

    def kill_the_processes(step: str) -> None:  # (once the first candidate is done)
        for child in multiprocessing.active_children():
            os.kill(child.pid, signal.SIGKILL)

    with pytest.raises(JobFailed, match=r"search in fewer \(--jobs\) or in this process"):
        search(
            source, obs, tail, target_loss=-1.0, rounds=40, repeats=1, jobs=2,
            policies=["uncoded", "frc", "erasurehead"], on_step=kill_the_processes,
        )  # fmt: skip


def test_step_sizes_keep_each_step_once_as_a_job_file_gives_it() -> None:
    # "auto" and "1/L" are one step; "0.5" typed on a command line is the number 0.5.
    assert step_sizes(["auto", "1/L", "0.5", 0.5, "0.5/L", 2]) == ["auto", 0.5, "0.5/L", 2.0]
    assert step_sizes([" 2 / l", ".50/L"]) == ["2/L", "0.5/L"]  # (as a job file shows it)
    for bad in ("x", 0, -1, "nan", True, "0/L"):
        with pytest.raises(ConfigError, match=r"0\.5/L"):
            step_sizes([bad])


def test_a_search_over_step_sizes_runs_every_candidate_at_each_and_names_it() -> None:
    source, obs = _source_12()
    tail = fit_delays(obs).best
    policies = ["uncoded", "frc"]
    one_step = search(source, obs, tail, target_loss=-1.0, rounds=3, repeats=1, policies=policies)
    assert [o.label for o in one_step] and all("lr=" not in o.label for o in one_step)
    # Loose enough for the small step to get there too, in more rounds.
    target = simulate(source.replace(rounds=30), CostModel.ideal()).records[-1].loss
    out = search(
        source, obs, tail, target_loss=target, rounds=120, repeats=1, policies=policies,
        steps=["0.5/L", "2/L"],
    )  # fmt: skip
    assert len(out) == 2 * len(one_step) and not [o.error for o in out if o.error]
    one_over_l = prepare(source, None).lr
    by_label = {o.label: o for o in out}
    for o in one_step:
        small, large = by_label[f"{o.label} lr=0.5/L"], by_label[f"{o.label} lr=2/L"]
        assert small.step_size == pytest.approx(0.5 * one_over_l)
        assert large.step_size == pytest.approx(2 * one_over_l)
        assert small.to_dict()["lr"] == "0.5/L" and large.policy == small.policy
        # The step is what the candidate ran at: twice 1/L takes fewer rounds than half.
        assert large.reached and small.reached and large.rounds[0] < small.rounds[0]
    assert [o.predicted for o in out] == sorted(o.predicted for o in out)


def test_tune_writes_the_step_size_it_chose_with_the_policy(tmp_path: Path) -> None:
    _small_run(tmp_path, 20)  # s.json (lr = "auto")
    done = _cli(
        "tune", "s.json", "--json", "--policy", "uncoded", "--policy", "frc",
        "--lr", "0.25/L", "--lr", "2/L", "--write", "w.toml", "--write-auto", "a.toml",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    ranked = doc["candidates"]
    assert {c["lr"] for c in ranked} == {"0.25/L", "2/L"}
    assert ranked[0]["lr"] == "2/L"  # (a larger step: fewer rounds to the run's own loss)
    written = JobConfig.from_toml(tmp_path / "w.toml")
    assert written.optimizer["lr"] == ranked[0]["lr"]
    assert written.policy.name == ranked[0]["policy"]["name"]
    origin = next(c for c in ranked if c["label"] == doc["auto_start"]["from"])
    assert JobConfig.from_toml(tmp_path / "a.toml").optimizer["lr"] == origin["lr"]
    ran = _cli("run", "-c", "w.toml", "-o", "w.json", "--no-progress", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    # A step that is none of the forms: one line, before any search.
    bad = _cli("tune", "s.json", "--lr", "fast", cwd=tmp_path)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "tune --lr 'fast' is not a step size" in bad.stderr and "candidates" not in bad.stdout


def test_a_dip_of_a_path_the_delays_do_not_change_is_where_a_job_stops() -> None:
    # g-lag at twice 1/L on this job: its loss falls to round 37, goes back up at 38 and
    # on down after (lazy steps overshoot), the same whatever the delays. A job given
    # that loss as its target stops at round 37, so the search predicts that, not the
    # later stay it asks of a path the delays decide.
    source, obs = _source_12()
    tail = fit_delays(obs).best
    lazy = Component("g-lag", {"s": 1, "xi": 10.0, "ride": 0.5})
    job = source.replace(policy=lazy, rounds=60, optimizer={"lr": "2/L"})
    losses = [r.loss for r in simulate(job, CostModel.ideal()).records]
    target = losses[37]
    assert min(losses[:37]) > target and losses[38] > target  # (the dip)
    stopped = simulate(job.replace(target_loss=target), CostModel.ideal()).records
    assert len(stopped) == 38

    def rounds_to_target(repeats: int) -> list[float]:
        ranked = search(
            source, obs, tail, target_loss=target, rounds=60, repeats=repeats,
            policies=["g-lag"], steps=["2/L"],
        )  # fmt: skip
        (outcome,) = [o for o in ranked if o.policy == lazy]
        return outcome.rounds

    assert rounds_to_target(2) == [38, 38]
    # One replay cannot show that the delays decide nothing: the stay is asked.
    (alone,) = rounds_to_target(1)
    assert alone > 38 + 1


def test_replays_along_different_losses_are_not_the_same_path() -> None:
    from codedgd.services.tuning.search import _Reach, _same_path

    def replay(losses: list[float]) -> _Reach:
        reach = _Reach(target=0.5, hold=100)
        for t, loss in enumerate(losses):
            reach(dataclasses.replace(_record(t, {0: 0.01}), loss=loss))
        return reach

    dip = [0.9, 0.6, 0.49, 0.52, 0.48]
    assert _same_path([replay(dip), replay(dip)])
    assert _same_path([replay(dip), replay([*dip[:3], 0.7, 0.8])])  # (the same to the touch)
    assert not _same_path([replay(dip), replay([0.9, 0.61, 0.49, 0.52, 0.48])])
    assert not _same_path([replay(dip), replay([0.9, 0.6, 0.52, 0.49, 0.48])])
    assert not _same_path([replay(dip)])  # one replay shows nothing
    assert not _same_path([replay([0.9, 0.8]), replay([0.9, 0.8])])  # never there
    assert not _same_path([replay([0.9, math.nan, 0.4]), replay([0.9, math.nan, 0.4])])


def _drawn(obs: Observations, draws: int) -> list[Outcome]:
    """The search of _source_12's job over ``obs``'s delays, the two best candidates
    predicted again on ``draws`` redrawn sources."""
    source, _ = _source_12()
    cost = CostModel(seconds_per_sample=1e-5, seconds_per_partition=0.0, decode_seconds=1e-4)
    target = simulate(source.replace(policy=Component("frc", {"s": 1})), cost).records[-1].loss
    return search(
        source, obs, fit_delays(obs).tail, target_loss=target, rounds=40, repeats=2,
        cost=cost, policies=["uncoded", "frc", "ignore-stragglers"], draws=draws, drawn_top=2,
    )  # fmt: skip


def test_a_redrawn_source_is_the_sources_rounds_drawn_whole() -> None:
    _, obs = _source_12()
    drawn = redraw(obs, np.random.default_rng(0))
    assert drawn.excess.shape == obs.excess.shape
    # Whole rounds (who was slow together stays together), some twice, some not at all.
    rows = [int(np.flatnonzero((obs.excess == row).all(axis=1))[0]) for row in drawn.excess]
    assert np.array_equal(drawn.compute, obs.compute[rows])
    assert len(set(rows)) < obs.rounds


def test_the_top_candidates_are_predicted_again_on_redrawn_sources() -> None:
    # One source run is one sample of the cluster's delays: the replays' range does not
    # show how another run would have moved the prediction; the redrawn sources do.
    _, obs = _source_12()
    out = _drawn(obs, draws=3)
    best = [o for o in out if o.reached][:2]
    assert [len(o.drawn) for o in out] == [3, 3] + [0] * (len(out) - 2) and best == out[:2]
    assert all(o.source_interval is not None for o in best)
    assert [o.drawn for o in _drawn(obs, draws=3)[:2]] == [o.drawn for o in best]  # seeded
    doc = best[0].to_dict()
    assert doc["source_draws_seconds"] == best[0].drawn
    assert doc["source_interval_seconds"] == [min(best[0].drawn), max(best[0].drawn)]
    assert out[2].to_dict()["source_interval_seconds"] is None
    with pytest.raises(ConfigError, match="given delays"):  # (an exhaustive search's)
        search(
            *_source_12(), fit_delays(obs).tail, target_loss=-1.0, rounds=4, repeats=1,
            draws=1, delays=lambda rep: create_straggler_model("none", {}, seed=0, n_workers=12),
        )  # fmt: skip
    # They move with the source's luck: a source of 20 rounds of exponential delays.
    assert any(max(o.drawn) > min(o.drawn) for o in best)
    # A source whose every round was the same has no luck to redraw: every redrawn source
    # is the source itself, and so is every prediction.
    same = observe_trace(np.tile(np.linspace(0.01, 0.12, 12), (20, 1)), 12, 1e-3)
    for o in _drawn(same, draws=3)[:2]:
        assert o.drawn == [o.predicted] * 3, o.drawn


def test_tune_prints_the_range_over_redrawn_sources_and_refuses_a_negative_count(
    tmp_path: Path,
) -> None:
    source, _ = _source_12()
    (tmp_path / "src.toml").write_text(_toml(source))
    done = _cli("simulate", "--config", "src.toml", "-o", "src.json", "--no-progress", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    done = _cli("tune", "src.json", "--source-draws", "-1", cwd=tmp_path)
    assert done.returncode != 0 and "--source-draws must be >= 0" in done.stderr
    assert "Traceback" not in done.stderr
    args = ("tune", "src.json", "--policy", "frc", "--repeats", "1", "--no-progress", "-j", "1")
    done = _cli(*args, "--source-draws", "2", "--top", "2", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    header = next(line for line in done.stdout.splitlines() if line.startswith("| rank"))
    assert "| over source draws (s) |" in header
    rows = [line for line in done.stdout.splitlines() if line.startswith("| 1 |")]
    assert len(rows) == 1 and rows[0].count("|") == header.count("|")
    plain = _cli(*args, "--top", "2", cwd=tmp_path)
    assert "over source draws" not in plain.stdout


@pytest.mark.parametrize(
    "policy",
    [["ring-allreduce"], ["codedreduce", "--param", "fanout=2"], ["tree", "--param", "fanout=2"]],
)
def test_tune_fits_a_topology_run_from_its_workers_own_times_over_the_stated_links(
    policy: list[str], tmp_path: Path
) -> None:
    """A ring's workers report when the whole ring is done, a tree's through their
    parents: the arrivals are the topology's. Each worker's own time from θ to its message
    comes along (ready_seconds) and is what tune fits; it holds no network time, so the
    links must be stated. A file without those times (before 2026-11-30) is refused:
    fitted from its arrivals, a codedreduce run of six workers gave 100 of its 120 values
    as cancelled at the round's end."""
    # codedreduce with fanout 2 and s = 1: each parent sums one child of two, and the
    # root one of its two level-1 nodes; a worker is timed in fewer rounds.
    rounds = "30" if policy[0] == "codedreduce" else "8"
    done = _cli(
        "simulate", "-n", "6", "--policy", *policy, "-r", rounds, "--stragglers",
        "exponential", "-o", "src.json", "--no-progress", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    doc = json.loads((tmp_path / "src.json").read_text())
    for record in doc["rounds"]:
        ready = {int(w): s for w, s in record["ready_seconds"].items()}
        compute = {int(w): s for w, s in record["worker_compute_seconds"].items()}
        assert set(ready) == set(record["workers_used"])  # everyone whose message counted
        assert all(ready[w] >= compute[w] >= 0 for w in ready)
        # A leaf its parent left out: bounded by the siblings it used (here one).
        for w, bound in record["left_out_seconds"].items():
            sibling = int(w) + 1 if int(w) % 2 == 0 else int(w) - 1  # leaves 2,3 and 4,5
            assert bound == ready[sibling] and int(w) not in ready
    done = _cli("tune", "src.json", "--no-progress", cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"src.json is a run of {policy[0]}" in done.stderr
    assert "--link-latency SECONDS --link-bandwidth BYTES_PER_S" in done.stderr
    links = ["--link-latency", "0.0002", "--link-bandwidth", "1.25e9"]
    done = _cli(
        "tune", "src.json", "--no-progress", "--repeats", "1",
        "--policy", "uncoded", "--policy", policy[0], *links, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"a {policy[0]} run: each worker's own time" in done.stdout
    # The root sums one of its two subtrees: half the worker-rounds are never timed.
    noted = "of src.json (50%) were not observed: the subtrees its codedreduce tree did"
    assert (noted in done.stderr) == (policy[0] == "codedreduce"), done.stderr
    censored = int(done.stdout.split(" censored")[0].rsplit("(", 1)[1])
    # Own times, not the arrivals at the round's end; only codedreduce leaves leaves out.
    assert (censored > 0) == (policy[0] == "codedreduce"), done.stdout
    assert "censored: leaves a parent left out)" in done.stdout
    done = _cli(
        "tune", "src.json", "--no-progress", "--repeats", "1", "--json",
        "--policy", "uncoded", *links, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["timings"] == "own"
    # The links every candidate paid, the coordinator's NIC as fast as a worker's link.
    assert json.loads(done.stdout)["link"] == {
        "latency_seconds": 0.0002,
        "bandwidth_bytes_per_second": 1.25e9,
        "coordinator_bandwidth_bytes_per_second": 1.25e9,
        "burst_bytes": 0.0,
    }
    for record in doc["rounds"]:
        record.pop("ready_seconds")  # as a file of an older version
    (tmp_path / "old.json").write_text(json.dumps(doc))
    done = _cli("tune", "old.json", *links, "--no-progress", cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"old.json is a run of {policy[0]} recorded without its workers' own" in done.stderr
    assert "--probe JOB.toml --coordinator HOST:PORT" in done.stderr


def test_tune_names_the_workers_a_tree_did_without_for_longer_than_chance(
    tmp_path: Path,
) -> None:
    """codedreduce never waits for a slow worker: its delays there are not in the run,
    and tune says which workers it did without round after round. One slow machine of
    eight (50x), on 2 × (1 + 3): the uncoded run of the same pool says which it is."""
    pool = [
        "-n", "8", "-r", "40", "--seed", "4", "--stragglers", "speed-classes",
        "--straggler-opt", "count=1", "--straggler-opt", "factor=50",
        "--straggler-opt", "mean=0.0001",
        "--data-opt", "rows=800", "--data-opt", "dim=5", "--no-progress",
    ]  # fmt: skip
    tree = ["--policy", "codedreduce", "--param", "fanout=3", "--param", "root=2"]
    for name, policy in (("tree.json", tree), ("star.json", ["--policy", "uncoded"])):
        done = _cli("simulate", *pool, *policy, "-o", name, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    star = json.loads((tmp_path / "star.json").read_text())["rounds"]
    median = [np.median([r["response_seconds"][str(w)] for r in star]) for w in range(8)]
    slow = int(np.argmax(median))
    assert median[slow] > 3 * sorted(median)[4]
    # A leaf (this seed): a level-1 worker's subtree would be timed in no round, which
    # tune refuses, naming it (test_a_topology_runs_timings_are_the_workers_own_and_...).
    assert slow >= 2
    links = ["--link-latency", "0.0002", "--link-bandwidth", "1.25e9"]
    done = _cli(
        "tune", "tree.json", "--no-progress", "--repeats", "1", "--policy", "uncoded",
        "--json", *links, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    named = done.stderr.split("tree.json went without workers ")[1].split("]")[0] + "]"
    assert slow in json.loads(named), done.stderr
    assert "how slow they were then is not in the run" in done.stderr
    went = json.loads(done.stdout)["went_without"]
    assert [int(w) for w in went] == json.loads(named) and went[str(slow)] == 40
    # The star's run waited for everyone: nothing to say.
    done = _cli(
        "tune", "star.json", "--no-progress", "--repeats", "1", "--policy", "uncoded",
        "--json", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0 and "went without" not in done.stderr, done.stderr
    assert json.loads(done.stdout)["went_without"] == {}


def test_a_topology_runs_timings_are_the_workers_own_and_put_the_network_on_the_links() -> None:
    """observe() takes ready − compute of each timed worker, censors a leaf its parent
    left out at its bound less the round's compute, and leaves an inner node left out
    unobserved; search() then charges every candidate, the star's too, the stated link."""
    rounds = [
        _record(t, {0: 0.5, 1: 0.5})  # the reporters' arrivals: the topology's
        for t in range(6)
    ]
    rounds = [
        dataclasses.replace(
            r,
            cancelled=0,
            ready_seconds={0: 0.125 + t, 1: 0.25, 2: 0.375},
            worker_compute_seconds={0: 0.125, 1: 0.125, 2: 0.125},
        )
        for t, r in enumerate(rounds)
    ]
    rounds[2] = dataclasses.replace(rounds[2], ready_seconds={0: 2.125, 1: 0.25})
    rounds[3] = dataclasses.replace(
        rounds[3], ready_seconds={0: 3.125, 1: 0.25}, left_out_seconds={2: 0.625}
    )
    obs = observe(rounds, 3)
    np.testing.assert_array_equal(obs.excess[:, 1], 0.125)
    np.testing.assert_array_equal(obs.excess[:, 0], np.arange(6.0))
    assert np.isnan(obs.excess[2, 2])  # an inner node left out: no bound on its own time
    assert obs.excess[3, 2] == 0.5 and obs.censored[3, 2]  # a leaf left out: censored
    assert obs.censored.sum() == 1
    # A worker never timed: never used either, an inner node a codedreduce parent left
    # out (no bound on its own time); used, it sent no own times with its message, as a
    # worker of another implementation may not.
    never = [
        dataclasses.replace(
            r, ready_seconds={0: 0.5, 1: 0.5}, left_out_seconds={}, workers_used=(0, 1)
        )
        for r in rounds
    ]
    with pytest.raises(ConfigError, match=r"workers \[2\] .* timed in none of the 6 rounds"):
        observe(never, 3)
    untimed = [dataclasses.replace(r, workers_used=(0, 1, 2)) for r in never]
    with pytest.raises(ConfigError, match=r"workers \[2\] .* sent no own times in any of the 6"):
        observe(untimed, 3)
    for field, what in (("ready_seconds", "has timings of"), ("left_out_seconds", "left out")):
        stray = [dataclasses.replace(r, **{field: {**r.ready_seconds, 7: 0.5}}) for r in rounds]
        with pytest.raises(ConfigError, match=rf"round 0 {what} workers \[7\].*another job"):
            observe(stray, 3)
    source, obs = _source_12()
    tail = fit_delays(obs).best
    with pytest.raises(ConfigError, match="hold no network time"):
        search(
            source, obs, tail, target_loss=-1.0, rounds=4, repeats=1, policies=["uncoded"],
            network_in_delays=False,
        )  # fmt: skip

    def uncoded(link: Link, network_in_delays: bool) -> float:
        [out] = search(
            source, obs, tail, target_loss=-1.0, rounds=4, repeats=1, policies=["uncoded"],
            link=link, network_in_delays=network_in_delays,
        )  # fmt: skip
        return float(np.mean(out.round_seconds))

    free = uncoded(Link(0.0, math.inf), False)
    # 50 ms a message: θ down and the gradient up cost a star round 0.1 s more, where
    # the delays hold no network time; where they do (a star source), nothing more.
    assert uncoded(Link(0.05, math.inf), False) == pytest.approx(free + 0.1, abs=0.01)
    assert uncoded(Link(0.05, math.inf), True) == pytest.approx(free, rel=1e-2)


@dataclasses.dataclass
class _Ranked:
    """What tune's tie note reads of a ranked candidate."""

    label: str
    predicted: float
    interval: tuple[float, float]
    reached: int = 3
    error: str = ""


def test_candidates_the_prediction_cannot_tell_apart_are_called_a_tie() -> None:
    from codedgd.client.cli.tune import TIE, _tied

    best = _Ranked("a", 10.0, (9.8, 10.4))
    close = _Ranked("b", 10.0 * (1 + TIE) - 1e-6, (10.25, 10.35))  # within TIE
    inside = _Ranked("c", 10.5, (10.39, 10.7))  # starts inside the best's replays
    apart = _Ranked("d", 10.6, (10.45, 10.8))
    assert [o.label for o in _tied([best, close, inside, apart])] == ["a", "b", "c"]
    assert [o.label for o in _tied([best, apart, close])] == ["a"]  # (ranked: stops)
    assert _tied([_Ranked("x", math.inf, (math.inf, math.inf), reached=0), best]) == []
    failed = _Ranked("f", math.nan, (math.nan, math.nan), error="diverged")
    assert [o.label for o in _tied([best, failed, close])] == ["a"]
