"""How a command ends: SIGTERM handled like Ctrl-C, and the rounds of a job that did not
finish saved with the error, under the exit code a shell expects."""

from __future__ import annotations

import contextlib
import signal
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from codedgd.client.results import summarize, write_result_pair
from codedgd.services.job import JobConfig
from codedgd.services.records import RoundRecord


class Terminated(KeyboardInterrupt):
    """The command got SIGTERM: it stops as on Ctrl-C, with its own exit code."""

    exit_code = 128 + signal.SIGTERM


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """Within: SIGTERM raises :class:`Terminated` (synchronous commands; main thread only)."""

    def handler(signum: int, frame: object) -> None:
        raise Terminated

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def save_unfinished(
    command: str,
    exc: BaseException,
    out: Path,
    job_doc: Mapping[str, Any],
    records: Sequence[RoundRecord],
    config: JobConfig,
    started: float,
) -> int:
    """Write the rounds of a job that failed or was interrupted, say where; the exit code."""
    if isinstance(exc, Terminated):
        error, code = "terminated (SIGTERM)", Terminated.exit_code
    elif isinstance(exc, KeyboardInterrupt):
        error, code = "interrupted", 130
    else:
        error, code = str(exc), 2
    summary = {**summarize(records, time.time() - started, config), "error": error}
    json_path, csv_path = write_result_pair(out, job_doc, records, summary)
    print(f"codedgd {command}: error: {error}", file=sys.stderr)
    print(f"the {len(records)} rounds done: {json_path} and {csv_path}", file=sys.stderr)
    return code
