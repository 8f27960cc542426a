"""Workers' ring and tree rounds over in-process peer links: the sums they upload are
the reference arithmetic, a slow child is left out (and told so), a broken link is named,
a silent peer is reported past the round's deadline (and only the right one is blamed).

The links parse every frame as the peer server would (codedgd.services.worker.peers.
LocalPeerLinks), so the framing, the mailbox's checks and the round code are the real
ones; only the sockets are missing.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import ClassVar

import numpy as np
import pytest

from codedgd.services.codes.cyclic import CyclicCode
from codedgd.services.compute.gradient import Computer, PartitionRows
from codedgd.services.compute.ring import reduced_segments, segments
from codedgd.services.coordinator.silence import Stall, silent_roots
from codedgd.services.models import LeastSquares
from codedgd.services.policies import create
from codedgd.services.policies.tree import CodedReduce
from codedgd.services.worker.peer_faults import PeerFault
from codedgd.services.worker.peers import LocalPeerLinks, Receive
from codedgd.services.worker.ring import RingRounds
from codedgd.services.worker.topology import TopologyContext
from codedgd.services.worker.tree import TreeRounds
from codedgd.services.worker.uploads import Outgoing, Upload, WorkerStats

DIM = 7
CHUNK = 24  # bytes: three floats a chunk, so every tensor travels in several chunks


class _Delays:
    name: ClassVar[str] = "fixed-per-worker"

    def __init__(self, seconds: dict[int, float]) -> None:
        self.seconds = seconds

    def delay(self, worker: int, round: int, compute_seconds: float, load: float) -> float:
        return self.seconds.get(worker, 0.0)


def _partitions(k: int, seed: int = 0) -> list[PartitionRows]:
    rng = np.random.default_rng(seed)
    return [
        PartitionRows(p, rng.standard_normal((4, DIM)), rng.standard_normal(4)) for p in range(k)
    ]


class _Cluster:
    """n workers' contexts on one in-process network; uploads and failures recorded."""

    def __init__(self, n: int, delays: dict[int, float] | None = None) -> None:
        self.network: dict[int, Receive] = {}
        self.uploads: dict[int, list[Upload]] = {w: [] for w in range(n)}
        self.errors: list[tuple[int, int, str]] = []
        self.failures: list[tuple[int, int, str]] = []
        # (reporter, round, attempt, peer, seconds waited, when reported, received)
        self.silent: list[tuple[int, int, int, int, float, float, int]] = []
        self.faults: dict[int, PeerFault] = {}
        self.refused: list[tuple[int, int, str]] = []  # (sender, peer, why)
        self.links = {
            w: LocalPeerLinks(w, self.network, self._failed(w), self._refused(w)) for w in range(n)
        }
        self.stats = {w: WorkerStats() for w in range(n)}
        self.delays = _Delays(delays or {})

    def _failed(self, w: int):  # type: ignore[no-untyped-def]
        return lambda peer, address, reason: self.failures.append((w, peer, reason))

    def _refused(self, w: int):  # type: ignore[no-untyped-def]
        return lambda peer, reason: self.refused.append((w, peer, reason))

    def context(self, w: int, computer: Computer) -> TopologyContext:
        def send(message: Outgoing) -> None:
            assert isinstance(message, Upload)
            self.uploads[w].append(message)

        def silent(
            round_: int, attempt: int, peer: int, waited: float, what: str, received: int
        ) -> None:
            self.silent.append((w, round_, attempt, peer, waited, time.monotonic(), received))

        return TopologyContext(
            job_id="j",
            index=w,
            dim=DIM,
            computer=computer,
            straggler=self.delays,  # type: ignore[arg-type]
            load=0.5,
            stats=self.stats[w],
            links=self.links[w],
            send=send,
            chunk_bytes=CHUNK,
            silent=silent,
            fault=self.faults.get(w),
        )

    def error(self, w: int):  # type: ignore[no-untyped-def]
        return lambda round_, message: self.errors.append((w, round_, message))

    async def wait_uploads(self, workers: list[int], count: int = 1) -> None:
        for _ in range(500):
            if all(len(self.uploads[w]) >= count for w in workers):
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"uploads: { {w: len(u) for w, u in self.uploads.items()} }")


