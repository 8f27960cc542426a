"""The norm guard: a result far larger than its peers' is thrown out, from the first round."""

from __future__ import annotations

import numpy as np

from codedgd.services.coordinator.guard import NormGuard

DIM = 4


def _honest(rng: np.random.Generator) -> np.ndarray:
    return rng.normal(size=DIM)


def test_in_the_first_round_arrivals_are_held_until_three_can_be_compared() -> None:
    rng = np.random.default_rng(0)
    guard = NormGuard(100.0, [1.0] * 4, memory=20)
    poisoned = _honest(rng) * 1e6
    assert guard.admit(0, poisoned, still_coming=3) == ([], {})  # held: nothing to compare
    assert guard.admit(1, _honest(rng), still_coming=2) == ([], {})
    assert guard.held == {0, 1}
    released, faults = guard.admit(2, _honest(rng), still_coming=1)
    assert [w for w, _ in released] == [1, 2]
    assert list(faults) == [0] and "times the size of recent results" in faults[0]
    assert guard.held == frozenset()


def test_after_the_first_judgement_arrivals_pass_at_once_or_are_thrown_out() -> None:
    rng = np.random.default_rng(1)
    guard = NormGuard(100.0, [1.0] * 4, memory=20)
    for w in range(3):
        guard.admit(w, _honest(rng), still_coming=3 - w)
    released, faults = guard.admit(3, _honest(rng) * 50, still_coming=0)  # 50x: under 100
    assert [w for w, _ in released] == [3] and not faults
    released, faults = guard.admit(0, _honest(rng) * 1e4, still_coming=3)
    assert not released and list(faults) == [0]


def test_too_few_arrivals_to_compare_are_accepted_unjudged() -> None:
    rng = np.random.default_rng(2)
    guard = NormGuard(100.0, [1.0] * 3, memory=20)
    assert guard.admit(0, _honest(rng) * 1e6, still_coming=2) == ([], {})
    # A loss leaves one more arrival at most: settle() releases both, nothing to compare.
    released, faults = guard.admit(1, _honest(rng), still_coming=0)
    assert [w for w, _ in released] == [0, 1] and not faults


def test_sizes_are_per_unit_of_the_codes_coefficients() -> None:
    """A cyclic code's row with coefficients summing to 40 sends a 40x larger message: not
    an attack."""
    rng = np.random.default_rng(3)
    guard = NormGuard(10.0, [1.0, 1.0, 1.0, 40.0], memory=20)
    for w in range(3):
        guard.admit(w, _honest(rng), still_coming=3 - w)
    released, faults = guard.admit(3, _honest(rng) * 40, still_coming=0)
    assert [w for w, _ in released] == [3] and not faults


def test_a_skipped_upload_passes_and_the_memory_is_bounded() -> None:
    rng = np.random.default_rng(4)
    guard = NormGuard(100.0, [1.0] * 3, memory=5)
    assert guard.admit(0, None, still_coming=2) == ([(0, None)], {})
    for _ in range(10):
        for w in range(3):
            guard.admit(w, _honest(rng), still_coming=2 - w)
        guard.end_round()
    assert len(guard.history) == 5


def test_a_sign_flip_passes_the_guard() -> None:
    """What the guard cannot see (the robust policies are for that)."""
    rng = np.random.default_rng(5)
    guard = NormGuard(100.0, [1.0] * 3, memory=20)
    g = [_honest(rng) for _ in range(3)]
    guard.admit(0, -g[0], still_coming=2)
    guard.admit(1, g[1], still_coming=1)
    released, faults = guard.admit(2, g[2], still_coming=0)
    assert len(released) == 3 and not faults
