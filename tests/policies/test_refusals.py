"""Plans that cannot exist are refused with a message naming the valid choices."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from codedgd.services.errors import ConfigError, PlanError, WorkerFault
from codedgd.services.policies import create, names
from codedgd.services.policies.base import JobContext


def test_new_policies_are_registered() -> None:
    assert {"frc", "cyclic", "erasurehead", "group-mds", "polynomial"} <= set(names())


@pytest.mark.parametrize(
    ("name", "params", "n", "needles"),
    [
        ("erasurehead", {"r": 4}, 30, ["r=4 does not divide n=30", "choose r in {2,3,5,6}"]),
        ("erasurehead", {"r": 40}, 30, ["1 <= r <= n", "{6,10,15,30}"]),
        ("erasurehead", {"K": 31}, 30, ["K=31 > n=30", "choose K in 1..30"]),
        ("frc", {"s": 3}, 30, ["s+1=4 does not divide n=30", "choose s in {1,2,4,5}"]),
        ("frc", {"s": 30}, 30, ["0 <= s < n", "s=30", "choose s in {5,9,14,29}"]),
        ("frc", {"s": -1}, 6, ["0 <= s < n", "choose s in {0,1,2,5}"]),
        ("cyclic", {"s": 5}, 5, ["0 <= s < n", "choose s in 0..4", "s=4 is the nearest"]),
        ("group-mds", {"s": 1, "m": 2, "d": 2}, 12, ["d=2 < s+m=3", "choose d in {3,4,6,12}"]),
        (
            "group-mds",
            {"s": 2, "m": 2},
            30,
            ["d = s+m=4 does not divide n=30", "choose d in {5,6,10,15}"],
        ),
        ("group-mds", {"s": 1, "m": 3, "d": 5}, 12, ["d=5 does not divide n=12", "{4,6,12}"]),
        ("group-mds", {"s": 4, "m": 3}, 6, ["s+m=7 > n=6"]),
        ("group-mds", {"s": 1, "m": 0}, 6, ["m >= 1", "m=0"]),
        ("polynomial", {"s": 2, "m": 2, "d": 3}, 10, ["d=3 < s+m=4", "choose d in 4..10"]),
        ("polynomial", {"s": 10, "m": 1}, 10, ["0 <= s < n", "s=9 is the nearest"]),
        ("polynomial", {"s": 6, "m": 5}, 10, ["d <= n", "s+m=11 > n=10"]),
    ],
)
def test_refused_plans_name_the_valid_choices(
    name: str, params: dict[str, Any], n: int, needles: list[str]
) -> None:
    policy = create(name, params)
    with pytest.raises(PlanError) as info:
        policy.plan(n, n)
    for needle in needles:
        assert needle in str(info.value)


@pytest.mark.parametrize("name", ["frc", "cyclic", "erasurehead", "group-mds", "polynomial"])
def test_partitions_other_than_n_are_refused(name: str) -> None:
    policy = create(name, {})
    with pytest.raises(PlanError, match="k = n = 6"):
        policy.plan(6, 12)


@pytest.mark.parametrize(
    ("name", "params", "needle"),
    [
        ("cyclic", {"h": "hadamard"}, "choose h in {orthonormal,gaussian}"),
        ("cyclic", {"tol": 0}, "tol must be positive"),
        ("polynomial", {"points": "random"}, "choose points in {interleaved,ordered}"),
        ("erasurehead", {"delta": 1.5}, "delta must be in (0, 1]"),
        ("erasurehead", {"delta": 0}, "delta must be in (0, 1]"),
        ("group-mds", {"r": 2}, "its parameters: s, m, d"),
    ],
)
def test_bad_parameters_are_config_errors(name: str, params: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        create(name, params)
    assert needle in str(info.value)


def test_valid_plans_have_the_documented_loads_and_lengths() -> None:
    n, dim = 12, 101
    frc = create("frc", {"s": 2}).plan(n, n)
    assert all(frc.load(i) == 3 / n for i in range(n))
    assert frc.workers[4].partitions == (3, 4, 5)
    cyc = create("cyclic", {"s": 3}).plan(n, n)
    assert cyc.workers[10].partitions == (10, 11, 0, 1)
    assert all(cyc.payload_length(i, dim) == dim for i in range(n))
    gm = create("group-mds", {"s": 1, "m": 3}).plan(n, n)
    assert all(gm.load(i) == 4 / n for i in range(n))
    assert all(gm.payload_length(i, dim) == 34 for i in range(n))  # ceil(101/3)
    poly = create("polynomial", {"s": 2, "m": 2}).plan(n, n)
    assert poly.workers[11].partitions == (11, 0, 1, 2)
    assert all(poly.payload_length(i, dim) == 51 for i in range(n))
    eh = create("erasurehead", {"r": 3}).plan(n, n)
    assert eh.workers[5].partitions == (3, 4, 5)


@pytest.mark.parametrize("name", sorted(names()))
def test_an_arrival_the_policy_cannot_use_is_its_senders_fault(name: str) -> None:
    """No gradient (a `skipped` result where the policy needs one: every policy in round 0,
    lag-wk included, as nothing was uploaded before) or a payload of the wrong length is
    a WorkerFault: the coordinator throws that worker out instead of failing the job. The
    policy's round is untouched, so the place's newcomer can still offer."""
    n, dim = 12, 4
    policy = create(name, {})
    plan = policy.plan(n, policy.default_partitions(n))
    policy.bind(JobContext(n_rows=60, step_size=0.1, smoothness=lambda parts: 1.0))
    spec = policy.begin_round(0, np.zeros(dim))
    worker = spec.workers[0]
    good = np.ones(plan.payload_length(worker, dim))
    with pytest.raises(WorkerFault, match=f"worker {worker}"):
        policy.offer(worker, None)
    with pytest.raises(WorkerFault, match=f"worker {worker}"):
        policy.offer(worker, np.ones(good.shape[0] + 1))
    policy.offer(worker, good)  # the same worker's (or its newcomer's) good result counts
