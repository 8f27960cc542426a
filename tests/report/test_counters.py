"""A lazy policy's savings show in the report: uploads against computations per run."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from codedgd.services.records import write_results
from codedgd.services.report import load_runs
from codedgd.services.report.summary import markdown_table, summarize_runs
from tests.report.test_problems import LOSSES, job_doc
from tests.sim.test_report import rec


def _result(path: Path, policy: str, uploads: int) -> Path:
    records = [
        dataclasses.replace(rec(t, 0.5 * (t + 1), 0.5, loss, 0.6), uploads=uploads, computations=8)
        for t, loss in enumerate(LOSSES)
    ]
    return write_results(path, job_doc({"name": policy}), records, {})


def test_uploads_and_computations_are_counted_and_shown_when_a_run_skipped(
    tmp_path: Path,
) -> None:
    runs = load_runs(
        [_result(tmp_path / "u.json", "uncoded", 8), _result(tmp_path / "l.json", "lag-wk", 3)]
    )
    report = summarize_runs(runs)
    counts = {r.policy: (r.uploads, r.computations) for r in report.rows}
    assert counts == {
        "uncoded": (8 * len(LOSSES), 8 * len(LOSSES)),
        "lag-wk": (3 * len(LOSSES), 8 * len(LOSSES)),
    }
    table = markdown_table(report)
    assert "uploads / computations" in table
    assert f"| {3 * len(LOSSES)} / {8 * len(LOSSES)} |" in table


def test_without_skipped_uploads_the_table_keeps_its_columns(tmp_path: Path) -> None:
    runs = load_runs([_result(tmp_path / "u.json", "uncoded", 8)])
    assert "uploads" not in markdown_table(summarize_runs(runs))
