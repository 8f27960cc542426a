"""The numbers of a report: runs read from result files, time to target, speedups.

Pure Python (no matplotlib): the table is computed here and only drawn by
:mod:`codedgd.services.report.plots`.

Definitions (also printed under the table):

- *time to target*: the ``wall_seconds`` of the first evaluated round whose training
  loss is <= the target; ``None`` when the run never reaches it.
- *target*: ``--target-loss`` if given, else the ``target_loss`` all runs' jobs share,
  else L* + 0.05·(L0 − L*) with L* the largest of the runs' smallest losses (the
  lowest loss every run reaches) and L0 the largest first evaluated loss: 95 % of
  the way down, so the time measures convergence, not the end of the slowest run.
- *speedup*: baseline's time to target / this run's time to target (> 1 = faster);
  *round speedup*: baseline's mean round time / this run's mean round time.
- *baseline*: ``--baseline`` (a label or a 0-based index), else the first uncoded
  run, else the first run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from codedgd.services.errors import ConfigError
from codedgd.services.records import RoundRecord, read_result_file

# The default target stops this fraction short of the lowest loss every run reaches, so
# time to target measures convergence, not the length of the slowest run.
DEFAULT_TARGET_SLACK = 0.05


@dataclass(frozen=True)
class Run:
    """One result file."""

    path: Path
    label: str
    policy: str
    simulated: bool
    job: dict[str, Any]
    records: tuple[RoundRecord, ...]
    error: str = ""  # why the run stopped early ("" when it ran to the end)

    def losses(self) -> list[tuple[RoundRecord, float]]:
        return [(r, r.loss) for r in self.records if not math.isnan(r.loss)]

    def metrics(self) -> list[tuple[RoundRecord, float]]:
        return [(r, r.metric) for r in self.records if not math.isnan(r.metric)]

    @property
    def metric_name(self) -> str:
        return self.records[0].metric_name if self.records else ""


@dataclass(frozen=True)
class RunSummary:
    label: str
    policy: str
    simulated: bool
    rounds: int
    mean_round_seconds: float
    p50_round_seconds: float
    p95_round_seconds: float
    training_seconds: float
    final_loss: float
    final_metric: float
    metric_name: str
    time_to_target: float | None
    rounds_to_target: int | None
    speedup: float | None
    round_speedup: float
    error: str = ""
    uploads: int = 0  # results received, over every round
    computations: int = 0  # gradients asked for (what a lazy policy saves shows here)


@dataclass(frozen=True)
class Report:
    target_loss: float
    target_source: str
    baseline: str
    rows: tuple[RunSummary, ...]


UNKNOWN = "?"

# What makes two runs the same problem: the objective (dataset with its options, model with
# its options), how many workers share it, the target loss the jobs stop at, and the
# held-out metric (one metric per axis even when a file does not name its model).
PROBLEM_KEYS = ("data", "model", "n", "target", "metric")

# How a job-document field is named in a label, in the order labels list them.
_FIELD_NAMES = {
    "job.workers": "n",
    "data": "data",
    "model": "model",
    "job.target_loss": "target",
    "stragglers": "stragglers",
    "optimizer": "optimizer",
    "job.seed": "seed",
    "job.rounds": "rounds",
    "job.partitions": "partitions",
    "job.eval_every": "eval_every",
}
# Never told apart in labels: ids, the policy (named first anyway), the simulator's
# cost model (the [sim] mark says a run is simulated).
_NOT_DISTINGUISHING = {"job_id", "policy", "simulation", "format"}


def component_text(doc: Any) -> str:
    """``exponential(mean=0.5)`` for ``{"name": "exponential", "mean": 0.5}``."""
    if not isinstance(doc, dict):
        return UNKNOWN if doc is None else str(doc)
    name = str(doc.get("name", ""))
    params = {k: v for k, v in doc.items() if k != "name"}
    inner = ", ".join(f"{k}={_value(v)}" for k, v in sorted(params.items()))
    if not name:
        return inner or UNKNOWN
    return f"{name}({inner})" if inner else name


def _value(v: Any) -> str:
    if isinstance(v, dict):
        return component_text(v)
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def run_label(job: dict[str, Any], simulated: bool) -> str:
    """``erasurehead(K=15, r=2)``, with `` [sim]`` for a simulated run."""
    policy = job.get("policy") or {}
    name = str(policy.get("name", "?"))
    params = {k: v for k, v in policy.items() if k != "name"}
    text = name + (
        "(" + ", ".join(f"{k}={v}" for k, v in sorted(params.items())) + ")" if params else ""
    )
    return text + (" [sim]" if simulated else "")


def job_fields(job: dict[str, Any]) -> dict[str, str]:
    """The job document flattened to ``field → text`` (``job.seed``, ``stragglers``, ...)."""
    out: dict[str, str] = {}
    for key, value in job.items():
        if key in _NOT_DISTINGUISHING:
            continue
        if key == "job" and isinstance(value, dict):
            out.update({f"job.{k}": _value(v) for k, v in value.items()})
        elif isinstance(value, dict):
            out[key] = component_text(value)
        else:
            out[key] = _value(value)
    return out


def problem_of(run: Run) -> dict[str, str]:
    """The run's problem: data, model, n, target, metric (``?`` where the file is silent)."""
    job = run.job
    section = job.get("job")
    if isinstance(section, dict):
        n = _value(section["workers"]) if "workers" in section else UNKNOWN
        target = _value(section["target_loss"]) if "target_loss" in section else "none"
    else:
        n = target = UNKNOWN
    return {
        "data": component_text(job["data"]) if "data" in job else UNKNOWN,
        "model": component_text(job["model"]) if "model" in job else UNKNOWN,
        "n": n,
        "target": target,
        "metric": run.metric_name or UNKNOWN,
    }


