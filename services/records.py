"""Per-round results: the public record type, a job's log of them, and their files.

:class:`RoundRecord` is what users see (the progress bar, result files, the
client API). It mirrors the wire's RoundReport, which never leaks past
:mod:`codedgd.services.messages`. :class:`RecordLog` holds a running job's records on
the coordinator: every one in a JSON-lines file, only the most recent in memory.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import io
import itertools
import json
import math
import os
from array import array
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, overload

from codedgd.services.errors import CodedGDError, ConfigError
from codedgd.services.files import atomic_open
from codedgd.services.machine import Machine


@dataclass(frozen=True)
class RoundRecord:
    """One completed round of a job."""

    round: int
    wall_seconds: float  # cumulative training time up to the end of this round (eval excluded)
    round_seconds: float  # broadcast → step done
    wait_seconds: float  # broadcast → the policy could decode
    decode_seconds: float
    compute_seconds_max: float  # slowest compute time among the results used
    loss: float  # training objective F(θ_{t+1}) (NaN when not evaluated this round)
    metric: float  # held-out metric (NaN when not evaluated this round)
    metric_name: str
    workers_used: tuple[int, ...]
    exact: bool
    decode_residual: float
    bytes_up: int  # result bytes received this round (all results, late ones included)
    bytes_down: int  # θ bytes sent this round
    uploads: int  # results received for this round
    computations: int  # workers asked to compute this round
    cancelled: int  # workers sent Cancel
    late_dropped: int  # results of earlier rounds dropped while this round ran
    # Per-worker timings of the results offered to the policy this round (a delay trace
    # can be made from them, see codedgd.services.sim.trace): worker → seconds from the broadcast
    # of θ_t to the result's arrival, and worker → its reported compute seconds.
    # Empty when not recorded (files of older versions).
    response_seconds: Mapping[int, float] = field(default_factory=dict)
    worker_compute_seconds: Mapping[int, float] = field(default_factory=dict)
    # What the policy changed at the start of this round and why (Policy.round_note; the
    # auto policy's switches), "" when nothing. Result and records files carry it.
    note: str = ""
    # Every worker of the plan whose message is not in the estimate, with why (cancelled,
    # lost, silent, left out by its tree parent, ...); empty when all are in.
    excluded: Mapping[int, str] = field(default_factory=dict)
    # Times the round was started (a ring or tree re-forms after a lost worker and starts
    # the round again), and why each earlier attempt was abandoned.
    attempts: int = 1
    restarts: tuple[str, ...] = ()
    # Workers cancelled before their result arrived: worker → seconds from the broadcast of
    # θ_t to its Cancel (a lower bound on its response). Empty: none, or not recorded
    # (files of older versions, ring and tree rounds), where the round's wait_seconds is
    # every cancelled worker's bound.
    cancelled_seconds: Mapping[int, float] = field(default_factory=dict)
    # Worker → seconds from θ_t complete at the worker to its own message ready (compute
    # plus straggling, no network; the worker's WorkerTiming), for every worker whose
    # message reached the coordinator (in a tree, inside a sum) and sent them. Their
    # compute seconds are in worker_compute_seconds. A star round's: since 2026-12-01
    # (its response_seconds add the network to them). Empty in files of versions before
    # 2026-11-30, and in their star rounds before 2026-12-01.
    ready_seconds: Mapping[int, float] = field(default_factory=dict)
    # Tree rounds: a leaf the round left out (its parent summed siblings of it, not it)
    # → a lower bound on its own time: the longest of those siblings' ready_seconds
    # (TreeShape.left_out_bounds). What tune takes as a censored value.
    left_out_seconds: Mapping[int, float] = field(default_factory=dict)
    # Places with a new holder from this round on → the holder's name as the coordinator
    # shows it (every place in the first round a coordinator runs of the job, then a
    # place a newcomer took under another name). Which machine answered for which place:
    # `codedgd tune` keys auto's prior by it. Empty from the simulator and in files of
    # versions before 2026-11-30.
    holders: Mapping[int, str] = field(default_factory=dict)
    # The plan's topology this round: "star", "ring" or "tree"; "" in files of versions
    # before 2026-12-01 (see :attr:`peered`).
    topology: str = ""
    # Places with a new holder from this round on (as :attr:`holders`) → the machine that
    # holder said it runs on, and the coordinator's own in the same rounds: which of the
    # job's processes shared a machine's cores (:func:`~codedgd.services.machine.one_machine`).
    # Empty (None) from the simulator and in files of versions before 2026-12-01.
    machines: Mapping[int, Machine] = field(default_factory=dict)
    coordinator_machine: Machine | None = None

    @property
    def peered(self) -> bool:
        """Whether workers sent to each other this round (a ring or tree): its arrivals
        are the topology's, and its workers' own times (:attr:`ready_seconds`) are what
        time each worker. Records without :attr:`topology` (older files) were peered
        exactly when they hold own times: a star's held none before 2026-12-01."""
        if self.topology:
            return self.topology != "star"
        return bool(self.ready_seconds)

    def to_dict(self) -> dict[str, Any]:
        # Field by field, not asdict: its deep copy of the timing maps, replaced below
        # anyway, was most of the cost of a round's line in the records file.
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["workers_used"] = list(self.workers_used)
        for key in _TIMING_MAPS:
            # JSON object keys are strings; from_dict turns them back into worker indices.
            d[key] = {str(w): float(s) for w, s in getattr(self, key).items()}
        for key in _TEXT_MAPS:
            d[key] = {str(w): str(text) for w, text in getattr(self, key).items()}
        d["restarts"] = list(self.restarts)
        d["machines"] = {str(w): _machine_dict(m) for w, m in self.machines.items()}
        d["coordinator_machine"] = (
            _machine_dict(self.coordinator_machine) if self.coordinator_machine else None
        )
        for key in ("loss", "metric"):
            if isinstance(d[key], float) and math.isnan(d[key]):
                d[key] = None
        return d

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> RoundRecord:
        values = dict(d)
        values["workers_used"] = tuple(values.get("workers_used", ()))
        for key in ("loss", "metric"):
            if values.get(key) is None:
                values[key] = math.nan
        for key in _FLOATS:  # a NaN or ±inf written as null (json_safe) reads back as NaN
            if key in values and values[key] is None:
                values[key] = math.nan
        for key in _TIMING_MAPS:
            raw = values.get(key) or {}
            if isinstance(raw, str):  # a CSV cell holds the JSON object
                raw = json.loads(raw) if raw.strip() else {}
            values[key] = {int(w): _float(s) for w, s in dict(raw).items()}
        for key in _TEXT_MAPS:
            texts = values.get(key) or {}
            if isinstance(texts, str):
                texts = json.loads(texts) if texts.strip() else {}
            values[key] = {int(w): str(text) for w, text in dict(texts).items()}
        restarts = values.get("restarts") or ()
        if isinstance(restarts, str):
            restarts = json.loads(restarts) if restarts.strip() else ()
        values["restarts"] = tuple(str(r) for r in restarts)
        values["attempts"] = int(values.get("attempts") or 1)
        machines = values.get("machines") or {}
        if isinstance(machines, str):
            machines = json.loads(machines) if machines.strip() else {}
        values["machines"] = {int(w): _machine(m) for w, m in dict(machines).items()}
        coordinator = values.get("coordinator_machine")
        if isinstance(coordinator, str):
            coordinator = json.loads(coordinator) if coordinator.strip() else None
        values["coordinator_machine"] = _machine(coordinator) if coordinator else None
        topology = values.get("topology")  # (anything else: unknown, read as older files)
        values["topology"] = topology if topology in ("star", "ring", "tree") else ""
        return RoundRecord(**{f.name: values[f.name] for f in fields(RoundRecord)})


