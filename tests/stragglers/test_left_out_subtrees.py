"""A subtree a codedreduce parent left out: kept whole by ``observe``, and replayed as
the slowest of its siblings, not as a random sample of its workers' other rounds."""

from __future__ import annotations

import numpy as np
import pytest

from codedgd.services.codes.tree import TreeShape
from codedgd.services.errors import ConfigError
from codedgd.services.job import Component, JobConfig
from codedgd.services.sim import CostModel, simulate
from codedgd.services.stragglers.fitted import (
    SUBTREE_DRAWS,
    SUBTREE_KEPT,
    DelayFit,
    Observations,
    ResampledDelay,
    observe,
)
from codedgd.services.tuning import redraw, source_tree

# 2 × (1 + 3): the coordinator's children 0 and 1; 0's are 2, 3, 4 and 1's 5, 6, 7.
TREE = TreeShape(fanout=3, levels=2, s=1, root=2)
FLAT = DelayFit("shifted-exponential", {"shift": 0.0, "rate": 100.0}, 0.0)


def test_a_left_out_subtree_came_after_every_worker_of_the_one_used() -> None:
    """With two children and s = 1 the coordinator sums one subtree a round: the other
    was ready after the latest own time in the one it used, which is its bound."""
    policy = Component("codedreduce", {"fanout": 3, "root": 2, "s": 1})
    job = JobConfig(
        workers=8,
        rounds=40,
        seed=5,
        policy=policy,
        data=Component("synthetic", {"rows": 400, "dim": 5}),
        stragglers=Component("exponential", {"mean": 0.02}),
    )
    records = simulate(job, CostModel()).records
    tree = source_tree(policy)
    assert tree == TREE
    obs = observe(records, 8, tree=tree)
    assert obs.left_out_after is not None
    for i, r in enumerate(records):
        ready = r.ready_seconds
        out = [h for h in (0, 1) if h not in ready]
        assert len(out) == 1, ready  # one level-1 subtree a round is done without
        [head] = out
        below = [head, *TREE.children(head)]
        assert np.isnan(obs.excess[i, below]).all()
        assert obs.left_out_after[i, head] == pytest.approx(max(ready.values()))
        # Only the heads of subtrees left out carry a bound (not leaves: censored).
        assert np.flatnonzero(np.isfinite(obs.left_out_after[i])).tolist() == [head]
    # Not given the tree (or a star's run): no bounds, as before.
    assert observe(records, 8).left_out_after is None
    assert source_tree(Component("uncoded", {})) is None
    with pytest.raises(ConfigError, match=r"the run's tree has 8 workers .* but the job 12"):
        observe(records, 12, tree=tree)


def _hand_built(bound: float) -> Observations:
    """Rows 0-39 observe everyone, subtree 1's delays exponential of mean 5 s; rows
    40-79 leave subtree 1 (workers 1, 5, 6, 7) out at ``bound``, worker 0's delay there
    7 s (the mark of such a row in a replay)."""
    rng = np.random.default_rng(11)
    excess = rng.exponential(0.01, size=(80, 8))
    excess[:40, [1, 5, 6, 7]] = rng.exponential(5.0, size=(40, 4))
    excess[40:, [1, 5, 6, 7]] = np.nan
    excess[40:, 0] = 7.0
    compute = np.where(np.isnan(excess), np.nan, 0.1)
    after = np.full((80, 8), np.nan)
    after[40:, 1] = bound
    censored = np.zeros((80, 8), dtype=bool)
    return Observations(excess, censored, compute, tree=TREE, left_out_after=after)


def _ready(row: np.ndarray) -> float:
    """Subtree 1's time to ready in a replayed row (compute 0.1 s each): its top
    worker once its own share and the faster two of its three children are."""
    kids = np.sort(row[[5, 6, 7]] + 0.1)
    return float(max(row[1] + 0.1, kids[1]))


def test_a_left_out_subtree_is_replayed_slower_than_the_subtree_its_parent_used() -> None:
    obs = _hand_built(bound=7.1)
    replay = ResampledDelay(obs, FLAT, seed=3)
    zero = np.zeros(8)
    filled, free = [], []
    for t in range(400):
        row = replay.delays(np.arange(8), t, zero, zero)
        (filled if row[0] == 7.0 else free).append(row)
    assert len(filled) > 100 and len(free) > 100
    # Every replayed row that left subtree 1 out has it ready after its bound, which
    # an unconditioned draw from its other rounds seldom is.
    assert all(_ready(row) >= 7.1 for row in filled)
    assert np.mean([_ready(row) >= 7.1 for row in free]) < 0.5
    # The redrawn source (tune --source-draws) keeps each round's bound with its row.
    drawn = redraw(obs, np.random.default_rng(0))
    assert drawn.left_out_after is not None
    rows_out = np.isnan(drawn.excess[:, 1])
    np.testing.assert_array_equal(np.isfinite(drawn.left_out_after[:, 1]), rows_out)


def test_a_bound_no_draw_reaches_keeps_the_latest_draws() -> None:
    obs = _hand_built(bound=1e6)
    replay = ResampledDelay(obs, FLAT, seed=3)
    [(workers, values, _)] = replay._subtree_fills()[40]
    assert workers.tolist() == [1, 5, 6, 7] and len(values) == SUBTREE_KEPT
    # The latest SUBTREE_KEPT of SUBTREE_DRAWS tries: each later than four in five of
    # the subtree's unconditioned draws (beyond chance: the lowest kept is the 241st
    # of 256).
    rng = np.random.default_rng(0)
    sample = obs.excess[rng.integers(0, 40, size=(20_000, 8))[:, [1, 5, 6, 7]], [1, 5, 6, 7]]
    rows = np.zeros((20_000, 8))
    rows[:, workers] = sample
    unconditioned = np.array([_ready(r) for r in rows])
    kept = []
    for v in values:
        row = np.zeros(8)
        row[workers] = v
        kept.append(_ready(row))
    assert min(kept) > np.percentile(unconditioned, 80)
    assert SUBTREE_DRAWS >= 10 * SUBTREE_KEPT
