"""uncoded's sum is built chunk by chunk as results arrive: each result counted once."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import numpy as np
import pytest

from codedgd.services.coordinator.server import CoordinatorServer
from codedgd.services.job import Component, JobConfig
from codedgd.services.proto import codedgd_pb2 as pb
from tests.e2e.fakes import FakeWorker, result, wait_for

DIM = 8
SYNTH = Component("synthetic", {"rows": 40, "dim": DIM})
CHUNK = 16  # two float64 a chunk: every result arrives in four chunks
VECTORS = {"a": np.arange(1.0, DIM + 1), "b": np.linspace(-3.0, 2.0, DIM)}


async def _run(
    coordinator: CoordinatorServer,
    fakes: list[FakeWorker],
    settled: Callable[[], bool] = lambda: True,
) -> object:
    """Run a one-round uncoded job with these fakes; stop them once ``settled()``."""
    for fake in fakes:
        fake.start()
    try:
        await wait_for(lambda: len(coordinator.service.sessions) == len(fakes))
        config = JobConfig(
            workers=len(fakes), rounds=1, data=SYNTH, optimizer={"lr": 1.0}, round_timeout=20
        )
        job = coordinator.service.submit(config)
        while not job.finished:
            await asyncio.wait_for(job.wait_change(), 60)
        await wait_for(settled)  # e.g. a Reject on its way to a fake
        return job
    finally:
        for fake in fakes:
            await fake.stop()


async def test_a_chunked_result_is_summed_once_and_a_second_one_is_dropped(
    coordinator: CoordinatorServer,
) -> None:
    def sender(name: str, duplicate: bool) -> FakeWorker:
        def behave(round_: int, theta: np.ndarray, a: pb.Assignment) -> list[pb.Result]:
            out = result(a.job_id, round_, VECTORS[name], CHUNK)
            if duplicate:  # the same round again, with a vector that would show
                out += result(a.job_id, round_, np.full(DIM, 1e6), CHUNK)
            return out

        return FakeWorker(coordinator.port, behave, name=name)

    job = await _run(coordinator, [sender("a", True), sender("b", False)])
    assert job.state == "done", job.error  # type: ignore[attr-defined]
    # θ1 = θ0 − lr·(Σ payloads)/N with θ0 = 0, lr = 1, λ = 0: proportional to a + b.
    theta = np.asarray(job.theta)  # type: ignore[attr-defined]
    expected = VECTORS["a"] + VECTORS["b"]
    scale = theta[0] / expected[0]
    assert scale < 0
    np.testing.assert_allclose(theta, scale * expected, rtol=1e-12)
    assert job.records[0].workers_used == (0, 1)  # type: ignore[attr-defined]


async def test_a_result_started_over_after_part_was_summed_loses_that_worker_clearly(
    coordinator: CoordinatorServer,
) -> None:
    def restarting(round_: int, theta: np.ndarray, a: pb.Assignment) -> list[pb.Result]:
        whole = result(a.job_id, round_, VECTORS["a"], CHUNK)
        return whole[:2] + whole  # two chunks, then from chunk 0 again

    def honest(round_: int, theta: np.ndarray, a: pb.Assignment) -> list[pb.Result]:
        return result(a.job_id, round_, VECTORS["b"], CHUNK)

    bad = FakeWorker(coordinator.port, restarting, name="a")
    good = FakeWorker(coordinator.port, honest, name="b")
    job = await _run(coordinator, [bad, good], settled=lambda: bad.rejected is not None)
    # Thrown out as lost; uncoded without replace_timeout cannot decode without it.
    assert job.state == "failed"  # type: ignore[attr-defined]
    assert "started over after part of it was summed" in job.error  # type: ignore[attr-defined]
    assert "job.replace_timeout" in job.error  # type: ignore[attr-defined]
    assert bad.rejected is not None and "started over" in bad.rejected


@pytest.mark.parametrize("cut", [(1, 3), (3, 1)])
async def test_a_worker_lost_part_way_through_a_summed_result_is_finished_by_its_replacement(
    coordinator: CoordinatorServer, cut: tuple[int, int]
) -> None:
    """Holders of place 0 send ``cut[0]``, then ``cut[1]`` of its 4 chunks and are lost; a
    third sends all 4. The sum must hold each of place 0's values exactly once."""

    def partly(chunks: int) -> Callable[[int, np.ndarray, pb.Assignment], list[pb.Result]]:
        def behave(round_: int, theta: np.ndarray, a: pb.Assignment) -> list[pb.Result]:
            return result(a.job_id, round_, VECTORS["a"], CHUNK)[:chunks]

        return behave

    def honest(round_: int, theta: np.ndarray, a: pb.Assignment) -> list[pb.Result]:
        return result(a.job_id, round_, VECTORS["b"], CHUNK)

    holders = [FakeWorker(coordinator.port, partly(c), name=f"a{c}") for c in cut]
    last = FakeWorker(coordinator.port, partly(4), name="a-last")
    b = FakeWorker(coordinator.port, honest, name="b")
    fakes = [*holders, last, b]
    holders[0].start()
    b.start()
    try:
        await wait_for(lambda: len(coordinator.service.sessions) == 2)
        config = JobConfig(
            workers=2,
            rounds=1,
            data=SYNTH,
            optimizer={"lr": 1.0},
            round_timeout=30,
            replace_timeout=30,
        )
        job = coordinator.service.submit(config)
        await wait_for(lambda: job.state == "running")
        index = next(i for i, w in enumerate(job.places.holders) if w.name == holders[0].name)
        in_sum = 0  # bytes of place 0's result in the sum so far
        for holder, chunks in zip(holders, cut, strict=True):
            if holder is not holders[0]:
                holder.start()
                await wait_for(lambda h=holder: job.places.holders[index].name == h.name)
            in_sum = max(in_sum, CHUNK * chunks)
            # Its chunks are in (the partial waits for the rest): now it is lost.
            await wait_for(
                lambda want=in_sum: (
                    (p := job.inbox.partials.get(index)) is not None
                    and p.assembler is not None
                    and p.assembler.added_bytes == want
                )
            )
            await holder.stop()
            await wait_for(lambda: index in job.places.lost)
        last.start()
        while not job.finished:
            await asyncio.wait_for(job.wait_change(), 60)
    finally:
        for fake in fakes:
            await fake.stop()
    assert job.state == "done", job.error
    theta = np.asarray(job.theta)
    expected = VECTORS["a"] + VECTORS["b"]
    scale = theta[0] / expected[0]  # -lr/N: one gradient step from θ0 = 0
    assert scale < 0
    np.testing.assert_allclose(theta, scale * expected, rtol=1e-12)
    assert job.records[0].workers_used == (0, 1)
