"""`codedgd report`: figures and a time-to-target table from result files."""

from __future__ import annotations

import argparse
from typing import Any

from codedgd.client.cli.options import EPILOG
from codedgd.services.errors import ConfigError


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``report`` to a subparsers object."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "report",
        help="plots and a time-to-target table from result files",
        description=(
            "Read result files of `codedgd run` / `codedgd simulate` (.json) and write, "
            "into --out-dir: loss and held-out metric against wall-clock time and against "
            "rounds, the distribution of round times per run (PNG and SVG), report.md "
            "(a markdown table of round times, final loss/metric, time to the target loss "
            "and speedups over the baseline, with the figures) and report.json (the same "
            "numbers at full precision). Runs are compared only within one problem "
            "(same data and its options, model and its options, n, jobs' target loss, "
            "metric): files of several problems are refused unless --split or --mix. "
            "Labels name the policy and whatever else differs among the runs. One color "
            "per policy, one line style and marker per run. Needs matplotlib "
            "(pip install 'codedgd[report]')."
        ),
        epilog=EPILOG,
    )
    p.add_argument("results", nargs="+", metavar="RESULTS.json", help="result files")
    p.add_argument(
        "--out-dir", "-o", default="report", help="directory of the report (default ./report)"
    )
    p.add_argument(
        "--label",
        action="append",
        default=[],
        help="a legend label per result file, in order, repeatable "
        "(default: policy(params), [sim] for simulated runs, then what else differs "
        "among the runs: n, data, stragglers, seed, ...)",
    )
    p.add_argument(
        "--target-gap",
        type=float,
        action="append",
        default=[],
        metavar="EPS",
        help="a target within EPS of the problem's optimal loss, F <= F*(1 + EPS), F* "
        "solved once by L-BFGS and cached (repeatable: e.g. --target-gap 1e-2 --target-gap "
        "1e-4 for a loose and a tight one; the first is the table's target, and a second "
        "table gives every run's time to each); needs the datasets (--data-dir)",
    )
    p.add_argument("--data-dir", help="directory of the real datasets (default $CODEDGD_DATA_DIR)")
    p.add_argument(
        "--target-loss",
        type=float,
        help="target training loss of the time-to-target column (default: the jobs' "
        "shared target_loss, else 95 %% of the way from the first loss to the lowest loss "
        "every run reaches)",
    )
    p.add_argument(
        "--baseline",
        help="label or 0-based index of the run the speedups are relative to "
        "(default: the first uncoded run, else the first)",
    )
    mixing = p.add_mutually_exclusive_group()
    mixing.add_argument(
        "--split",
        action="store_true",
        help="result files of different problems: one table and one set of figures per "
        "problem (figures in a sub-directory each) instead of refusing",
    )
    mixing.add_argument(
        "--mix",
        action="store_true",
        help="result files of different problems: draw them on the same figures and "
        "table anyway (labels name what differs; losses and speedups are not comparable)",
    )
    p.add_argument("--title", default="codedgd report", help="title of report.md")
    p.add_argument("--no-figures", action="store_true", help="only report.md and report.json")
    p.set_defaults(func=cmd_report)
    return p


def cmd_report(args: argparse.Namespace) -> int:
    from codedgd.services.report import build_report

    if args.label and len(args.label) != len(args.results):
        raise ConfigError(f"{len(args.label)} --label(s) for {len(args.results)} result file(s)")
    if args.target_gap and args.target_loss is not None:
        raise ConfigError("give --target-loss or --target-gap, not both")
    files = build_report(
        args.results,
        args.out_dir,
        labels=args.label,
        target_loss=args.target_loss,
        baseline=args.baseline,
        figures=not args.no_figures,
        title=args.title,
        mixing="split" if args.split else "mix" if args.mix else "refuse",
        target_gaps=args.target_gap,
        data_dir=args.data_dir,
    )
    print(files.markdown.read_text(encoding="utf-8"))
    print(f"report: {files.markdown}, {files.json}, {len(files.figures)} figure file(s)")
    return 0
