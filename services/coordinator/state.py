"""The coordinator's state directory (``--state-dir``): what survives its death.

Layout, one directory per job, in submission order::

    STATE_DIR/jobs/<job_id>/job.json           the job: id, order, config, state, error
    STATE_DIR/jobs/<job_id>/records.jsonl      one RoundRecord (JSON) per line, per round
    STATE_DIR/jobs/<job_id>/checkpoint.npz     the state after the last checkpointed round
    STATE_DIR/jobs/<job_id>/checkpoint.prev.npz  the one before (used if the last is bad)
    STATE_DIR/jobs/<job_id>/model.npz          the trained model, once the job has ended

``job.json``, the checkpoints and the model are written atomically (temporary file,
fsync, rename); ``records.jsonl`` is appended a line per round and synced at every
checkpoint. It is the job's :class:`~codedgd.services.records.RecordLog`: the coordinator
keeps only the last ``--records-in-memory`` records in memory and reads older ones back
from it. A coordinator started on a state directory reads every job back: finished
ones for status, watch and model; unfinished ones (queued, running, or interrupted by a
SIGTERM) are queued again in their order and resume from their last checkpoint that
passes its checksum, or from round 0 if none does, with a warning saying which.

Without a state directory, the records of each job go to a :class:`SpillDir` instead: a
temporary directory of this coordinator, removed when it stops.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import tempfile
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from codedgd.services.errors import ConfigError
from codedgd.services.files import atomic_open
from codedgd.services.job import JobConfig
from codedgd.services.job.checkpoint import (
    Checkpoint,
    CheckpointError,
    read_checkpoint,
    write_checkpoint,
)
from codedgd.services.records import DEFAULT_RECORDS_IN_MEMORY, RecordLog, RoundRecord

log = logging.getLogger("codedgd.coordinator")

JOB_FORMAT = "codedgd.job.v1"
# States a job is read back in and run again from (its checkpoint).
UNFINISHED = ("queued", "assigning", "running", "interrupted")


@dataclass
class StoredJob:
    """A job read back from the state directory."""

    id: str
    order: int
    config: JobConfig
    state: str
    error: str
    # The rounds it keeps: all of a finished job, a resumed one's up to its checkpoint.
    records: RecordLog
    checkpoint: Checkpoint | None
    store: JobStore  # its files, ``records`` among them


class StateDir:
    """The coordinator's state directory; one :class:`JobStore` per job, each keeping the
    last ``records_in_memory`` of its round records in memory."""

    def __init__(
        self, path: str | Path, records_in_memory: int = DEFAULT_RECORDS_IN_MEMORY
    ) -> None:
        self.path = Path(path)
        self.records_in_memory = records_in_memory
        self.jobs_path = self.path / "jobs"
        try:
            self.jobs_path.mkdir(parents=True, exist_ok=True)
            probe = self.path / ".write-test"
            probe.write_text("ok")
            probe.unlink()
        except OSError as exc:
            raise ConfigError(
                f"cannot use --state-dir {self.path}: {exc.strerror or exc}; give a "
                "directory this process can create and write"
            ) from None

    def job(self, job_id: str) -> JobStore:
        return JobStore(self.jobs_path / job_id, job_id, self.records_in_memory)

    def load(self) -> list[StoredJob]:
        """Every job stored, in submission order (a damaged job directory is skipped with
        a warning naming it)."""
        jobs: list[StoredJob] = []
        for entry in sorted(self.jobs_path.iterdir()):
            if not entry.is_dir():
                continue
            try:
                jobs.append(self.job(entry.name).load())
            except ConfigError as exc:
                log.warning("state directory: skipping job %s: %s", entry.name, exc)
        jobs.sort(key=lambda j: j.order)
        return jobs

    def next_order(self) -> int:
        orders = []
        for entry in self.jobs_path.glob("*/job.json"):
            try:
                orders.append(int(json.loads(entry.read_text())["order"]))
            except (OSError, ValueError, KeyError, TypeError):
                continue
        return max(orders, default=-1) + 1

    def forget(self, job_id: str) -> None:
        """Remove a job's directory (an old finished job past the kept count)."""
        shutil.rmtree(self.jobs_path / job_id, ignore_errors=True)


