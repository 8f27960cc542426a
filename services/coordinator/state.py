"""The coordinator's state directory (``--state-dir``): what survives its death.

Layout, one directory per job, in submission order::

    STATE_DIR/jobs/<job_id>/job.json           the job: id, order, config, state, error
    STATE_DIR/jobs/<job_id>/records.jsonl      one RoundRecord (JSON) per line, per round
    STATE_DIR/jobs/<job_id>/checkpoint.npz     the state after the last checkpointed round
    STATE_DIR/jobs/<job_id>/checkpoint.prev.npz  the one before (used if the last is bad)
    STATE_DIR/jobs/<job_id>/model.npz          the trained model, once the job has ended

``job.json``, the checkpoints and the model are written atomically (temporary file,
fsync, rename); ``records.jsonl`` is appended a line per round and synced at every
checkpoint. A coordinator started on a state directory reads every job back: finished
ones for status, watch and model; unfinished ones (queued, running, or interrupted by a
SIGTERM) are queued again in their order and resume from their last checkpoint that
passes its checksum, or from round 0 if none does, with a warning saying which.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
from collections.abc import Iterator
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
from codedgd.services.records import RoundRecord, json_safe

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
    records: list[RoundRecord]
    checkpoint: Checkpoint | None


class StateDir:
    """The coordinator's state directory; one :class:`JobStore` per job."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
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
        return JobStore(self.jobs_path / job_id, job_id)

    def load(self) -> list[StoredJob]:
        """Every job stored, in submission order (a damaged job directory is skipped with
        a warning naming it)."""
        jobs: list[StoredJob] = []
        for entry in sorted(self.jobs_path.iterdir()):
            if not entry.is_dir():
                continue
            try:
                jobs.append(JobStore(entry, entry.name).load())
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
    """One job's files in the state directory."""

    def __init__(self, path: Path, job_id: str) -> None:
        self.path = path
        self.job_id = job_id
        self._records: IO[str] | None = None
        self._writing = threading.Lock()  # a periodic checkpoint and a shutdown's

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
        if self._records is None:
            self.path.mkdir(parents=True, exist_ok=True)
            self._records = (self.path / "records.jsonl").open("a", encoding="utf-8")
        self._records.write(json.dumps(json_safe(record.to_dict()), allow_nan=False) + "\n")
        self._records.flush()

    def truncate_records(self, records: list[RoundRecord]) -> None:
        """Rewrite the records file to hold exactly ``records`` (those a resume keeps)."""
        self.close()
        with atomic_open(self.path / "records.jsonl") as f:
            for r in records:
                f.write(json.dumps(json_safe(r.to_dict()), allow_nan=False) + "\n")

    def checkpoint(self, checkpoint: Checkpoint) -> None:
        """Sync the records, keep the last checkpoint as the previous one, write this one."""
        with self._writing:
            records = self._records
            if records is not None and not records.closed:
                os.fsync(records.fileno())
            if self.checkpoint_path.exists():
                os.replace(self.checkpoint_path, self.previous_checkpoint_path)
            write_checkpoint(self.checkpoint_path, checkpoint)

    def close(self) -> None:
        if self._records is not None:
            self._records.close()
            self._records = None

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
        records = list(self._read_records())
        checkpoint = self._usable_checkpoint() if state in UNFINISHED else None
        if checkpoint is not None:
            kept = [r for r in records if r.round <= checkpoint.round]
            if len(kept) != checkpoint.round + 1 or [r.round for r in kept] != list(
                range(checkpoint.round + 1)
            ):
                log.warning(
                    "job %s: the records file holds %d of the %d rounds up to its checkpoint; "
                    "the job starts again from round 0",
                    self.job_id,
                    len(kept),
                    checkpoint.round + 1,
                )
                checkpoint, kept = None, []
            records = kept
        elif state in UNFINISHED:
            records = []
        return StoredJob(self.job_id, order, config, state, error, records, checkpoint)

    def _read_records(self) -> Iterator[RoundRecord]:
        path = self.path / "records.jsonl"
        if not path.exists():
            return
        with path.open(encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                try:
                    yield RoundRecord.from_dict(json.loads(line))
                except (ValueError, KeyError, TypeError):
                    log.warning(
                        "job %s: %s is cut short at line %d (a process died writing it); "
                        "the rounds before it are kept",
                        self.job_id,
                        path,
                        number,
                    )
                    return

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
