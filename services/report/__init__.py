"""`codedgd report`: figures and a time-to-target table from result files.

:func:`build_report` reads one or more result files (``codedgd run`` or
``codedgd simulate`` JSON), computes the table (:mod:`codedgd.services.report.summary`),
draws the figures (:mod:`codedgd.services.report.plots`, needs matplotlib: the
``report`` extra) and writes ``report.md`` (table and figures) and
``report.json`` (the table's numbers at full precision) beside them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from codedgd.services.errors import ConfigError
from codedgd.services.report.summary import (
    Group,
    Report,
    Run,
    distinguishing_labels,
    group_by_problem,
    incomparable_message,
    load_runs,
    markdown_table,
    mixed_group,
    problem_text,
    problem_title,
    relabel,
    report_dict,
    summarize_runs,
    time_to_target,
)

__all__ = [
    "Group",
    "Report",
    "ReportFiles",
    "Run",
    "build_report",
    "group_by_problem",
    "load_runs",
    "markdown_table",
    "summarize_runs",
]

# What to do with result files of different problems (see group_by_problem).
MIXING = ("refuse", "split", "mix")


@dataclass(frozen=True)
class ReportFiles:
    report: Report  # the first problem's (the only one unless split)
    markdown: Path
    json: Path
    figures: tuple[Path, ...]
    reports: tuple[Report, ...] = ()  # one per problem
    groups: tuple[Group, ...] = ()


def _slug(i: int, group: Group) -> str:
    """``p2-amazon-logistic-n30``: the sub-directory of a problem's figures."""
    p = group.problem
    parts = [f"p{i}", p["data"].split("(")[0], p["model"].split("(")[0], f"n{p['n']}"]
    text = "-".join(x for x in parts if x and x not in ("?", "n?"))
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)


def _baseline_for(group: Group, runs: Sequence[Run], wanted: str | None) -> str | None:
    """--baseline for one problem of a split report: a label or a file index of one of its
    runs applies; otherwise that problem takes the default baseline."""
    if wanted is None:
        return None
    if any(r.label == wanted for r in group.runs):
        return wanted
    if wanted.isdigit() and int(wanted) < len(runs) and runs[int(wanted)] in group.runs:
        return runs[int(wanted)].label
    return None


def build_report(
    paths: Sequence[str | Path],
    out_dir: str | Path,
    *,
    labels: Sequence[str] = (),
    target_loss: float | None = None,
    baseline: str | None = None,
    figures: bool = True,
    title: str = "codedgd report",
    mixing: str = "refuse",
    target_gaps: Sequence[float] = (),
    data_dir: str | None = None,
) -> ReportFiles:
    """Write the figures, ``report.md`` and ``report.json`` into ``out_dir``.

    Runs of one problem (same data, model, n, target loss and metric) share a table and
    figures. ``target_gaps`` (e.g. 1e-2 and 1e-4): targets within that fraction of the
    problem's optimal loss F* (:mod:`codedgd.services.job.optimum`, solved once and
    cached; ``data_dir`` for the real datasets); the first is the table's target, and a
    second table gives every run's time to each of them. Runs of several problems are
    refused (``mixing="refuse"``, the message names the keys they differ in and the
    files), reported one problem after the other with the figures in a sub-directory each
    (``"split"``), or drawn together anyway (``"mix"``).
    """
    from codedgd.services.report.plots import write_figures

    if mixing not in MIXING:
        raise ConfigError(f"mixing must be one of {', '.join(MIXING)}, got {mixing!r}")
    runs = load_runs(paths, labels)
    groups = group_by_problem(runs)
    if len(groups) > 1:
        if mixing == "refuse":
            raise ConfigError(incomparable_message(groups))
        if mixing == "mix":
            groups = [mixed_group(runs)]
        elif not labels:
            # Labels tell apart the runs of a problem, not of the whole input.
            groups = [
                Group(g.problem, tuple(relabel(g.runs, distinguishing_labels(g.runs))))
                for g in groups
            ]
    split = len(groups) > 1
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    reports: list[Report] = []
    written: list[Path] = []
    sections: list[str] = []
    docs: list[dict[str, Any]] = []
    for i, group in enumerate(groups, 1):
        wanted = _baseline_for(group, runs, baseline) if split else baseline
        gaps = _gap_targets(group, target_gaps, data_dir)
        report = summarize_runs(
            group.runs,
            target_loss=gaps[0][1] if gaps else target_loss,
            baseline=wanted,
            target_source=f"within {target_gaps[0]:g} of the optimal loss" if gaps else "",
        )
        reports.append(report)
        where = out / _slug(i, group) if split else out
        figs: tuple[Path, ...] = ()
        if group.differing:
            heading = "mixed problems (they differ in " + ", ".join(group.differing) + ")"
        else:
            heading = problem_title(group.problem)
        if figures:
            # A diverged run's huge losses overflow the log axis' transforms (numpy warns);
            # matplotlib still draws them at the top of the axis.
            with np.errstate(over="ignore", invalid="ignore"):
                figs = tuple(
                    write_figures(group.runs, where, target_loss=report.target_loss, title=heading)
                )
        written.extend(figs)
        sections.append(_section(i if split else 0, group, report, figs, out, gaps))
        docs.append(
            {
                "problem": group.problem,
                "differing": list(group.differing),
                **({"figures_dir": where.name} if split else {}),
                **report_dict(report),
                **({"gap_targets": _gap_dict(group, gaps)} if gaps else {}),
            }
        )
    md = out / "report.md"
    md.write_text(f"# {title}\n\n" + "\n".join(sections), encoding="utf-8")
    js = out / "report.json"
    doc: dict[str, Any] = {"problems": docs} if split else docs[0]
    js.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return ReportFiles(reports[0], md, js, tuple(written), tuple(reports), tuple(groups))


