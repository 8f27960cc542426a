"""The live progress bar of `codedgd run` / `codedgd submit --watch` (tqdm)."""

from __future__ import annotations

import math
import sys

from tqdm import tqdm

from codedgd.services.records import RoundRecord


class Progress:
    """round / rounds, loss, held-out metric and round time, on stderr; a round whose
    policy changed itself (``RoundRecord.note``) gets a line above the bar."""

    def __init__(self, rounds: int, *, enabled: bool = True, notes: bool = True) -> None:
        """``notes``: write the policy's notes (False where the coordinator's own log,
        in this process, says them already: `run -v`)."""
        self._notes = notes
        self._bar = tqdm(
            total=rounds,
            unit="round",
            file=sys.stderr,
            dynamic_ncols=True,
            disable=None if enabled else True,  # None: off when stderr is not a terminal
            desc="training",
        )
        self._loss = math.nan
        self._metric = math.nan

    def status(self, text: str) -> None:
        """Say what the job does instead of training, e.g. "waiting for 3 more workers
        (5 connected, job needs 8)"; the next round puts "training" back."""
        self._bar.set_description_str(text)

    def update(self, record: RoundRecord) -> None:
        if record.note and self._notes:  # what the policy changed (auto's switches)
            tqdm.write(f"round {record.round}: {record.note}", file=sys.stderr)
        if not math.isnan(record.loss):
            self._loss = record.loss
        if not math.isnan(record.metric):
            self._metric = record.metric
        self._bar.set_description_str("training")
        self._bar.set_postfix_str(
            f"loss={self._loss:.5g} {record.metric_name}={self._metric:.4g} "
            f"round={record.round_seconds * 1e3:.0f}ms used={len(record.workers_used)}",
            refresh=False,
        )
        self._bar.update(1)

    def close(self) -> None:
        self._bar.close()