class JobStore:
    """One job's files in the state directory; :attr:`records` is its records file."""

    def __init__(
        self, path: Path, job_id: str, records_in_memory: int = DEFAULT_RECORDS_IN_MEMORY
    ) -> None:
        self.path = path
        self.job_id = job_id
        self.records = RecordLog(self.records_path, records_in_memory)
        self._writing = threading.Lock()  # a periodic checkpoint and a shutdown's

    @property
    def records_path(self) -> Path:
        return self.path / "records.jsonl"

    @property
    def checkpoint_path(self) -> Path:
        return self.path / "checkpoint.npz"

    @property
    def previous_checkpoint_path(self) -> Path:
        return self.path / "checkpoint.prev.npz"

    @property
    def model_path(self) -> Path:
        return self.path / "model.npz"

    def save_job(self, order: int, config: JobConfig, state: str, error: str = "") -> None:
        doc = {
            "format": JOB_FORMAT,
            "id": self.job_id,
            "order": order,
            "state": state,
            "error": error,
            "config": config.to_dict(),
        }
        with atomic_open(self.path / "job.json") as f:
            f.write(json.dumps(doc, indent=1, allow_nan=False) + "\n")

    # ------------------------------------------------------------ rounds

    def append_record(self, record: RoundRecord) -> None:
        """One round's record, as a line (flushed; synced at the next checkpoint)."""
        self.path.mkdir(parents=True, exist_ok=True)
        self.records.append(record)

    def checkpoint(self, checkpoint: Checkpoint) -> None:
        """Sync the records, keep the last checkpoint as the previous one, write this one."""
        with self._writing:
            self.records.sync()
            if self.checkpoint_path.exists():
                os.replace(self.checkpoint_path, self.previous_checkpoint_path)
            write_checkpoint(self.checkpoint_path, checkpoint)

    def close(self) -> None:
        self.records.close()

    # ------------------------------------------------------------ reading back

    def load(self) -> StoredJob:
        try:
            doc = json.loads((self.path / "job.json").read_text(encoding="utf-8"))
            if doc.get("format") != JOB_FORMAT:
                raise ConfigError(f"{self.path / 'job.json'} is not a {JOB_FORMAT} file")
            config = JobConfig.from_dict(doc["config"])
            order, state, error = int(doc["order"]), str(doc["state"]), str(doc["error"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"{self.path / 'job.json'} cannot be read ({exc})") from None
        checkpoint = self._usable_checkpoint() if state in UNFINISHED else None
        # A finished job keeps all its rounds, a resumed one those up to its checkpoint
        # (its file is cut there once it runs again), one without a checkpoint none.
        if checkpoint is None:
            records = self._read_records(0 if state in UNFINISHED else None)
        else:
            records = self._read_records(checkpoint.round + 1)
            ordered = _leading_rounds(records)
            if ordered != checkpoint.round + 1:
                log.warning(
                    "job %s: the records file holds %d of the %d rounds up to its checkpoint; "
                    "the job starts again from round 0",
                    self.job_id,
                    ordered,
                    checkpoint.round + 1,
                )
                checkpoint, records = None, self._read_records(0)
        self.records = records
        return StoredJob(self.job_id, order, config, state, error, records, checkpoint, self)

    def _read_records(self, limit: int | None) -> RecordLog:
        records = RecordLog.load(self.records_path, self.records.window, limit)
        if records.cut_line is not None:
            log.warning(
                "job %s: %s is cut short at line %d (a process died writing it); "
                "the rounds before it are kept",
                self.job_id,
                self.records_path,
                records.cut_line,
            )
        return records

    def _usable_checkpoint(self) -> Checkpoint | None:
        for path in (self.checkpoint_path, self.previous_checkpoint_path):
            if not path.exists():
                continue
            try:
                checkpoint = read_checkpoint(path)
            except CheckpointError as exc:
                log.warning("job %s: %s; trying the one before", self.job_id, exc)
                continue
            if checkpoint.job_id != self.job_id:
                log.warning("job %s: %s is job %s's", self.job_id, path, checkpoint.job_id)
                continue
            if path == self.previous_checkpoint_path:
                log.warning("job %s: resuming from the previous checkpoint", self.job_id)
            return checkpoint
        return None


def _leading_rounds(records: RecordLog) -> int:
    """How many records from the first are rounds 0, 1, 2, … in order."""
    count = 0
    for record in records:
        if record.round != count:
            break
        count += 1
    return count


class SpillDir:
    """Where a coordinator without ``--state-dir`` keeps its jobs' records files: a
    temporary directory, made for the first job and removed by :meth:`remove` (at
    shutdown), or at the latest when the process exits.

    The directory holds an ``.owner`` file locked (flock) for the coordinator's life, so
    that the directories of coordinators killed outright (kill -9, the OOM killer) are
    found and removed by the next one that makes its own.
    """

    def __init__(self, records_in_memory: int = DEFAULT_RECORDS_IN_MEMORY) -> None:
        self.records_in_memory = records_in_memory
        self.path: Path | None = None
        self._cleanup: Callable[[], object] | None = None  # at most once

    def records(self, job_id: str) -> RecordLog:
        """A new job's records, in ``<job_id>.jsonl`` of the directory."""
        if self.path is None:
            self.path = self._make()
        return RecordLog(self.path / f"{job_id}.jsonl", self.records_in_memory)

    def _make(self) -> Path:
        tmp = Path(tempfile.gettempdir())
        try:
            remove_abandoned_spills(tmp)
            path, owner = _locked_directory(tmp)
        except OSError as exc:
            raise ConfigError(
                f"cannot make a temporary directory for the jobs' round records in {tmp}: "
                f"{exc.strerror or exc}; set TMPDIR to a writable directory, or give "
                "--state-dir"
            ) from None
        self._cleanup = weakref.finalize(self, _remove_spill, path, owner)
        return path

    def forget(self, job_id: str) -> None:
        """Remove a job's records file (a finished job past the kept count)."""
        if self.path is not None:
            (self.path / f"{job_id}.jsonl").unlink(missing_ok=True)

    def remove(self) -> None:
        """Remove the directory and every records file in it."""
        if self._cleanup is not None:
            self._cleanup()
        self.path, self._cleanup = None, None


SPILL_PREFIX = "codedgd-records-"


def _locked_directory(tmp: Path) -> tuple[Path, IO[str]]:
    """A new spill directory in ``tmp`` and its ``.owner`` file, locked."""
    path = Path(tempfile.mkdtemp(prefix=SPILL_PREFIX, dir=tmp))
    try:
        owner = (path / ".owner.new").open("w")
    except OSError:
        shutil.rmtree(path, ignore_errors=True)
        raise
    try:
        fcntl.flock(owner, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.rename(path / ".owner.new", path / ".owner")  # seen by others only once locked
    except OSError:
        _remove_spill(path, owner)
        raise
    return path, owner


def _remove_spill(path: Path, owner: IO[str]) -> None:
    shutil.rmtree(path, ignore_errors=True)
    owner.close()  # the lock goes last: nobody else removes the directory meanwhile


def remove_abandoned_spills(tmp: Path) -> int:
    """Remove the spill directories in ``tmp`` whose coordinator is gone (its ``.owner``
    lock can be taken); how many."""
    removed = 0
    for owner_path in tmp.glob(f"{SPILL_PREFIX}*/.owner"):
        try:
            with owner_path.open("a") as owner:
                fcntl.flock(owner, fcntl.LOCK_EX | fcntl.LOCK_NB)
                shutil.rmtree(owner_path.parent, ignore_errors=True)
                removed += 1
        except OSError:  # locked: its coordinator is alive (or the entry vanished)
            continue
    if removed:
        log.info("removed %d round-records directories of coordinators that died", removed)
    return removed
