"""Shipping a job to its workers: each place's Assignment, then its partitions' rows.

A worker gets its place in the plan (partitions, encoding coefficients, the job
document), then the rows of its partitions as ``PartitionData`` chunks, then
``AssignmentEnd``; it acknowledges once it has built its data. A worker started with
``--data-dir`` loads a real dataset itself: no rows travel, and fingerprints in the
Assignment let it prove it holds the rows planned here. The same shipping serves a job's
start (:meth:`Assigner.assign`) and a newcomer taking a lost place
(:mod:`.replacement`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from codedgd.services.compute.lazy import LAST_UPLOAD_KEY
from codedgd.services.coordinator.metrics import CoordinatorMetrics
from codedgd.services.coordinator.places import Places
from codedgd.services.coordinator.sessions import Sessions, WorkerSession
from codedgd.services.data import is_generated
from codedgd.services.data.dataset import FINGERPRINT_PREFIX, Matrix, fingerprint, take_rows
from codedgd.services.errors import JobFailed
from codedgd.services.job import JobConfig
from codedgd.services.job.prepare import Prepared
from codedgd.services.policies.base import Plan
from codedgd.services.proto import codedgd_pb2 as pb
from codedgd.services.wire import PARTITION_DATA, chunks, framed, tensor_chunks

log = logging.getLogger("codedgd.coordinator")


@dataclass
class Assigner:
    """Ships one prepared job's places to worker sessions."""

    job_id: str
    config: JobConfig
    prepared: Prepared
    metrics: CoordinatorMetrics
    chunk_bytes: int
    timeout: float  # seconds to wait for workers, and for each acknowledgement
    places: Places
    credential: str = ""  # the job's peer credential (worker-to-worker topologies)
    assign_seconds: float = 0.0  # the job's start: first Assignment sent to the last ack

    @property
    def topology(self) -> str:
        return self.prepared.plan.topology.kind

    def can_take(self, session: WorkerSession) -> bool:
        """Can this worker hold a place of the job (a ring or tree needs a Peer service)?"""
        return self.topology == "star" or bool(session.peer_address)

    async def assign(
        self,
        sessions: Sessions,
        places: Places,
        on_idle: Callable[[int], None] | None = None,
    ) -> None:
        """Wait for n idle workers, give them the job's places, and wait for every ack.

        ``on_idle`` hears how many idle workers are connected while this waits for them."""
        n = self.config.workers
        try:
            chosen = await sessions.wait_idle(n, self.timeout, on_idle)
        except TimeoutError:
            raise JobFailed(
                f"the job needs {n} workers but only {len(sessions.idle())} idle worker(s) "
                f"connected within {self.timeout:.0f} s: start more workers "
                f"(codedgd worker --coordinator ...) or lower job.workers"
            ) from None
        places.take_all(chosen)
        without = [s.label for s in places.holders if not self.can_take(s)]
        if without:
            raise JobFailed(
                f"policy {self.config.policy.name!r} sends gradients between workers over a "
                f"{self.topology}, but {', '.join(without)} serve(s) no Peer service: start "
                "the workers with --peer-listen HOST:PORT (and --peer-address if their peers "
                "must dial another address)"
            )
        job_json = self.config.to_json()
        started = time.perf_counter()
        for index, session in enumerate(places.holders):
            await self.send(index, session, job_json)
        for index, future in places.acks.items():
            error = await self.acknowledged(future)
            if error and index in places.lost:
                # It went away before acknowledging (a crash, a cut link): its place is
                # vacant like any lost worker's, for a tolerant policy to do without or a
                # newcomer to take (or the first round fails naming it).
                log.warning(
                    "job %s: %s was lost while taking its assignment (%s); its place is vacant",
                    self.job_id,
                    places[index].label,
                    error,
                )
            elif error:
                raise JobFailed(f"{places[index].label} cannot take its assignment: {error}")
        self.assign_seconds = time.perf_counter() - started

    async def reassign(self, plan: Plan) -> Moved:
        """Move the job's places to ``plan`` between rounds (a policy's ``replan``): each
        holder gets its new Assignment with ``reassignment`` set and the rows of only the
        partitions it lacks; returns once every one has acknowledged, with the holders
        that refused or did not answer within the timeout (the caller takes their places
        from them: a newcomer takes one with the new plan)."""
        started = time.perf_counter()
        old = self.prepared.plan
        lacking = old.lacking(plan)
        self.prepared.plan = plan  # what every assignment from now on (newcomers too) gets
        job_json = self.config.to_json()
        loop = asyncio.get_running_loop()
        sent_bytes = rows = parts = 0
        waiting: dict[int, asyncio.Future[str]] = {}
        for index, session in enumerate(self.places.holders):
            if index in self.places.lost:
                continue  # vacant: its newcomer is assigned the new plan
            waiting[index] = self.places.acks[index] = loop.create_future()
            sent = await self.send(index, session, job_json, reassign=lacking[index])
            sent_bytes += sent
            parts += len(lacking[index])
            rows += sum(int(self.prepared.blocks[p].shape[0]) for p in lacking[index])
        refused = {}
        for index, future in waiting.items():
            error = await self.acknowledged(future)
            if error and index not in self.places.lost:
                refused[index] = error
        seconds = time.perf_counter() - started
        return Moved(seconds, sent_bytes, parts, rows, refused)

    async def acknowledged(self, future: asyncio.Future[str]) -> str:
        """The worker's answer to its assignment: "" when it took it, else why not."""
        try:
            return await asyncio.wait_for(future, timeout=self.timeout)
        except TimeoutError:
            return f"no acknowledgement within {self.timeout:.0f} s"

    async def send(
        self,
        index: int,
        session: WorkerSession,
        job_json: str,
        *,
        replacement: bool = False,
        reassign: tuple[int, ...] | None = None,
    ) -> int:
        """Queue place ``index``'s Assignment, its partitions' rows and AssignmentEnd;
        the bytes queued. ``reassign``: a re-assignment of a holder, shipping the rows of
        only these partitions (the ones it lacks)."""
        prepared = self.prepared
        plan, ds = prepared.plan, prepared.dataset
        n, dim = self.config.workers, prepared.dim
        wp = plan.workers[index]
        coeff = next(tensor_chunks("coefficients", wp.coefficients.astype(np.float64)))
        # A worker started with --data-dir loads real datasets itself (no data on the
        # wire); the fingerprints let it prove it holds the rows planned here.
        from_disk = session.has_data_dir and not is_generated(self.config.data.name)
        options = dict(wp.options)
        parts = {p: take_rows(ds.X_train, prepared.blocks[p]) for p in wp.partitions}
        if from_disk:
            for p in wp.partitions:
                key = f"{FINGERPRINT_PREFIX}{p}"
                options[key] = fingerprint(parts[p], ds.y_train[prepared.blocks[p]])
        assignment = pb.CoordinatorMessage(
            assignment=pb.Assignment(
                job_id=self.job_id,
                worker_index=index,
                n_workers=n,
                job_json=job_json,
                partitions=list(wp.partitions),
                coefficients=coeff,
                chunks=wp.chunks,
                dim=dim,
                inline_data=not from_disk,
                options=options,
                n_partitions=plan.n_partitions,
                replacement=replacement,
                reassignment=reassign is not None,
            )
        )
        if self.topology != "star":
            own = session.peer_address

            def address(j: int) -> str:
                return own if j == index else self.places[j].peer_address

            assignment.assignment.topology.CopyFrom(
                topology_message(plan, index, address, self.credential)
            )
        session.send(assignment)
        nbytes = assignment.ByteSize()
        shipped = wp.partitions if reassign is None else reassign
        for p in shipped if not from_disk else ():
            messages = partition_messages(
                self.job_id, p, parts[p], ds.y_train[prepared.blocks[p]], self.chunk_bytes
            )
            for message in messages:
                session.send(message)
                nbytes += len(message)
                await asyncio.sleep(0)
        memory = prepared.policy.worker_memory(index)
        if memory is not None:  # the place's last upload: the newcomer decides the same
            for message in tensor_messages(
                self.job_id, 0, [(LAST_UPLOAD_KEY, memory)], self.chunk_bytes
            ):
                session.send(message)
                nbytes += len(message)
        session.send(pb.CoordinatorMessage(assignment_end=pb.AssignmentEnd(job_id=self.job_id)))
        self.metrics.assignment_bytes.inc(nbytes)
        return nbytes


