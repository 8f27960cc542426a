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

import numpy as np

from codedgd.services.report.summary import (
    Report,
    Run,
    load_runs,
    markdown_table,
    report_dict,
    summarize_runs,
)

__all__ = [
    "Report",
    "ReportFiles",
    "Run",
    "build_report",
    "load_runs",
    "markdown_table",
    "summarize_runs",
]


@dataclass(frozen=True)
class ReportFiles:
    report: Report
    markdown: Path
    json: Path
    figures: tuple[Path, ...]


def build_report(
    paths: Sequence[str | Path],
    out_dir: str | Path,
    *,
    labels: Sequence[str] = (),
    target_loss: float | None = None,
    baseline: str | None = None,
    figures: bool = True,
    title: str = "codedgd report",
) -> ReportFiles:
    """Write the figures, ``report.md`` and ``report.json`` into ``out_dir``."""
    from codedgd.services.report.plots import write_figures

    runs = load_runs(paths, labels)
    report = summarize_runs(runs, target_loss=target_loss, baseline=baseline)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: tuple[Path, ...] = ()
    if figures:
        # A diverged run's huge losses overflow the log axis' transforms (numpy warns);
        # matplotlib still draws them at the top of the axis.
        with np.errstate(over="ignore", invalid="ignore"):
            written = tuple(write_figures(runs, out, target_loss=report.target_loss))
    sources = "\n".join(f"- {r.label}: `{r.path}`" for r in runs)
    images = "\n".join(
        f"![{p.stem.replace('_', ' ')}]({p.name})" for p in written if p.suffix == ".png"
    )
    md = out / "report.md"
    md.write_text(
        f"# {title}\n\n{markdown_table(report)}\nResult files:\n\n{sources}\n\n{images}\n",
        encoding="utf-8",
    )
    js = out / "report.json"
    js.write_text(json.dumps(report_dict(report), indent=1) + "\n", encoding="utf-8")
    return ReportFiles(report, md, js, written)
