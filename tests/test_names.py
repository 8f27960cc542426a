"""Which machine a worker name stands for from one run to the next (services/names.py)."""

from __future__ import annotations

import pytest

from codedgd.services.names import host, machine, match_machines


def test_a_name_is_its_machine_without_the_coordinator_s_session_suffix() -> None:
    assert machine("gpu-3#17") == "gpu-3" and machine("gpu-3") == "gpu-3"
    assert host("ip-10-0-0-7:4242#3") == "ip-10-0-0-7"
    assert host("worker:a") is None and host("worker") is None and host(":42") is None


@pytest.mark.parametrize(
    ("before", "now", "expected"),
    [
        # The same names, in another order; a session suffix on either side.
        (["a", "b", "c"], ["c#9", "a", "b"], [2, 0, 1]),
        (["a#4", "b", "c"], ["b", "a", "x"], [1, 0, None]),
        # Default names: a new pid on the same host is the same machine...
        (["h1:10", "h2:20"], ["h2:31", "h1:32"], [1, 0]),
        # ...unless that host held two places on either run: not told apart.
        (["h1:10", "h1:11", "h2:20"], ["h1:30", "h2:31", "h1:32"], [None, 2, None]),
        (["h1:10", "h2:20"], ["h1:30", "h1:31"], [None, None]),
        # A name that held two places on the source run matches nothing; "" nothing.
        (["a", "a", "b"], ["a", "b", ""], [None, 2, None]),
        # An exact name goes first; the host match takes only what is left.
        (["h1:10", "h1"], ["h1", "h1:55"], [1, 0]),
    ],
)
def test_places_of_two_runs_are_paired_by_their_holders_names(
    before: list[str], now: list[str], expected: list[int | None]
) -> None:
    assert match_machines(before, now) == expected
    matched = [i for i in match_machines(before, now) if i is not None]
    assert len(matched) == len(set(matched))  # no source entry given twice
