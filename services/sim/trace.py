"""Delay traces: record per-worker, per-round delays and replay them.

The format (read by the ``trace`` straggler model, :class:`TraceDelay`, registered in
:mod:`codedgd.services.stragglers` under the name ``trace``):

- ``.json``: ``{"delays": [[d_00, d_01, ...], [d_10, ...], ...]}``: row = round,
  column = worker, seconds >= 0, ``null`` where nothing was recorded; a bare list of
  rows is accepted too. :func:`write_trace` adds ``"kind"`` and ``"source"`` keys
  that say what the numbers are; readers ignore them.
- ``.csv``: the header ``round,worker,delay`` then one line per recorded entry.

Replaying: ``--stragglers trace --straggler-opt path=TRACE.json`` (``cycle=true`` to
start again after the last round), in ``codedgd run`` and ``codedgd simulate``
alike. The delay is added after the compute, like every straggler model.

Recording from a real run: result files of ``codedgd run`` hold, per round, each
offered worker's response seconds (broadcast of θ_t → arrival) and its reported
compute seconds (``RoundRecord.response_seconds`` / ``worker_compute_seconds``).
:func:`trace_from_records` turns them into a trace of

- ``kind="excess"`` (default): response − compute, i.e. the time a worker spent on
  anything but computing (network, queueing, its injected or natural straggling),
  to be replayed with a compute cost model that adds the new policy's own compute;
- ``kind="response"``: the whole response time, to be replayed with the simulator's
  compute and communication costs set to zero (``--compute none --latency 0
  --bandwidth inf``); only right for a policy with the recorded run's loads.

A ring's or tree's round records each worker's own time from θ_t to its message
instead (``RoundRecord.ready_seconds``): its "response" here, which holds no network
time; a tree's leaf its parent left out is censored at ``left_out_seconds``, and an
inner node left out is not recorded (``null``) in either mode.

Workers that were cancelled in a round have no response (censored: they were
slower than the round's decode time). ``censored="bound"`` (default) fills them with
that lower bound, just above ``round.wait_seconds`` (for ``excess``, minus the round's mean
recorded compute seconds: their own compute is unknown), so a replay keeps them
about that slow; ``censored="null"`` leaves
them unrecorded, which a replay rejects for that worker and round.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from codedgd.services.errors import ConfigError
from codedgd.services.records import RoundRecord, read_results
from codedgd.services.stragglers.models import TraceDelay, load_trace

__all__ = [
    "TraceDelay",
    "load_trace",
    "trace_from_records",
    "trace_from_results",
    "write_trace",
]

KINDS = ("excess", "response")
CENSORED = ("bound", "null")


def trace_from_records(
    records: Sequence[RoundRecord],
    n_workers: int,
    *,
    kind: str = "excess",
    censored: str = "bound",
) -> list[list[float | None]]:
    """A (rounds × workers) delay table from the timings recorded in ``records``."""
    if kind not in KINDS:
        raise ConfigError(f"trace kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if censored not in CENSORED:
        raise ConfigError(f"censored must be one of {', '.join(CENSORED)}, got {censored!r}")
    if records and not any(r.response_seconds for r in records):
        raise ConfigError(
            "the result file has no per-worker response times: record it with a codedgd "
            "version whose RoundRecord has response_seconds (or simulate it)"
        )
    table: list[list[float | None]] = []
    for r in records:
        row: list[float | None] = []
        computes = list(r.worker_compute_seconds.values())
        mean_compute = sum(computes) / len(computes) if computes else 0.0
        own = r.peered  # a ring's or tree's round: its workers' own times
        times = r.ready_seconds if own else r.response_seconds
        for w in range(n_workers):
            response = times.get(w)
            compute = r.worker_compute_seconds.get(w, mean_compute)
            value: float | None
            if response is None:
                # Strictly later than the bound: a tie could change who is used. A tree's
                # leaf left out is bounded by its used siblings; an inner node left out,
                # by nothing (null: a replay of that round names it).
                bound = r.left_out_seconds.get(w) if own else float(r.wait_seconds)
                value = (
                    None
                    if censored == "null" or bound is None
                    else math.nextafter(float(bound), math.inf)
                )
            else:
                value = float(response)
            if value is not None and kind == "excess":
                value = max(value - compute, 0.0)
            row.append(value)
        table.append(row)
    return table


def trace_from_results(
    path: str | Path, *, kind: str = "excess", censored: str = "bound"
) -> list[list[float | None]]:
    """The delay table of a result file written by ``codedgd run`` or ``codedgd simulate``."""
    job, records = read_results(path)
    n = _workers_of(job, records)
    return trace_from_records(records, n, kind=kind, censored=censored)


def write_trace(
    path: str | Path,
    table: Sequence[Sequence[float | None]],
    *,
    kind: str = "excess",
    source: str = "",
) -> Path:
    """Write a delay table as a .json or .csv trace (by suffix); returns the path."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    suffix = p.suffix.lower()
    if suffix == ".csv":
        with p.open("w", newline="", encoding="utf-8") as fh:
            writer = csv.writer(fh)
            writer.writerow(["round", "worker", "delay"])
            for r, row in enumerate(table):
                for w, value in enumerate(row):
                    if value is not None and math.isfinite(value):
                        writer.writerow([r, w, repr(float(value))])
    elif suffix == ".json":
        doc: dict[str, Any] = {
            "kind": kind,
            "source": source,
            "delays": [[None if v is None else float(v) for v in row] for row in table],
        }
        p.write_text(json.dumps(doc, allow_nan=False) + "\n", encoding="utf-8")
    else:
        raise ConfigError(f"a trace file must end in .json or .csv, got {p.name!r}")
    return p


def _workers_of(job: dict[str, Any], records: Sequence[RoundRecord]) -> int:
    section = job.get("job")
    if isinstance(section, dict) and isinstance(section.get("workers"), int):
        return int(section["workers"])
    seen = [w for r in records for w in r.response_seconds]
    return max(seen) + 1 if seen else 0
