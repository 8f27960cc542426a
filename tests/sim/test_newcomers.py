"""Which lost place a crashed worker takes when it comes back, as the coordinator decides."""

from __future__ import annotations

import math

from codedgd.services.sim.newcomers import Newcomers


def test_a_newcomer_takes_the_place_the_round_waits_for_else_the_lowest() -> None:
    places = Newcomers(join_seconds=[0.5, 0.5, 0.25])
    places.crash(0, at=1.0, restart=1.0)  # back at 2.0
    places.crash(2, at=1.5, restart=10.0)  # back at 11.5
    assert places.take(1.9, wanted={2}) == []  # no one has connected yet
    assert places.take(2.0, wanted={2}) == [2]  # 0's worker, but the round waits for 2
    assert places.joining == {2: 2.25}
    assert places.take(11.5, wanted=set()) == [0]  # 2's worker takes the place left
    assert places.joining == {2: 2.25, 0: 12.0}


def test_between_rounds_connections_and_joins_settle_in_time_order() -> None:
    places = Newcomers(join_seconds=[0.5, 0.5])
    places.crash(1, at=0.0, restart=1.0)
    places.crash(0, at=0.2, restart=math.inf)  # never back
    assert places.settle(1.4) == []  # connected at 1.0 and took place 0, the lowest
    assert places.joining == {0: 1.5} and places.lost == {0, 1}
    assert places.settle(1.5) == [0]
    assert places.lost == {1} and places.replaced == {0}  # 1 stays lost for good
    assert places.waiting == []


def test_a_spare_takes_a_place_the_moment_it_is_lost() -> None:
    places = Newcomers(join_seconds=[0.5, 0.25, 0.5], spares=1)
    assert places.settle(10.0) == [] and places.waiting == [0.0]  # idle: nothing is lost
    places.crash(1, at=12.0, restart=math.inf)
    assert places.take(12.0, wanted={1}) == [1]  # joins from the loss on, not from time 0
    assert places.joining == {1: 12.25} and places.waiting == []
    places.crash(0, at=13.0, restart=math.inf)
    assert places.take(13.0, wanted={0}) == []  # one spare only: place 0 stays lost
    assert places.settle(20.0) == [1] and places.lost == {0}


def test_a_spare_taking_a_lost_place_drops_autos_prior_entry_for_it() -> None:
    """The prior is of the machines that held the places: a spare that takes one is
    another machine, and the simulator tells the policy so (Policy.replaced), as the
    coordinator does."""
    from codedgd.services.job import Component, JobConfig
    from codedgd.services.policies.auto import Auto
    from codedgd.services.sim import CostModel
    from codedgd.services.sim.engines import make_simulator

    config = JobConfig(
        workers=4,
        rounds=6,
        seed=5,
        data=Component("synthetic", {"rows": 400, "dim": 6}),
        policy=Component("auto", {"r": 2, "prior": "2,3,4,5", "lazy": "none"}),
        replace_timeout=60.0,
        spares=1,
        stragglers=Component("crash", {"count": 1, "start": 2, "restart": -1}),
    )
    sim = make_simulator(config, CostModel())
    records = sim.run().records
    policy = sim.prepared.policy
    assert isinstance(policy, Auto)
    crashed = [w for w in range(4) if policy.prior[w] is None]
    assert len(crashed) == 1  # the crashed place's entry, and only it
    kept = [v for w, v in enumerate(policy.prior) if w != crashed[0]]
    assert kept == [w + 2.0 for w in range(4) if w != crashed[0]]  # the others untouched
    assert len(records) == 6
