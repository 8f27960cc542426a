"""uncoded's sum is built chunk by chunk as results arrive: each result counted once."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import numpy as np

from services.coordinator.server import CoordinatorServer
from services.job import Component, JobConfig
from services.proto import codedgd_pb2 as pb
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


async def test_a_result_started_over_after_part_was_summed_fails_the_round_clearly(
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
    assert job.state == "failed"  # type: ignore[attr-defined]
    assert "added into the sum" in job.error  # type: ignore[attr-defined]
    assert bad.rejected is not None and "started over" in bad.rejected
