"""Rings and trees of real worker processes over loopback gRPC, peers pushing to peers.

Each test starts its worker processes once (with a Peer service on loopback) and runs
its jobs on them one after another.
"""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from grpc import aio

from codedgd.services.codes.tree import TreeShape
from codedgd.services.coordinator.job_run import JobRun
from codedgd.services.coordinator.server import CoordinatorServer
from codedgd.services.job import Component, JobConfig
from codedgd.services.proto import codedgd_pb2 as pb
from codedgd.services.security import Security
from codedgd.services.worker.peers import PUSH_METHOD, PeerServer
from codedgd.services.worker.topology import peer_frames
from tests.conftest import WorkerProcesses
from tests.e2e.fakes import wait_for
from tests.e2e.test_training import SYNTH, reference_gd

PEERS = ("--peer-listen", "127.0.0.1:0")
CODEDREDUCE = Component("codedreduce", {"fanout": 3, "levels": 2, "s": 1})
CODEDREDUCE_TREE = TreeShape(3, 2, 1)


def _config(policy: Component, workers: int, rounds: int, **job: Any) -> JobConfig:
    return JobConfig(
        workers=workers,
        rounds=rounds,
        seed=9,
        data=SYNTH,
        model=Component("logistic", {"l2": 1e-3}),
        policy=policy,
        **job,
    )


async def _run(server: CoordinatorServer, config: JobConfig, timeout: float = 120) -> JobRun:
    job = server.service.submit(config)

    async def finished() -> None:
        while not job.finished:
            await job.wait_change()

    await asyncio.wait_for(finished(), timeout=timeout)
    return job


def _assert_gd(job: JobRun, config: JobConfig) -> None:
    assert job.state == "done", job.error
    assert len(job.records) == config.rounds and all(r.exact for r in job.records)
    assert job.theta is not None
    expected = reference_gd(config)
    assert np.linalg.norm(job.theta - expected) <= 1e-9 * np.linalg.norm(expected)


async def test_ring_tree_and_codedreduce_step_like_gradient_descent_for_20_rounds(
    coordinator: CoordinatorServer, worker_processes: WorkerProcesses
) -> None:
    worker_processes.start(coordinator.port, 12, extra=PEERS)
    stragglers = Component("exponential", {"mean": 0.005})
    dim = 20
    for policy, n in (
        (Component("ring-allreduce"), 12),
        (Component("ring-allreduce"), 2),
        (Component("tree", {"fanout": 3, "levels": 2}), 12),
        (CODEDREDUCE, 12),
        # A root fanout of its own: 2 + 6 (the coordinator decodes 1 of its 2 with B(2, 1)),
        # and 4 + 8 (uncoded).
        (Component("codedreduce", {"fanout": 3, "levels": 2, "s": 1, "root": 2}), 8),
        (Component("tree", {"fanout": 2, "levels": 2, "root": 4}), 12),
    ):
        config = _config(policy, n, 20, stragglers=stragglers)
        job = await _run(coordinator, config)
        _assert_gd(job, config)
        first = job.records[0]
        if policy.name == "ring-allreduce":  # O(ℓ) in and out at the coordinator
            assert 8 * dim <= first.bytes_up < 8 * dim + 200 * n
            assert first.workers_used == tuple(range(n))
        else:  # it hears level 1 only
            level1 = int(policy.options.get("root", 0) or policy.options.get("fanout", 3))
            needed = level1 - int(policy.options.get("s", 0))  # the root decodes these
            assert len(set(range(level1)) & set(first.workers_used)) >= needed
            assert needed <= first.uploads <= level1
            assert first.bytes_up < level1 * (8 * dim + 200)
        # Every worker computes every round (a tree's below level 1 too), as simulated.
        assert all(r.computations == n for r in job.records), policy
        for r in job.records:  # yet every counted worker's own time reached it (tune's)
            assert set(r.workers_used) <= set(r.ready_seconds), (policy, r.round)
            assert all(
                r.ready_seconds[w] >= r.worker_compute_seconds[w] >= 0 for w in r.ready_seconds
            )


