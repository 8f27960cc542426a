"""hetero: loads follow speed, every partition on s+1 workers, exact for every straggler set."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from codedgd.services.codes.encoding import encode
from codedgd.services.codes.hetero import circle_placement, speed_loads
from codedgd.services.errors import ConfigError, PlanError
from codedgd.services.job import Component, JobConfig
from codedgd.services.policies.registry import create
from codedgd.services.sim import CostModel, Simulator

CASES = [
    (4, 1, "2,2,1,1"),
    (5, 2, "1,1,1,1,1"),
    (6, 1, "3,1,1,1,2,2"),
    (6, 2, "1,2,3,4,5,6"),
    (6, 0, "1,2,3,4,5,6"),
    (7, 3, "1,1,1,4,4,4,4"),
    (8, 1, "2,2,2,2,1,1,1,1"),
]


def _compositions(total: int, parts: int, top: int):
    """Every way to write total as parts integers in 1..top."""
    if parts == 1:
        if 1 <= total <= top:
            yield (total,)
        return
    for first in range(1, min(top, total - parts + 1) + 1):
        for rest in _compositions(total - first, parts - 1, top):
            yield (first, *rest)


def _round(policy, plan, grads: np.ndarray, order: list[int]) -> tuple[np.ndarray, int]:
    """Offer the workers' real encoded messages in ``order``; (estimate, arrivals used)."""
    policy.begin_round(0, np.zeros(grads.shape[1]))
    for i, w in enumerate(order, start=1):
        wp = plan.workers[w]
        message = encode(grads[list(wp.partitions)], wp.coefficients)
        if policy.offer(w, message):
            return policy.decode().gradient, i
    raise AssertionError(f"order {order} never decoded")


@pytest.mark.parametrize(("n", "s", "speeds"), CASES)
def test_placement_follows_the_speeds_and_holds_each_partition_s_plus_1_times(
    n: int, s: int, speeds: str
) -> None:
    policy = create("hetero", {"s": s, "speeds": speeds})
    k = policy.default_partitions(n)
    plan = policy.plan(n, k)
    v = np.array([float(x) for x in speeds.split(",")])
    loads = np.array([len(wp.partitions) for wp in plan.workers])
    assert loads.sum() == (s + 1) * k
    # The slowest finishes within one partition of the ideal (every worker busy alike).
    assert max(loads / v) <= (s + 1) * k / v.sum() + 1 / v.min() + 1e-9
    # No integer loads with the same total finish sooner (the slowest's load/speed).
    best = (
        min(
            max(m / x for m, x in zip(ms, v, strict=True))
            for ms in _compositions((s + 1) * k, n, k)
        )
        if n <= 5
        else None
    )
    if best is not None:
        assert max(loads / v) == pytest.approx(best)
    holders = np.zeros(k, dtype=int)
    for wp in plan.workers:
        assert len(set(wp.partitions)) == len(wp.partitions)
        holders[list(wp.partitions)] += 1
    assert np.all(holders == s + 1)


@pytest.mark.parametrize(("n", "s", "speeds"), CASES)
def test_exact_for_every_straggler_set_and_order(n: int, s: int, speeds: str) -> None:
    policy = create("hetero", {"s": s, "speeds": speeds})
    k = policy.default_partitions(n)
    plan = policy.plan(n, k)
    rng = np.random.default_rng(n * 10 + s)
    grads = rng.standard_normal((k, 7))
    want = grads.sum(axis=0)
    for stragglers in itertools.combinations(range(n), s):
        survivors = [w for w in range(n) if w not in stragglers]
        for order in (survivors, survivors[::-1], list(rng.permutation(survivors))):
            got, used = _round(policy, plan, grads, [int(w) for w in order])
            assert used == n - s
            np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)


def test_exact_on_random_sets_of_a_large_code() -> None:
    n, s = 40, 3
    speeds = ",".join(str(1 + (w % 3)) for w in range(n))
    policy = create("hetero", {"s": s, "speeds": speeds})
    k = policy.default_partitions(n)
    plan = policy.plan(n, k)
    rng = np.random.default_rng(1)
    grads = rng.standard_normal((k, 5))
    want = grads.sum(axis=0)
    for _ in range(60):
        order = [int(w) for w in rng.permutation(n)]
        got, used = _round(policy, plan, grads, order)
        assert used >= n - s
        np.testing.assert_allclose(got, want, rtol=1e-7, atol=1e-7)


def test_a_job_on_hetero_takes_uncodeds_steps_and_rounds_follow_the_fast_workers() -> None:
    base = JobConfig(
        workers=6,
        rounds=15,
        seed=4,
        data=Component("synthetic", {"rows": 1200, "dim": 8}),
        stragglers=Component("speed-classes", {"count": 3, "factor": 2.0}),
    )
    cost = CostModel(seconds_per_sample=1e-4, seconds_per_partition=0.0, decode_seconds=0.0)
    uncoded = Simulator(base, cost).run()
    slow = Simulator(base, cost).straggler.slow(0)  # type: ignore[attr-defined]
    speeds = ",".join("1" if s else "2" for s in slow)
    aware = Simulator(
        base.replace(policy=Component("hetero", {"s": 0, "speeds": speeds})), cost
    ).run()
    np.testing.assert_allclose(aware.theta, uncoded.theta, rtol=1e-9, atol=1e-12)
    mean = lambda r: float(np.mean([x.round_seconds for x in r.records]))  # noqa: E731
    # Half the pool 2x slower: capacity 0.75n against uniform load's 0.5n, ideally 1.5x.
    assert mean(uncoded) / mean(aware) > 1.35


def test_bad_speeds_and_sizes_are_refused_naming_the_fix() -> None:
    with pytest.raises(PlanError, match="gives 3 speeds for 4 workers"):
        create("hetero", {"speeds": "1,2,3"}).plan(4, 16)
    with pytest.raises(PlanError, match="every speed must be a finite number > 0"):
        create("hetero", {"speeds": "1,0,1,1"}).plan(4, 16)
    with pytest.raises(PlanError, match="comma-separated"):
        create("hetero", {"speeds": "fast,slow"}).plan(2, 8)
    with pytest.raises(PlanError, match=r"choose s in 0\.\.3"):
        create("hetero", {"s": 4}).plan(4, 16)
    with pytest.raises(PlanError, match="use at least 3 partitions"):
        create("hetero", {"s": 1}).plan(6, 2)
    with pytest.raises(ConfigError, match="granularity must be >= 1"):
        create("hetero", {"granularity": 0})


def test_loads_and_circle_round_trip() -> None:
    loads = speed_loads([5, 1, 1], 1, 7)
    assert sum(loads) == 14 and all(1 <= m <= 7 for m in loads)
    supports = circle_placement(loads, 7)
    assert [len(s) for s in supports] == loads
