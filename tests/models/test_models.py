"""Gradient oracles: gradients, stability, AUC, smoothness, registry errors."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import scipy.sparse as sp

from codedgd.services.data.dataset import Matrix
from codedgd.services.errors import ConfigError, DataError
from codedgd.services.models import (
    MODELS,
    LeastSquares,
    LogisticRegression,
    create_model,
    objective,
    objective_smoothness,
    roc_auc,
)
from codedgd.services.models.base import Model
from codedgd.services.models.least_squares import gram_lambda_max


def _data(
    seed: int, n: int = 40, d: int = 12, density: float = 0.3
) -> tuple[np.ndarray, sp.csr_matrix]:
    rng = np.random.default_rng(seed)
    dense = rng.standard_normal((n, d)) * (rng.random((n, d)) < density)
    return dense, sp.csr_matrix(dense)


def _finite_difference(model: Model, theta: np.ndarray, X: Matrix, y: np.ndarray) -> np.ndarray:
    h = 1e-6
    grad = np.empty_like(theta)
    for j in range(theta.size):
        e = np.zeros_like(theta)
        e[j] = h
        grad[j] = (model.loss_sum(theta + e, X, y) - model.loss_sum(theta - e, X, y)) / (2 * h)
    return grad


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "csr"])
@pytest.mark.parametrize("model_name", ["logistic", "least-squares"])
def test_gradient_matches_central_differences(model_name: str, sparse: bool) -> None:
    dense, csr = _data(1)
    X: Matrix = csr if sparse else dense
    rng = np.random.default_rng(2)
    theta = rng.standard_normal(dense.shape[1])
    y = (rng.random(dense.shape[0]) < 0.5).astype(np.float64)
    if model_name == "least-squares":
        y = rng.standard_normal(dense.shape[0])
    model = create_model(model_name, {})
    grad = model.grad_sum(theta, X, y)
    assert grad.dtype == np.float64 and grad.shape == theta.shape
    np.testing.assert_allclose(grad, _finite_difference(model, theta, X, y), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("model_name", ["logistic", "least-squares"])
def test_dense_and_csr_agree(model_name: str) -> None:
    dense, csr = _data(3)
    rng = np.random.default_rng(4)
    theta = rng.standard_normal(dense.shape[1])
    y = (rng.random(dense.shape[0]) < 0.5).astype(np.float64)
    model = create_model(model_name, {})
    np.testing.assert_allclose(model.grad_sum(theta, csr, y), model.grad_sum(theta, dense, y))
    assert model.loss_sum(theta, csr, y) == pytest.approx(model.loss_sum(theta, dense, y))
    assert model.metric(theta, csr, y) == pytest.approx(model.metric(theta, dense, y))


def test_partition_sums_add_up() -> None:
    """Sums over row blocks add to the full sum: what gradient codes rely on."""
    dense, csr = _data(5, n=60)
    rng = np.random.default_rng(6)
    theta = rng.standard_normal(dense.shape[1])
    y = (rng.random(60) < 0.5).astype(np.float64)
    model = LogisticRegression()
    parts = [np.arange(0, 25), np.arange(25, 60)]
    total = sum(model.grad_sum(theta, csr[p], y[p]) for p in parts)
    np.testing.assert_allclose(total, model.grad_sum(theta, csr, y))


def test_logistic_loss_is_stable_for_huge_margins() -> None:
    X = np.array([[1.0], [1.0], [-1.0], [-1.0]])
    y = np.array([1.0, 0.0, 1.0, 0.0])
    model = LogisticRegression()
    theta = np.array([1e4])
    # margins ±1e4: the right-classified rows cost ~0, the wrong ones 1e4 each.
    assert model.loss_sum(theta, X, y) == pytest.approx(2e4)
    grad = model.grad_sum(theta, X, y)
    assert np.all(np.isfinite(grad))
    np.testing.assert_allclose(grad, [2.0])  # (σ−y)x: (0)(1)+(1)(1)+(0−1)(−1)+(0)(−1)
    assert model.loss_sum(np.array([800.0]), X[:1], y[:1]) == 0.0
    assert np.isfinite(model.loss_sum(np.array([-800.0]), X[:1], y[:1]))


def test_logistic_loss_value() -> None:
    X = np.array([[0.5, -1.0], [2.0, 0.0]])
    y = np.array([1.0, 0.0])
    theta = np.array([1.0, 2.0])
    z = X @ theta
    expected = np.log1p(np.exp(-z[0])) + np.log1p(np.exp(z[1]))
    assert LogisticRegression().loss_sum(theta, X, y) == pytest.approx(expected)


def _auc_pairwise(scores: np.ndarray, labels: np.ndarray) -> float:
    pos = scores[labels == 1]
    neg = scores[labels == 0]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p, n in itertools.product(pos, neg))
    return wins / (len(pos) * len(neg))


@pytest.mark.parametrize("seed", range(5))
def test_auc_matches_pairwise_count_with_ties(seed: int) -> None:
    rng = np.random.default_rng(seed)
    scores = rng.integers(0, 6, size=50).astype(np.float64)  # many ties
    labels = (rng.random(50) < 0.4).astype(np.float64)
    assert roc_auc(scores, labels) == pytest.approx(_auc_pairwise(scores, labels), abs=1e-12)


def test_auc_edge_cases() -> None:
    assert roc_auc(np.array([1.0, 2.0, 3.0]), np.array([0.0, 1.0, 1.0])) == 1.0
    assert roc_auc(np.array([3.0, 2.0, 1.0]), np.array([0.0, 1.0, 1.0])) == 0.0
    assert roc_auc(np.full(4, 7.0), np.array([0.0, 1.0, 0.0, 1.0])) == 0.5
    # saturated (infinite) scores still tie with each other
    inf = np.inf
    assert roc_auc(np.array([inf, inf, -inf]), np.array([1.0, 0.0, 0.0])) == 0.75
    assert np.isnan(roc_auc(np.array([1.0, 2.0]), np.array([1.0, 1.0])))
    assert np.isnan(roc_auc(np.array([np.nan, 2.0]), np.array([0.0, 1.0])))


def test_metrics() -> None:
    X = np.array([[1.0], [2.0], [3.0]])
    theta = np.array([1.0])
    ls = LeastSquares()
    assert ls.metric(theta, X, np.array([1.0, 2.0, 5.0])) == pytest.approx(4.0 / 3.0)
    assert ls.loss_sum(theta, X, np.array([1.0, 2.0, 5.0])) == pytest.approx(2.0)
    assert not ls.higher_is_better and ls.metric_name == "mse"
    lr = LogisticRegression()
    assert lr.metric(theta, X, np.array([0.0, 1.0, 1.0])) == 1.0
    assert lr.higher_is_better and lr.metric_name == "auc"


@pytest.mark.parametrize("shape", [(30, 8), (8, 30), (600, 40), (40, 700)])
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "csr"])
def test_smoothness_bounds_the_largest_eigenvalue(shape: tuple[int, int], sparse: bool) -> None:
    dense, csr = _data(7, n=shape[0], d=shape[1], density=0.2)
    X: Matrix = csr if sparse else dense
    true = float(np.linalg.eigvalsh(dense.T @ dense)[-1])
    lam = gram_lambda_max(X)
    assert lam >= true * (1 - 1e-9)
    assert lam <= true * (1 + 1e-6)
    assert LeastSquares().smoothness(X) == pytest.approx(lam)
    assert LogisticRegression().smoothness(X) == pytest.approx(0.25 * lam)


def test_smoothness_uses_lanczos_path_on_larger_sparse_data() -> None:
    # min(n, d) > 512 forces the Lanczos branch.
    rng = np.random.default_rng(8)
    X = sp.random(700, 900, density=0.01, format="csr", random_state=rng)
    true = float(np.linalg.eigvalsh((X.T @ X).toarray())[-1])
    lam = gram_lambda_max(X)
    assert true * (1 - 1e-9) <= lam <= true * (1 + 1e-6)


def test_objective_adds_l2_and_averages() -> None:
    dense, _ = _data(9)
    rng = np.random.default_rng(10)
    theta = rng.standard_normal(dense.shape[1])
    y = (rng.random(dense.shape[0]) < 0.5).astype(np.float64)
    model = create_model("logistic", {"l2": "0.5"})
    assert model.l2 == 0.5
    expected = LogisticRegression().loss_sum(theta, dense, y) / dense.shape[0]
    expected += 0.25 * float(theta @ theta)
    assert objective(model, theta, dense, y) == pytest.approx(expected)
    expected_L = model.smoothness(dense) / dense.shape[0] + 0.5
    assert objective_smoothness(model, dense) == pytest.approx(expected_L)


def test_registry_and_errors() -> None:
    assert set(MODELS) == {"logistic", "least-squares", "mlp", "cnn"}
    assert isinstance(create_model("least-squares", {"l2": 0}), LeastSquares)
    with pytest.raises(ConfigError, match="least-squares"):
        create_model("least_squares", {})
    with pytest.raises(ConfigError, match="l2"):
        create_model("logistic", {"lambda": 1.0})
    for bad in (-1.0, "abc", float("nan"), True, None):
        with pytest.raises(ConfigError, match="l2"):
            create_model("logistic", {"l2": bad})


def test_bad_labels_and_shapes_are_clear_errors() -> None:
    X = np.ones((3, 2))
    model = LogisticRegression()
    with pytest.raises(DataError, match="0, 1"):
        model.grad_sum(np.zeros(2), X, np.array([1.0, -1.0, 1.0]))
    with pytest.raises(DataError, match="features"):
        model.grad_sum(np.zeros(3), X, np.array([1.0, 0.0, 1.0]))
    with pytest.raises(DataError, match="rows"):
        LeastSquares().grad_sum(np.zeros(2), X, np.zeros(4))


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "csr"])
@pytest.mark.parametrize("model_name", ["logistic", "least-squares"])
def test_a_bound_block_gives_grad_sum_for_every_theta(model_name: str, sparse: bool) -> None:
    """A worker binds its partition once and reuses it: each θ gives the one-shot gradient."""
    dense, csr = _data(5, n=30, d=9)
    X: Matrix = csr if sparse else dense
    rng = np.random.default_rng(6)
    y = (rng.random(30) < 0.5).astype(np.float64)
    model = create_model(model_name, {})
    block = model.block(X, y)
    assert block.dim == 9
    for _ in range(3):
        theta = rng.standard_normal(9)
        got = block.grad_sum(theta)
        assert got.dtype == np.float64 and got.shape == (9,)
        np.testing.assert_array_equal(got, model.grad_sum(theta, X, y))
        # Its result is the caller's: changing it leaves the next round's alone.
        got[:] = np.nan
        assert np.isfinite(block.grad_sum(theta)).all()


def test_a_block_checks_its_data_when_bound_and_theta_every_round() -> None:
    X = sp.csr_matrix(np.ones((3, 2)))
    with pytest.raises(DataError, match="0, 1"):
        LogisticRegression().block(X, np.array([1.0, -1.0, 1.0]))
    with pytest.raises(DataError, match="rows"):
        LeastSquares().block(X, np.zeros(4))
    block = LogisticRegression().block(X, np.array([1.0, 0.0, 1.0]))
    with pytest.raises(DataError, match="features"):
        block.grad_sum(np.zeros(3))
    # Any θ is taken as float64, as grad_sum takes it, even with float32 data.
    X32 = sp.csr_matrix(np.array([[0.1, 0.7], [0.3, 0.2], [0.9, 0.4]], dtype=np.float32))
    y = np.array([1.0, 0.0, 1.0])
    theta32 = np.array([0.5, -0.25], dtype=np.float32)
    got = LogisticRegression().block(X32, y).grad_sum(theta32)
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, LogisticRegression().grad_sum(theta32, X32, y))
