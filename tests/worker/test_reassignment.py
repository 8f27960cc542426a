"""A worker re-assigned mid-job (auto changing its group size) keeps the rows it holds.

The coordinator ships a re-assigned worker the rows of only the partitions it lacks
(Assignment.reassignment in the .proto); the worker must compute its next rounds over all
the partitions listed, the kept ones and the shipped ones. A first assignment keeps
nothing from an earlier job: a partition listed without its rows is refused.
"""

from __future__ import annotations

import numpy as np

from codedgd.services.coordinator.assignment import partition_messages
from codedgd.services.job import Component, JobConfig
from codedgd.services.job.prepare import prepare
from codedgd.services.models import create_model
from codedgd.services.proto import codedgd_pb2 as pb
from codedgd.services.wire import DEFAULT_CHUNK_BYTES, tensor_chunks
from codedgd.services.worker import agent as worker_agent
from codedgd.services.worker.rounds import Rounds
from codedgd.services.worker.uploads import Outgoing, WorkerStats

CONFIG = JobConfig(
    workers=2, seed=5, data=Component("synthetic", {"rows": 120, "dim": 4}), eval_every=1
)


def _assignment(partitions: list[int], *, reassignment: bool) -> pb.Assignment:
    ones = np.ones((len(partitions), 1))
    return pb.Assignment(
        job_id="j",
        worker_index=0,
        n_workers=2,
        n_partitions=2,
        job_json=CONFIG.to_json(),
        partitions=partitions,
        coefficients=next(tensor_chunks("coefficients", ones)),
        chunks=1,
        dim=4,
        inline_data=True,
        reassignment=reassignment,
    )


async def _assign(
    rounds: Rounds, sent: list[Outgoing], a: pb.Assignment, shipped: list[int]
) -> pb.AssignmentAck:
    prepared = prepare(CONFIG, None)
    ds = prepared.dataset
    rounds.start_job(a)
    for p in shipped:
        block = prepared.blocks[p]
        frames = partition_messages("j", p, ds.X_train[block], ds.y_train[block], 1 << 20)
        for frame in frames:
            parsed = worker_agent._coordinator_frame(frame)
            assert not isinstance(parsed, Exception)
            rounds.add_data(parsed.message.data, parsed.data)
    await rounds.finish_assignment("j")
    ack = sent[-1]
    assert isinstance(ack, pb.WorkerMessage) and ack.HasField("ack")
    return ack.ack


async def _holding_partition_0() -> tuple[Rounds, list[Outgoing]]:
    """A worker's rounds, assigned partition 0 of the job (and what it sent)."""
    sent: list[Outgoing] = []
    rounds = Rounds(
        sent.append, data_dir=None, chunk_bytes=DEFAULT_CHUNK_BYTES, stats=WorkerStats()
    )
    assert (await _assign(rounds, sent, _assignment([0], reassignment=False), [0])).ok
    return rounds, sent


async def test_a_reassigned_worker_computes_over_its_kept_and_its_shipped_rows() -> None:
    rounds, sent = await _holding_partition_0()
    ack = await _assign(rounds, sent, _assignment([0, 1], reassignment=True), [1])
    assert ack.ok, ack.error
    job = rounds.job
    assert job is not None and job.computer is not None
    theta = np.linspace(-0.5, 0.5, 4)
    got = job.computer.compute(theta).payload
    prepared = prepare(CONFIG, None)
    ds, model = prepared.dataset, create_model("logistic", {})
    want = sum(model.block(ds.X_train[b], ds.y_train[b]).grad_sum(theta) for b in prepared.blocks)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    # Back to partition 1 alone: nothing shipped, partition 0 dropped.
    assert (await _assign(rounds, sent, _assignment([1], reassignment=True), [])).ok
    assert rounds.job is not None and sorted(rounds.job.intake.arrays) == [(1, "X"), (1, "y")]


async def test_a_first_assignment_keeps_nothing_from_before() -> None:
    rounds, sent = await _holding_partition_0()
    ack = await _assign(rounds, sent, _assignment([0, 1], reassignment=False), [1])
    assert not ack.ok
    assert "partition 0 was assigned but its data never arrived" in ack.error
