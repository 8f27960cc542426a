"""A censored delay informed by the worker's own earlier delays (auto's look-ahead)."""

from __future__ import annotations

import numpy as np

from codedgd.services.stragglers.fitted import Observations


def _obs(compute: float) -> Observations:
    # Workers 0 and 1 answer (excess 0.01 and 0.03); worker 2 is cancelled at 0.05 s.
    excess = np.array([[0.01, 0.03, 0.05]] * 3)
    censored = np.array([[False, False, True]] * 3)
    times = np.array([[compute, compute, np.nan]] * 3)
    return Observations(excess, censored, times)


def test_relative_delays_are_beyond_the_typical_per_second_of_compute() -> None:
    rel = _obs(0.1).relative()
    # The typical (median answered) excess is 0.02: worker 0 is at it, worker 1 0.01 past.
    np.testing.assert_allclose(rel[:, :2], [[0.0, 0.1]] * 3)


def test_a_censored_delay_takes_the_workers_own_past_scaled_to_the_load() -> None:
    history = [np.empty(0), np.empty(0), np.array([5.0, 4.0, 6.0])]  # a 5x-slow machine
    for compute in (0.1, 0.2):
        informed = _obs(compute).informed(history)
        # 0.02 typical + 5 s per compute second: 0.52 s at 0.1 s of compute, 1.02 at 0.2.
        np.testing.assert_allclose(informed.excess[:, 2], 0.02 + 5.0 * compute)
        assert not informed.censored.any()
    # A past below the bound says nothing new: the value stays a censored bound.
    low = _obs(0.1).informed([np.empty(0), np.empty(0), np.array([0.1])])
    assert low.censored[:, 2].all() and np.all(low.excess[:, 2] == 0.05)
    # No past at all: censored, as observed.
    assert _obs(0.1).informed([np.empty(0)] * 3).censored[:, 2].all()


def test_an_earlier_bound_raises_a_censored_value_but_leaves_it_censored() -> None:
    # Worker 2 was cancelled before at 1 s beyond the typical per second of compute: it
    # was at least that slow, and no more is known. Its bound here (0.05 s) is raised to
    # what that says at this round's compute (0.02 + 1.0 * 0.1), and it stays a bound:
    # the replay draws beyond it.
    bounds = [np.empty(0), np.empty(0), np.array([1.0])]
    raised = _obs(0.1).informed([np.empty(0)] * 3, bounds)
    np.testing.assert_allclose(raised.excess[:, 2], 0.12)
    assert raised.censored[:, 2].all()
    # An earlier bound below this one says nothing new.
    low = _obs(0.1).informed([np.empty(0)] * 3, [np.empty(0), np.empty(0), np.array([0.1])])
    assert low.censored[:, 2].all() and np.all(low.excess[:, 2] == 0.05)
    # A delay it answered with is a value: taken over any bound.
    answered = _obs(0.1).informed([np.empty(0), np.empty(0), np.array([5.0])], bounds)
    np.testing.assert_allclose(answered.excess[:, 2], 0.52)
    assert not answered.censored.any()
