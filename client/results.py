"""Result files of a job's rounds, and their summary: what `run`, `simulate` and `watch`
write with ``--output`` (a JSON with the job, the summary and every round, and a CSV of
the rounds beside it)."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from codedgd.services.errors import ConfigError
from codedgd.services.job import JobConfig
from codedgd.services.models.neural import export_network
from codedgd.services.models.saved import SavedModel, model_path, save_model
from codedgd.services.records import RoundRecord, write_results


def result_paths(out: Path) -> tuple[Path, Path]:
    """The JSON and CSV result files that ``--output`` names (either suffix names both)."""
    json_path = out.with_suffix(".json") if out.suffix.lower() == ".csv" else out
    return json_path, json_path.with_suffix(".csv")


def write_result_pair(
    out: Path,
    job_doc: Mapping[str, Any],
    records: Sequence[RoundRecord],
    summary: Mapping[str, Any],
) -> tuple[Path, Path]:
    """Write the JSON (job, summary, rounds) and the CSV (rounds) of ``--output``."""
    json_path, csv_path = result_paths(out)
    write_results(json_path, job_doc, records, summary)
    write_results(csv_path, {}, records, {})
    return json_path, csv_path


def check_output(out: Path) -> None:
    """Refuse, before anything runs, result files that could not be written at the end.

    Each file is opened for appending (created and removed again if it was not there):
    the one test that answers for permissions, read-only file systems, a directory in
    the way or a file where a directory should be.
    """
    for path in result_paths(out):
        check_writable(path, "the results", "--output")


def check_writable(path: Path, what: str, flag: str) -> None:
    """Refuse, before anything runs, a file ``flag`` names that could not be written at
    the end: it is opened for appending (created and removed again if it was not there),
    the one test that answers for permissions, read-only file systems, a directory in the
    way or a file where a directory should be."""
    try:
        if path.is_dir():
            raise IsADirectoryError(21, "it is a directory")
        path.parent.mkdir(parents=True, exist_ok=True)
        existed = path.exists()
        with path.open("a"):
            pass
        if not existed:
            path.unlink()
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ConfigError(
            f"cannot write {what} to {path}: {reason}; choose another {flag}"
        ) from None


def summarize(
    records: Sequence[RoundRecord], elapsed: float, config: JobConfig | None
) -> dict[str, Any]:
    """The summary of a result file (``config`` None: a watched job's, policy unknown)."""
    losses = [r for r in records if not math.isnan(r.loss)]
    last = losses[-1] if losses else None
    times = sorted(r.round_seconds for r in records)
    target_loss = config.target_loss if config is not None else None
    target_round = None
    if target_loss is not None:
        hit = [r for r in losses if r.loss <= target_loss]
        target_round = hit[0] if hit else None
    return {
        "rounds": len(records),
        "policy": config.policy.name if config is not None else None,
        "final_loss": last.loss if last else None,
        "final_metric": last.metric if last else None,
        "metric_name": last.metric_name if last else None,
        "training_seconds": records[-1].wall_seconds if records else 0.0,
        "elapsed_seconds": elapsed,
        "mean_round_seconds": sum(times) / len(times) if times else None,
        "p50_round_seconds": times[len(times) // 2] if times else None,
        "bytes_up": sum(r.bytes_up for r in records),
        "bytes_down": sum(r.bytes_down for r in records),
        # What every policy counts per round, summed: results received, gradient
        # computations asked, workers cancelled, late results dropped (a lazy policy
        # such as LAG uploads less than it computes).
        "uploads": sum(r.uploads for r in records),
        "computations": sum(r.computations for r in records),
        "cancelled": sum(r.cancelled for r in records),
        "late_dropped": sum(r.late_dropped for r in records),
        "target_loss": target_loss,
        "time_to_target_seconds": target_round.wall_seconds if target_round else None,
        "rounds_to_target": target_round.round + 1 if target_round else None,
    }


def summary_line(s: dict[str, Any]) -> str:
    parts = [
        f"{s['rounds']} rounds of {s['policy']} in {s['training_seconds']:.2f} s training time"
    ]
    if s["final_loss"] is not None:
        parts.append(f"loss {s['final_loss']:.6g}")
    if s["final_metric"] is not None and not math.isnan(s["final_metric"]):
        parts.append(f"{s['metric_name']} {s['final_metric']:.4g}")
    if s["mean_round_seconds"] is not None:
        parts.append(f"mean round {s['mean_round_seconds'] * 1e3:.1f} ms")
    if s.get("uploads", 0) != s.get("computations", 0):  # a lazy policy skipped uploads
        parts.append(f"{s['uploads']} uploads of {s['computations']} computations")
    if s["target_loss"] is not None:
        t = s["time_to_target_seconds"]
        parts.append(
            f"target {s['target_loss']:g} "
            + (f"reached at {t:.2f} s" if t is not None else "not reached")
        )
    return ", ".join(parts)


def write_model(out: Path, saved: SavedModel) -> Path:
    """The trained model beside the result files of ``--output`` (x.json → x.model.npz),
    and a network's PyTorch ``state_dict`` beside it (x.model.pt)."""
    path = save_model(model_path(result_paths(out)[0]), saved)
    export_network(path.with_suffix(".pt"), saved)
    return path


def default_output(config: JobConfig, prefix: str = "") -> Path:
    """results/<prefix><policy>-n<N>-seed<S>-<time>.json"""
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    name = f"{prefix}{config.policy.name}-n{config.workers}-seed{config.seed}-{stamp}.json"
    return Path("results") / name
