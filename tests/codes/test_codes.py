"""The coding math alone (codedgd.services.codes), without policies."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from codedgd.services.codes import (
    CyclicCode,
    GroupMDSCode,
    PolynomialCode,
    block_condition,
    covered,
    cyclic_matrix,
    divisors,
    early_stop_count,
    encode,
    erasure_probability,
    frc_groups,
    frc_matrix,
    gaussian_h,
    make_h,
    orthonormal_h,
    unbiased_scale,
)


def test_divisors_and_groups() -> None:
    assert divisors(30) == [1, 2, 3, 5, 6, 10, 15, 30]
    assert divisors(1) == [1]
    assert frc_groups(6, 3) == ((0, 1, 2), (3, 4, 5))
    with pytest.raises(ValueError, match="does not divide"):
        frc_groups(6, 4)
    B = frc_matrix(6, 2)
    assert B.sum(axis=1).tolist() == [2.0] * 6 and B[2, 3] == 1 and B[2, 4] == 0
    assert covered([0, 5], 6, 2).tolist() == [True, False, True]


@pytest.mark.parametrize("kind", ["orthonormal", "gaussian"])
def test_h_annihilates_ones_and_b_lies_in_its_null_space(kind: str) -> None:
    n, s = 11, 3
    code = CyclicCode(n, s, h=kind, rng=np.random.default_rng(4))
    np.testing.assert_allclose(code.H @ np.ones(n), 0, atol=1e-12)
    np.testing.assert_allclose(code.H @ code.B.T, 0, atol=1e-10)
    for i in range(n):  # support exactly S_i, diagonal 1
        outside = [j for j in range(n) if j not in code.support(i)]
        assert np.all(code.B[i, outside] == 0) and code.B[i, i] == 1
        assert np.all(code.B[i, list(code.support(i))] != 0)
    if kind == "orthonormal":
        np.testing.assert_allclose(code.H @ code.H.T, np.eye(s), atol=1e-12)


def test_orthonormal_h_keeps_the_best_conditioned_of_its_draws() -> None:
    n, s, draws = 20, 3, 5
    picked = make_h("orthonormal", n, s, np.random.default_rng(9), draws)
    rng = np.random.default_rng(9)
    candidates = [orthonormal_h(n, s, rng) for _ in range(draws)]
    scores = [block_condition(H) for H in candidates]
    assert np.array_equal(picked, candidates[int(np.argmin(scores))])
    assert block_condition(picked) <= min(scores)
    # The paper's H is one draw, kept as is.
    assert np.array_equal(
        make_h("gaussian", n, s, np.random.default_rng(9)),
        gaussian_h(n, s, np.random.default_rng(9)),
    )


def test_cyclic_matrix_with_no_straggler_is_identity() -> None:
    assert np.array_equal(cyclic_matrix(np.zeros((0, 5))), np.eye(5))


@pytest.mark.parametrize("kind", ["orthonormal", "gaussian"])
def test_cyclic_decoding_vector_for_every_survivor_set(kind: str) -> None:
    n, s = 10, 3
    code = CyclicCode(n, s, h=kind, rng=np.random.default_rng(1))
    for F in itertools.combinations(range(n), n - s):
        vec = code.decoding_vector(F)
        assert vec.workers == F
        assert vec.residual < 1e-10
        np.testing.assert_allclose(vec.a @ code.B[list(F)], np.ones(n), atol=1e-10)
        assert 1.0 <= vec.condition < 1e8
    assert len(code.cache) == math.comb(n, n - s)
    # Cached by the set, whatever the arrival order; weights follow the order given.
    order = [9, 2, 5, 0, 7, 3, 4]
    misses = code.cache.misses
    a, vec = code.weights(order)
    assert code.cache.misses == misses
    np.testing.assert_allclose(a @ code.B[order], np.ones(n), atol=1e-10)
    assert not vec.a.flags.writeable


def test_erasurehead_closed_forms() -> None:
    assert early_stop_count(30, 0.5) == 15
    assert early_stop_count(30, 0.1) == 3  # not 4 from 0.1*30 = 3.0000000000000004
    assert early_stop_count(30, 1.0) == 30 and early_stop_count(4, 0.01) == 1
    p = erasure_probability(30, 2, 15)
    assert math.isclose(p, 15 * 14 / (30 * 29))
    assert round(p, 4) == 0.2414 and round(unbiased_scale(30, 2, 15), 3) == 1.318
    assert erasure_probability(30, 4, 27) == 0.0  # K > n−r: every group is hit
    assert erasure_probability(6, 2, 0) == 1.0


def test_group_mds_encoding_and_every_decode() -> None:
    n, d, m = 8, 4, 2
    code = GroupMDSCode(n, d, m, rng=np.random.default_rng(0))
    assert code.stragglers_per_group == 2 and code.n_groups == 2
    C = code.coefficients(5)  # position 1 of group 1
    assert C.shape == (d, m) and np.all(code.generator[:, 1] == C)
    assert code.partitions(5) == (4, 5, 6, 7)
    rng = np.random.default_rng(1)
    dim = 11  # padded to 12 = 2·6
    grads = rng.standard_normal((n, dim))
    msgs = [encode(grads[list(code.partitions(w))], code.coefficients(w)) for w in range(n)]
    assert all(msg.shape == (6,) for msg in msgs)
    target = grads.sum(axis=0)
    for R0, R1 in itertools.product(itertools.combinations(range(4), m), repeat=2):
        arrivals = [(w, msgs[w]) for w in [*R0, *(4 + t for t in R1)]]
        np.testing.assert_allclose(code.decode(arrivals, dim), target, rtol=1e-10, atol=1e-10)
        assert code.solve(list(R0)).residual < 1e-12
    assert code.worst_condition() >= code.condition([0, 1]) >= 1.0
    with pytest.raises(ValueError, match="1 of 2 arrivals"):
        code.decode([(0, msgs[0]), (4, msgs[4]), (5, msgs[5])], dim)


def test_group_mds_with_one_chunk_is_fractional_repetition() -> None:
    code = GroupMDSCode(6, 3, 1, generator=np.ones((1, 3)))
    assert all(np.array_equal(code.coefficients(w), np.ones((3, 1))) for w in range(6))


def test_polynomial_encoding_uses_only_held_partitions() -> None:
    code = PolynomialCode(9, 2, 2)
    assert code.d == 4 and code.need == 7 and code.tolerates == 2
    for i in range(9):
        held = set(code.support(i))
        for j in range(9):
            nonzero = np.any(code.encoding[i, j] != 0)
            assert nonzero == (j in held)
    assert len(set(code.alpha.tolist()) | set(code.beta.tolist())) == 11  # distinct points


@pytest.mark.parametrize("points", ["interleaved", "ordered"])
def test_polynomial_decodes_from_every_survivor_set(points: str) -> None:
    n, s, m = 10, 2, 3
    code = PolynomialCode(n, s, m, points=points)
    dim = 20
    grads = np.random.default_rng(0).standard_normal((n, dim))
    msgs = np.stack([encode(grads[list(code.support(w))], code.coefficients(w)) for w in range(n)])
    target = grads.sum(axis=0)
    for F in itertools.combinations(range(n), n - s):
        W, dec = code.weights(list(F))
        out = (W @ msgs[list(F)]).reshape(-1)[:dim]
        np.testing.assert_allclose(out, target, rtol=1e-9, atol=1e-9 * np.abs(target).max())
        assert dec.residual < 1e-9 and dec.condition >= 1.0


def test_interleaved_points_keep_coefficients_small() -> None:
    inter = PolynomialCode(30, 3, 2, points="interleaved")
    ordered = PolynomialCode(30, 3, 2, points="ordered")
    assert np.abs(inter.encoding).max() < 1e3 < 1e6 < np.abs(ordered.encoding).max()


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((5, 1, 0), "m >= 1"),
        ((5, 2, 2, 3), "s\\+m <= d <= n"),
        ((5, 3, 3), "s\\+m <= d <= n"),
    ],
)
def test_polynomial_code_rejects_impossible_parameters(args: tuple[int, ...], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        PolynomialCode(*args)
