"""Whom the coordinator blames for a stalled ring or tree: the roots of who waits for whom,
and the deadline derived from measured rounds (codedgd.services.coordinator.silence)."""

from __future__ import annotations

import pytest

from codedgd.services.coordinator.silence import (
    COORDINATOR,
    Stall,
    peer_deadline,
    silent_roots,
)


def _stall(reporter: int, peers: set[int], since: float) -> Stall:
    return Stall(reporter, frozenset(peers), since, "data")


def test_the_deadline_is_round_timeout_until_rounds_are_timed_then_a_multiple() -> None:
    assert peer_deadline([], 10, 1.0, 300) == 300
    assert peer_deadline([0.2, 0.3], 10, 1.0, 300) == 300
    assert peer_deadline([0.2, 0.3, 0.25], 10, 1.0, 300) == pytest.approx(3.0)
    # the longest of the last 20 rounds counts; older ones do not
    assert peer_deadline([5.0] + [0.2] * 20, 10, 1.0, 300) == pytest.approx(2.0)
    assert peer_deadline([0.01] * 5, 10, 1.0, 300) == 1.0  # the floor
    assert peer_deadline([100.0] * 5, 10, 1.0, 300) == 300  # round_timeout caps it


def test_a_ring_stalled_behind_one_hung_worker_blames_only_it() -> None:
    # worker 2 is hung: 3 waits for 2, 4 for 3, 0 for 4, 1 for 0 (each a little later);
    # the coordinator misses every upload.
    n = 5
    stalls = [_stall((2 + k) % n, {(1 + k) % n}, 10.0 + k) for k in range(1, n)]
    stalls.append(_stall(COORDINATOR, set(range(n)), 9.0))
    blamed = silent_roots(stalls, now=20.0)
    assert list(blamed) == [2]
    assert blamed[2] == "silent: worker 3 waited 9.0 s for its data"


def test_a_tree_blames_the_silent_leaf_not_its_waiting_parent() -> None:
    stalls = [
        _stall(COORDINATOR, {1}, 0.0),  # the coordinator misses level-1 worker 1
        _stall(1, {5}, 0.5),  # which waits for its leaf 5
    ]
    assert list(silent_roots(stalls, now=5.0)) == [5]


def test_a_missing_reporter_nobody_waits_for_is_blamed_by_the_coordinator() -> None:
    assert list(silent_roots([_stall(COORDINATOR, {0, 2}, 0.0)], now=1.0)) == [0, 2]


def test_a_cycle_of_waits_blames_the_peer_waited_for_longest() -> None:
    # a link 1 -> 2 that swallows data: 2 waits for 1 first, then the ring stalls round
    stalls = [_stall(2, {1}, 3.0), _stall(0, {2}, 3.4), _stall(1, {0}, 3.2)]
    assert list(silent_roots(stalls, now=10.0)) == [1]


def test_a_cycle_blames_where_data_stopped_first_not_the_earliest_estimated_wait() -> None:
    # Worker 3 of a ring of 4 hangs; the stall spreads 0 <- 3 (nothing had), 1 <- 0 (one
    # θ segment had), 2 <- 1 (two), and the hung 3 waits for 2 too (two). Worker 1's wait
    # is estimated to have begun first (its report reached a loaded coordinator quickly,
    # worker 0's slowly): the counts still blame worker 3, not the innocent worker 0.
    stalls = [
        Stall(1, frozenset({0}), 3.0, "data", received=1),
        Stall(0, frozenset({3}), 3.1, "data", received=0),
        Stall(2, frozenset({1}), 3.2, "data", received=2),
        Stall(3, frozenset({2}), 3.3, "data", received=2),
        _stall(COORDINATOR, {0, 1, 2, 3}, 2.0),
    ]
    blamed = silent_roots(stalls, now=10.0)
    assert list(blamed) == [3]
    assert blamed[3] == "silent: worker 0 waited 6.9 s for its data"


def test_no_reports_blame_nobody() -> None:
    assert silent_roots([], now=1.0) == {}