def problem_text(problem: dict[str, str]) -> str:
    """``data=amazon, model=logistic(l2=0.0001), n=30, target=none, metric=auc``."""
    return ", ".join(f"{k}={v}" for k, v in problem.items() if v != UNKNOWN) or "unknown problem"


def problem_title(problem: dict[str, str]) -> str:
    """A figure's suptitle: ``amazon · logistic(l2=0.0001) · n = 30``."""
    parts = [problem[k] for k in ("data", "model") if problem[k] != UNKNOWN]
    if problem["n"] != UNKNOWN:
        parts.append(f"n = {problem['n']}")
    if problem["target"] not in (UNKNOWN, "none"):
        parts.append(f"jobs' target loss {problem['target']}")
    return " · ".join(parts)


@dataclass(frozen=True)
class Group:
    """Runs of one problem (or, forced with ``--mix``, of several)."""

    problem: dict[str, str]  # the keys the runs share; differing keys hold "mixed"
    runs: tuple[Run, ...]
    differing: tuple[str, ...] = ()  # problem keys on which the runs differ (forced mix)


def _compatible(a: dict[str, str], b: dict[str, str]) -> bool:
    return all(a[k] == b[k] or UNKNOWN in (a[k], b[k]) for k in PROBLEM_KEYS)


def group_by_problem(runs: Sequence[Run]) -> list[Group]:
    """Runs grouped by problem, in the order of the files; a key a file does not say
    (``?``, e.g. a watched job's result) matches any value."""
    groups: list[tuple[dict[str, str], list[Run]]] = []
    for run in runs:
        mine = problem_of(run)
        for problem, members in groups:
            if _compatible(problem, mine):
                members.append(run)
                problem.update({k: v for k, v in mine.items() if problem[k] == UNKNOWN})
                break
        else:
            groups.append((dict(mine), [run]))
    return [Group(problem, tuple(members)) for problem, members in groups]


def mixed_group(runs: Sequence[Run]) -> Group:
    """All runs as one group (``--mix``): the problem keys they differ on are named."""
    problems = [problem_of(r) for r in runs]
    differing = tuple(
        k for k in PROBLEM_KEYS if len({p[k] for p in problems if p[k] != UNKNOWN}) > 1
    )
    problem = {
        k: "mixed" if k in differing else next((p[k] for p in problems if p[k] != UNKNOWN), UNKNOWN)
        for k in PROBLEM_KEYS
    }
    return Group(problem, tuple(runs), differing)


def incomparable_message(groups: Sequence[Group]) -> str:
    """Why runs of several problems are refused, which files belong to which, and the flags."""
    differing = [k for k in PROBLEM_KEYS if len({g.problem[k] for g in groups} - {UNKNOWN}) > 1]
    lines = [
        f"the result files hold {len(groups)} different problems (they differ in "
        f"{', '.join(differing)}): their losses, targets and speedups are not comparable"
    ]
    for i, g in enumerate(groups, 1):
        keys = ", ".join(f"{k}={g.problem[k]}" for k in differing)
        files = ", ".join(str(r.path) for r in g.runs)
        lines.append(f"  problem {i} ({keys}): {files}")
    lines.append(
        "give --split for one table and one set of figures per problem, or --mix to "
        "draw them together anyway"
    )
    return "\n".join(lines)


