"""`codedgd report` compares runs only within one problem, labels every curve by what
tells it apart, keeps coinciding curves visible and one metric per axis."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest

from codedgd.services.errors import ConfigError
from codedgd.services.records import write_results
from codedgd.services.report import build_report, group_by_problem, load_runs
from codedgd.services.report import plots as plots_module
from tests.sim.test_report import rec

pytest.importorskip("matplotlib")

LOSSES = [0.69, 0.6, 0.52, 0.47, 0.44, 0.42, 0.41, 0.405, 0.4, 0.398, 0.397, 0.396]


def job_doc(
    policy: dict[str, Any],
    *,
    n: int = 8,
    data: dict[str, Any] | None = None,
    model: dict[str, Any] | None = None,
    seed: int = 0,
    stragglers: dict[str, Any] | None = None,
    target: float | None = None,
) -> dict[str, Any]:
    job: dict[str, Any] = {"workers": n, "rounds": len(LOSSES), "seed": seed}
    if target is not None:
        job["target_loss"] = target
    return {
        "job": job,
        "data": data or {"name": "synthetic", "rows": 300},
        "model": model or {"name": "logistic", "l2": 0.0001},
        "policy": policy,
        "optimizer": {"lr": "auto"},
        "stragglers": stragglers or {"name": "exponential", "mean": 0.2},
        "job_id": "x",
    }


def result(
    path: Path,
    doc: dict[str, Any],
    *,
    round_s: float = 0.5,
    losses: list[float] = LOSSES,
    metric_name: str = "auc",
) -> Path:
    records = []
    for t, loss in enumerate(losses):
        r = rec(t, round_s * (t + 1), round_s, loss, 0.6 + t / 100)
        records.append(dataclasses.replace(r, metric_name=metric_name))
    return write_results(path, doc, records, {})


class Drawn:
    """What each figure showed, captured as it is saved."""

    def __init__(self) -> None:
        self.figures: dict[str, Any] = {}

    def __call__(self, fig: Any, stem: Path) -> list[Path]:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        axes = []
        for ax in fig.axes:
            axes.append(
                {
                    "ylabel": ax.get_ylabel(),
                    "title": ax.get_title(),
                    "lines": [
                        {
                            "label": line.get_label(),
                            "linestyle": line.get_linestyle(),
                            "marker": line.get_marker(),
                            "markevery": line.get_markevery(),
                            "ydata": list(line.get_ydata()),
                        }
                        for line in ax.get_lines()
                        if line.get_label() not in ("target loss", "")
                        and not line.get_label().startswith("_")
                    ],
                    "title_box": ax.title.get_window_extent(renderer),
                    "box": ax.get_tightbbox(renderer),
                }
            )
        suptitle = fig._suptitle
        legends = [leg.get_window_extent(renderer) for leg in fig.legends]
        self.figures[stem.name] = {
            "axes": axes,
            "suptitle": suptitle.get_text() if suptitle is not None else "",
            "suptitle_box": suptitle.get_window_extent(renderer) if suptitle else None,
            "legends": legends,
            "legend_labels": [t.get_text() for leg in fig.legends for t in leg.get_texts()],
            "size": fig.bbox,
        }
        return []


@pytest.fixture
def drawn(monkeypatch: pytest.MonkeyPatch) -> Drawn:
    capture = Drawn()
    monkeypatch.setattr(plots_module, "_save", capture)
    return capture


def test_runs_are_grouped_by_data_model_n_target_and_metric(tmp_path: Path) -> None:
    a = result(tmp_path / "a.json", job_doc({"name": "uncoded"}))
    b = result(
        tmp_path / "b.json",
        job_doc({"name": "frc", "s": 1}, stragglers={"name": "pareto"}, seed=3),
    )
    c = result(tmp_path / "c.json", job_doc({"name": "uncoded"}, n=16))
    d = result(tmp_path / "d.json", job_doc({"name": "uncoded"}, data={"name": "amazon"}))
    e = result(
        tmp_path / "e.json",
        job_doc({"name": "uncoded"}, model={"name": "least-squares"}),
        metric_name="mse",
    )
    f = result(tmp_path / "f.json", job_doc({"name": "uncoded"}, target=0.4))
    g = result(tmp_path / "g.json", job_doc({"name": "uncoded"}, data={"name": "synthetic"}))
    groups = group_by_problem(load_runs([a, b, c, d, e, f, g]))
    # Policy, stragglers and seed do not change the problem; n, data (and its options),
    # model and the jobs' target loss do.
    assert [[r.path.name for r in grp.runs] for grp in groups] == [
        ["a.json", "b.json"],
        ["c.json"],
        ["d.json"],
        ["e.json"],
        ["f.json"],
        ["g.json"],
    ]
    assert groups[0].problem == {
        "data": "synthetic(rows=300)",
        "model": "logistic(l2=0.0001)",
        "n": "8",
        "target": "none",
        "metric": "auc",
    }
    assert groups[3].problem["metric"] == "mse"


def test_a_file_silent_about_the_problem_joins_any_group(tmp_path: Path) -> None:
    a = result(tmp_path / "a.json", job_doc({"name": "uncoded"}))
    watched = result(tmp_path / "w.json", {"policy": {"name": "frc", "s": 1}})
    groups = group_by_problem(load_runs([a, watched]))
    assert len(groups) == 1 and len(groups[0].runs) == 2


def test_runs_of_different_problems_are_refused_with_the_keys_and_files(
    tmp_path: Path,
) -> None:
    a = result(tmp_path / "small.json", job_doc({"name": "uncoded"}, n=8))
    b = result(tmp_path / "big.json", job_doc({"name": "uncoded"}, n=16))
    c = result(tmp_path / "big-frc.json", job_doc({"name": "frc", "s": 1}, n=16))
    with pytest.raises(ConfigError) as exc:
        build_report([a, b, c], tmp_path / "report", figures=False)
    text = str(exc.value)
    assert "2 different problems (they differ in n)" in text
    assert f"problem 1 (n=8): {a}" in text
    assert f"problem 2 (n=16): {b}, {c}" in text
    assert "--split" in text and "--mix" in text
    assert not (tmp_path / "report" / "report.md").exists()


def test_split_writes_one_table_and_one_set_of_figures_per_problem(tmp_path: Path) -> None:
    a = result(tmp_path / "a.json", job_doc({"name": "uncoded"}, n=8), round_s=1.0)
    b = result(tmp_path / "b.json", job_doc({"name": "frc", "s": 1}, n=8), round_s=0.5)
    c = result(
        tmp_path / "c.json",
        job_doc({"name": "uncoded"}, n=16),
        losses=[x + 1 for x in LOSSES],
    )
    out = tmp_path / "report"
    files = build_report([a, b, c], out, mixing="split", baseline="frc(s=1)")
    doc = json.loads(files.json.read_text())
    assert [p["problem"]["n"] for p in doc["problems"]] == ["8", "16"]
    first, second = doc["problems"]
    assert [r["label"] for r in first["runs"]] == ["uncoded", "frc(s=1)"]
    assert first["baseline"] == "frc(s=1)"  # --baseline applies where it names a run
    assert second["baseline"] == "uncoded"
    # Each problem has its own target: the second's losses are 1 higher.
    assert second["target_loss"] == pytest.approx(first["target_loss"] + 1)
    for p in doc["problems"]:
        assert (out / p["figures_dir"] / "loss_vs_time.png").is_file()
    md = files.markdown.read_text()
    assert md.count("## Problem ") == 2 and "n = 16" in md
    assert f"![loss vs time]({first['figures_dir']}/loss_vs_time.png)" in md


def test_mix_draws_everything_labels_what_differs_and_one_metric_per_axis(
    tmp_path: Path, drawn: Drawn
) -> None:
    a = result(tmp_path / "a.json", job_doc({"name": "uncoded"}, n=8))
    b = result(tmp_path / "b.json", job_doc({"name": "uncoded"}, n=16))
    c = result(
        tmp_path / "c.json",
        job_doc({"name": "uncoded"}, n=8, model={"name": "least-squares"}),
        metric_name="mse",
    )
    files = build_report([a, b, c], tmp_path / "report", mixing="mix")
    labels = [r.label for r in files.report.rows]
    assert labels == [
        "uncoded · n=8, model=logistic(l2=0.0001)",
        "uncoded · n=16, model=logistic(l2=0.0001)",
        "uncoded · n=8, model=least-squares",
    ]
    assert "Mixed problems" in files.markdown.read_text()
    fig = drawn.figures["metric_vs_time"]
    assert fig["suptitle"].startswith("mixed problems (they differ in model, n, metric)")
    by_axis = {ax["ylabel"]: [line["label"] for line in ax["lines"]] for ax in fig["axes"]}
    assert by_axis == {"held-out ROC AUC": labels[:2], "held-out MSE": labels[2:]}


def test_labels_name_what_differs_within_a_problem(tmp_path: Path) -> None:
    paths = [
        result(tmp_path / "a.json", job_doc({"name": "frc", "s": 1})),
        result(tmp_path / "b.json", job_doc({"name": "frc", "s": 1}, seed=1)),
        result(
            tmp_path / "c.json",
            job_doc({"name": "frc", "s": 1}, stragglers={"name": "pareto", "alpha": 1.5}),
        ),
    ]
    labels = [r.label for r in load_runs(paths)]
    assert labels == [
        "frc(s=1) · stragglers=exponential(mean=0.2), seed=0",
        "frc(s=1) · stragglers=exponential(mean=0.2), seed=1",
        "frc(s=1) · stragglers=pareto(alpha=1.5), seed=0",
    ]
    # Nothing but the policy differs: the policy alone.
    same = [
        result(tmp_path / "u.json", job_doc({"name": "uncoded"})),
        result(tmp_path / "e.json", job_doc({"name": "erasurehead", "r": 2})),
    ]
    assert [r.label for r in load_runs(same)] == ["uncoded", "erasurehead(r=2)"]


def test_coinciding_curves_stay_visible_and_titles_do_not_overlap(
    tmp_path: Path, drawn: Drawn
) -> None:
    # Two policies that wait for the same workers: the very same curve, twice.
    paths = [
        result(tmp_path / "ign.json", job_doc({"name": "ignore-stragglers", "s": 2})),
        result(tmp_path / "eh2.json", job_doc({"name": "erasurehead", "r": 2, "K": 4})),
        result(tmp_path / "eh3.json", job_doc({"name": "erasurehead", "r": 3, "K": 4})),
        result(tmp_path / "unc.json", job_doc({"name": "uncoded"}), round_s=1.0),
    ]
    build_report(paths, tmp_path / "report")
    assert set(drawn.figures) == {
        "loss_vs_time",
        "loss_vs_rounds",
        "metric_vs_time",
        "metric_vs_rounds",
        "round_times",
    }
    fig = drawn.figures["loss_vs_rounds"]
    lines = fig["axes"][0]["lines"]
    assert [line["ydata"] for line in lines[:3]] == [LOSSES] * 3  # they do coincide
    # ... yet each run has its own line style and marker, and the markers of coinciding
    # curves sit at different rounds.
    assert len({(line["linestyle"], line["marker"]) for line in lines}) == 4
    assert len({line["marker"] for line in lines}) == 4
    assert len({line["markevery"] for line in lines[:3]}) == 3
    for line in lines:
        start, step = line["markevery"]
        assert 0 <= start < step < len(LOSSES)
    for name, fig in drawn.figures.items():
        # The problem is the suptitle of every figure.
        assert fig["suptitle"] == "synthetic(rows=300) · logistic(l2=0.0001) · n = 8", name
        boxes = [fig["suptitle_box"], *(ax["title_box"] for ax in fig["axes"])]
        boxes += fig["legends"]
        for i, one in enumerate(boxes):
            assert fig["size"].contains(one.x0 + 1, one.y0 + 1), name  # inside the figure
            assert fig["size"].contains(one.x1 - 1, one.y1 - 1), name
            for other in boxes[i + 1 :]:
                assert not one.overlaps(other), name
    legend = drawn.figures["loss_vs_time"]["legend_labels"]
    assert legend == [
        "ignore-stragglers(s=2)",
        "erasurehead(K=4, r=2)",
        "erasurehead(K=4, r=3)",
        "uncoded",
        "target loss",
    ]


def test_the_cli_refuses_then_splits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from codedgd.client.cli import main

    a = result(tmp_path / "a.json", job_doc({"name": "uncoded"}, data={"name": "amazon"}))
    b = result(tmp_path / "b.json", job_doc({"name": "uncoded"}, data={"name": "covtype"}))
    out = tmp_path / "rep"
    assert main(["report", str(a), str(b), "-o", str(out), "--no-figures"]) == 2
    err = capsys.readouterr().err
    assert "codedgd report: error: the result files hold 2 different problems" in err
    assert "(they differ in data)" in err and "problem 2 (data=covtype)" in err
    assert main(["report", str(a), str(b), "-o", str(out), "--no-figures", "--split"]) == 0
    doc = json.loads((out / "report.json").read_text())
    assert [p["problem"]["data"] for p in doc["problems"]] == ["amazon", "covtype"]
    assert main(["report", str(a), str(b), "-o", str(out), "--no-figures", "--mix"]) == 0
    doc = json.loads((out / "report.json").read_text())
    assert doc["differing"] == ["data"]
    assert [r["label"] for r in doc["runs"]] == ["uncoded · data=amazon", "uncoded · data=covtype"]
    assert all(math.isfinite(r["mean_round_seconds"]) for r in doc["runs"])
