"""The report's figures (matplotlib, imported lazily; PNG and SVG of each).

- ``loss_vs_time``, ``loss_vs_rounds``: training objective against training
  wall-clock seconds and against rounds, with the target loss dotted;
- ``metric_vs_time``, ``metric_vs_rounds``: the held-out metric likewise;
- ``round_times``: the distribution of round times per run (box: quartiles,
  whiskers: 5th–95th percentile, triangle: mean).

One color per policy (the same in every figure and every report); each run of a
figure has its own line style and its own hollow marker, the markers of different runs
at staggered rounds, so curves that coincide (two policies that wait for the same
workers) still show each run. A metric axis holds one metric (a panel per metric name
if runs were forced together with --mix); the problem is the figure's suptitle, the
legend sits below the axes; constrained layout keeps titles, labels and legend apart.
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
LINESTYLES = ("-", "--", ":", "-.", (0, (5, 1, 1, 1)), (0, (3, 1, 1, 1, 1, 1)))
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "*")
# Markers per curve, about: enough to tell the runs apart, few enough to see the line.
MARKS_PER_CURVE = 9

METRIC_LABELS = {"auc": "held-out ROC AUC", "mse": "held-out MSE"}


def policy_color(policy: str) -> str:
    """The policy's color: fixed for the built-in policies, stable for others."""
    if policy in POLICY_COLORS:
        return POLICY_COLORS[policy]
    return _SPARE[sum(policy.encode()) % len(_SPARE)]


def styles(runs: Sequence[Run]) -> list[dict[str, Any]]:
    """Color by policy; line style and marker by the run's place in the figure, so no two
    runs of a figure (up to six) look alike even when their curves coincide."""
    return [
        {
            "color": policy_color(run.policy),
            "linestyle": LINESTYLES[i % len(LINESTYLES)],
            "marker": MARKERS[i % len(MARKERS)],
        }
        for i, run in enumerate(runs)
    ]


