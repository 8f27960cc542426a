"""Workers a run did without. A subtree a codedreduce parent left out: kept whole by
``observe``, and replayed as the slowest of its siblings, not as a random sample of its
workers' other rounds. A worker done without for longer than chance gives: named."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from codedgd.services.codes.tree import TreeShape
from codedgd.services.errors import ConfigError
from codedgd.services.job import Component, JobConfig
from codedgd.services.records import RoundRecord
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


def _run_on_tree() -> tuple[Component, list[RoundRecord]]:
    """40 rounds of codedreduce on TREE (s = 1), exponential delays: its policy and
    records."""
    policy = Component("codedreduce", {"fanout": 3, "root": 2, "s": 1})
    job = JobConfig(
        workers=8,
        rounds=40,
        seed=5,
        policy=policy,
        data=Component("synthetic", {"rows": 400, "dim": 5}),
        stragglers=Component("exponential", {"mean": 0.02}),
    )
    return policy, list(simulate(job, CostModel()).records)


def test_a_left_out_subtree_came_after_every_worker_of_the_one_used() -> None:
    """With two children and s = 1 the coordinator sums one subtree a round: the other
    was ready after the latest own time in the one it used, which is its bound."""
    policy, records = _run_on_tree()
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
    # A subtree that lost a worker was not left out for being slow: no bound.
    first = records[0]
    [head] = [h for h in (0, 1) if h not in first.ready_seconds]
    lost = dataclasses.replace(first, excluded={TREE.children(head)[0]: "lost: stream closed"})
    again = observe([lost, *records[1:]], 8, tree=tree)
    assert again.left_out_after is not None and np.isnan(again.left_out_after[0]).all()
    assert np.isfinite(again.left_out_after[1:]).sum() == len(records) - 1
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


def _done_without(shape: TreeShape, rounds: int, rng: np.random.Generator) -> Observations:
    """A codedreduce run of equal workers: every parent uses m − s of its children at
    random (the root m₀ − s); the rest of each group is left out (a leaf censored, an
    inner node's subtree not observed)."""
    n = shape.n_workers
    excess = rng.exponential(0.01, size=(rounds, n))
    censored = np.zeros((rounds, n), dtype=bool)
    for i in range(rounds):
        groups, used = [shape.children(-1)], set()
        while groups:
            kids = groups.pop()
            if not kids:
                continue
            keep = len(kids) - shape.s
            chosen = rng.choice(len(kids), size=keep, replace=False)
            for j, c in enumerate(kids):
                if j in chosen:
                    used.add(c)
                    groups.append(shape.children(c))
                elif shape.children(c):
                    excess[i, list(shape.subtree(c))] = np.nan
                else:
                    censored[i, c] = True
    compute = np.where(np.isnan(excess) | censored, np.nan, 0.1)
    return Observations(excess, censored, compute, tree=shape)


def test_stretches_count_rounds_done_without_and_skip_rounds_not_asked() -> None:
    excess = np.array([[0.1, 0.1], [np.nan, 0.1], [0.2, 0.1], [0.3, np.nan], [0.1, 0.1]])
    censored = np.array([[1, 0], [0, 0], [1, 0], [1, 0], [0, 0]], dtype=bool)
    star = Observations(excess, censored, np.full(excess.shape, 0.1))
    # A star's round not asked (NaN) neither counts nor breaks a stretch: worker 0 was
    # cancelled in rounds 0, 2 and 3, not asked in 1.
    assert star.unanswered_stretch().tolist() == [3, 0]
    # In a tree a worker not observed was in a subtree left out: it counts.
    tree = Observations(excess, censored, excess * 0, tree=TreeShape(2, 1, 1))
    assert tree.unanswered_stretch().tolist() == [4, 1]


def test_rounds_a_worker_was_lost_are_not_rounds_it_was_done_without() -> None:
    """A worker lost (its stream closed, its machine gone) is not timed, in a tree as if
    left out; those rounds say nothing of its speed, nor of the workers below it, whose
    messages went through it: they neither count toward a stretch nor break one."""
    _, records = _run_on_tree()

    def lose(r: RoundRecord, worker: int) -> RoundRecord:
        gone = set(TREE.subtree(worker))
        return dataclasses.replace(
            r,
            ready_seconds={w: s for w, s in r.ready_seconds.items() if w not in gone},
            left_out_seconds={w: s for w, s in r.left_out_seconds.items() if w not in gone},
            workers_used=tuple(w for w in r.workers_used if w not in gone),
            excluded={worker: "lost: stream closed"},
        )

    # Leaf 5 lost from round 10 on.
    lossy = [lose(r, 5) if r.round >= 10 else r for r in records]
    obs = observe(lossy, 8, tree=TREE)
    assert obs.lost is not None
    assert obs.lost[10:, 5].all() and not obs.lost[:10, 5].any()
    assert not np.delete(obs.lost, 5, axis=1).any()
    # Its stretch is that of the rounds it was not lost in; the others' are unchanged.
    stretch = obs.unanswered_stretch()
    assert stretch[5] == observe(records[:10], 8, tree=TREE).unanswered_stretch()[5]
    assert (
        np.delete(stretch, 5).tolist()
        == np.delete(observe(records, 8, tree=TREE).unanswered_stretch(), 5).tolist()
    )
    # Counted as done without (the version before), its 30 rounds lost would be beyond
    # chance (22 rounds for a leaf here) and it would be named; it is not.
    assert stretch[5] <= 10 and obs.chance_stretch()[5] == 22
    assert not (stretch >= obs.chance_stretch()).any()
    # A level-1 worker lost in a round its parent did without it: everyone below it
    # too (their messages went through it), not those timed.
    out = [i for i, r in enumerate(records) if 1 not in r.ready_seconds]
    headless = [
        dataclasses.replace(r, excluded={1: "lost: stream closed"}) if i in out else r
        for i, r in enumerate(records)
    ]
    marked = observe(headless, 8, tree=TREE).lost
    assert marked is not None
    assert marked[out][:, [1, 5, 6, 7]].all() and not marked[out][:, [0, 2, 3, 4]].any()
    assert not np.delete(marked, out, axis=0).any()
    before = observe(records, 8, tree=TREE).unanswered_stretch()
    after = observe(headless, 8, tree=TREE).unanswered_stretch()
    # Worker 1 was done without only when lost; its leaves still when 1 left them out.
    assert after[1] == 0 < before[1]
    assert (after[[5, 6, 7]] <= before[[5, 6, 7]]).all()
    assert (after[[0, 2, 3, 4]] == before[[0, 2, 3, 4]]).all()
    # The rows resampled keep it.
    assert obs.rows_at(np.arange(10, 20)).lost is not None
    assert obs.rows_at(np.arange(10, 20)).unanswered_stretch()[5] == 0


def test_equal_workers_are_seldom_said_to_be_done_without_beyond_chance() -> None:
    """The limit is set so that in 19 runs of 20 no equal worker goes beyond it."""
    shape = TreeShape(fanout=3, levels=2, s=1, root=4)  # 4 × (1 + 3)
    rng = np.random.default_rng(2)
    first = _done_without(shape, 100, rng)
    # A leaf is done without in half the rounds (15 in a row is beyond chance in 100),
    # a level-1 worker in a quarter (the floor, 10).
    assert first.chance_stretch().tolist() == [10] * 4 + [15] * 12
    flagged = [
        bool((o.unanswered_stretch() >= o.chance_stretch()).any())
        for o in [first, *(_done_without(shape, 100, rng) for _ in range(99))]
    ]
    assert sum(flagged) <= 10  # 5 expected at most
    # A leaf slow for 30 rounds, left out by its parent in each: named.
    slow = _done_without(shape, 100, rng)
    slow.censored[40:70, 9] = ~np.isnan(slow.excess[40:70, 9])
    named = np.flatnonzero(slow.unanswered_stretch() >= slow.chance_stretch())
    assert 9 in named.tolist()
