"""A worker's rounds in-process: results, and failures reported instead of killing it.

The first round computes in a thread (nothing is known of its cost yet); later short
rounds compute on the event loop and are queued at once. Both paths must report a
failure (of the computation, of the straggler model) to the coordinator as a
WorkerError and keep the worker alive.
"""

from __future__ import annotations

import asyncio
from typing import ClassVar

import numpy as np
import scipy.sparse as sp

from codedgd.services.compute.gradient import Computer, PartitionRows
from codedgd.services.errors import DataError
from codedgd.services.framing import parse
from codedgd.services.models import LogisticRegression
from codedgd.services.proto import codedgd_pb2 as pb
from codedgd.services.wire import THETA_DATA, WORKER_TENSOR_PATHS, Assembler, chunks, framed
from codedgd.services.worker import agent as worker_agent
from codedgd.services.worker.agent import WorkerAgent, WorkerOptions
from codedgd.services.worker.rounds import Job as _Job
from codedgd.services.worker.uploads import Upload as _Upload

DIM = 6


class _BrokenStragglers:
    name: ClassVar[str] = "broken"

    def delay(self, worker: int, round: int, compute_seconds: float, load: float) -> float:
        raise DataError("the delay trace has 0 rounds but the job asked for round 0")


class _BrokenBlock:
    def grad_sum(self, theta: np.ndarray) -> np.ndarray:
        raise FloatingPointError("overflow in the gradient")


class _BrokenModel(LogisticRegression):
    def block(self, X: sp.csr_matrix, y: np.ndarray) -> _BrokenBlock:  # type: ignore[override]
        return _BrokenBlock()


def _agent(model: LogisticRegression, stragglers: object | None) -> WorkerAgent:
    rng = np.random.default_rng(0)
    X = sp.csr_matrix(rng.standard_normal((5, DIM)))
    y = (rng.random(5) < 0.5).astype(np.float64)
    agent = WorkerAgent(WorkerOptions())
    assignment = pb.Assignment(job_id="j", worker_index=0, n_workers=2, n_partitions=2)
    assignment.partitions.append(0)
    job = _Job("j", assignment, None)  # type: ignore[arg-type]
    job.computer = Computer(model, [PartitionRows(0, X, y)], np.ones((1, 1)))
    job.straggler = stragglers  # type: ignore[assignment]
    agent.rounds.job = job
    return agent


def _theta_frame(t: int) -> bytes:
    c = next(chunks("theta", np.linspace(-1, 1, DIM), 1 << 20))
    message = pb.CoordinatorMessage()
    message.round.job_id = "j"
    message.round.round = t
    c.fill(message.round.theta, with_data=False)
    return framed(message, THETA_DATA, c.data)


async def _round(agent: WorkerAgent, t: int) -> pb.WorkerMessage | _Upload:
    frame = worker_agent._coordinator_frame(_theta_frame(t))
    assert not isinstance(frame, Exception)
    assert await agent._handle(frame.message, frame.data)
    job = agent.rounds.job
    assert job is not None
    if job.task is not None:
        await job.task
    out = await asyncio.wait_for(agent._out.get(), timeout=5)
    assert out is not None and not isinstance(out, bytes)
    return out


async def test_both_paths_send_the_gradient() -> None:
    agent = _agent(LogisticRegression(), None)
    for t in range(3):  # round 0 in a thread, then on the loop
        out = await _round(agent, t)
        assert isinstance(out, _Upload)
        (raw,) = list(out)
        result = parse(pb.WorkerMessage, raw, WORKER_TENSOR_PATHS)
        got = Assembler("gradient", dtype="<f8", shape=(DIM,)).add(
            result.message.result.payload, result.data
        )
        assert result.message.result.round == t
        job = agent.rounds.job
        assert job is not None and job.computer is not None
        part = job.computer.partitions[0]
        expected = LogisticRegression().grad_sum(np.linspace(-1, 1, DIM), part.X, part.y)
        assert got is not None and np.array_equal(got, expected)
    assert agent.stats.rounds_computed == 3


async def test_a_failing_straggler_model_is_reported_on_both_paths() -> None:
    agent = _agent(LogisticRegression(), _BrokenStragglers())
    for t in range(3):
        out = await _round(agent, t)
        assert isinstance(out, pb.WorkerMessage) and out.WhichOneof("kind") == "error"
        assert out.error.round == t
        assert "straggler model failed: DataError: the delay trace has 0 rounds" in (
            out.error.message
        )
    assert agent._out.empty()


async def test_a_failing_computation_is_reported_on_both_paths() -> None:
    agent = _agent(_BrokenModel(), None)
    for t in range(2):
        # Round 0 computes in a thread and reports from the loop; round 1 (taken as
        # short) computes on the loop.
        agent.rounds.last_compute = float("inf") if t == 0 else 0.0
        out = await _round(agent, t)
        assert isinstance(out, pb.WorkerMessage) and out.WhichOneof("kind") == "error"
        assert out.error.round == t
        assert out.error.message == (
            "gradient computation failed: FloatingPointError: overflow in the gradient"
        )
    assert agent.stats.rounds_computed == 0