@dataclass(frozen=True)
class Moved:
    """What a re-assignment took: seconds (first message queued to last ack), bytes
    queued, the partitions and rows shipped, and the places whose holder refused it (why)."""

    seconds: float
    nbytes: int
    partitions: int
    rows: int
    refused: dict[int, str]


def topology_message(
    plan: Plan, index: int, address: Callable[[int], str], credential: str
) -> pb.Topology:
    """Worker ``index``'s place in the plan's ring or tree, with its peers' addresses."""
    topology = plan.topology
    message = pb.Topology(kind=topology.kind, credential=credential)
    peers: list[int] = []
    if topology.kind == "ring":
        n = plan.n_workers
        peers = sorted({(index - 1) % n, (index + 1) % n} - {index})
    elif topology.kind == "tree":
        tree, code = topology.tree, topology.code
        assert tree is not None and code is not None
        parent, children = tree.parent(index), tree.children(index)
        message.parent = parent
        message.level = tree.level(index)
        message.children.extend(children)
        message.s = tree.s
        message.tol = topology.tol
        if children:
            message.code.CopyFrom(next(tensor_chunks("code", code.astype(np.float64))))
        peers = ([parent] if parent >= 0 else []) + list(children)
    for j in peers:
        message.peers.add(index=j, address=address(j))
    return message


def partition_messages(
    job_id: str, partition: int, X: Matrix, y: np.ndarray, chunk_bytes: int
) -> list[bytes]:
    """A partition's rows as serialized PartitionData frames."""
    import scipy.sparse as sp

    tensors: list[tuple[str, np.ndarray]] = [("y", np.asarray(y, dtype=np.float64))]
    if sp.issparse(X):
        csr = sp.csr_matrix(X)
        tensors += [
            ("X.data", csr.data.astype(np.float64)),
            ("X.indices", csr.indices.astype(np.int32)),
            ("X.indptr", csr.indptr.astype(np.int64)),
            ("X.shape", np.asarray(csr.shape, dtype=np.int64)),
        ]
    else:
        tensors.append(("X", np.asarray(X, dtype=np.float64)))
    return tensor_messages(job_id, partition, tensors, chunk_bytes)


def tensor_messages(
    job_id: str, partition: int, tensors: list[tuple[str, np.ndarray]], chunk_bytes: int
) -> list[bytes]:
    """Tensors as serialized PartitionData frames of ``partition``."""
    messages = []
    for key, array in tensors:
        for c in chunks(key, array, chunk_bytes):
            message = pb.CoordinatorMessage()
            message.data.job_id = job_id
            message.data.partition = partition
            c.fill(message.data.chunk, with_data=False)
            messages.append(framed(message, PARTITION_DATA, c.data))
    return messages