def _gap_targets(
    group: Group, gaps: Sequence[float], data_dir: str | None
) -> list[tuple[float, float, float]]:
    """(gap, target F*(1 + gap), F*) for each gap, F* of the group's problem."""
    if not gaps:
        return []
    if group.differing:
        raise ConfigError(
            "--target-gap needs one problem per table: the runs differ in "
            + ", ".join(group.differing)
            + " (use --split)"
        )
    from codedgd.services.job import JobConfig
    from codedgd.services.job.optimum import job_optimum

    job = {k: v for k, v in group.runs[0].job.items() if k in _SECTIONS}
    try:
        optimum = job_optimum(JobConfig.from_dict(job), data_dir)
    except ConfigError as exc:
        raise ConfigError(f"{group.runs[0].path}: cannot solve its optimal loss: {exc}") from None
    return [(gap, optimum.target(gap), optimum.loss) for gap in gaps]


_SECTIONS = ("job", "data", "model", "policy", "optimizer", "stragglers")


def _gap_dict(group: Group, gaps: Sequence[tuple[float, float, float]]) -> list[dict[str, Any]]:
    return [
        {
            "gap": gap,
            "target_loss": target,
            "optimal_loss": optimal,
            "time_to_target": {r.label: time_to_target(r, target)[0] for r in group.runs},
            "rounds_to_target": {r.label: time_to_target(r, target)[1] for r in group.runs},
        }
        for gap, target, optimal in gaps
    ]


def _gap_table(group: Group, gaps: Sequence[tuple[float, float, float]]) -> str:
    """Each run's time (rounds) to every target relative to the optimum."""
    head = "| run | " + " | ".join(f"F ≤ F*(1 + {g:g}) (s, rounds)" for g, _, _ in gaps) + " |"
    rows = [head, "|---|" + "---|" * len(gaps)]
    for r in group.runs:
        cells = []
        for _, target, _ in gaps:
            seconds, rounds = time_to_target(r, target)
            cells.append("not reached" if seconds is None else f"{seconds:.4g} ({rounds})")
        rows.append(f"| {r.label} | " + " | ".join(cells) + " |")
    optimal = gaps[0][2]
    return (
        f"Time to targets relative to the optimal loss F* = {optimal:.8g} (L-BFGS on the "
        "full training data, cached):\n\n" + "\n".join(rows) + "\n\n"
    )


def _section(
    index: int,
    group: Group,
    report: Report,
    figs: Sequence[Path],
    out: Path,
    gaps: Sequence[tuple[float, float, float]] = (),
) -> str:
    if group.differing:
        problem = (
            f"**Mixed problems** (forced with --mix): the runs differ in "
            f"{', '.join(group.differing)}, so their losses, the target and the speedups "
            "are not comparable."
        )
    else:
        problem = f"Problem: {problem_text(group.problem)}."
    head = f"## Problem {index}: {problem_title(group.problem)}\n\n" if index else ""
    sources = "\n".join(f"- {r.label}: `{r.path}`" for r in group.runs)
    images = "\n".join(
        f"![{p.stem.replace('_', ' ')}]({p.relative_to(out).as_posix()})"
        for p in figs
        if p.suffix == ".png"
    )
    extra = _gap_table(group, gaps) if gaps else ""
    return (
        f"{head}{problem}\n\n{markdown_table(report)}\n{extra}Result files:\n\n{sources}\n\n"
        f"{images}\n"
    )