async def test_codedreduce_leaves_out_exactly_the_workers_a_trace_slows(
    coordinator: CoordinatorServer, worker_processes: WorkerProcesses, tmp_path: Path
) -> None:
    """A sample of straggler patterns, one per round: the slow worker's message is in no
    sum (the record names who counted), and θ is gradient descent's."""
    slow = {0: [4], 1: [1], 2: [3, 7], 3: [4, 8, 10], 4: []}  # round → slowed workers
    trace = [[0.8 if w in slow[t] else 0.0 for w in range(12)] for t in range(5)]
    path = tmp_path / "delays.json"
    path.write_text(json.dumps(trace))
    worker_processes.start(coordinator.port, 12, extra=PEERS)
    config = _config(
        CODEDREDUCE, 12, 5, stragglers=Component("trace", {"path": str(path)}), round_timeout=60
    )
    job = await _run(coordinator, config)
    _assert_gd(job, config)
    tree = CODEDREDUCE_TREE
    for t, record in enumerate(job.records):
        excluded = set(range(12)) - set(record.workers_used)
        assert set(slow[t]) <= excluded, (t, record.workers_used)
        # Every group of three siblings counts two: 2 of level 1, 2 below each of those.
        assert len(record.workers_used) == 2 + 2 * 2
        # The record names every worker left out, and why.
        assert set(record.excluded) == excluded
        for w, why in record.excluded.items():
            parent = tree.parent(w)
            if parent == -1:
                assert why.startswith("cancelled"), (w, why)
            elif parent in record.workers_used:
                assert why.startswith(f"left out by worker {parent}: slower"), (w, why)
                if not tree.children(w):  # a leaf: its own time bounded by its siblings'
                    assert 0 < record.left_out_seconds[w] < (0.8 if w in slow[t] else 1e9)
            else:
                assert why == f"below worker {parent}, which the round did without"
        assert record.attempts == 1 and not record.restarts


def _procs_by_name(procs: list[Any]) -> dict[str, Any]:
    return {p.args[p.args.index("--name") + 1]: p for p in procs}


@pytest.mark.parametrize("policy", [Component("ring-allreduce"), CODEDREDUCE], ids=["ring", "cr"])
async def test_a_killed_worker_is_replaced_and_the_round_runs_again(
    coordinator: CoordinatorServer, worker_processes: WorkerProcesses, policy: Component
) -> None:
    """kill -9 of a worker mid-job: its peers' links fail, a spare takes its place, the
    round starts again as a new attempt, and θ stays gradient descent's."""
    n = 4 if policy.name == "ring-allreduce" else 12
    procs = _procs_by_name(worker_processes.start(coordinator.port, n + 1, extra=PEERS))
    # CodedReduce (s = 1) goes on without the lost level-1 worker while the spare loads
    # its data: enough rounds that the job is still running when the spare takes over (a
    # 16-round job once finished first, on a loaded machine).
    rounds = 16 if policy.name == "ring-allreduce" else 300
    config = _config(policy, n, rounds, replace_timeout=60, round_timeout=60)
    job = coordinator.service.submit(config)
    await wait_for(lambda: len(job.records) >= 4, timeout=90)
    victim = 1  # a level-1 worker of the tree, a ring member
    killed = procs[job.places.holders[victim].name]
    killed.send_signal(signal.SIGKILL)
    await _run_to_end(job)
    _assert_gd(job, config)
    metrics = coordinator.service.metrics
    assert killed.poll() is not None  # the fault fired
    assert metrics.replacements._value.get() == 1
    # A ring cannot finish a round without every member: it starts the round again once
    # the spare joined. CodedReduce (s = 1) decodes without one level-1 worker: no restart.
    restarts = metrics.round_restarts._value.get()
    assert restarts >= 1 if policy.name == "ring-allreduce" else restarts == 0
    # A restarted round's record counts every attempt's computations, as the metric does.
    assert sum(r.computations for r in job.records) == metrics.computations._value.get()


async def _run_to_end(job: JobRun) -> None:
    async def finished() -> None:
        while not job.finished:
            await job.wait_change()

    await asyncio.wait_for(finished(), timeout=120)


async def test_a_tree_goes_on_without_a_lost_leaf_within_s(
    coordinator: CoordinatorServer, worker_processes: WorkerProcesses
) -> None:
    """A leaf killed with no spare: its parent decodes from the other two, every round."""
    procs = _procs_by_name(worker_processes.start(coordinator.port, 12, extra=PEERS))
    config = _config(CODEDREDUCE, 12, 12, round_timeout=60)
    job = coordinator.service.submit(config)
    await wait_for(lambda: len(job.records) >= 3, timeout=90)
    leaf = 7
    procs[job.places.holders[leaf].name].send_signal(signal.SIGKILL)
    killed_after = len(job.records)  # rounds go on meanwhile: count from the kill
    await _run_to_end(job)
    _assert_gd(job, config)
    assert leaf in job.places.lost
    assert all(leaf not in r.workers_used for r in job.records[killed_after + 1 :])


async def test_a_job_without_peer_services_is_refused_naming_the_flag(
    coordinator: CoordinatorServer, worker_processes: WorkerProcesses
) -> None:
    worker_processes.start(coordinator.port, 2)
    job = await _run(coordinator, _config(Component("ring-allreduce"), 2, 3))
    assert job.state == "failed" and "--peer-listen" in job.error


