"""Protobuf messages ↔ codedgd's public dataclasses: the one place that knows both.

Users see dataclasses (:class:`~codedgd.services.records.RoundRecord`, the client's
``JobState``); the generated protobuf classes stay in the wire layer (this module, the
coordinator and worker services, the client's gRPC calls), so a change of the contract
is a change here, not in every caller.
"""

from __future__ import annotations

from codedgd.services.proto import codedgd_pb2 as pb
from codedgd.services.records import RoundRecord


def record_to_pb(record: RoundRecord, job_id: str) -> pb.RoundReport:
    """A round's record as the RoundReport WatchJob streams (per-worker timings stay home)."""
    return pb.RoundReport(
        job_id=job_id,
        round=record.round,
        wall_seconds=record.wall_seconds,
        round_seconds=record.round_seconds,
        wait_seconds=record.wait_seconds,
        decode_seconds=record.decode_seconds,
        compute_seconds_max=record.compute_seconds_max,
        loss=record.loss,
        metric=record.metric,
        metric_name=record.metric_name,
        workers_used=list(record.workers_used),
        exact=record.exact,
        decode_residual=record.decode_residual,
        bytes_up=record.bytes_up,
        bytes_down=record.bytes_down,
        uploads=record.uploads,
        computations=record.computations,
        cancelled=record.cancelled,
        late_dropped=record.late_dropped,
    )


def record_from_pb(m: pb.RoundReport) -> RoundRecord:
    """A streamed RoundReport as the record users see."""
    return RoundRecord(
        round=int(m.round),
        wall_seconds=m.wall_seconds,
        round_seconds=m.round_seconds,
        wait_seconds=m.wait_seconds,
        decode_seconds=m.decode_seconds,
        compute_seconds_max=m.compute_seconds_max,
        loss=m.loss,
        metric=m.metric,
        metric_name=m.metric_name,
        workers_used=tuple(int(w) for w in m.workers_used),
        exact=m.exact,
        decode_residual=m.decode_residual,
        bytes_up=int(m.bytes_up),
        bytes_down=int(m.bytes_down),
        uploads=int(m.uploads),
        computations=int(m.computations),
        cancelled=int(m.cancelled),
        late_dropped=int(m.late_dropped),
    )
