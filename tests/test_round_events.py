"""The round loop against stale events: a Lost or Replaced about a session that no
longer holds its index must change nothing (driven event by event, no network)."""

from __future__ import annotations

import asyncio
import contextlib
import time

import numpy as np
import pytest

from codedgd.services.coordinator.dataplane import RingPlane, StarPlane, TreePlane
from codedgd.services.coordinator.inbox import Arrival, Lost, Replaced
from codedgd.services.coordinator.job_run import JobRun
from codedgd.services.coordinator.metrics import CoordinatorMetrics
from codedgd.services.coordinator.places import Places
from codedgd.services.coordinator.replacement import next_place
from codedgd.services.coordinator.rounds import Outcome, RoundLoop
from codedgd.services.coordinator.sessions import Sessions, WorkerSession
from codedgd.services.errors import JobFailed
from codedgd.services.job import JobConfig
from codedgd.services.policies import Policy, create
from codedgd.services.policies.base import Estimate, JobContext, Plan, RoundSpec
from codedgd.services.policies.lag_coded import LagCoded
from codedgd.services.proto import codedgd_pb2 as pb
from codedgd.services.wire import DEFAULT_CHUNK_BYTES, tensor_chunks
from tests.policies.test_rounds import DEGENERATE_B

DIM = 6


def _session(index: int, name: str) -> WorkerSession:
    session = WorkerSession(index + 100, name, "test", has_data_dir=False)
    session.job_id, session.index = "j", index
    return session


def _job(n: int, replace_timeout: float = 0.0) -> tuple[JobRun, Policy]:
    config = JobConfig(workers=n, round_timeout=5.0, replace_timeout=replace_timeout)
    job = JobRun("j", config, Sessions(), CoordinatorMetrics())
    job.places.holders = [_session(i, f"w{i}") for i in range(n)]
    policy = create("uncoded", {})
    policy.plan(n, n)
    return job, policy


def _loop(job: JobRun) -> RoundLoop:
    plane = StarPlane(job.id, job.places, DEFAULT_CHUNK_BYTES, create("uncoded", {}).plan(2, 2))
    return RoundLoop(job.id, job.config, job.places, job.inbox, plane, job.metrics, job.throw_out)


def _answer(job: JobRun, *workers: int) -> None:
    """Results of round 0 from these workers, summed on arrival as uncoded's are."""
    for w in workers:
        result = pb.Result(job_id="j", round=0)
        job.inbox.put(Arrival(w, result, None, time.perf_counter(), summed=True))


def _theta_frames(session: WorkerSession) -> int:
    count = 0
    while not session.outbox.empty():
        item = session.outbox.get_nowait()
        count += isinstance(item, bytes)  # θ goes out as ready-made frames
    return count


async def _round(job: JobRun, policy: Policy) -> asyncio.Task[Outcome]:
    task = asyncio.create_task(_loop(job).one_round(0, np.zeros(DIM), policy))
    await asyncio.sleep(0.01)  # θ is out, the loop waits for events
    assert not task.done()
    return task


async def test_a_lost_event_about_the_previous_holder_of_an_index_is_ignored() -> None:
    job, policy = _job(2)  # uncoded, replace_timeout 0: a real loss fails the round at once
    previous = _session(0, "old")  # index 0 was replaced before its Lost was handled
    task = await _round(job, policy)
    job.inbox.put(Lost(0, "disconnected", previous))
    _answer(job, 0, 1)
    outcome = await asyncio.wait_for(task, 5)
    assert outcome.estimate.workers_used == (0, 1)


async def test_a_lost_event_about_the_holder_fails_uncoded_at_once() -> None:
    """The same event about the session that holds the index is a real loss."""
    job, policy = _job(2)
    task = await _round(job, policy)
    job.places.lost.add(0)
    job.inbox.put(Lost(0, "disconnected", job.places.holders[0]))
    try:
        await asyncio.wait_for(task, 5)
    except Exception as exc:
        assert "worker 0 was lost in round 0" in str(exc)
    else:
        raise AssertionError("the round decoded without worker 0")