def distinguishing_labels(runs: Sequence[Run]) -> list[str]:
    """Each run's policy label plus the job fields that differ among ``runs``
    (``frc(s=1) · n=8, stragglers=exponential(mean=0.5)``); equal labels are then told
    apart by file name, then by position."""
    fields = [job_fields(r.job) for r in runs]
    keys = list(dict.fromkeys(k for f in fields for k in f))
    # A field a file does not hold (a watched job's, a hand-written one) tells nothing apart.
    differ = [k for k in keys if len({f[k] for f in fields if k in f}) > 1]
    order = list(_FIELD_NAMES)
    differ.sort(key=lambda k: (order.index(k) if k in order else len(order), k))
    labels = []
    for run, f in zip(runs, fields, strict=True):
        base = run_label(run.job, run.simulated)
        extra = ", ".join(
            f"{_FIELD_NAMES.get(k, k.removeprefix('job.'))}={f[k]}" for k in differ if k in f
        )
        labels.append(f"{base} · {extra}" if extra else base)
    return _distinct(labels, [r.path.stem for r in runs])


def relabel(runs: Sequence[Run], labels: Sequence[str]) -> list[Run]:
    return [
        Run(r.path, label, r.policy, r.simulated, r.job, r.records, r.error)
        for r, label in zip(runs, labels, strict=True)
    ]


def load_runs(paths: Sequence[str | Path], labels: Sequence[str] = ()) -> list[Run]:
    """Read result files (``codedgd run``/``simulate`` JSON) into labelled runs: the
    given labels, else :func:`distinguishing_labels`."""
    if not paths:
        raise ConfigError("give at least one result file (.json written by run or simulate)")
    if labels and len(labels) != len(paths):
        raise ConfigError(f"{len(labels)} --label value(s) for {len(paths)} result file(s)")
    runs: list[Run] = []
    for raw in paths:
        path = Path(raw)
        if not path.is_file():
            raise ConfigError(f"result file {path} does not exist")
        try:
            job, summary, records = read_result_file(path)
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"{path}: {exc}") from None
        if not records:
            raise ConfigError(f"{path} holds no rounds")
        simulated = "simulation" in job
        policy = str((job.get("policy") or {}).get("name", "?"))
        error = str(summary.get("error") or "")
        runs.append(Run(path, "", policy, simulated, job, tuple(records), error))
    if labels:
        return relabel(runs, _distinct(list(labels), [r.path.stem for r in runs]))
    return relabel(runs, distinguishing_labels(runs))


def _distinct(labels: list[str], stems: list[str]) -> list[str]:
    """Tell equal labels apart: by file name, then by position."""
    out = [
        f"{label} ({stem})" if labels.count(label) > 1 else label
        for label, stem in zip(labels, stems, strict=True)
    ]
    return [f"{label} #{i + 1}" if out.count(label) > 1 else label for i, label in enumerate(out)]


def time_to_target(run: Run, target: float) -> tuple[float | None, int | None]:
    """(wall seconds, rounds) at the first evaluated round with loss <= target."""
    for record, loss in run.losses():
        if loss <= target:
            return record.wall_seconds, record.round + 1
    return None, None


def choose_target(runs: Sequence[Run], explicit: float | None) -> tuple[float, str]:
    if explicit is not None:
        return float(explicit), "given"
    targets = {(r.job.get("job") or {}).get("target_loss") for r in runs}
    if len(targets) == 1 and None not in targets:
        return float(next(iter(targets))), "the jobs' target_loss"  # type: ignore[arg-type]
    evaluated = [r.losses() for r in runs if r.losses()]
    if not evaluated:
        raise ConfigError("no run has an evaluated loss: cannot choose a target loss")
    reached = max(min(loss for _, loss in pts) for pts in evaluated)
    start = max(pts[0][1] for pts in evaluated)
    target = reached + DEFAULT_TARGET_SLACK * max(start - reached, 0.0)
    return target, "95 % of the way from the first loss to the lowest loss every run reaches"


def choose_baseline(runs: Sequence[Run], wanted: str | None) -> Run:
    if wanted is not None:
        for r in runs:
            if r.label == wanted:
                return r
        if wanted.isdigit() and int(wanted) < len(runs):
            return runs[int(wanted)]
        raise ConfigError(
            f"--baseline {wanted!r} is neither a run label nor an index 0..{len(runs) - 1}; "
            f"labels: {', '.join(r.label for r in runs)}"
        )
    return next((r for r in runs if r.policy == "uncoded"), runs[0])


