"""Ring all-reduce's schedule: played step by step, it gives the reference sums and θ."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from codedgd.services.compute.ring import (
    gather_segment,
    reduced_segment,
    reduced_segments,
    scatter_segment,
    segments,
)


@pytest.mark.parametrize(("length", "n"), [(10, 3), (7, 7), (5, 8), (1000, 4), (0, 2)])
def test_segments_cover_the_vector_in_order(length: int, n: int) -> None:
    bounds = segments(length, n)
    assert len(bounds) == n and bounds[0][0] == 0 and bounds[-1][1] == length
    assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds))
    sizes = [stop - start for start, stop in bounds]
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_playing_the_schedule_gives_the_reference_sums_bit_for_bit(n: int) -> None:
    rng = np.random.default_rng(n)
    messages = [rng.standard_normal(23) for _ in range(n)]
    bounds = segments(23, n)
    partial = [m.copy() for m in messages]  # what each worker has accumulated so far
    for step in range(n - 1):
        sent = {
            (w + 1) % n: (q := scatter_segment(w, step, n), partial[w][slice(*bounds[q])].copy())
            for w in range(n)
        }
        for receiver, (q, values) in sent.items():
            partial[receiver][slice(*bounds[q])] = values + messages[receiver][slice(*bounds[q])]
    reference = reduced_segments(messages)
    total = np.sum(messages, axis=0)
    for w in range(n):
        q = reduced_segment(w, n)
        held = partial[w][slice(*bounds[q])]
        assert np.array_equal(held, reference[w])  # the same order of additions
        np.testing.assert_allclose(held, total[slice(*bounds[q])], rtol=1e-12)


@pytest.mark.parametrize("n", [1, 2, 4, 7])
def test_all_gather_gives_everyone_every_segment_exactly(n: int) -> None:
    theta = np.random.default_rng(n).standard_normal(19)
    bounds = segments(19, n)
    have = [{w: theta[slice(*bounds[w])].copy()} for w in range(n)]
    for step in range(n - 1):
        sent = [(w, gather_segment(w, step, n)) for w in range(n)]
        for w, q in sent:
            assert q in have[w]  # a worker forwards only what it holds
            have[(w + 1) % n][q] = have[w][q]
    for w in range(n):
        rebuilt = np.concatenate([have[w][q] for q in range(n)])
        assert np.array_equal(rebuilt, theta)
