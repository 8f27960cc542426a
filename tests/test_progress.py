"""The progress of `codedgd run`: a policy's switch is said once."""

from __future__ import annotations

import dataclasses

import pytest

from codedgd.client.progress import Progress
from tests.test_tune import _record


@pytest.mark.parametrize("notes", [True, False])
def test_a_note_is_written_above_the_bar_unless_the_log_says_it(
    notes: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    bar = Progress(3, enabled=False, notes=notes)
    plain = _record(0, {0: 0.1})
    bar.update(plain)
    bar.update(dataclasses.replace(plain, round=1, note="auto: r=2 K=4 -> r=2 K=2 (saves 1 s)"))
    bar.close()
    err = capsys.readouterr().err
    assert ("round 1: auto: r=2 K=4 -> r=2 K=2 (saves 1 s)" in err) == notes
    assert "round 0" not in err
