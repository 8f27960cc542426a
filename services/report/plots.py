"""The report's figures (matplotlib, imported lazily; PNG and SVG of each).

- ``loss_vs_time``, ``loss_vs_rounds``: training objective against training
  wall-clock seconds and against rounds, with the target loss dotted;
- ``metric_vs_time``, ``metric_vs_rounds``: the held-out metric likewise;
- ``round_times``: the distribution of round times per run (box: quartiles,
  whiskers: 5th–95th percentile, triangle: mean).

One color per policy (the same in every figure and every report), one line style
per run of that policy, a legend on every figure, axes labelled with units.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from codedgd.services.errors import ConfigError
from codedgd.services.report.summary import Run

FORMATS = ("png", "svg")

POLICY_COLORS: dict[str, str] = {
    "uncoded": "#4d4d4d",
    "ignore-stragglers": "#8c564b",
    "frc": "#1f77b4",
    "cyclic": "#2ca02c",
    "erasurehead": "#d62728",
    "group-mds": "#9467bd",
    "polynomial": "#e377c2",
    "lag-wk": "#bcbd22",
    "lag-ps": "#17becf",
    "g-lag": "#ff7f0e",
    "lagc": "#7f7f00",
    "ring": "#393b79",
    "codedreduce": "#843c39",
}
_SPARE = ("#637939", "#8c6d31", "#7b4173", "#3182bd", "#e6550d", "#31a354", "#756bb1")
LINESTYLES = ("-", "--", ":", "-.", (0, (5, 1, 1, 1)), (0, (1, 1)))

METRIC_LABELS = {"auc": "held-out ROC AUC", "mse": "held-out MSE"}


def policy_color(policy: str) -> str:
    """The policy's color: fixed for the built-in policies, stable for others."""
    if policy in POLICY_COLORS:
        return POLICY_COLORS[policy]
    return _SPARE[sum(policy.encode()) % len(_SPARE)]


def styles(runs: Sequence[Run]) -> list[dict[str, Any]]:
    """Color by policy, line style by the run's rank among runs of its policy."""
    count: dict[str, int] = {}
    out = []
    for run in runs:
        i = count.get(run.policy, 0)
        count[run.policy] = i + 1
        out.append({"color": policy_color(run.policy), "linestyle": LINESTYLES[i % 6]})
    return out


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise ConfigError(
            "codedgd report needs matplotlib: pip install 'codedgd[report]' "
            "(or pip install matplotlib)"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_figures(
    runs: Sequence[Run], out_dir: Path, *, target_loss: float | None = None
) -> list[Path]:
    """Draw every figure into ``out_dir`` as PNG and SVG; returns the files written."""
    plt = _pyplot()
    out_dir.mkdir(parents=True, exist_ok=True)
    st = styles(runs)
    written: list[Path] = []
    time_label = "training wall-clock time (s)" + (
        "; [sim] = simulated time" if any(r.simulated for r in runs) else ""
    )
    metric_names = sorted({r.metric_name for r in runs if r.metric_name})
    metric_label = " / ".join(METRIC_LABELS.get(m, f"held-out {m}") for m in metric_names)

    def series(
        name: str,
        title: str,
        ylabel: str,
        points: Callable[[Run], list[tuple[float, float]]],
        xlabel: str,
        hline: float | None = None,
    ) -> None:
        fig, ax = plt.subplots(figsize=(7.5, 4.6), constrained_layout=True)
        values: list[float] = []
        for run, style in zip(runs, st, strict=True):
            pts = points(run)
            if not pts:
                continue
            xs, ys = zip(*pts, strict=True)
            values += ys
            marker = "o" if len(pts) <= 30 else None
            ax.plot(xs, ys, label=run.label, linewidth=1.8, marker=marker, markersize=3, **style)
        if hline is not None:
            ax.axhline(hline, color="black", linestyle=":", linewidth=1, label="target loss")
        positive = [v for v in values if v > 0]
        if positive and len(positive) == len(values) and max(values) / min(positive) > 20:
            ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small", loc="best")
        written.extend(_save(fig, out_dir / name))
        plt.close(fig)

    def loss_time(run: Run) -> list[tuple[float, float]]:
        return [(r.wall_seconds, v) for r, v in run.losses()]

    def loss_rounds(run: Run) -> list[tuple[float, float]]:
        return [(r.round + 1, v) for r, v in run.losses()]

    def metric_time(run: Run) -> list[tuple[float, float]]:
        return [(r.wall_seconds, v) for r, v in run.metrics()]

    def metric_rounds(run: Run) -> list[tuple[float, float]]:
        return [(r.round + 1, v) for r, v in run.metrics()]

    loss_label = "training loss F(θ) (objective, no unit)"
    series(
        "loss_vs_time",
        "Training loss vs wall-clock time",
        loss_label,
        loss_time,
        time_label,
        target_loss,
    )
    series(
        "loss_vs_rounds",
        "Training loss vs rounds",
        loss_label,
        loss_rounds,
        "round (gradient steps)",
        target_loss,
    )
    if any(r.metrics() for r in runs):
        series(
            "metric_vs_time",
            f"{metric_label} vs wall-clock time",
            metric_label,
            metric_time,
            time_label,
        )
        series(
            "metric_vs_rounds",
            f"{metric_label} vs rounds",
            metric_label,
            metric_rounds,
            "round (gradient steps)",
        )
    written.extend(_round_times(plt, runs, st, out_dir))
    return written


def _round_times(
    plt: Any, runs: Sequence[Run], st: list[dict[str, Any]], out_dir: Path
) -> list[Path]:
    data = [[r.round_seconds for r in run.records] for run in runs]
    fig, ax = plt.subplots(figsize=(max(5.0, 1.1 * len(runs) + 2.5), 4.8), constrained_layout=True)
    box = ax.boxplot(
        data,
        whis=(5, 95),
        showmeans=True,
        showfliers=True,
        patch_artist=True,
        widths=0.6,
        flierprops={"markersize": 2, "alpha": 0.4},
        meanprops={"marker": "^", "markerfacecolor": "white", "markeredgecolor": "black"},
        medianprops={"color": "black"},
    )
    for patch, style in zip(box["boxes"], st, strict=True):
        patch.set_facecolor(style["color"])
        patch.set_alpha(0.75)
        patch.set_linestyle(style["linestyle"])
    ax.set_xticks(range(1, len(runs) + 1))
    ax.set_xticklabels([r.label for r in runs], rotation=25, ha="right", fontsize="small")
    flat = [v for d in data for v in d if v > 0]
    if flat and max(flat) / min(flat) > 50:
        ax.set_yscale("log")
    ax.set_ylabel("round time (s)")
    ax.set_xlabel("run (policy)")
    ax.set_title(
        "Round times per run\n(box: quartiles, whiskers: 5–95 %, ▲: mean)", fontsize="medium"
    )
    ax.grid(True, axis="y", alpha=0.3)
    handles = [
        plt.Rectangle((0, 0), 1, 1, color=policy_color(p), alpha=0.75)
        for p in dict.fromkeys(r.policy for r in runs)
    ]
    ax.legend(
        handles, list(dict.fromkeys(r.policy for r in runs)), fontsize="small", title="policy"
    )
    paths = _save(fig, out_dir / "round_times")
    plt.close(fig)
    return paths


def _save(fig: Any, stem: Path) -> list[Path]:
    paths = []
    for fmt in FORMATS:
        path = stem.with_suffix("." + fmt)
        fig.savefig(path, dpi=150 if fmt == "png" else None)
        paths.append(path)
    return paths