_TIMING_MAPS = (
    "response_seconds",
    "worker_compute_seconds",
    "cancelled_seconds",
    "ready_seconds",
    "left_out_seconds",
)
_TEXT_MAPS = ("excluded", "holders")
_FLOATS = tuple(f.name for f in fields(RoundRecord) if f.type == "float")


def _float(value: Any) -> float:
    return math.nan if value is None else float(value)


def _machine_dict(machine: Machine) -> dict[str, Any]:
    return {"id": machine.id, "cpus": machine.cpus}


def _machine(value: Any) -> Machine:
    """A machine as a file holds it: {"id": str, "cpus": int}."""
    if not isinstance(value, Mapping):
        raise ValueError(f"a machine is an object with id and cpus, got {value!r}")
    return Machine(str(value.get("id", "")), int(value.get("cpus", 0)))


def write_results(
    path: str | Path,
    job: Mapping[str, Any],
    records: Sequence[RoundRecord],
    summary: Mapping[str, Any],
) -> Path:
    """Write a result file: JSON (job, summary, rounds) or CSV (one row per round) by suffix,
    atomically (:mod:`codedgd.services.files`): whole, or the previous version."""
    p = Path(path)
    if p.suffix.lower() == ".csv":
        _write_csv(p, records)
    else:
        doc = {
            "format": "codedgd.results.v1",
            "job": dict(job),
            "summary": dict(summary),
            "rounds": [r.to_dict() for r in records],
        }
        # JSON has no NaN or infinity (an AUC over a one-class test set is NaN, a diverging
        # run's residual may be inf): they are written as null, as a missing loss is.
        with atomic_open(p) as fh:
            fh.write(json.dumps(json_safe(doc), indent=1, allow_nan=False) + "\n")
    return p