def markevery(n_points: int, index: int, n_runs: int) -> tuple[int, int]:
    """(start, step) of a curve's markers: the runs' markers are staggered along the
    curve, so the markers of curves that coincide do not cover each other."""
    step = max(1, n_points // MARKS_PER_CURVE, min(n_runs, n_points))
    return (index * step // max(1, n_runs)) % step, step


def legend_columns(labels: Sequence[str], panels: int = 1) -> int:
    """Columns of a legend below the axes: as many as fit the figure's width."""
    longest = max((len(x) for x in labels), default=0)
    fit = max(1, (60 + 40 * (panels - 1)) // max(longest, 1))
    return max(1, min(len(labels), fit, 3))


def wrap_label(label: str, width: int = 24) -> str:
    """A run label on several lines, broken after `` · `` and ``, `` (box plot ticks)."""
    pieces: list[str] = []
    for i, part in enumerate(label.split(" · ")):
        items = _split_top(part)
        pieces += [x + ("," if j < len(items) - 1 else "") for j, x in enumerate(items)]
        if i < label.count(" · "):
            pieces[-1] += " ·"
    lines: list[str] = []
    for piece in pieces:
        if lines and len(lines[-1]) + 1 + len(piece) <= width:
            lines[-1] += " " + piece
        else:
            lines.append(piece)
    return "\n".join(lines)


def _split_top(text: str) -> list[str]:
    """``text`` split at the ``, `` outside parentheses."""
    items, depth, start = [], 0, 0
    for i, c in enumerate(text):
        depth += (c == "(") - (c == ")")
        if depth == 0 and text.startswith(", ", i):
            items.append(text[start:i])
            start = i + 2
    return [*items, text[start:]]


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
    runs: Sequence[Run],
    out_dir: Path,
    *,
    target_loss: float | None = None,
    title: str = "",
) -> list[Path]:
    """Draw every figure into ``out_dir`` as PNG and SVG; returns the files written.

    ``title`` (the problem) is each figure's suptitle."""
    plt = _pyplot()
    out_dir.mkdir(parents=True, exist_ok=True)
    st = styles(runs)
    written: list[Path] = []
    time_label = "training wall-clock time (s)" + (
        "; [sim] = simulated time" if any(r.simulated for r in runs) else ""
    )
    metric_names = list(dict.fromkeys(r.metric_name for r in runs if r.metrics()))

    def series(
        name: str,
        panels: list[tuple[str, str, Callable[[Run], list[tuple[float, float]]]]],
        xlabel: str,
        hline: float | None = None,
    ) -> None:
        """One figure, one axis per panel (axis title, y label, points of a run)."""
        fig, axes = plt.subplots(
            1,
            len(panels),
            figsize=(7.5 + 4.5 * (len(panels) - 1), 5.4),
            layout="constrained",
            squeeze=False,
        )
        for ax, (axis_title, ylabel, points) in zip(axes[0], panels, strict=True):
            values: list[float] = []
            for i, (run, style) in enumerate(zip(runs, st, strict=True)):
                pts = points(run)
                if not pts:
                    continue
                xs, ys = zip(*pts, strict=True)
                values += ys
                ax.plot(
                    xs,
                    ys,
                    label=run.label,
                    linewidth=1.6,
                    alpha=0.85,
                    markersize=6,
                    markerfacecolor="none",
                    markeredgewidth=1.3,
                    markevery=markevery(len(pts), i, len(runs)),
                    **style,
                )
            if hline is not None:
                ax.axhline(hline, color="black", linestyle=":", linewidth=1, label="target loss")
            positive = [v for v in values if v > 0]
            if positive and len(positive) == len(values) and max(values) / min(positive) > 20:
                ax.set_yscale("log")
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            ax.set_title(axis_title, fontsize="medium")
            ax.grid(True, alpha=0.3)
        legend: dict[str, Any] = {}
        for ax in axes[0]:
            for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
                legend.setdefault(label, handle)
        labels = list(legend)
        if title:
            fig.suptitle(title, fontsize="medium")
        fig.legend(
            list(legend.values()),
            labels,
            loc="outside lower center",
            ncols=legend_columns(labels, len(panels)),
            fontsize="small",
            frameon=False,
        )
        written.extend(_save(fig, out_dir / name))
        plt.close(fig)

    def loss_time(run: Run) -> list[tuple[float, float]]:
        return [(r.wall_seconds, v) for r, v in run.losses()]

    def loss_rounds(run: Run) -> list[tuple[float, float]]:
        return [(r.round + 1, v) for r, v in run.losses()]

    def metric_points(
        metric: str, x: Callable[[Any], float]
    ) -> Callable[[Run], list[tuple[float, float]]]:
        def points(run: Run) -> list[tuple[float, float]]:
            if run.metric_name != metric:
                return []
            return [(x(r), v) for r, v in run.metrics()]

        return points

    loss_label = "training loss F(θ) (objective, no unit)"
    series(
        "loss_vs_time",
        [("Training loss vs wall-clock time", loss_label, loss_time)],
        time_label,
        target_loss,
    )
    series(
        "loss_vs_rounds",
        [("Training loss vs rounds", loss_label, loss_rounds)],
        "round (gradient steps)",
        target_loss,
    )
    if metric_names:

        def panels(
            x: Callable[[Any], float], against: str
        ) -> list[tuple[str, str, Callable[[Run], list[tuple[float, float]]]]]:
            out = []
            for m in metric_names:
                label = METRIC_LABELS.get(m, f"held-out {m}")
                out.append((f"{label} vs {against}", label, metric_points(m, x)))
            return out

        series(
            "metric_vs_time",
            panels(lambda r: r.wall_seconds, "wall-clock time"),
            time_label,
        )
        series(
            "metric_vs_rounds",
            panels(lambda r: r.round + 1, "rounds"),
            "round (gradient steps)",
        )
    written.extend(_round_times(plt, runs, st, out_dir, title))
    return written


def _round_times(
    plt: Any, runs: Sequence[Run], st: list[dict[str, Any]], out_dir: Path, title: str = ""
) -> list[Path]:
    data = [[r.round_seconds for r in run.records] for run in runs]
    ticks = [wrap_label(r.label) for r in runs]
    longest = max(len(line) for tick in ticks for line in tick.splitlines())
    per_run = max(1.2, 0.075 * longest)  # inches: a tick label's widest line fits
    fig, ax = plt.subplots(figsize=(max(6.5, per_run * len(runs) + 1.5), 5.4), layout="constrained")
    if title:
        fig.suptitle(title, fontsize="medium")
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
    ax.set_xticklabels(ticks, fontsize="small")
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
