"""Rings and trees on the virtual clock: the same θ as uncoded, round times that match
the closed forms, and the link model's reason to exist (the star's coordinator queue)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from codedgd.services.errors import ConfigError
from codedgd.services.job import Component, JobConfig
from codedgd.services.sim import CostModel, simulate
from codedgd.services.sim.closed_forms import rth_arrival_mean
from codedgd.services.sim.cost import COORDINATOR, Buckets
from codedgd.services.sim.topologies import Cpu, Links
from codedgd.services.stragglers import create_straggler_model


def _config(n: int, policy: Component, rounds: int = 20, **job: object) -> JobConfig:
    return JobConfig(
        workers=n,
        rounds=rounds,
        seed=3,
        data=Component("synthetic", {"rows": 600, "dim": 40}),
        policy=policy,
        **job,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("policy", "n"),
    [
        (Component("ring-allreduce"), 12),
        (Component("tree", {"fanout": 3, "levels": 2}), 12),
        (Component("codedreduce", {"fanout": 3, "levels": 2, "s": 1}), 12),
        (Component("codedreduce", {"fanout": 3, "levels": 2, "s": 1, "root": 4}), 16),
        (Component("tree", {"fanout": 2, "levels": 2, "root": 4}), 12),
    ],
    ids=["ring", "tree", "codedreduce", "codedreduce-4x(1+3)", "tree-4x(1+2)"],
)
def test_topologies_train_exactly_like_uncoded(policy: Component, n: int) -> None:
    """20 rounds with exponential stragglers: every loss and the final θ agree with the
    star's uncoded sums to rounding (the additions happen in another order)."""
    stragglers = Component("exponential", {"mean": 0.01})
    cost = CostModel(compute="none", seconds_per_sample=0.0, seconds_per_partition=0.0)
    base = simulate(_config(n, Component("uncoded"), stragglers=stragglers), cost)
    other = simulate(_config(n, policy, stragglers=stragglers), cost)
    np.testing.assert_allclose(other.theta, base.theta, rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(
        [r.loss for r in other.records], [r.loss for r in base.records], rtol=1e-11
    )
    assert all(r.exact for r in other.records)


def _no_compute(**links: float | None) -> CostModel:
    return CostModel(
        compute="none",
        decode_seconds=0.0,
        **links,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("n", [2, 4, 8])
def test_a_ring_round_takes_2n_hops_of_a_segment(n: int) -> None:
    """Scatter θ, n−1 all-gather and n−1 reduce-scatter steps, upload: 2n hops of
    latency α plus ℓ/n values at β each (the all-reduce itself is 2(n−1) of them)."""
    alpha, beta = 1e-3, 1e6
    dim = 40  # the synthetic dataset's dim; 8 * n bytes divide it
    config = _config(n, Component("ring-allreduce"), rounds=3)
    result = simulate(config, _no_compute(latency_seconds=alpha, bandwidth_bytes_per_second=beta))
    hop = alpha + 8 * dim / n / beta
    for record in result.records:
        assert record.wait_seconds == pytest.approx(2 * n * hop, rel=1e-9)
        assert record.bytes_up == record.bytes_down == 8 * dim  # O(ℓ) at the coordinator


@pytest.mark.parametrize("n", [4, 8, 10])  # n | 40: equal segments
def test_when_bandwidth_binds_the_star_queues_on_the_coordinators_nic(n: int) -> None:
    """The coordinator's NIC like a worker's (full duplex, rate β), no latency, no compute.
    The star sends n copies of θ (S bytes) out one after another and takes the n gradients
    in as they come: (n+1)·S/β. The ring sends S out and takes S in at the coordinator,
    and its all-gather and reduce-scatter move (n−1)/n·S on every link at once:
    (2 + 2(n−1)/n)·S/β. So the ring is about n/4 times faster, and more as n grows."""
    beta, S = 1e5, 8 * 40
    links = {
        "latency_seconds": 0.0,
        "bandwidth_bytes_per_second": beta,
        "ingress_bandwidth_bytes_per_second": beta,
        "egress_bandwidth_bytes_per_second": beta,
    }
    star = simulate(_config(n, Component("uncoded"), rounds=2), _no_compute(**links))
    ring = simulate(_config(n, Component("ring-allreduce"), rounds=2), _no_compute(**links))
    assert star.records[-1].round_seconds == pytest.approx((n + 1) * S / beta, rel=1e-9)
    expected_ring = (2 + 2 * (n - 1) / n) * S / beta
    assert ring.records[-1].round_seconds == pytest.approx(expected_ring, rel=1e-9)


@pytest.mark.parametrize("n", [4, 8, 10])
def test_what_fits_in_a_nics_burst_costs_only_its_latency(n: int) -> None:
    """As above, with every NIC a token bucket of three messages (full at the first
    round's start). The star's first three copies of θ leave at once and the rest queue,
    so copy k is out after (k − 3)⁺·S/β; three gradients then come in at once and the
    coordinator takes the rest one after another: (n − 2)·S/β, against (n + 1)·S/β
    without the burst. That round refilled each of the coordinator's buckets by
    (n − 2)·S and spent n·S: the next starts with one message in each, and every round
    after takes n·S/β, the rate's (what a round moves through a side beyond what its
    rate refills, it pays). A ring's steps all fit: only its 2n hops' latency is left,
    round after round (its buckets refill faster than it spends them)."""
    beta, S, alpha = 1e5, 8 * 40, 1e-3
    links = {
        "latency_seconds": 0.0,
        "bandwidth_bytes_per_second": beta,
        "ingress_bandwidth_bytes_per_second": beta,
        "egress_bandwidth_bytes_per_second": beta,
        "burst_bytes": 3 * S,
    }
    star = simulate(_config(n, Component("uncoded"), rounds=4), _no_compute(**links))
    assert [r.round_seconds for r in star.records] == pytest.approx(
        [(n - 2) * S / beta] + [n * S / beta] * 3, rel=1e-9
    )
    fair = _no_compute(**links).replace(sharing="fair")
    star = simulate(_config(n, Component("uncoded"), rounds=2), fair)
    # Side by side the bucket drains into every copy alike: all are out at (n − 3)·S/β.
    downs = star.records[0].response_seconds
    assert min(downs.values()) == pytest.approx((n - 3) * S / beta, rel=1e-9)
    ring = simulate(
        _config(n, Component("ring-allreduce"), rounds=3),
        _no_compute(**{**links, "latency_seconds": alpha, "burst_bytes": 10 * S}),
    )
    assert [r.round_seconds for r in ring.records] == pytest.approx([2 * n * alpha] * 3, rel=1e-9)
    # A coordinator unlimited, the workers' NICs bursting: θ's copies fit in every
    # worker's bucket, side by side as one after another, and a tree parent's fan-out
    # is charged its own side only (its children's buckets take θ whole).
    for sharing in ("fifo", "fair"):
        unlimited = {"egress_bandwidth_bytes_per_second": None, "sharing": sharing}
        free = _no_compute(**{**links, **unlimited, "ingress_bandwidth_bytes_per_second": None})
        star = simulate(_config(n, Component("uncoded"), rounds=2), free)
        assert star.records[-1].round_seconds == pytest.approx(0.0, abs=1e-12), sharing
        tree = Component("tree", {"fanout": 2, "levels": 2})
        two = simulate(_config(6, tree, rounds=2), free)
        # A parent's three messages each way (θ in, two sums in; θ out twice, its sum
        # up) fit its bucket of three: no time. A round of no time refills nothing: the
        # next pays its rate.
        assert two.records[0].round_seconds == pytest.approx(0.0, abs=1e-12), sharing
        assert two.records[1].round_seconds > S / beta, sharing
    with pytest.raises(ConfigError, match="burst_bytes"):
        CostModel(burst_bytes=-1.0)
    with pytest.raises(ConfigError, match="burst_bytes"):
        CostModel(burst_bytes=float("inf"))


def test_a_nics_bucket_refills_at_its_rate_between_rounds() -> None:
    cost = CostModel(
        bandwidth_bytes_per_second=100.0,
        egress_bandwidth_bytes_per_second=1000.0,
        burst_bytes=500.0,
    )
    buckets = Buckets(cost)
    assert buckets.level(3, True) == 500.0  # full until a round spends it
    buckets.after({(3, True): 450.0, (COORDINATOR, True): 900.0, (3, False): 50.0}, 1.0)
    # 50 left + 100 refilled; the coordinator's −400 + 1000 refilled, capped at full;
    # a side that moved less than its rate refills is full again.
    assert buckets.level(3, True) == pytest.approx(150.0)
    assert buckets.level(COORDINATOR, True) == pytest.approx(500.0)
    assert buckets.level(3, False) == pytest.approx(500.0)
    buckets.after({(COORDINATOR, True): 1600.0}, 1.0)
    assert buckets.level(COORDINATOR, True) == 0.0  # (−1100 + 1000: never below 0)
    buckets.after({}, 0.2)
    assert buckets.level(COORDINATOR, True) == pytest.approx(200.0)
    assert buckets.level(3, True) == pytest.approx(270.0)  # (150, +100, +20)
    # The coordinator's ingress is unlimited: never short.
    buckets.after({(COORDINATOR, False): 1e9}, 0.0)
    assert buckets.level(COORDINATOR, False) == 500.0
    # No burst: no bucket to keep.
    none = Buckets(cost.replace(burst_bytes=0.0))
    none.after({(3, True): 1e9}, 1.0)
    assert none.level(3, True) == 0.0


@pytest.mark.parametrize(("m", "s", "lam"), [(6, 1, 1.0), (8, 3, 0.5)])
def test_a_one_level_codedreduce_waits_for_the_m_minus_s_th_arrival(
    m: int, s: int, lam: float
) -> None:
    """L = 1 is the cyclic code on m workers holding s+1 partitions each: the mean round
    is E[T_(m−s)] = c/m + (c/(λm))(H_m − H_s) with c = s+1 (SCHEMES.md's closed form)."""
    rounds = 2500
    config = JobConfig(
        workers=m,
        rounds=rounds,
        seed=11,
        eval_every=rounds,
        data=Component("synthetic", {"rows": 2 * m, "dim": 2}),
        policy=Component("codedreduce", {"fanout": m, "levels": 1, "s": s}),
        stragglers=Component("shifted-exponential", {"shift": 1.0, "rate": lam}),
    )
    result = simulate(config, CostModel.ideal())
    measured = float(np.mean([r.round_seconds for r in result.records]))
    assert measured == pytest.approx(rth_arrival_mean(m, lam, m - s, c=s + 1), rel=0.03)


@pytest.mark.parametrize(("root", "k"), [(3, 15), (4, 20)])
def test_a_two_level_tree_round_is_the_order_statistics_recursion(root: int, k: int) -> None:
    """Ideal links: a node sends once its own delay has passed and its (m−s)-th child has
    arrived; the root decodes at its (m₀−s)-th. Computed here independently, round by
    round, from the same seeded delays (m₀ = m = 3: 3 + 9; m₀ = 4: 4 + 12)."""
    m, levels, s, rounds = 3, 2, 1, 40
    n = root * (1 + m)
    config = JobConfig(
        workers=n,
        rounds=rounds,
        seed=5,
        data=Component("synthetic", {"rows": 300, "dim": 3}),
        policy=Component("codedreduce", {"fanout": m, "levels": levels, "s": s, "root": root}),
        stragglers=Component("shifted-exponential", {"shift": 1.0, "rate": 2.0}),
    )
    result = simulate(config, CostModel.ideal())
    straggler = create_straggler_model(
        "shifted-exponential", {"shift": 1.0, "rate": 2.0}, seed=5, n_workers=n
    )
    load = 4 / k  # every node: g^L = 4 of k = m₀·(g + m) partitions
    for t, record in enumerate(result.records):
        own = [straggler.delay(w, t, 0.0, load) for w in range(n)]
        node = [
            max(own[v], sorted(own[root + m * v + c] for c in range(m))[m - s - 1])
            for v in range(root)
        ]
        assert record.wait_seconds == pytest.approx(sorted(node)[root - s - 1], rel=1e-12)


def test_crashes_are_not_modelled_on_topologies_and_say_so() -> None:
    config = _config(
        4,
        Component("ring-allreduce"),
        stragglers=Component("crash", {"workers": 1, "at_round": 2}),
    )
    with pytest.raises(ConfigError, match="does not model crashes"):
        simulate(config, CostModel.ideal())


def test_fair_sharing_is_a_fluid_processor_sharing_queue() -> None:
    from codedgd.services.sim.cost import fair_finish

    np.testing.assert_allclose(fair_finish(np.zeros(4), np.full(4, 10.0), 10.0), [4.0] * 4)
    # A flow alone at first, then sharing: 5 bytes alone, then 5 + 5 at half speed each.
    np.testing.assert_allclose(
        fair_finish(np.array([0.0, 0.5]), np.full(2, 10.0), 10.0), [1.5, 2.0]
    )
    # No faster than its other end.
    np.testing.assert_allclose(
        fair_finish(np.zeros(3), np.full(3, 10.0), 100.0, cap=10.0), [1.0] * 3
    )


@pytest.mark.parametrize("n", [4, 8])
def test_with_fair_sharing_the_star_waits_for_all_of_theta_then_all_uploads(n: int) -> None:
    """TCP-like sharing: the n copies of θ all arrive at n·S/β, the n results then share
    the coordinator's receiving side and all land at 2n·S/β; the ring is unchanged (its
    scatter and upload finish at S/β either way, and every other hop is one flow)."""
    beta, S = 1e5, 8 * 40
    links = {
        "latency_seconds": 0.0,
        "bandwidth_bytes_per_second": beta,
        "ingress_bandwidth_bytes_per_second": beta,
        "egress_bandwidth_bytes_per_second": beta,
        "sharing": "fair",
    }
    star = simulate(_config(n, Component("uncoded"), rounds=2), _no_compute(**links))
    ring = simulate(_config(n, Component("ring-allreduce"), rounds=2), _no_compute(**links))
    assert star.records[-1].round_seconds == pytest.approx(2 * n * S / beta, rel=1e-9)
    expected_ring = (2 + 2 * (n - 1) / n) * S / beta
    assert ring.records[-1].round_seconds == pytest.approx(expected_ring, rel=1e-9)


def _shared(cores: float, peer: float = 0.001) -> CostModel:
    """One machine of ``cores`` cores: no compute, free links, ``peer`` seconds of CPU at
    each end of a worker-to-worker hop, nothing else."""
    return CostModel(
        compute="none",
        decode_seconds=0.0,
        latency_seconds=0.0,
        bandwidth_bytes_per_second=math.inf,
        cores=cores,
        peer_cpu_seconds_per_message=peer,
        peer_cpu_seconds_per_byte=0.0,
        coordinator_cpu_seconds_per_message=0.0,
        coordinator_cpu_seconds_per_byte=0.0,
    )


def test_a_process_does_its_cpu_work_one_task_at_a_time_in_its_gaps() -> None:
    cpu = Cpu(_shared(8))
    assert cpu.run(0, 1.0, 5.0) == 6.0
    # Asked later but ready earlier: the process was idle before 5 s.
    assert cpu.run(0, 1.0, 0.0) == 1.0
    # [4.5, 5) is too short a gap: after the task already at 5-6 s.
    assert cpu.run(0, 1.0, 4.5) == 7.0
    # Another process is not held up by this one's tasks (8 cores).
    assert cpu.run(1, 1.0, 5.0) == 6.0
    # Without cores every process has a machine: a message costs nothing.
    alone = Cpu(_shared(8).replace(cores=None))
    assert alone.message(0, 100, 2.0) == 2.0
    assert alone.run(0, 1.0, 2.0) == 3.0


def test_processes_on_too_few_cores_slow_each_other() -> None:
    one = Cpu(_shared(1))
    assert one.run(0, 1.0, 0.0) == 1.0
    # On one core beside a second of another process's work: half a core, 2 s.
    assert one.run(1, 1.0, 0.0) == 2.0
    two = Cpu(_shared(2))
    assert [two.run(w, 1.0, 0.0) for w in range(2)] == [1.0, 1.0]
    # 1.5 cores: the second process gets the half core left, then a whole one; the third
    # the half left once the first is done, then a core. A process uses one core at most.
    half = Cpu(_shared(1.5))
    assert [half.run(w, 1.0, 0.0) for w in range(3)] == pytest.approx([1.0, 1.5, 2.25])
    # A task placed later gets what is left: nothing before 1.5 s, the half core beside
    # the third's until 2.25 s (0.375 s of work), then a core for the last 0.125 s.
    assert half.run(3, 0.5, 0.0) == pytest.approx(2.375)
    # A hop on one machine: the sender builds the message, the receiver parses it.
    links = Links(_shared(8, peer=0.002))
    assert links.transfer(0, 1, 1000, 1.0) == pytest.approx(1.004)


def test_a_task_that_exactly_fills_a_gap_takes_it_despite_rounding() -> None:
    """0.1 + 0.2 is not 0.3 in floats: a task whose pieces fill a gap exactly must not
    miss it by a rounding step and wait out whatever comes after."""
    one = Cpu(_shared(1))
    assert one.run(0, 0.4, 0.1) == pytest.approx(0.5)
    assert one.run(1, 100.0, 0.7) == pytest.approx(100.7)
    # The core is free over [0, 0.1) and [0.5, 0.7): 0.3 s of work ends at 0.7, not 100.7.
    assert one.run(2, 0.3, 0.0) == pytest.approx(0.7)
    # The process's own gap [0.2, 0.3) holds a task of 0.1 s exactly.
    cpu = Cpu(_shared(1))
    cpu.run(5, 0.1, 0.0)
    cpu.run(5, 1.0, 0.3)
    cpu.run(6, 0.1, 0.1)
    assert cpu.run(5, 0.1, 0.1) == pytest.approx(0.3)
    # A task of no length, or one that never ends, leaves the profile as it was.
    assert cpu.run(7, 1e-300, 2.0) == pytest.approx(2.0)
    assert cpu.run(7, math.inf, 2.0) == math.inf
    assert all(a < b for a, b in itertools.pairwise(cpu._at))  # no piece of no width
    with pytest.raises(ConfigError, match=r"at least 0\.01"):
        _shared(1e-13)


@pytest.mark.parametrize(
    ("policy", "n", "hops"),
    [
        # θ's segment in, 3 forwarded, 3 partial sums, the reduced segment up: each a
        # hop after the last, 2 ms each but the first and last (whose other end is the
        # coordinator, free here): 4(n - 1) + 2 ms.
        (Component("ring-allreduce"), 4, 14),
        # θ in, the sum up.
        (Component("tree", {"fanout": 3, "levels": 1}), 3, 2),
        # A level-1 worker parses θ (1 ms), sends it to its two children one after the
        # other (2 ms), the second child parses it (1 ms) and sends its sum (1 ms), the
        # parent parses the two (the second at 6 ms) and sends the sum up (7 ms).
        (Component("tree", {"fanout": 2, "levels": 2}), 6, 7),
    ],
    ids=["ring", "tree-1-level", "tree-2-levels"],
)
def test_rings_and_trees_on_one_machine_pay_each_hops_cpu(
    policy: Component, n: int, hops: int
) -> None:
    """A machine of many cores: each process's tasks one after another, nothing shared."""
    many = simulate(_config(n, policy, rounds=3), _shared(64))
    assert [r.round_seconds for r in many.records] == pytest.approx([hops * 1e-3] * 3)
    # A machine per worker: the hops' CPU is not charged (it is the links' latency).
    free = simulate(_config(n, policy, rounds=3), _shared(64).replace(cores=None))
    assert [r.round_seconds for r in free.records] == pytest.approx([0.0] * 3, abs=1e-12)
    # Fewer cores than processes: the workers' hops share them, and the round is longer.
    seconds = [
        simulate(_config(n, policy, rounds=1), _shared(c)).records[0].round_seconds
        for c in (64, 2, 1)
    ]
    assert seconds[0] < seconds[1] < seconds[2]


@pytest.mark.parametrize("n", [3, 4, 6])
@pytest.mark.parametrize("cores", [1.0, 2.0])
def test_a_ring_on_too_few_cores_takes_all_of_its_cpu_work_over_the_cores(
    n: int, cores: float
) -> None:
    """The cores are a shared fluid: no instant holds more than C cores of work, and no
    core idles while a task is ready (each of a ring's steps gives every worker one)."""
    # Each worker parses θ's segment, sends and receives 2(n - 1) segments, builds its
    # upload: 4n(n - 1) + 2n ends of 1 ms (the coordinator's ends are free here).
    work = (4 * n * (n - 1) + 2 * n) * 1e-3
    result = simulate(_config(n, Component("ring-allreduce"), rounds=2), _shared(cores))
    assert [r.round_seconds for r in result.records] == pytest.approx([work / cores] * 2)