def json_safe(value: Any) -> Any:
    """``value`` with every NaN and ±inf float, however deeply nested, replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def _write_csv(path: Path, records: Iterable[RoundRecord]) -> None:
    names = [f.name for f in fields(RoundRecord)]
    with atomic_open(path) as fh:
        writer = csv.DictWriter(fh, fieldnames=names)
        writer.writeheader()
        for r in records:
            row = r.to_dict()
            row["workers_used"] = " ".join(str(w) for w in r.workers_used)
            for key in (*_TIMING_MAPS, *_TEXT_MAPS, "restarts", "machines", "coordinator_machine"):
                row[key] = json.dumps(row[key], separators=(",", ":")) if row[key] else ""
            writer.writerow(row)


def read_results(path: str | Path) -> tuple[dict[str, Any], list[RoundRecord]]:
    """Read a JSON result file written by :func:`write_results`: (job document, rounds)."""
    job, _, records = read_result_file(path)
    return job, records


def read_result_file(
    path: str | Path,
) -> tuple[dict[str, Any], dict[str, Any], list[RoundRecord]]:
    """(job document, summary, rounds) of a JSON result file.

    The summary of a run that failed or was interrupted holds its ``error``.
    """
    what = (
        f"{path} is not a codedgd result file (the .json that `codedgd run`, `simulate` "
        "and `submit -o` write)"
    )
    name = Path(path).name
    stem = name[: -len(".model.npz")] if name.endswith(".model.npz") else Path(path).stem
    json_twin = Path(path).with_name(stem + ".json")
    if Path(path).suffix.lower() in (".csv", ".npz") and json_twin.is_file():
        kind = "the rounds' CSV" if Path(path).suffix.lower() == ".csv" else "the model file"
        raise ConfigError(f"{path} is {kind} of a run: give its result file, {json_twin}")
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"result file {path} does not exist") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{what}: it is not text (a binary file?)") from None
    except OSError as exc:
        raise ConfigError(f"cannot read result file {path}: {exc}") from None
    except json.JSONDecodeError as exc:
        # Cut short: the parser ran off the end, or inside a string that never closes.
        ends = exc.pos >= len(exc.doc.rstrip()) or exc.msg.startswith("Unterminated string")
        if exc.doc.lstrip().startswith("{") and ends:
            raise ConfigError(
                f"result file {path} is cut short: its JSON ends unfinished after "
                f"{len(exc.doc)} characters (a process died writing it, or the copy is "
                "incomplete); codedgd writes result files whole, so this one was not "
                "written by codedgd as it is now"
            ) from None
        if not exc.doc.strip():
            raise ConfigError(f"{what}: it is empty") from None
        raise ConfigError(f"{what}: it is not JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != "codedgd.results.v1":
        raise ConfigError(f"{what}: it has no format codedgd.results.v1")
    try:
        summary = doc.get("summary") or {}
        return doc["job"], dict(summary), [RoundRecord.from_dict(r) for r in doc["rounds"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{path}: a damaged codedgd result file ({exc!r})") from None


# ---------------------------------------------------------------- a job's records

# Records a coordinator keeps in memory per job by default (--records-in-memory): about
# 9 KB each at 64 workers (their timing maps), so some 9 MB per job.
DEFAULT_RECORDS_IN_MEMORY = 1000
_INDEX_EVERY = 256  # lines between the byte offsets a log keeps to seek its file
_READ_CHUNK = 256  # records read from the file at a time when iterating


class RecordLog(Sequence[RoundRecord]):
    """A job's round records in order: every one in a JSON-lines file (one record a line,
    as :meth:`RoundRecord.to_dict` gives it), the last ``window`` also in memory.

    It reads as a sequence of all of them (``len``, indexing, slices, iteration); those
    before the window are read back from the file. Memory stays bounded however many
    rounds a job runs: the window, and one byte offset per 256 lines. Without a file
    (``path`` None), every record stays in memory.

    The event loop's thread appends; :meth:`read_file` may run in another thread for
    records already in the file: a line is written whole before it counts there, and the
    file is never cut below them.

    A record that cannot be written (a full disk) is still counted and kept in memory,
    with every later one, until a later append writes them all (:attr:`unwritten`,
    :attr:`write_error`): nothing is lost, memory grows only while the disk fails.
    """

    def __init__(self, path: Path | None = None, window: int = DEFAULT_RECORDS_IN_MEMORY) -> None:
        if window < 1:
            raise ConfigError(f"a record log keeps at least 1 record in memory, not {window}")
        self.path = path
        self.window = window
        self.cut_line: int | None = None  # set by load: the first line it could not read
        self._recent: deque[RoundRecord] = deque()  # the window, and any not in the file
        self._count = 0
        self._in_file = 0  # the first _in_file records are lines of the file
        self._end = 0  # bytes of the file that hold them
        self._offsets = array("q")  # the byte offset of every _INDEX_EVERY-th line
        self._file: io.FileIO | None = None
        self.write_error: str | None = None  # why the last write failed, until one succeeds

    @classmethod
    def load(cls, path: Path, window: int, limit: int | None = None) -> RecordLog:
        """The records of ``path`` (at most ``limit``), up to its first line that is not a
        whole record (:attr:`cut_line`; a process died writing it). The file is not
        changed until the first append, which cuts it after the records counted."""
        log = cls(path, window)
        if not path.exists() or limit == 0:
            return log
        with path.open("rb") as f:
            for number, line in enumerate(f, 1):
                record = _parse_line(line)
                if record is None:
                    log.cut_line = number
                    break
                log._recent.append(record)
                log._count += 1
                log._counted_in_file(len(line))
                if len(log._recent) > window:
                    log._recent.popleft()
                if limit is not None and len(log) >= limit:
                    break
        return log

    # ------------------------------------------------------------ writing

    def append(self, record: RoundRecord) -> None:
        """Count ``record``: the newest in memory, and a line of the file with any that
        could not be written before (see :attr:`write_error`)."""
        self._recent.append(record)
        self._count += 1
        if self.path is not None:
            self._write_unwritten()

    @property
    def unwritten(self) -> int:
        """Records counted but not in the file yet (a write failed)."""
        return self._count - self._in_file if self.path is not None else 0

    def _write_unwritten(self) -> None:
        first = self.first_in_memory
        lines = [_line(r) for r in itertools.islice(self._recent, self._in_file - first, None)]
        try:
            f = self.open()
            data = memoryview(b"".join(lines))
            while data:  # an unbuffered file: a short write is written on
                written = f.write(data)
                if not written:
                    raise OSError(errno.ENOSPC, "nothing written")
                data = data[written:]
        except (OSError, CodedGDError) as exc:
            self.write_error = str(getattr(exc, "strerror", None) or exc)
            self._undo_torn_write()
            return
        self.write_error = None
        for line in lines:
            self._counted_in_file(len(line))
        while len(self._recent) > self.window and self.first_in_memory < self._in_file:
            self._recent.popleft()

    def _undo_torn_write(self) -> None:
        """Cut the bytes of a failed write (the file ends with whole records again)."""
        f, self._file = self._file, None
        if f is not None:
            with contextlib.suppress(OSError):
                f.truncate(self._end)
            with contextlib.suppress(OSError):
                f.close()  # open() cuts at _end again if the truncate failed

    def _counted_in_file(self, size: int) -> None:
        if self._in_file % _INDEX_EVERY == 0:
            self._offsets.append(self._end)
        self._in_file += 1
        self._end += size

    def open(self) -> io.FileIO:
        """The file, ready for appends: cut after the records counted (dropping a torn
        last line, or the rounds after a checkpoint a resumed job runs again)."""
        if self._file is None:
            assert self.path is not None, "a log without a file has nothing to open"
            f: io.FileIO | None = None
            try:  # in a directory that exists (a removed spill directory is not made again)
                f = io.FileIO(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644), "r+")
                f.truncate(self._end)
                f.seek(self._end)
            except OSError as exc:
                if f is not None:
                    f.close()
                raise CodedGDError(
                    f"cannot write the round records to {self.path}: {exc.strerror or exc}"
                ) from None
            self._file = f
        return self._file

    def sync(self) -> None:
        """Make the records written so far durable (fsync)."""
        f = self._file
        if f is not None and not f.closed:
            os.fsync(f.fileno())

    def close(self) -> None:
        """Close the file for writing (it stays readable; an append opens it again)."""
        if self._file is not None:
            self._file.close()
            self._file = None

    # ------------------------------------------------------------ reading

    def __len__(self) -> int:
        return self._count

    @property
    def first_in_memory(self) -> int:
        """The index of the oldest record held in memory (the ones before: in the file)."""
        return self._count - len(self._recent)

    @property
    def in_memory(self) -> int:
        return len(self._recent)

    @overload
    def __getitem__(self, index: int) -> RoundRecord: ...

    @overload
    def __getitem__(self, index: slice) -> list[RoundRecord]: ...

    def __getitem__(self, index: int | slice) -> RoundRecord | list[RoundRecord]:
        if isinstance(index, slice):
            wanted = range(*index.indices(self._count))
            if not wanted:
                return []
            lo, hi = min(wanted), max(wanted) + 1
            span = self.read(lo, hi)
            return [span[i - lo] for i in wanted]
        i = index + self._count if index < 0 else index
        if not 0 <= i < self._count:
            raise IndexError(f"round record {index} of {self._count}")
        return self.read(i, i + 1)[0]

    def __iter__(self) -> Iterator[RoundRecord]:
        """Every record from the first, including those appended meanwhile."""
        i = 0
        while i < self._count:
            chunk = self._next_chunk(i)
            yield from chunk
            i += len(chunk)

    def _next_chunk(self, start: int) -> list[RoundRecord]:
        first = self.first_in_memory
        if start < first:
            return self.read_file(start, min(first, start + _READ_CHUNK))
        return self.read(start, self._count)

    def read(self, start: int, stop: int) -> list[RoundRecord]:
        """Records ``start`` to ``stop`` (exclusive, within the count): from the file those
        before the window, then from memory. On the event loop's thread only."""
        first = self.first_in_memory
        out = self.read_file(start, min(stop, first)) if start < first else []
        lo = max(start, first)
        if stop > lo:
            out.extend(itertools.islice(self._recent, lo - first, stop - first))
        return out

    def read_file(self, start: int, stop: int) -> list[RoundRecord]:
        """Records ``start`` to ``stop`` (exclusive, within the count) read from the file;
        safe in a worker thread while the loop appends."""
        if stop <= start:
            return []
        if self.path is None or stop > self._in_file:
            raise IndexError(f"round records {start}..{stop} are not in {self.path}")
        block = start // _INDEX_EVERY
        out: list[RoundRecord] = []
        with self.path.open("rb") as f:
            f.seek(self._offsets[block])
            lines = itertools.islice(f, start - block * _INDEX_EVERY, stop - block * _INDEX_EVERY)
            for line in lines:
                record = _parse_line(line)
                if record is None:
                    raise CodedGDError(f"{self.path} was changed under the coordinator")
                out.append(record)
        if len(out) != stop - start:
            raise CodedGDError(f"{self.path} was cut short under the coordinator")
        return out

    def __repr__(self) -> str:
        return (
            f"RecordLog({self.path}, {self._count} records, "
            f"{len(self._recent)} in memory of {self.window})"
        )


def _line(record: RoundRecord) -> bytes:
    """``record`` as a line of a records file (a NaN or ±inf anywhere written as null)."""
    d = record.to_dict()
    try:
        text = json.dumps(d, allow_nan=False)
    except ValueError:  # rare (an infinite residual): only then walk the whole record
        text = json.dumps(json_safe(d), allow_nan=False)
    return (text + "\n").encode()


def _parse_line(line: bytes) -> RoundRecord | None:
    """The record of a whole line of a records file; None for a torn or damaged one."""
    if not line.endswith(b"\n"):
        return None
    try:
        return RoundRecord.from_dict(json.loads(line))
    except (ValueError, KeyError, TypeError):
        return None


def move_note(partitions: int, nbytes: int, seconds: float) -> str:
    """What a re-assignment between rounds moved, appended to the round's note."""
    return (
        f"; re-assigned: {partitions} partition{'s' if partitions != 1 else ''} "
        f"({nbytes / 1e6:.3g} MB) shipped in {seconds:.3g} s"
    )
