"""CodedReduce placement: exact at the root for every straggler pattern of every group."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence

import numpy as np
import pytest

from codedgd.services.codes.cyclic import CyclicCode, CyclicRound
from codedgd.services.codes.tree import TreeShape, place

DIM = 5


def _code(shape: TreeShape, seed: int = 0) -> CyclicCode:
    return CyclicCode(shape.fanout, shape.s, rng=np.random.default_rng(seed))


def _codes(shape: TreeShape, seed: int = 0) -> dict[int, CyclicCode]:
    """The code each decoding node uses: B(m₀, s) at the root (−1), B(m, s) below."""
    rng = np.random.default_rng(seed)
    sibling = CyclicCode(shape.fanout, shape.s, rng=rng)
    root = sibling if shape.regular else CyclicCode(shape.root, shape.s, rng=rng)
    return {v: root if v == -1 else sibling for v in _inner(shape)}


def _own(
    shape: TreeShape, code: CyclicCode, grads: np.ndarray, root: CyclicCode | None = None
) -> list[np.ndarray]:
    """Each worker's own message Σ_p w_p·g_p from its placement."""
    return [
        sum((w * grads[p] for p, w in zip(pl.partitions, pl.weights, strict=True)), np.zeros(DIM))
        for pl in place(shape, code.B, None if root is None else root.B)
    ]


def _inner(shape: TreeShape) -> list[int]:
    """The nodes that decode a sibling group: the root (−1) and every non-leaf worker."""
    return [-1, *(w for w in range(shape.n_workers) if shape.children(w))]


def _patterns(shape: TreeShape, most: int = 4000) -> Iterator[dict[int, tuple[int, ...]]]:
    """Every choice, for every decoding node, of the m−s children it uses (in arrival
    order); past ``most`` patterns, a seeded random sample of ``most`` of them."""
    nodes = _inner(shape)
    used = {
        v: list(itertools.combinations(range(m), m - shape.s))
        for v in nodes
        for m in [len(shape.children(v))]
    }
    if math.prod(len(u) for u in used.values()) <= most:
        for choice in itertools.product(*(used[v] for v in nodes)):
            yield dict(zip(nodes, choice, strict=True))
        return
    rng = np.random.default_rng(7)
    for _ in range(most):
        yield {v: tuple(rng.permutation(used[v][rng.integers(len(used[v]))])) for v in nodes}


def _root(
    shape: TreeShape,
    codes: CyclicCode | dict[int, CyclicCode],
    own: Sequence[np.ndarray],
    used: dict[int, tuple[int, ...]],
) -> np.ndarray:
    """The root's result, each node decoding its children with CyclicRound as workers do
    (``codes``: one for every node, or each node's)."""

    def up(worker: int) -> np.ndarray:
        kids = shape.children(worker)
        if not kids:
            return own[worker]
        code = codes[worker] if isinstance(codes, dict) else codes
        decoding = CyclicRound(code, tol=1e-9)
        decoding.reset(DIM)
        for position in used[worker]:
            decoding.add(position, up(kids[position]))
        z, _ = decoding.combine()
        return z if worker == -1 else own[worker] + z

    return up(-1)


