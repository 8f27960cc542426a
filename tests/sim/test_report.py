"""`codedgd report` on fixture result files: the figures exist, the numbers are the inputs'."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from codedgd.services.errors import ConfigError
from codedgd.services.records import RoundRecord, write_results
from codedgd.services.report import build_report, load_runs, summarize_runs
from codedgd.services.report.plots import policy_color, styles
from tests.factories import round_record

pytest.importorskip("matplotlib")


def rec(t: int, wall: float, round_s: float, loss: float, metric: float) -> RoundRecord:
    return round_record(
        t,
        wall_seconds=wall,
        round_seconds=round_s,
        wait_seconds=round_s,
        loss=loss,
        metric=metric,
        metric_name="auc",
        workers_used=(0,),
        uploads=1,
        computations=1,
    )


def fixture_run(
    path: Path, policy: dict[str, object], round_times: list[float], losses: list[float]
) -> Path:
    records, wall = [], 0.0
    for t, (rs, loss) in enumerate(zip(round_times, losses, strict=True)):
        wall += rs
        # Evaluated every other round, as with eval_every = 2 (plus the last round).
        evaluated = t % 2 == 0 or t == len(losses) - 1
        records.append(
            rec(
                t,
                wall,
                rs,
                loss if evaluated else math.nan,
                0.5 + t / 100 if evaluated else math.nan,
            )
        )
    return write_results(path, {"job": {"workers": 4}, "policy": policy}, records, {})


@pytest.fixture
def result_files(tmp_path: Path) -> list[Path]:
    losses = [0.69, 0.6, 0.5, 0.45, 0.4, 0.38, 0.36, 0.35]
    return [
        fixture_run(
            tmp_path / "uncoded.json",
            {"name": "uncoded"},
            [1.0, 2.0, 1.5, 2.5, 1.0, 2.0, 1.0, 3.0],
            losses,
        ),
        fixture_run(tmp_path / "frc.json", {"name": "frc", "s": 1}, [0.5] * 8, losses),
        fixture_run(
            tmp_path / "eh.json",
            {"name": "erasurehead", "r": 2, "K": 15},
            [0.25] * 8,
            [0.69, 0.62, 0.55, 0.5, 0.47, 0.45, 0.44, 0.43],
        ),
    ]


def test_report_writes_figures_and_a_table_computed_from_the_inputs(
    result_files: list[Path], tmp_path: Path
) -> None:
    out = tmp_path / "report"
    files = build_report(result_files, out, target_loss=0.45)
    stems = {"loss_vs_time", "loss_vs_rounds", "metric_vs_time", "metric_vs_rounds", "round_times"}
    assert {p.name for p in files.figures} == {f"{s}.{e}" for s in stems for e in ("png", "svg")}
    for p in files.figures:
        assert p.stat().st_size > 2000
        head = p.read_bytes()[:8]
        assert head.startswith(b"\x89PNG") if p.suffix == ".png" else b"<" in head

    doc = json.loads(files.json.read_text())
    rows = {r["label"]: r for r in doc["runs"]}
    assert doc["baseline"] == "uncoded" and doc["target_loss"] == 0.45
    # Uncoded reaches 0.45 at round 4 (evaluated rounds 0, 2, 4, ...; round 3 = 0.45 is not
    # evaluated): wall = 1 + 2 + 1.5 + 2.5 + 1 = 8.0 s, 5 rounds.
    assert rows["uncoded"]["time_to_target"] == pytest.approx(8.0)
    assert rows["uncoded"]["rounds_to_target"] == 5
    assert rows["frc(s=1)"]["time_to_target"] == pytest.approx(2.5)
    # erasurehead's loss 0.45 first appears at round 5, which is not evaluated; round 6
    # (0.44) is: 7 rounds of 0.25 s.
    assert rows["erasurehead(K=15, r=2)"]["time_to_target"] == pytest.approx(1.75)
    assert rows["frc(s=1)"]["speedup"] == pytest.approx(8.0 / 2.5)
    assert rows["erasurehead(K=15, r=2)"]["speedup"] == pytest.approx(8.0 / 1.75)
    mean_uncoded = sum([1.0, 2.0, 1.5, 2.5, 1.0, 2.0, 1.0, 3.0]) / 8
    assert rows["uncoded"]["mean_round_seconds"] == pytest.approx(mean_uncoded)
    assert rows["frc(s=1)"]["round_speedup"] == pytest.approx(mean_uncoded / 0.5)
    assert rows["uncoded"]["p50_round_seconds"] == pytest.approx(1.75)
    assert rows["erasurehead(K=15, r=2)"]["final_loss"] == pytest.approx(0.43)
    assert rows["uncoded"]["final_metric"] == pytest.approx(0.57)

    # The markdown table shows the same numbers.
    md = files.markdown.read_text()
    line = next(x for x in md.splitlines() if x.startswith("| erasurehead"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert float(cells[7]) == pytest.approx(1.75)
    assert cells[8] == "7"
    assert float(cells[9].rstrip("×")) == pytest.approx(8.0 / 1.75, rel=1e-3)
    assert re.search(r"Target loss 0\.45 \(given\)", md)
    assert "![round times](round_times.png)" in md


def test_default_target_is_near_the_lowest_loss_every_run_reaches(result_files: list[Path]) -> None:
    report = summarize_runs(load_runs(result_files))
    # L* = 0.43 (erasurehead's best), L0 = 0.69: target 0.43 + 0.05·0.26 = 0.443.
    assert report.target_loss == pytest.approx(0.443)
    assert report.target_source.startswith("95 % of the way")
    by_label = {r.label: r for r in report.rows}
    # erasurehead: evaluated 0.44 at round 6 is the first <= 0.443: 7 rounds of 0.25 s.
    assert by_label["erasurehead(K=15, r=2)"].time_to_target == pytest.approx(1.75)
    # Uncoded's first evaluated loss <= 0.43 is round 4 (0.40): 8.0 s.
    assert by_label["uncoded"].time_to_target == pytest.approx(8.0)
    assert by_label["uncoded"].rounds_to_target == 5


def test_baseline_choice_labels_and_errors(result_files: list[Path], tmp_path: Path) -> None:
    report = summarize_runs(load_runs(result_files), target_loss=0.45, baseline="1")
    assert report.baseline == "frc(s=1)"
    assert {r.label: r.speedup for r in report.rows}["frc(s=1)"] == pytest.approx(1.0)
    runs = load_runs(result_files, labels=["a", "b", "c"])
    assert [r.label for r in runs] == ["a", "b", "c"]
    with pytest.raises(ConfigError, match="--baseline"):
        summarize_runs(runs, baseline="nope")
    with pytest.raises(ConfigError, match="does not exist"):
        load_runs([tmp_path / "missing.json"])
    unreachable = summarize_runs(load_runs(result_files), target_loss=0.1)
    assert all(r.time_to_target is None and r.speedup is None for r in unreachable.rows)


def test_one_color_per_policy_and_a_style_per_run(result_files: list[Path]) -> None:
    runs = load_runs([result_files[0], result_files[1], result_files[1]])
    st = styles(runs)
    assert st[1]["color"] == st[2]["color"] == policy_color("frc") != st[0]["color"]
    assert st[1]["linestyle"] != st[2]["linestyle"]
    assert runs[1].label != runs[2].label  # same policy twice: told apart by file


def test_a_run_that_stopped_early_is_named_with_its_error(
    result_files: list[Path], tmp_path: Path
) -> None:
    stopped = tmp_path / "stopped.json"
    records = [rec(t, t + 1.0, 1.0, 0.69 - 0.01 * t, 0.5) for t in range(3)]
    error = "round 3 was not decodable within job.round_timeout=2 s"
    write_results(stopped, {"policy": {"name": "cyclic", "s": 1}}, records, {"error": error})
    files = build_report([*result_files, stopped], tmp_path / "report", target_loss=0.68)
    md = files.markdown.read_text()
    assert f"- cyclic(s=1): {error}" in md
    assert md.count("stopped before their last round") == 1  # the finished runs are not
    assert md.count("(incomplete)") == 1 and "| cyclic(s=1) (incomplete) | 3 |" in md
    rows = {r["label"]: r for r in json.loads(files.json.read_text())["runs"]}
    assert rows["cyclic(s=1)"]["error"] == error and rows["cyclic(s=1)"]["rounds"] == 3
    assert rows["uncoded"]["error"] == ""


def test_a_result_file_cut_short_is_named_as_such(result_files: list[Path], tmp_path: Path) -> None:
    whole = result_files[0].read_text()
    cut = tmp_path / "cut.json"
    cut.write_text(whole[: len(whole) // 2])
    with pytest.raises(ConfigError, match="is cut short: its JSON ends unfinished"):
        load_runs([cut])
    garbage = tmp_path / "garbage.json"
    garbage.write_text("not json at all")
    with pytest.raises(ConfigError, match="it is not JSON"):
        load_runs([garbage])