async def test_a_push_without_the_jobs_credential_is_refused_before_it_is_read() -> None:
    received: list[pb.PeerData] = []

    def receive(message: pb.PeerData, data: memoryview | None) -> None:
        received.append(message)

    server = PeerServer(receive, lambda: ("the-right-one",), Security())
    port = await server.start("127.0.0.1:0")
    try:
        big = np.zeros(1 << 20)  # 8 MB the server must not read
        frames = list(peer_frames("j", 0, 0, 1, "reduce", "gradient", big, 1 << 22))
        async with aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            push = channel.stream_unary(PUSH_METHOD, response_deserializer=pb.PeerAck.FromString)
            for credential in ("wrong", ""):

                async def requests() -> Any:
                    for frame in frames:
                        yield frame

                metadata = (("authorization", f"Bearer {credential}"),)
                with pytest.raises(aio.AioRpcError) as refused:
                    await push(requests(), metadata=metadata)
                # The server answers UNAUTHENTICATED at once; a client still writing its
                # 8 MB may see the write fail first (gRPC then says INTERNAL).
                assert refused.value.code() in (
                    grpc.StatusCode.UNAUTHENTICATED,
                    grpc.StatusCode.INTERNAL,
                )
            assert server.refused == 2 and not received
            ack = await push(
                iter(frames[:1]), metadata=(("authorization", "Bearer the-right-one"),)
            )
            assert ack.received == 1 and len(received) == 1
    finally:
        await server.stop()


TREE_2X2 = Component("tree", {"fanout": 2, "levels": 2})  # level 1: 0, 1; leaves: 2-5


@pytest.mark.parametrize(
    ("policy", "n", "hung_first"),
    [
        (Component("ring-allreduce"), 4, False),
        # The tree cases wait out a 5 s deadline each: the slow suite runs them.
        pytest.param(TREE_2X2, 6, False, marks=pytest.mark.slow),  # the last place: a leaf
        # The first to connect: place 0, a level-1 node that stops passing θ down.
        pytest.param(TREE_2X2, 6, True, marks=pytest.mark.slow),
    ],
    ids=["ring", "tree-leaf", "tree-inner"],
)
async def test_a_silent_peer_is_caught_by_the_measured_deadline_and_replaced(
    coordinator: CoordinatorServer,
    worker_processes: WorkerProcesses,
    policy: Component,
    n: int,
    hung_first: bool,
) -> None:
    """A worker that stays connected but sends its peers nothing from round 3 on (the
    --peer-fault test instrument): it is reported past the deadline derived from the
    rounds before (not round_timeout's 120 s), the coordinator releases it (not the
    peers stalled behind it, nor the children it stopped passing θ to), a spare takes its
    place, the round runs again, and θ stays gradient descent's."""
    idle = coordinator.service.sessions.idle

    def start_hung() -> Any:
        return worker_processes.start(
            coordinator.port, 1, name="hung", extra=(*PEERS, "--peer-fault", "silent:3")
        )[0]

    hung = start_hung() if hung_first else None
    await wait_for(lambda: len(idle()) >= (1 if hung_first else 0), timeout=30)
    worker_processes.start(coordinator.port, n - 1, extra=PEERS)
    await wait_for(lambda: len(idle()) >= (n if hung_first else n - 1), timeout=30)
    hung = hung or start_hung()
    await wait_for(lambda: len(idle()) >= n, timeout=30)
    config = _config(policy, n, 8, replace_timeout=60, round_timeout=120)
    job = coordinator.service.submit(config)
    await wait_for(lambda: job.state == "running", timeout=60)
    worker_processes.start(coordinator.port, 1, name="spare", extra=PEERS)
    await _run_to_end(job)
    _assert_gd(job, config)
    place = next(i for i, s in enumerate(job.places.holders) if s.name.startswith("spare"))
    assert place == (0 if hung_first else n - 1)  # the hung worker's place, and only it
    record = job.records[3]
    assert record.attempts == 2, record
    assert "silent" in record.restarts[0] and f"worker {place}" in record.restarts[0]
    assert coordinator.service.metrics.stragglers.labels("silent_peer")._value.get() == 1
    # Caught by the derived deadline: far sooner than round_timeout.
    assert record.round_seconds < 30
    hung.terminate()  # (the coordinator runs on this event loop: wait off it)
    _, err = await asyncio.to_thread(hung.communicate, timeout=30)
    assert b"TEST INSTRUMENT --peer-fault silent:3 fired" in err  # the fault fired


