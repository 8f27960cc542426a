"""ring-allreduce, tree and codedreduce as the coordinator runs them: what reaches it
decodes to the full gradient; shapes that cannot fit the pool are refused, naming why."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from codedgd.services.codes.cyclic import CyclicCode, CyclicRound
from codedgd.services.codes.encoding import encode
from codedgd.services.compute.ring import reduced_segments
from codedgd.services.errors import PlanError
from codedgd.services.policies import Plan, create
from codedgd.services.policies.tree import CodedReduce
from tests.policies.support import planned, relative_error

DIM = 9


def _own(plan: Plan, grads: np.ndarray) -> list[np.ndarray]:
    return [encode(grads[list(wp.partitions)], wp.coefficients) for wp in plan.workers]


@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_ring_segments_decode_to_the_sum_whatever_their_order(n: int) -> None:
    policy, plan = planned("ring-allreduce", n)
    assert plan.topology.kind == "ring" and plan.reporters() == tuple(range(n))
    grads = np.random.default_rng(n).standard_normal((n, DIM))
    uploads = reduced_segments(_own(plan, grads))
    assert [u.shape[0] for u in uploads] == [plan.payload_length(w, DIM) for w in range(n)]
    for order in (range(n), reversed(range(n))):
        policy.begin_round(0, np.zeros(DIM))
        done = [policy.offer(w, uploads[w]) for w in order]
        assert done == [False] * (n - 1) + [True]
        assert relative_error(policy.decode().gradient, grads.sum(axis=0)) < 1e-14
    policy.begin_round(1, np.zeros(DIM))
    policy.offer(0, uploads[0])
    assert not policy.feasible(frozenset(range(2, n)))  # a lost worker: no segment of its


def _tree_round(
    policy: CodedReduce, plan: Plan, own: list[np.ndarray], used: dict[int, tuple[int, ...]]
) -> np.ndarray:
    """Inner nodes decode their children with CyclicRound (as workers do); the policy is the
    root, offered its level-1 workers in the order ``used[-1]``."""
    tree, code = plan.topology.tree, plan.topology.code
    assert tree is not None and code is not None
    sibling = CyclicCode(tree.fanout, tree.s)
    sibling.B = code  # the plan's code, as the workers receive it

    def up(worker: int) -> np.ndarray:
        kids = tree.children(worker)
        if not kids:
            return own[worker]
        decoding = CyclicRound(sibling, plan.topology.tol)
        decoding.reset(DIM)
        for position in used[worker]:
            decoding.add(position, up(kids[position]))
        z, _ = decoding.combine()
        return own[worker] + z

    spec = policy.begin_round(0, np.zeros(DIM))
    assert spec.workers == plan.reporters() == tree.children(-1)
    for position in used[-1]:
        if policy.offer(position, up(position)):
            return policy.decode().gradient
    raise AssertionError("the root never decoded")


def test_codedreduce_at_m3_l2_s1_is_exact_for_every_straggler_pattern() -> None:
    policy, plan = planned("codedreduce", 12, {"fanout": 3, "levels": 2, "s": 1}, seed=4)
    assert isinstance(policy, CodedReduce)
    assert plan.n_partitions == 15 and plan.topology.kind == "tree"
    grads = np.random.default_rng(1).standard_normal((15, DIM))
    own = _own(plan, grads)
    orders = [p for c in itertools.combinations(range(3), 2) for p in itertools.permutations(c)]
    nodes = [-1, 0, 1, 2]
    for choice in itertools.product(orders, repeat=len(nodes)):  # 6^4 = 1296 patterns
        got = _tree_round(policy, plan, own, dict(zip(nodes, choice, strict=True)))
        assert relative_error(got, grads.sum(axis=0)) < 1e-12


def test_codedreduce_with_a_root_fanout_of_its_own_is_exact_for_every_straggler_pattern() -> None:
    """16 workers as 4 × (1 + 3): the coordinator decodes its 4 children with B(4, 1),
    each of them its 3 with B(3, 1); every order of every 3 of 4 at the root and of every
    2 of 3 below (24 · 6⁴ = 31,104 patterns, a seeded 3,000 of them)."""
    policy, plan = planned("codedreduce", 16, {"fanout": 3, "levels": 2, "root": 4}, seed=4)
    assert isinstance(policy, CodedReduce)
    tree = plan.topology.tree
    assert tree is not None and plan.topology.code is not None
    assert policy.code is not None and policy.code.B.shape == (4, 4)
    assert plan.topology.code.shape == (3, 3)  # what level-1 workers get to decode with
    assert plan.n_partitions == tree.n_partitions == 4 * (2 + 3) and tree.n_workers == 16
    grads = np.random.default_rng(3).standard_normal((plan.n_partitions, DIM))
    own = _own(plan, grads)
    top = [p for c in itertools.combinations(range(4), 3) for p in itertools.permutations(c)]
    below = [p for c in itertools.combinations(range(3), 2) for p in itertools.permutations(c)]
    rng = np.random.default_rng(11)
    for _ in range(3000):
        used = {-1: top[rng.integers(len(top))]}
        used |= {w: below[rng.integers(len(below))] for w in range(4)}
        got = _tree_round(policy, plan, own, used)
        assert relative_error(got, grads.sum(axis=0)) < 1e-12


def test_the_uncoded_tree_waits_for_every_child_and_sums() -> None:
    policy, plan = planned("tree", 12, {"fanout": 3, "levels": 2})
    assert plan.n_partitions == 12 and np.array_equal(plan.topology.code, np.eye(3))
    grads = np.random.default_rng(2).standard_normal((12, DIM))
    got = _tree_round(policy, plan, _own(plan, grads), dict.fromkeys([-1, 0, 1, 2], (2, 0, 1)))
    assert relative_error(got, grads.sum(axis=0)) < 1e-14


@pytest.mark.parametrize(
    ("name", "n", "params", "match"),
    [
        ("codedreduce", 8, {}, r"needs exactly 12 workers \(3 \+ 9\); got n = 8: use -n 12"),
        ("codedreduce", 12, {"s": 3}, r"0 <= s < fanout; got s=3, fanout=3"),
        ("tree", 6, {"fanout": 2, "levels": 1}, r"needs exactly 2 workers"),
        ("codedreduce", 12, {"fanout": 1}, r"fanout >= 2"),
        (
            "codedreduce",
            16,
            {},
            r"got n = 16: use -n 12, or one that fits 16 workers: fanout=3 levels=2 root=4, "
            r"fanout=7 levels=2 root=2$",
        ),
        ("tree", 7, {}, r"no tree of two or more levels has 7 workers"),
        (
            "codedreduce",
            8,
            {"fanout": 3, "s": 2},
            r"got n = 8: use -n 12, or choose fanout and levels for your pool \(no tree of "
            r"two or more levels has 8 workers and groups of more than s=2\)",
        ),
        ("codedreduce", 14, {}, r"fanout=6 levels=2 root=2, fanout=2 levels=3$"),
        ("codedreduce", 12, {"root": 1}, r"root >= 2 \(or 0: as many as fanout\), got root=1"),
        ("tree", 4, {"fanout": 2, "levels": 1, "root": 4}, r"give their number as fanout"),
        (
            "codedreduce",
            8,
            {"fanout": 3, "root": 2, "s": 2},
            r"s < root \(the coordinator's children\); got s=2, root=2: choose s in 0..1",
        ),
        (
            "codedreduce",
            60,
            {"fanout": 3, "root": 16},
            r"fanout 3, root 16 and 2 level\(s\) needs exactly 64 workers \(16 \+ 48\); got n = 60",
        ),
    ],
)
def test_a_tree_that_does_not_fit_the_pool_is_refused(
    name: str, n: int, params: dict[str, int], match: str
) -> None:
    with pytest.raises(PlanError, match=match):
        policy = create(name, params)
        policy.plan(n, policy.default_partitions(n))


def test_partitions_are_the_trees_own() -> None:
    policy = create("codedreduce", {})
    with pytest.raises(PlanError, match=r"places 15 partitions itself \(got k = 12\)"):
        policy.plan(12, 12)
    with pytest.raises(PlanError, match=r"k = n = 4"):
        create("ring-allreduce", {}).plan(4, 8)