@pytest.mark.parametrize(
    ("m", "levels", "s"),
    [(3, 1, 1), (3, 2, 1), (4, 2, 1), (4, 2, 2), (5, 2, 2), (2, 3, 1), (3, 3, 1), (3, 2, 0)],
)
def test_root_gets_the_full_gradient_for_every_straggler_pattern(
    m: int, levels: int, s: int
) -> None:
    shape = TreeShape(m, levels, s)
    code = _code(shape)
    grads = np.random.default_rng(m * 100 + levels * 10 + s).standard_normal(
        (shape.n_partitions, DIM)
    )
    own = _own(shape, code, grads)
    full = grads.sum(axis=0)
    for used in _patterns(shape):  # all of them; (3, 3, 1) has 3^13: a random 4,000
        np.testing.assert_allclose(_root(shape, code, own, used), full, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize(
    ("root", "m", "levels", "s"),
    [(4, 3, 2, 1), (2, 3, 2, 1), (4, 2, 2, 1), (3, 2, 3, 1), (5, 4, 2, 2), (2, 5, 2, 1)],
)
def test_a_root_fanout_of_its_own_keeps_the_root_exact_for_every_straggler_pattern(
    root: int, m: int, levels: int, s: int
) -> None:
    """m₀ ≠ m: level 1 is one group of m₀ (the root's code B(m₀, s)), every other group
    m; every node still computes g^L base partitions, and every choice of m₀−s and m−s
    children decodes to the full gradient."""
    shape = TreeShape(m, levels, s, root=root)
    assert shape.n_workers == root * sum(m**d for d in range(levels))
    codes = _codes(shape)
    grads = np.random.default_rng(root * 1000 + m * 100 + levels * 10 + s).standard_normal(
        (shape.n_partitions, DIM)
    )
    placements = place(shape, codes[0].B if levels > 1 else codes[-1].B, codes[-1].B)
    assert {len(p.partitions) for p in placements} == {shape.share}
    own = _own(shape, codes[0] if levels > 1 else codes[-1], grads, codes[-1])
    full = grads.sum(axis=0)
    count = 0
    for used in _patterns(shape):  # all, (3, 2, 3, 1)'s 3·2⁹ = 1,536 too; (5, 4, 2, 2): 4,000
        np.testing.assert_allclose(_root(shape, codes, own, used), full, rtol=1e-9, atol=1e-9)
        count += 1
    assert count == min(4000, math.prod(math.comb(len(shape.children(v)), s) for v in codes))


def test_every_node_computes_the_same_share_and_the_shape_is_the_papers() -> None:
    shape = TreeShape(12, 2, 1)  # the authors' library: n = 12, L = 2, 156 workers
    assert shape.n_workers == 156
    placements = place(shape, _code(shape).B)
    assert {len(p.partitions) for p in placements} == {shape.share} == {4}
    # c = |D| / Σ (m/g)^l: in base partitions, k / (c per node) = Σ (m/g)^l
    assert shape.n_partitions / shape.share == pytest.approx(6 + 36)
    # Compute per node relative to ring's |D|/N: (n+1)(s+1)²/(n+s+1) = 13·4/14 ≈ 3.7.
    ratio = shape.share / shape.n_partitions * shape.n_workers
    assert ratio == pytest.approx(13 * 4 / 14)


def test_the_uncoded_tree_holds_each_partition_once_with_weight_one() -> None:
    shape = TreeShape(3, 2, 0)
    placements = place(shape, np.eye(3))
    held = sorted(p for pl in placements for p in pl.partitions)
    assert held == list(range(shape.n_partitions)) == list(range(shape.n_workers))
    assert all(w == 1.0 for pl in placements for w in pl.weights)


@pytest.mark.parametrize(
    ("m", "levels", "root"), [(3, 2, 0), (2, 3, 0), (4, 1, 0), (3, 2, 16), (2, 3, 5)]
)
def test_numbering_parents_children_and_positions_agree(m: int, levels: int, root: int) -> None:
    shape = TreeShape(m, levels, 0, root=root)
    assert shape.children(-1) == tuple(range(root or m))
    for worker in range(shape.n_workers):
        parent = shape.parent(worker)
        assert shape.children(parent)[shape.position(worker)] == worker
        assert shape.level(worker) == (1 if parent == -1 else shape.level(parent) + 1)
        assert bool(shape.children(worker)) == (shape.level(worker) < levels)
        # A subtree: the worker and everyone whose chain of parents reaches it, parents
        # before children.
        below = shape.subtree(worker)
        assert below[0] == worker and list(below) == sorted(below)
        for other in range(shape.n_workers):
            up = other
            while up not in (-1, worker):
                up = shape.parent(up)
            assert (other in below) == (up == worker)


def test_a_group_with_more_than_s_stragglers_cannot_decode() -> None:
    """With s+1 children missing, the residual check refuses: never a silent wrong sum."""
    shape = TreeShape(3, 1, 1)
    code = _code(shape)
    decoding = CyclicRound(code, tol=1e-6)
    decoding.reset(DIM)
    decoding.add(0, np.ones(DIM))
    assert not decoding.feasible(0)
    with pytest.raises(Exception, match="of the 2 messages needed"):
        decoding.combine()


def test_shapes_that_cannot_exist_are_refused() -> None:
    with pytest.raises(ValueError, match="0 <= s < fanout"):
        TreeShape(3, 2, 3)
    with pytest.raises(ValueError, match="fanout >= 1"):
        TreeShape(0, 2, 0)


def test_a_left_out_leaf_is_bounded_by_the_siblings_its_parent_used_and_no_inner_node_is() -> None:
    """Workers 0-2 (level 1), 3-5 below 0, 6-8 below 1, 9-11 below 2. The root used 0 and
    1, worker 0 used 3 and 4, worker 1 used 6 and 8: leaves 5 and 7 are bounded by their
    used siblings' longest own time; inner node 2 (left out by the root) is not, nor
    are its leaves 9-11 (no used parent decided about them)."""
    shape = TreeShape(3, 2, 1)
    used = {0, 1, 3, 4, 6, 8}
    ready = {0: 0.1, 1: 0.2, 3: 0.3, 4: 0.5, 6: 0.25, 8: 0.125}
    assert shape.left_out_bounds(ready, used) == {5: 0.5, 7: 0.25}
    # One level: the leaves are level 1, and the root's own decision bounds them.
    flat = TreeShape(3, 1, 1)
    assert flat.left_out_bounds({0: 0.5, 2: 0.25}, {0, 2}) == {1: 0.5}
    # Everyone used (a tree with s = 0): nothing to bound.
    assert shape.left_out_bounds(dict.fromkeys(range(12), 0.5), set(range(12))) == {}