def summarize_runs(
    runs: Sequence[Run],
    *,
    target_loss: float | None = None,
    baseline: str | None = None,
    target_source: str = "",
) -> Report:
    target, source = choose_target(runs, target_loss)
    source = target_source or source
    base = choose_baseline(runs, baseline)
    base_time, _ = time_to_target(base, target)
    base_mean = float(np.mean([r.round_seconds for r in base.records]))
    rows = []
    for run in runs:
        times = np.array([r.round_seconds for r in run.records], dtype=np.float64)
        ttt, rtt = time_to_target(run, target)
        losses, metrics = run.losses(), run.metrics()
        mean = float(np.mean(times))
        speedup = base_time / ttt if base_time is not None and ttt is not None and ttt > 0 else None
        rows.append(
            RunSummary(
                label=run.label,
                policy=run.policy,
                simulated=run.simulated,
                rounds=len(run.records),
                mean_round_seconds=mean,
                p50_round_seconds=float(np.percentile(times, 50)),
                p95_round_seconds=float(np.percentile(times, 95)),
                training_seconds=float(run.records[-1].wall_seconds),
                final_loss=losses[-1][1] if losses else math.nan,
                final_metric=metrics[-1][1] if metrics else math.nan,
                metric_name=run.metric_name,
                time_to_target=ttt,
                rounds_to_target=rtt,
                speedup=speedup,
                round_speedup=base_mean / mean if mean > 0 else math.inf,
                error=run.error,
                uploads=sum(r.uploads for r in run.records),
                computations=sum(r.computations for r in run.records),
            )
        )
    return Report(target, source, base.label, tuple(rows))


def _num(value: float | None, digits: int = 4) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:.{digits}g}"


def markdown_table(report: Report) -> str:
    """The time-to-target table as GitHub markdown (numbers to 4 significant digits)."""
    # Uploads against computations only when they differ in some run: a lazy policy's
    # skipped uploads, cancelled workers, a tree's sums (one upload for a subtree).
    lazy = any(r.uploads != r.computations for r in report.rows)
    head = (
        "| run | rounds | mean round (s) | p50 round (s) | p95 round (s) | final loss | "
        "final metric | time to target (s) | rounds to target | speedup | round speedup |"
        + (" uploads / computations |" if lazy else "")
    )
    lines = [head, "|" + "---|" * (12 if lazy else 11)]
    for r in report.rows:
        metric = f"{_num(r.final_metric)} {r.metric_name}".strip()
        mark = " (incomplete)" if r.error else ""
        lines.append(
            f"| {r.label}{mark} | {r.rounds} | {_num(r.mean_round_seconds)} | "
            f"{_num(r.p50_round_seconds)} | {_num(r.p95_round_seconds)} | {_num(r.final_loss)} | "
            f"{metric} | {_num(r.time_to_target)} | "
            f"{r.rounds_to_target if r.rounds_to_target is not None else '–'} | "
            f"{_num(r.speedup, 3)}{'×' if r.speedup is not None else ''} | "
            f"{_num(r.round_speedup, 3)}× |"
            + (f" {r.uploads} / {r.computations} |" if lazy else "")
        )
    lines.append("")
    lines.append(
        f"Target loss {report.target_loss:.6g} ({report.target_source}); speedups relative "
        f"to **{report.baseline}** (baseline time to target / run's time to target; round "
        "speedup: baseline mean round time / run's mean round time). Times are training "
        "wall-clock seconds, evaluation excluded; [sim] runs are on the simulator's "
        "virtual clock."
    )
    stopped = [r for r in report.rows if r.error]
    if stopped:
        lines.append("")
        lines.append(
            "Incomplete runs, stopped before their last round (rows cover the rounds done):"
        )
        lines.append("")
        lines.extend(f"- {r.label}: {r.error}" for r in stopped)
    return "\n".join(lines) + "\n"


def report_dict(report: Report) -> dict[str, Any]:
    """The report as JSON-ready data (full precision)."""

    def clean(v: Any) -> Any:
        return None if isinstance(v, float) and not math.isfinite(v) else v

    return {
        "target_loss": report.target_loss,
        "target_source": report.target_source,
        "baseline": report.baseline,
        "runs": [{k: clean(v) for k, v in vars(r).items()} for r in report.rows],
    }