async def test_a_replaced_event_about_a_newcomer_lost_again_sends_it_nothing() -> None:
    job, policy = _job(2, replace_timeout=5.0)
    job.places.lost.add(0)  # lost before the round: it waits for a replacement
    task = await _round(job, policy)
    assert _theta_frames(job.places.holders[1]) == 1 and _theta_frames(job.places.holders[0]) == 0
    flaky = _session(0, "flaky")
    job.places.holders[0] = flaky  # took the place, then was lost again before the event
    job.inbox.put(Replaced(0, flaky))
    await asyncio.sleep(0.01)
    assert _theta_frames(flaky) == 0 and not task.done()
    good = _session(0, "good")
    job.places.holders[0] = good
    job.places.lost.discard(0)
    job.inbox.put(Replaced(0, good))
    await asyncio.sleep(0.01)
    assert _theta_frames(good) == 1  # θ of the round in progress
    _answer(job, 0, 1)
    outcome = await asyncio.wait_for(task, 5)
    assert outcome.estimate.workers_used == (0, 1) and outcome.computations == 2


class _TwoOfThree(Policy):
    """A stand-in lazy rule: round t contacts workers 1 and 2 only, and needs both."""

    name = "two-of-three"
    summary = "test"
    exact = True

    def plan(self, n_workers: int, n_partitions: int) -> Plan:
        raise NotImplementedError

    def begin_round(self, t: int, theta: np.ndarray) -> RoundSpec:
        self._arrived: set[int] = set()
        return RoundSpec(round=t, workers=(1, 2))

    def offer(self, worker: int, payload: np.ndarray | None) -> bool:
        self._arrived.add(worker)
        return self._arrived == {1, 2}

    def decode(self) -> Estimate:
        return Estimate(np.zeros(DIM), tuple(sorted(self._arrived)), exact=True)

    def feasible(self, outstanding: frozenset[int]) -> bool:
        return self._arrived | (outstanding & {1, 2}) == {1, 2}


async def test_a_newcomer_takes_the_place_the_running_round_waits_for() -> None:
    job, _ = _job(3, replace_timeout=5.0)
    job.places.lost.update({0, 1})  # 0 is not contacted this round; 1 is, and is needed
    assert next_place(job.places, {0, 1}) == 0  # between rounds: the lowest
    task = await _round(job, _TwoOfThree())
    assert next_place(job.places, {0, 1}) == 1
    assert next_place(job.places, {0}) == 0
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def test_a_loss_that_leaves_lagc_short_fails_when_the_shortfall_shows() -> None:
    """lagc's first n-s messages are near-singular and the worker that could fix it was
    lost earlier: with replace_timeout 0 the round fails at that arrival, with the lost
    worker named, not at round_timeout."""
    job, _ = _job(4)
    policy = create("lagc", {"s": 1}, seed=1)
    policy.plan(4, 4)
    assert isinstance(policy, LagCoded) and policy.code is not None
    policy.code.B = DEGENERATE_B  # {0, 1, 3} cannot decode; {0, 2, 3} can
    policy.bind(JobContext(n_rows=8, step_size=0.5, smoothness=lambda parts: 1.0))
    task = await _round(job, policy)  # warm-up: all four contacted
    job.places.lost.add(2)
    job.inbox.put(Lost(2, "disconnected", job.places.holders[2]))
    await asyncio.sleep(0.01)
    assert not task.done()  # 0, 1 and 3 could still decode as far as anyone knows
    grads = np.random.default_rng(5).standard_normal((4, DIM))
    for w in (0, 1, 3):
        result = pb.Result(job_id="j", round=0)
        job.inbox.put(Arrival(w, result, DEGENERATE_B[w] @ grads, time.perf_counter()))
    with pytest.raises(JobFailed, match=r"cannot decode round 0 without the lost worker"):
        await asyncio.wait_for(task, 2)  # round_timeout is 5 s


async def test_a_lost_former_holder_cannot_acknowledge_for_the_newcomer() -> None:
    job, _ = _job(2)
    old = job.places.holders[0]
    job.places.lost.add(0)
    newcomer = _session(0, "newcomer")
    job.places.candidates[0] = newcomer
    job.places.acks[0] = asyncio.get_running_loop().create_future()
    job.ack(old, pb.AssignmentAck(job_id="j", ok=True))
    assert not job.places.acks[0].done()
    job.ack(newcomer, pb.AssignmentAck(job_id="j", ok=True))
    assert job.places.acks[0].result() == ""


