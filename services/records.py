"""Per-round results: the public record type and its JSON/CSV files.

:class:`RoundRecord` is what users see (the progress bar, result files, the
client API). It mirrors the wire's RoundReport, which never leaks past
:mod:`codedgd.services.messages`.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from codedgd.services.errors import ConfigError
from codedgd.services.files import atomic_open


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
    # Empty when not recorded (older files, the wire's RoundReport).
    response_seconds: Mapping[int, float] = field(default_factory=dict)
    worker_compute_seconds: Mapping[int, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["workers_used"] = list(self.workers_used)
        for key in _TIMING_MAPS:
            # JSON object keys are strings; from_dict turns them back into worker indices.
            d[key] = {str(w): float(s) for w, s in getattr(self, key).items()}
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
        for key in _TIMING_MAPS:
            raw = values.get(key) or {}
            if isinstance(raw, str):  # a CSV cell holds the JSON object
                raw = json.loads(raw) if raw.strip() else {}
            values[key] = {int(w): float(s) for w, s in dict(raw).items()}
        return RoundRecord(**{f.name: values[f.name] for f in fields(RoundRecord)})


_TIMING_MAPS = ("response_seconds", "worker_compute_seconds")


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
            for key in _TIMING_MAPS:
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
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"result file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read result file {path}: {exc}") from None
    except json.JSONDecodeError as exc:
        if exc.doc.lstrip().startswith("{") and exc.pos >= len(exc.doc.rstrip()):
            raise ConfigError(
                f"result file {path} is cut short: its JSON ends unfinished after "
                f"{len(exc.doc)} characters (a process died writing it, or the copy is "
                "incomplete); codedgd writes result files whole, so this one was not "
                "written by codedgd as it is now"
            ) from None
        raise ConfigError(f"{what}: it is not JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != "codedgd.results.v1":
        raise ConfigError(f"{what}: it has no format codedgd.results.v1")
    try:
        summary = doc.get("summary") or {}
        return doc["job"], dict(summary), [RoundRecord.from_dict(r) for r in doc["rounds"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{path}: a damaged codedgd result file ({exc!r})") from None
