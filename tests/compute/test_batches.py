"""Mini-batch rounds: every worker holding a partition takes the same seeded sample of
its rows (a rule any language reproduces), the sampled sum is scaled to estimate the full
one, and an exact code decodes exactly the sampled batch's gradient from every straggler
pattern."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from codedgd.services.compute.batches import batch_key, batch_rows, batch_scale, splitmix64
from codedgd.services.compute.gradient import Computer, PartitionRows
from codedgd.services.models import LogisticRegression
from tests.policies.support import planned, relative_error, run_round


def _reference_splitmix64(x: int) -> int:
    """SplitMix64 in plain integers, as the wire contract states it."""
    m = (1 << 64) - 1
    z = (x + 0x9E3779B97F4A7C15) & m
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
    return z ^ (z >> 31)


def test_splitmix64_is_the_published_generator() -> None:
    assert int(splitmix64(0)) == 0xE220A8397B1DCDAF  # its well-known first output
    for x in (1, 12345, 2**63 + 7, 2**64 - 1):
        assert int(splitmix64(x)) == _reference_splitmix64(x)


def test_the_sample_follows_the_contracts_rule_in_plain_integers() -> None:
    seed, t, p, n, b = 7, 3, 5, 50, 9
    key = _reference_splitmix64(_reference_splitmix64(_reference_splitmix64(seed) ^ t) ^ p)
    assert int(batch_key(seed, t, p)) == key
    ranked = sorted(range(n), key=lambda i: (_reference_splitmix64(key ^ i), i))
    assert batch_rows(seed, t, p, n, b).tolist() == sorted(ranked[:b])


def test_samples_differ_by_round_and_partition_and_cover_all_when_small() -> None:
    a = batch_rows(0, 0, 0, 100, 10)
    assert a is not None and len(set(a.tolist())) == 10 and list(a) == sorted(a)
    assert not np.array_equal(a, batch_rows(0, 1, 0, 100, 10))
    assert not np.array_equal(a, batch_rows(0, 0, 1, 100, 10))
    assert batch_rows(0, 0, 0, 10, 10) is None and batch_rows(0, 0, 0, 10, 0) is None
    assert batch_scale(100, a) == 10.0 and batch_scale(100, None) == 1.0


def _data(k: int, rows: int = 30, dim: int = 6) -> list[PartitionRows]:
    rng = np.random.default_rng(4)
    return [
        PartitionRows(p, rng.standard_normal((rows, dim)), (rng.random(rows) < 0.5) * 1.0)
        for p in range(k)
    ]


def test_a_coded_round_decodes_the_sampled_batch_exactly_for_every_straggler_set() -> None:
    n, s, batch, seed = 6, 2, 7, 11
    policy, plan = planned("cyclic", n, {"s": s})
    parts = _data(n)
    model = LogisticRegression(l2=0.0)
    computers = [
        Computer(
            model,
            [parts[p] for p in wp.partitions],
            wp.coefficients,
            batch_size=batch,
            seed=seed,
        )
        for wp in plan.workers
    ]
    theta = np.random.default_rng(0).standard_normal(6)
    for t, stragglers in enumerate(itertools.combinations(range(n), s)):
        # The batch's gradient, computed directly: each partition's sample, scaled.
        target = np.zeros(6)
        for part in parts:
            rows = batch_rows(seed, t, part.index, 30, batch)
            assert rows is not None
            target += (30 / batch) * model.grad_sum(theta, part.X[rows], part.y[rows])
        msgs = [c.compute(theta, None, t).payload for c in computers]
        order = [w for w in range(n) if w not in stragglers]
        est = run_round(policy, msgs, order, 6, t)
        assert est.exact and relative_error(est.gradient, target) <= 1e-10, stragglers


def test_without_batches_every_row_counts() -> None:
    parts = _data(1)
    model = LogisticRegression(l2=0.0)
    full = Computer(model, parts, np.ones((1, 1))).compute(np.ones(6), None, 3).payload
    assert np.allclose(full, model.grad_sum(np.ones(6), parts[0].X, parts[0].y))


@pytest.mark.parametrize("batch", [-1, 1.5, True])
def test_a_bad_batch_size_is_refused_naming_it(batch: object) -> None:
    from codedgd.services.errors import ConfigError
    from codedgd.services.job import JobConfig

    with pytest.raises(ConfigError, match=r"job\.batch_size"):
        JobConfig(batch_size=batch)  # type: ignore[arg-type]


@pytest.mark.parametrize("n_rows", [2, 33, 1000, 30_000])
def test_the_linear_time_selection_takes_the_batch_smallest_hashes(n_rows: int) -> None:
    # The rule by a full stable sort, as the contract states it, on partitions of the
    # sizes real jobs have: the sampler's partial selection must agree round after round.
    for t in range(3):
        for b in (1, n_rows // 2, n_rows - 1):
            if b < 1:
                continue
            key = batch_key(5, t, 1)
            r = splitmix64(key ^ np.arange(n_rows, dtype=np.uint64))
            expected = np.sort(np.argsort(r, kind="stable")[:b])
            assert batch_rows(5, t, 1, n_rows, b).tolist() == expected.tolist()
