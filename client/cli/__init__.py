"""The `codedgd` command line: one module per command (or group), over :mod:`.options`.

    codedgd run            a coordinator and N worker processes on this machine, one job (run.py)
    codedgd coordinator    serve a coordinator (workers and clients dial in)      (serve.py)
    codedgd worker         serve as a worker of a coordinator                     (serve.py)
    codedgd submit         submit a job to a running coordinator (and watch it)   (jobs.py)
    codedgd watch          follow a job's rounds                                  (jobs.py)
    codedgd status         jobs and workers of a coordinator                      (jobs.py)
    codedgd cancel         cancel a job                                           (jobs.py)
    codedgd model          fetch a job's trained model into a file                (model.py)
    codedgd evaluate       score a trained model on a dataset                     (model.py)
    codedgd predict        a trained model's predictions, as CSV                  (model.py)
    codedgd policies       the aggregation policies and their parameters          (catalog.py)
    codedgd stragglers     the straggler models and their options                 (catalog.py)
    codedgd simulate       the same job on a virtual clock                        (simulate.py)
    codedgd report         plots and tables from result files                     (report.py)
    codedgd health         container healthcheck probe                            (health.py)

Every error a user can cause prints one line naming the fix (exit status 2); never a
traceback. A command module registers its subcommand(s) with ``add_parser(s)`` and sets
``func``; it imports nothing from this package's other command modules.
"""

from __future__ import annotations

import argparse
import difflib
import logging
import re
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from codedgd.client.cli import (
    catalog,
    health,
    jobs,
    logs,
    model,
    report,
    run,
    serve,
    simulate,
    tune,
)
from codedgd.client.cli.exits import Terminated
from codedgd.client.cli.options import EPILOG, apply_env_defaults, check_env
from codedgd.services.errors import CodedGDError, ConfigError

LOG_FORMAT_HELP = "log lines as text (default) or one JSON object per line"


class _Parser(argparse.ArgumentParser):
    """argparse, with a suggestion for a mistyped command or flag ("did you mean")."""

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            command = self._command_parser(getattr(parsed, "command", None))
            hints = [_hint(extra, _flags(command or self)) for extra in extras]
            self.error(
                f"unrecognized arguments: {' '.join(extras)}"
                + "".join(f"; did you mean {h}?" for h in dict.fromkeys(hints) if h)
            )
        return parsed

    def error(self, message: str) -> NoReturn:
        choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if choice:
            options = re.findall(r"'([^']*)'", choice.group(2))
            near = difflib.get_close_matches(choice.group(1), options, n=1)
            if near:
                message += f"; did you mean {near[0]}?"
        super().error(message)

    def _command_parser(self, command: str | None) -> argparse.ArgumentParser | None:
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction) and command in action.choices:
                parser: argparse.ArgumentParser = action.choices[command]
                return parser
        return None


def _flags(parser: argparse.ArgumentParser) -> list[str]:
    return [s for action in parser._actions for s in action.option_strings if s.startswith("--")]


def _hint(extra: str, flags: list[str]) -> str:
    """The flag ``extra`` (``--name`` or ``--name=value``) was probably meant to be."""
    if not extra.startswith("--"):
        return ""
    near = difflib.get_close_matches(extra.split("=", 1)[0], flags, n=1, cutoff=0.7)
    return near[0] if near else ""


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="codedgd",
        description="Straggler-resilient, communication-efficient distributed gradient descent.",
        epilog=EPILOG,
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging")
    parser.add_argument("--log-format", default="text", metavar="{text,json}", help=LOG_FORMAT_HELP)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run.add_parser(sub)
    serve.add_parsers(sub)
    jobs.add_parsers(sub)
    catalog.add_parsers(sub)
    model.add_parsers(sub)
    simulate.add_parser(sub)
    report.add_parser(sub)
    tune.add_parser(sub)
    health.add_parser(sub)
    for command in sub.choices.values():  # -v after the command too: `codedgd run -v`
        command.add_argument(
            "-v",
            "--verbose",
            action="count",
            default=argparse.SUPPRESS,
            help="more logging (-vv: debug)",
        )
        command.add_argument(
            "--log-format", default=argparse.SUPPRESS, metavar="{text,json}", help=LOG_FORMAT_HELP
        )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    env_errors = apply_env_defaults(parser)
    args = parser.parse_args(argv)
    try:
        check_env(env_errors, args.command)
    except ConfigError as exc:
        print(f"codedgd {args.command}: error: {exc}", file=sys.stderr)
        return 2
    if args.log_format not in logs.FORMATS:
        print(
            f"codedgd {args.command}: error: --log-format {args.log_format!r} (or "
            "CODEDGD_LOG_FORMAT): choose text or json",
            file=sys.stderr,
        )
        return 2
    logs.configure(
        logging.WARNING - 10 * min(args.verbose, 2)
        if args.command not in ("coordinator", "worker")
        else logging.INFO - 10 * min(args.verbose, 1),
        args.log_format,
    )
    if args.command in ("run", "coordinator", "worker"):
        from codedgd.services.allocator import keep_freed_memory

        keep_freed_memory()
    try:
        return int(args.func(args))
    except CodedGDError as exc:
        print(f"codedgd {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except Terminated:
        print(f"codedgd {args.command}: terminated (SIGTERM)", file=sys.stderr)
        return Terminated.exit_code
    except KeyboardInterrupt:
        print(f"codedgd {args.command}: interrupted", file=sys.stderr)
        return 130
    except OSError as exc:
        print(f"codedgd {args.command}: error: {exc}", file=sys.stderr)
        return 2


__all__ = ["build_parser", "main"]
