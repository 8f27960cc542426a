"""The Python client of a running coordinator: submit, watch, status, cancel.

Public types are dataclasses (:class:`JobConfig`, :class:`RoundRecord`,
:class:`JobState`); protobuf stays behind this module::

    async with Client("127.0.0.1:50051") as client:
        job_id = await client.submit(JobConfig(workers=4, rounds=50))
        async for record in client.watch(job_id):
            print(record.round, record.loss)
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from types import TracebackType
from typing import Any

import grpc
from grpc import aio

from codedgd.services.errors import CodedGDError, ConfigError, JobFailed
from codedgd.services.job import JobConfig
from codedgd.services.messages import model_from_messages, record_from_pb
from codedgd.services.models.saved import SavedModel
from codedgd.services.proto import codedgd_pb2 as pb
from codedgd.services.proto import codedgd_pb2_grpc as pb_grpc
from codedgd.services.records import RoundRecord
from codedgd.services.security import Security
from codedgd.services.wire import GRPC_OPTIONS


class CoordinatorUnavailable(CodedGDError):
    """The coordinator cannot be reached (wrong address, not running, TLS mismatch)."""


@dataclass(frozen=True)
class JobState:
    job_id: str
    state: str  # queued | assigning | running | done | failed | diverged | cancelled | interrupted
    round: int
    rounds: int
    error: str
    loss: float
    metric: float
    metric_name: str
    # What the job waits for, in words, e.g. "waiting for 3 more workers (5 connected,
    # job needs 8)" ("": nothing), and while it waits for workers, how many more it needs.
    detail: str = ""
    workers_missing: int = 0
    workers_needed: int = 0
    # Over its rounds so far: results received, and gradient computations asked of
    # workers (a lazy policy such as LAG uploads less than it computes).
    uploads: int = 0
    computations: int = 0

    @property
    def rounds_done(self) -> int:
        """Rounds finished. ``round`` is the round running, or once done the last one."""
        if self.state == "done":
            return min(self.round + 1, self.rounds)
        return self.round if self.state in ("running", "failed", "diverged", "cancelled") else 0

    def to_dict(self) -> dict[str, Any]:
        """The job's state as JSON values (NaN loss or metric: None)."""
        d = asdict(self)
        for key in ("loss", "metric"):
            if is_nan(d[key]):
                d[key] = None
        d["rounds_done"] = self.rounds_done
        return d


@dataclass(frozen=True)
class CoordinatorStatus:
    jobs: tuple[JobState, ...]
    workers_connected: int
    workers: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        """What `codedgd status --json` prints."""
        return {
            "workers_connected": self.workers_connected,
            "workers": list(self.workers),
            "jobs": [j.to_dict() for j in self.jobs],
        }


class Client:
    """An async client of one coordinator."""

    def __init__(self, target: str, security: Security | None = None) -> None:
        self.target = target
        self.security = security or Security()
        self._channel = self.security.channel(target, options=GRPC_OPTIONS)
        self._stub = pb_grpc.CoordinatorStub(self._channel)
        self._md = self.security.metadata()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    async def submit(self, config: JobConfig) -> str:
        """Queue a job; returns its id. Raises ConfigError when the coordinator refuses it."""
        try:
            reply = await self._stub.SubmitJob(
                pb.SubmitJobRequest(job_json=config.to_json()), metadata=self._md
            )
        except aio.AioRpcError as exc:
            raise self._error(exc) from None
        return str(reply.job_id)

    async def watch(self, job_id: str) -> AsyncIterator[RoundRecord]:
        """Every round of the job from the first; raises JobFailed if the job fails."""
        try:
            async for report in self._stub.WatchJob(pb.JobRef(job_id=job_id), metadata=self._md):
                yield record_from_pb(report)
        except aio.AioRpcError as exc:
            raise self._error(exc) from None

    async def status(self, job_id: str = "") -> CoordinatorStatus:
        try:
            reply = await self._stub.GetStatus(pb.StatusRequest(job_id=job_id), metadata=self._md)
        except aio.AioRpcError as exc:
            raise self._error(exc) from None
        jobs = tuple(
            JobState(
                j.job_id,
                j.state,
                int(j.round),
                int(j.rounds),
                j.error,
                j.loss,
                j.metric,
                j.metric_name,
                j.detail,
                int(j.workers_missing),
                int(j.workers_needed),
                int(j.uploads),
                int(j.computations),
            )
            for j in reply.jobs
        )
        return CoordinatorStatus(jobs, int(reply.workers_connected), tuple(reply.workers))

    async def cancel(self, job_id: str) -> bool:
        try:
            reply = await self._stub.CancelJob(pb.JobRef(job_id=job_id), metadata=self._md)
        except aio.AioRpcError as exc:
            raise self._error(exc) from None
        return bool(reply.cancelled)

    async def model(self, job_id: str) -> SavedModel:
        """The job's trained model (θ after its last completed round), checksum checked.

        Save it with :func:`codedgd.services.models.saved.save_model`.
        """
        try:
            messages = [
                m async for m in self._stub.GetModel(pb.JobRef(job_id=job_id), metadata=self._md)
            ]
        except aio.AioRpcError as exc:
            raise self._error(exc) from None
        return model_from_messages(messages, f"the model of job {job_id}")

    def _error(self, exc: aio.AioRpcError) -> CodedGDError:
        code, details = exc.code(), exc.details() or ""
        if code == grpc.StatusCode.INVALID_ARGUMENT:
            return ConfigError(details)
        if code in (grpc.StatusCode.ABORTED, grpc.StatusCode.CANCELLED):
            return JobFailed(details)
        if code == grpc.StatusCode.UNAVAILABLE:
            return CoordinatorUnavailable(
                f"cannot reach the coordinator at {self.target} ({details}); is it running, "
                "and do --tls-ca / the address match how it serves?"
            )
        if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
            return CodedGDError(details)  # a missing, wrong or other role's token
        if code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION):
            return CodedGDError(details)
        return CodedGDError(f"coordinator error {code.name}: {details}")


def is_nan(x: float) -> bool:
    return isinstance(x, float) and math.isnan(x)
