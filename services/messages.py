"""Protobuf messages ↔ codedgd's public dataclasses: the one place that knows both.

Users see dataclasses (:class:`~codedgd.services.records.RoundRecord`, the client's
``JobState``); the generated protobuf classes stay in the wire layer (this module, the
coordinator and worker services, the client's gRPC calls), so a change of the contract
is a change here, not in every caller.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator

from codedgd.services.errors import WireError
from codedgd.services.machine import Machine
from codedgd.services.models.saved import SavedModel
from codedgd.services.names import MAX_NAME_LENGTH, NAME_PATTERN
from codedgd.services.proto import codedgd_pb2 as pb
from codedgd.services.records import RoundRecord
from codedgd.services.wire import Assembler, tensor_chunks

MAX_ADDRESS_LENGTH = 255
ADDRESS_PATTERN = re.compile(r"[A-Za-z0-9._:\[\]%-]+")
# Free text from a worker (its WorkerError, a PeerFailure's reason) is cut to this.
MAX_TEXT_LENGTH = 1000


def check_worker_name(name: str) -> str | None:
    """Why ``name`` cannot name a worker (None: it can; empty means "use my address")."""
    if len(name) > MAX_NAME_LENGTH:
        return (
            f"the worker name is {len(name)} characters long; at most {MAX_NAME_LENGTH} are "
            "allowed: give a shorter --name"
        )
    if name and NAME_PATTERN.fullmatch(name) is None:
        return (
            f"the worker name '{printable(name)}' has characters other than letters, digits "
            "and . _ : @ + -: give --name such a name (host:pid is the default)"
        )
    return None


def check_peer_address(address: str) -> str | None:
    """Why ``address`` cannot be a Hello's peer_address (None: it can)."""
    if len(address) > MAX_ADDRESS_LENGTH or (
        address and ADDRESS_PATTERN.fullmatch(address) is None
    ):
        return (
            f"the peer address '{printable(address, 80)}' is not HOST:PORT: give "
            "--peer-address as a host name or IP address and a port"
        )
    return None


def printable(text: str, limit: int = MAX_TEXT_LENGTH) -> str:
    """``text`` safe for one log line: control characters escaped, cut to ``limit``."""
    cut = text[:limit]
    escaped = "".join(c if c.isprintable() else repr(c)[1:-1] for c in cut)
    return escaped + (f"... ({len(text)} characters)" if len(text) > limit else "")


def record_to_pb(record: RoundRecord, job_id: str) -> pb.RoundReport:
    """A round's record as the RoundReport WatchJob streams, per-worker timings included."""
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
        response_seconds={int(w): float(s) for w, s in record.response_seconds.items()},
        worker_compute_seconds={int(w): float(s) for w, s in record.worker_compute_seconds.items()},
        note=record.note,
        excluded={int(w): why for w, why in record.excluded.items()},
        attempts=record.attempts,
        restarts=list(record.restarts),
        cancelled_seconds={int(w): float(s) for w, s in record.cancelled_seconds.items()},
        ready_seconds={int(w): float(s) for w, s in record.ready_seconds.items()},
        left_out_seconds={int(w): float(s) for w, s in record.left_out_seconds.items()},
        holders={int(w): name for w, name in record.holders.items()},
        topology=record.topology,
        machines={int(w): machine_to_pb(m) for w, m in record.machines.items()},
        coordinator_machine=(
            machine_to_pb(record.coordinator_machine) if record.coordinator_machine else None
        ),
    )


def machine_to_pb(machine: Machine) -> pb.Machine:
    return pb.Machine(id=machine.id, cpus=machine.cpus)


def machine_from_pb(m: pb.Machine) -> Machine:
    return Machine(str(m.id), int(m.cpus))


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
        response_seconds={int(w): float(s) for w, s in m.response_seconds.items()},
        worker_compute_seconds={int(w): float(s) for w, s in m.worker_compute_seconds.items()},
        note=m.note,
        excluded={int(w): str(why) for w, why in m.excluded.items()},
        attempts=int(m.attempts) or 1,
        restarts=tuple(m.restarts),
        cancelled_seconds={int(w): float(s) for w, s in m.cancelled_seconds.items()},
        ready_seconds={int(w): float(s) for w, s in m.ready_seconds.items()},
        left_out_seconds={int(w): float(s) for w, s in m.left_out_seconds.items()},
        holders={int(w): str(name) for w, name in m.holders.items()},
        topology=str(m.topology),
        machines={int(w): machine_from_pb(x) for w, x in m.machines.items()},
        coordinator_machine=(
            machine_from_pb(m.coordinator_machine) if m.HasField("coordinator_machine") else None
        ),
    )


def model_messages(saved: SavedModel) -> Iterator[pb.ModelChunk]:
    """A trained model as GetModel streams it: its description, then θ in chunks."""
    yield pb.ModelChunk(meta_json=json.dumps(saved.meta(), allow_nan=False))
    for chunk in tensor_chunks("theta", saved.theta):
        yield pb.ModelChunk(theta=chunk)


def model_from_messages(messages: Iterable[pb.ModelChunk], source: str) -> SavedModel:
    """The model GetModel streamed, checked against its checksum."""
    meta = None
    assembler = Assembler("theta", dtype="<f8")
    theta = None
    for message in messages:
        if meta is None:
            if not message.meta_json:
                raise WireError(f"{source}: the model's description did not come first")
            try:
                meta = json.loads(message.meta_json)
            except ValueError as exc:
                raise WireError(f"{source}: the model's description is not JSON ({exc})") from None
            if not isinstance(meta, dict):
                raise WireError(
                    f"{source}: the model's description is a JSON {type(meta).__name__}, "
                    "not an object"
                )
            continue
        theta = assembler.add(message.theta)
    if meta is None or theta is None:
        raise WireError(f"{source}: the model stream ended before θ was complete")
    return SavedModel.from_meta(meta, theta, source)