async def test_a_newcomer_lost_before_its_join_starts_frees_the_place_at_once() -> None:
    job, _ = _job(2)
    job.places.lost.add(0)
    newcomer = _session(0, "newcomer")
    job.places.candidates[0] = newcomer
    job.places.acks[0] = asyncio.get_running_loop().create_future()  # as _replace_lost does
    job.lose(newcomer, "disconnected")
    assert job.places.acks[0].result().startswith("disconnected")


class _SumsAndSparesOne(Policy):
    """A stand-in that sums on arrival yet decodes from two of three: none does today."""

    name = "sums-and-spares-one"
    summary = "test"
    exact = False

    def plan(self, n_workers: int, n_partitions: int) -> Plan:
        raise NotImplementedError

    def begin_round(self, t: int, theta: np.ndarray) -> RoundSpec:
        self._arrived: set[int] = set()
        self._sum = np.zeros(DIM)
        return RoundSpec(round=t, workers=(0, 1, 2))

    def offer(self, worker: int, payload: np.ndarray | None) -> bool:
        raise NotImplementedError

    def arrival_sum(self) -> np.ndarray | None:
        return self._sum

    def offer_summed(self, worker: int) -> bool:
        self._arrived.add(worker)
        return len(self._arrived) >= 2

    def decode(self) -> Estimate:
        return Estimate(self._sum, tuple(sorted(self._arrived)), exact=False)

    def feasible(self, outstanding: frozenset[int]) -> bool:
        return len(self._arrived | outstanding) >= 2


async def test_a_round_never_decodes_with_half_of_a_lost_workers_result_in_its_sum() -> None:
    job, _ = _job(3)
    task = await _round(job, _SumsAndSparesOne())
    assert job.inbox.summing is not None
    # Worker 0 sent the first of two chunks, which went into the sum, then was lost.
    chunk = next(tensor_chunks("gradient", np.ones(DIM), chunk_bytes=8 * DIM // 2))
    result = pb.Result(job_id="j", round=0, payload=chunk)
    job.inbox.payload_len = [DIM] * 3
    job.deliver(job.places.holders[0], result, chunk.ByteSize())
    assert job.inbox.partials[0].assembler is not None
    job.lose(job.places.holders[0], "disconnected")
    _answer(job, 1, 2)  # enough for the stand-in to decode
    with pytest.raises(JobFailed, match=r"decoded without place\(s\) \[0\], part of whose"):
        await asyncio.wait_for(task, 5)


async def test_a_result_from_a_worker_already_lost_is_never_added_into_the_sum() -> None:
    """A worker that reported an error is lost, though its stream may stay open."""
    job, policy = _job(2, replace_timeout=5.0)
    task = await _round(job, policy)
    assert job.inbox.summing is not None
    job.inbox.payload_len = [DIM] * 2
    job.lose(job.places.holders[0], "gradient computation failed")
    chunk = next(tensor_chunks("gradient", np.ones(DIM)))
    job.deliver(job.places.holders[0], pb.Result(job_id="j", round=0, payload=chunk), 64)
    assert not job.inbox.summing.any() and 0 not in job.inbox.partials
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def test_a_rounds_computations_are_every_worker_its_theta_reaches() -> None:
    """The record's and the metric's computations: in a star or a ring, the workers sent
    θ_t; in a tree, θ_t goes to level 1 and down, so every worker below them computes
    too, but none below a lost one (θ_t reaches a worker only through its parent)."""
    tree = create("tree", {"fanout": 3, "levels": 2, "root": 4})  # 4 + 12: 0's are 4-6
    plane = TreePlane("job", Places("job"), DEFAULT_CHUNK_BYTES, tree.plan(16, 16))
    assert plane.computing([0, 1, 2, 3], set()) == 16
    assert plane.computing([0, 2, 3], {1}) == 12  # 1 and its 3 children
    assert plane.computing([0, 1, 2, 3], {4, 9}) == 14  # a leaf of 0's, one of 1's
    ring = RingPlane(
        "job", Places("job"), DEFAULT_CHUNK_BYTES, create("ring-allreduce", {}).plan(4, 4)
    )
    star = StarPlane("job", Places("job"), DEFAULT_CHUNK_BYTES, create("uncoded", {}).plan(4, 4))
    assert ring.computing([0, 1, 2, 3], set()) == star.computing([0, 2, 3], {1}) + 1 == 4