async def test_a_killed_worker_of_a_plain_tree_is_replaced_and_the_round_runs_again(
    coordinator: CoordinatorServer, worker_processes: WorkerProcesses
) -> None:
    """tree (s = 0) cannot decode without any node: kill -9 of a leaf mid-job, a spare
    takes its place, the round starts again, θ stays gradient descent's."""
    policy = Component("tree", {"fanout": 2, "levels": 2})
    procs = _procs_by_name(worker_processes.start(coordinator.port, 7, extra=PEERS))
    config = _config(policy, 6, 12, replace_timeout=60, round_timeout=60)
    job = coordinator.service.submit(config)
    await wait_for(lambda: len(job.records) >= 3, timeout=90)
    leaf = 4
    killed = procs[job.places.holders[leaf].name]
    killed.send_signal(signal.SIGKILL)
    await _run_to_end(job)
    _assert_gd(job, config)
    assert killed.poll() is not None  # the fault fired
    assert coordinator.service.metrics.round_restarts._value.get() >= 1
    restarted = [r for r in job.records if r.attempts > 1]
    assert restarted and all(f"worker {leaf}" in r.restarts[0] for r in restarted)


async def test_a_ring_without_a_replacement_fails_naming_the_lost_worker(
    coordinator: CoordinatorServer, worker_processes: WorkerProcesses
) -> None:
    procs = _procs_by_name(worker_processes.start(coordinator.port, 3, extra=PEERS))
    config = _config(Component("ring-allreduce"), 3, 200, round_timeout=60)
    job = coordinator.service.submit(config)
    await wait_for(lambda: len(job.records) >= 3, timeout=90)
    victim = job.places.holders[1].name
    procs[victim].send_signal(signal.SIGKILL)
    await _run_to_end(job)
    assert job.state == "failed"
    assert f"worker 1 ({victim})" in job.error and "ring-allreduce" in job.error, job.error
    assert "--replace-timeout" in job.error  # and how to do without failing


async def test_a_member_pushing_the_wrong_shape_is_released_not_its_receiver(
    coordinator: CoordinatorServer, worker_processes: WorkerProcesses
) -> None:
    """A ring member whose pushes are one value short from round 3 on (--peer-fault):
    its successor refuses them on arrival, the sender reports the fault as its own and
    gives up its place, a spare takes it, and no honest worker is lost."""
    n = 4
    honest = worker_processes.start(coordinator.port, n - 1, extra=PEERS)
    bad = worker_processes.start(
        coordinator.port, 1, name="bad", extra=(*PEERS, "--peer-fault", "shape:3")
    )[0]
    await wait_for(lambda: len(coordinator.service.sessions.idle()) >= n, timeout=30)
    config = _config(Component("ring-allreduce"), n, 8, replace_timeout=60, round_timeout=120)
    job = coordinator.service.submit(config)
    await wait_for(lambda: job.state == "running", timeout=60)
    worker_processes.start(coordinator.port, 1, name="spare", extra=PEERS)
    await _run_to_end(job)
    _assert_gd(job, config)
    record = job.records[3]
    assert record.attempts == 2 and "refused this worker's pushes" in record.restarts[0]
    assert {s.name for s in job.places.holders} == {"w0", "w1", "w2", "spare0"}
    assert all(p.poll() is None for p in honest)
    bad.terminate()  # (the coordinator runs on this event loop: wait off it)
    _, err = await asyncio.to_thread(bad.communicate, timeout=30)
    assert b"TEST INSTRUMENT --peer-fault shape:3 fired" in err  # the fault fired


@pytest.mark.parametrize("spare", [False, True], ids=["no-spare", "spare"])
async def test_an_advertised_peer_address_nobody_can_reach_is_named(
    coordinator: CoordinatorServer, worker_processes: WorkerProcesses, spare: bool
) -> None:
    """A worker that tells the coordinator a peer address nothing listens on: the peer
    that dials it names the worker and the address; the job replaces it (a spare joins and
    the round runs again) or, with no one to take its place, fails with that reason."""
    worker_processes.start(coordinator.port, 2, extra=PEERS)
    await wait_for(lambda: len(coordinator.service.sessions.idle()) >= 2, timeout=30)
    worker_processes.start(
        coordinator.port, 1, name="far", extra=(*PEERS, "--peer-address", "127.0.0.1:9")
    )
    await wait_for(lambda: len(coordinator.service.sessions.idle()) >= 3, timeout=30)
    config = _config(
        Component("ring-allreduce"), 3, 6, replace_timeout=60 if spare else 5, round_timeout=60
    )
    job = coordinator.service.submit(config)
    await wait_for(lambda: job.state == "running", timeout=60)
    if spare:
        worker_processes.start(coordinator.port, 1, name="spare", extra=PEERS)
    await _run_to_end(job)
    if spare:
        _assert_gd(job, config)
        restarted = [r for r in job.records if r.attempts > 1]
        assert restarted and "127.0.0.1:9" in restarted[0].restarts[0]
        assert "far0" not in {s.name for s in job.places.holders}
    else:
        assert job.state == "failed"
        assert "worker 2" in job.error and "peer address 127.0.0.1:9" in job.error, job.error