def _rings(cluster: _Cluster, n: int) -> list[RingRounds]:
    """A ring of n workers on the cluster's network, each holding one partition."""
    parts = _partitions(n)
    rings = [
        RingRounds(
            cluster.context(w, Computer(LeastSquares(), [parts[w]], np.ones((1, 1)))),
            n,
            cluster.error(w),
        )
        for w in range(n)
    ]
    for w, ring in enumerate(rings):
        cluster.network[w] = ring.receive
    return rings


def _payload(upload: Upload) -> np.ndarray:
    return np.asarray(upload.payload, dtype=np.float64)


@pytest.mark.parametrize("n", [2, 3, 5])
async def test_a_ring_uploads_the_reference_segments_round_after_round(n: int) -> None:
    cluster = _Cluster(n)
    parts = _partitions(n)
    computers = [Computer(LeastSquares(), [parts[w]], np.ones((1, 1))) for w in range(n)]
    rings = [RingRounds(cluster.context(w, computers[w]), n, cluster.error(w)) for w in range(n)]
    for w, ring in enumerate(rings):
        cluster.network[w] = ring.receive
    bounds = segments(DIM, n)
    for t in range(3):
        theta = np.random.default_rng(t).standard_normal(DIM)
        for w, ring in enumerate(rings):
            ring.begin(t, 0, theta[slice(*bounds[w])].copy())
        await cluster.wait_uploads(list(range(n)), t + 1)
        own = [c.compute(theta).payload for c in computers]
        reference = reduced_segments(own)
        for w in range(n):
            upload = cluster.uploads[w][t]
            assert (upload.round, upload.segment) == (t, (w + 1) % n)
            assert np.array_equal(_payload(upload), reference[w])  # bit for bit
            (own_time,) = upload.timings  # its own, for the coordinator's record
            assert own_time.worker == w and 0 <= own_time.compute_seconds <= own_time.ready_seconds
    assert not cluster.errors and not cluster.failures
    assert all(cluster.stats[w].rounds_computed == 3 for w in range(n))
    # Each worker passed 2(n-1) segments a round on, and received as many.
    for w in range(n):
        totals = cluster.stats[w].peers["ring"]
        assert totals.bytes_sent > 3 * 2 * (n - 1) * 8 * (DIM // n)
        assert totals.bytes_received == 3 * 2 * (n - 1) * 0 + sum(
            8 * (hi - lo)
            for t in range(3)
            for step in range(n - 1)
            for lo, hi in [bounds[(w - 1 - step) % n]] * 2
        )


async def test_a_ring_names_the_link_that_broke() -> None:
    cluster = _Cluster(3)
    rings = _rings(cluster, 3)
    cluster.links[1].broken.add(2)  # worker 1 cannot reach worker 2
    bounds = segments(DIM, 3)
    for w, ring in enumerate(rings):
        ring.begin(0, 0, np.zeros(DIM)[slice(*bounds[w])])
    for _ in range(100):
        if cluster.failures:
            break
        await asyncio.sleep(0.01)
    assert cluster.failures[0][:2] == (1, 2)  # the fault fired, and is named
    for ring in rings:
        ring.stop()


def _tree(
    delays: dict[int, float] | None = None,
) -> tuple[_Cluster, CodedReduce, list[TreeRounds], list[Computer]]:
    policy = create("codedreduce", {"fanout": 3, "levels": 2, "s": 1}, seed=2)
    assert isinstance(policy, CodedReduce)
    plan = policy.plan(12, 15)
    tree, B = plan.topology.tree, plan.topology.code
    assert tree is not None and B is not None
    code = CyclicCode.from_matrix(B, tree.s)
    parts = _partitions(15, seed=1)
    cluster = _Cluster(12, delays)
    computers = [
        Computer(LeastSquares(), [parts[p] for p in wp.partitions], wp.coefficients)
        for wp in plan.workers
    ]
    nodes = [
        TreeRounds(
            cluster.context(w, computers[w]),
            tree.parent(w),
            tree.children(w),
            code if tree.children(w) else None,
            plan.topology.tol,
            cluster.error(w),
        )
        for w in range(12)
    ]
    for w, node in enumerate(nodes):
        cluster.network[w] = node.receive
    return cluster, policy, nodes, computers


def _start(nodes: list[TreeRounds], t: int, theta: np.ndarray) -> None:
    from codedgd.services.coordinator.dataplane import theta_frames
    from codedgd.services.framing import parse
    from codedgd.services.proto import codedgd_pb2 as pb
    from codedgd.services.wire import COORDINATOR_TENSOR_PATHS

    for raw in theta_frames("j", t, theta, {}, CHUNK):
        frame = parse(pb.CoordinatorMessage, raw, COORDINATOR_TENSOR_PATHS)
        for node in nodes[:3]:  # level 1 hears the coordinator
            node.theta_chunk(frame.message.round, frame.data)


async def test_codedreduce_workers_deliver_the_full_gradient_to_the_root() -> None:
    cluster, policy, nodes, _computers = _tree()
    theta = np.random.default_rng(5).standard_normal(DIM)
    _start(nodes, 0, theta)
    await cluster.wait_uploads([0, 1, 2])
    policy.begin_round(0, theta)
    done = False
    for w in range(3):
        done = policy.offer(w, _payload(cluster.uploads[w][0]))
        if done:
            break
    assert done
    # Σ over every base partition of its gradient: what uncoded would step with.
    full = sum(LeastSquares().grad_sum(theta, part.X, part.y) for part in _partitions(15, seed=1))
    np.testing.assert_allclose(policy.decode().gradient, full, rtol=1e-10)
    assert not cluster.errors and not cluster.failures


async def test_a_slow_leaf_is_left_out_of_its_parents_sum_and_told_to_stop() -> None:
    slow = 4  # a leaf below worker 0 (its children are 3, 4, 5)
    cluster, policy, nodes, _ = _tree({slow: 5.0})
    theta = np.random.default_rng(6).standard_normal(DIM)
    _start(nodes, 0, theta)
    await cluster.wait_uploads([0, 1, 2])
    upload = cluster.uploads[0][0]
    assert upload.contributors == (3, 5)  # the slow leaf's message is not in the sum
    cancels = [m for to, m in cluster.links[0].sent if to == slow and m.stage == "cancel"]
    assert cancels and cancels[0].round == 0  # the fault's effect fired: it was stopped
    await asyncio.sleep(0.05)
    assert cluster.stats[slow].rounds_cancelled == 1
    assert cluster.stats[0].peers["ring"].children_cancelled == 1
    policy.begin_round(0, theta)
    done = [policy.offer(w, _payload(cluster.uploads[w][0])) for w in range(2)]
    assert done[-1]
    full = sum(LeastSquares().grad_sum(theta, p.X, p.y) for p in _partitions(15, seed=1))
    np.testing.assert_allclose(policy.decode().gradient, full, rtol=1e-10)


async def test_a_trees_sums_carry_each_contributors_own_times_to_the_coordinator() -> None:
    """The coordinator hears level 1 only; each worker's own time from θ to its message
    (what tune fits) travels up with the sum it is in: the sender's and every
    contributor's, none of a worker left out, the slow one's delay in its own."""
    cluster, _, nodes, _ = _tree({1: 0.2, 4: 5.0})  # 4: a leaf of worker 0, left out
    _start(nodes, 0, np.random.default_rng(7).standard_normal(DIM))
    await cluster.wait_uploads([0, 1, 2])
    ready: dict[int, float] = {}
    for w in range(3):
        upload = cluster.uploads[w][0]
        times = {int(t.worker): t for t in upload.timings}
        assert set(times) == {w, *upload.contributors}
        for v, t in times.items():
            assert 0 <= t.compute_seconds <= t.ready_seconds
            ready[v] = t.ready_seconds
    # Each parent sums two of its three children (s = 1): 3 + 3 x 2 workers timed.
    assert 4 not in ready and len(ready) == 9
    assert ready[1] >= 0.2 and max(s for v, s in ready.items() if v != 1) < 0.2
    for node in nodes:
        node.stop()


async def test_a_sum_whose_timings_name_a_worker_not_in_it_is_refused() -> None:
    from codedgd.services.errors import WireError
    from codedgd.services.framing import parse
    from codedgd.services.proto import codedgd_pb2 as pb
    from codedgd.services.wire import PEER_TENSOR_PATHS
    from codedgd.services.worker.topology import peer_frames

    _cluster, _, nodes, _ = _tree({w: 5.0 for w in range(12)})  # the round stays open
    _start(nodes, 0, np.zeros(DIM))
    for timings, why in [
        ([pb.WorkerTiming(worker=9, compute_seconds=0.1, ready_seconds=0.2)], "worker 9"),
        ([pb.WorkerTiming(worker=3, compute_seconds=0.3, ready_seconds=0.2)], "compute 0.3"),
        ([pb.WorkerTiming(worker=3, compute_seconds=0.1, ready_seconds=math.inf)], "inf"),
    ]:
        (raw,) = list(
            peer_frames("j", 0, 0, 3, "reduce", "gradient", np.ones(DIM), 1 << 20, timings=timings)
        )
        frame = parse(pb.PeerData, raw, PEER_TENSOR_PATHS)
        with pytest.raises(WireError, match=why):
            nodes[0].receive(frame.message, frame.data)
    for node in nodes:
        node.stop()


async def test_a_push_from_a_worker_that_is_not_a_child_is_refused() -> None:
    from codedgd.services.errors import WireError
    from codedgd.services.framing import parse
    from codedgd.services.proto import codedgd_pb2 as pb
    from codedgd.services.wire import PEER_TENSOR_PATHS
    from codedgd.services.worker.topology import peer_frames

    _cluster, _, nodes, _ = _tree({w: 5.0 for w in range(12)})  # the round stays open
    _start(nodes, 0, np.zeros(DIM))
    (raw,) = list(peer_frames("j", 0, 0, 7, "reduce", "gradient", np.ones(DIM), 1 << 20))
    frame = parse(pb.PeerData, raw, PEER_TENSOR_PATHS)  # worker 7 is worker 2's child, not 0's
    with pytest.raises(WireError, match="not from worker 7"):
        nodes[0].receive(frame.message, frame.data)
    for node in nodes:
        node.stop()


def _roots(cluster: _Cluster) -> list[int]:
    """Whom the coordinator's rule blames from the workers' silent reports."""
    stalls = [
        Stall(r, frozenset({p}), at - waited, "data", got)
        for r, _, _, p, waited, at, got in cluster.silent
    ]
    return list(silent_roots(stalls, time.monotonic()))


async def test_a_ring_reports_its_silent_member_and_only_it_is_to_blame() -> None:
    n, deadline = 4, 0.3
    cluster = _Cluster(n)
    cluster.faults[1] = PeerFault.parse("silent:1")  # worker 1 goes quiet from round 1
    rings = _rings(cluster, n)
    bounds = segments(DIM, n)
    for t in range(2):
        for w, ring in enumerate(rings):
            ring.begin(t, 0, np.zeros(DIM)[slice(*bounds[w])], deadline)
        if t == 0:
            await cluster.wait_uploads(list(range(n)))
    assert not cluster.silent  # round 0 went round within its deadline
    await asyncio.sleep(deadline * 3)
    assert cluster.faults[1].fired > 0  # the fault fired
    # Worker 2, which hears from worker 1, reported it first; the others waited behind it.
    first = min(cluster.silent, key=lambda r: r[5])
    assert (first[0], first[1], first[3]) == (2, 1, 1)
    assert first[4] >= deadline
    assert _roots(cluster) == [1]
    # Each wait says how far its peer got: worker 2 heard nothing of round 1 from worker 1;
    # the stall spread downstream, one more message had per hop, round to worker 1 itself
    # (waiting in its reduce-scatter, having had all n - 1 θ segments).
    received = {(r[0], r[3]): r[6] for r in cluster.silent}
    assert received == {(2, 1): 0, (3, 2): 1, (0, 3): 2, (1, 0): n - 1}
    # So the counts alone find the hung worker, even were the reports' starts misjudged
    # (on a loaded machine, when a wait began is estimated across scheduling and transit).
    reversed_starts = [
        Stall(r, frozenset({p}), -at, "data", got) for r, _, _, p, _, at, got in cluster.silent
    ]
    assert list(silent_roots(reversed_starts, time.monotonic())) == [1]
    # once per peer and round: no report repeats
    assert len({(r[0], r[1], r[3]) for r in cluster.silent}) == len(cluster.silent)
    assert all(len(cluster.uploads[w]) == 1 for w in range(n))  # round 1 is stuck, not failed
    assert not cluster.errors
    for ring in rings:
        ring.stop()


async def test_a_tree_node_reports_the_children_it_still_needs_past_the_deadline() -> None:
    cluster, _policy, nodes, _ = _tree()
    cluster.faults.update({3: PeerFault.parse("silent:0"), 4: PeerFault.parse("silent:0")})
    for w in (3, 4):  # rebuild the two leaves with their faults
        nodes[w].ctx.fault = cluster.faults[w]
    from codedgd.services.coordinator.dataplane import theta_frames
    from codedgd.services.framing import parse
    from codedgd.services.proto import codedgd_pb2 as pb
    from codedgd.services.wire import COORDINATOR_TENSOR_PATHS

    for raw in theta_frames("j", 0, np.zeros(DIM), {}, CHUNK, deadline=0.3):
        frame = parse(pb.CoordinatorMessage, raw, COORDINATOR_TENSOR_PATHS)
        for node in nodes[:3]:
            node.theta_chunk(frame.message.round, frame.data)
    await cluster.wait_uploads([1, 2])  # the other level-1 nodes decode as usual
    await asyncio.sleep(0.6)
    # worker 0's children are 3, 4, 5: with 3 and 4 silent it cannot decode (needs 2)
    reports = {(r[0], r[3]) for r in cluster.silent}
    assert reports == {(0, 3), (0, 4)}
    assert sorted(_roots(cluster)) == [3, 4]
    assert not cluster.uploads[0]
    for node in nodes:
        node.stop()


async def test_a_wrong_shape_push_is_refused_on_arrival_and_blamed_on_its_sender() -> None:
    """A member of the job pushing a tensor one value short: the receiver refuses it at
    once (its round unharmed, still waiting for a valid push), and the sender hears that
    the fault is its own; nothing is reported against the receiver."""
    n = 3
    cluster = _Cluster(n)
    cluster.faults[0] = PeerFault.parse("shape:0")
    rings = _rings(cluster, n)
    bounds = segments(DIM, n)
    for w, ring in enumerate(rings):
        ring.begin(0, 0, np.zeros(DIM)[slice(*bounds[w])])
    for _ in range(100):
        if cluster.refused:
            break
        await asyncio.sleep(0.01)
    assert cluster.faults[0].fired > 0  # the fault fired
    sender, peer, why = cluster.refused[0]
    assert (sender, peer) == (0, 1) and "shape" in why
    assert not cluster.errors and not cluster.failures  # no one else's round is harmed
    assert not any(cluster.uploads.values())
    for ring in rings:
        ring.stop()


async def test_data_too_far_ahead_is_refused() -> None:
    from codedgd.services.errors import WireError
    from codedgd.services.worker.peers import peer_frame
    from codedgd.services.worker.topology import Mailbox, peer_frames

    mailbox = Mailbox()
    mailbox.expect("reduce", 0, [1], (2,))
    mailbox.begin(5, 0)
    for r in (6, 7):  # one and two rounds ahead: kept
        for raw in peer_frames("j", r, 0, 1, "reduce", "gradient", np.ones(2), 1024):
            frame = peer_frame(raw)
            mailbox.put(frame.message, frame.data)
    frame = peer_frame(next(peer_frames("j", 8, 0, 1, "reduce", "gradient", np.ones(2), 1024)))
    with pytest.raises(WireError, match="too far ahead"):
        mailbox.put(frame.message, frame.data)
    old = peer_frame(next(peer_frames("j", 4, 0, 1, "reduce", "gradient", np.ones(2), 1024)))
    mailbox.put(old.message, old.data)  # an older round's: dropped, not refused
    assert mailbox.dropped == 1
