"""Least squares, and the linear algebra every linear model shares.

Besides :class:`LeastSquares`, this module holds what the linear models share:
:func:`gram_lambda_max`, which computes λ_max(XᵀX) = σ_max(X)², the smoothness
constant behind ``lr = "auto"`` and LAG's thresholds, without forming XᵀX, and the
shape checks. The gradient Xᵀr itself is computed by :mod:`codedgd.services.models.block`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from codedgd.services.data.dataset import Matrix
from codedgd.services.errors import ConfigError, DataError
from codedgd.services.models.block import BlockGradient

# Below this many rows (or columns) the smaller Gram matrix is formed densely and
# solved exactly: faster than Lanczos and free of convergence questions.
_DENSE_GRAM_LIMIT = 512


def gram_lambda_max(X: Matrix) -> float:
    """λ_max(XᵀX), the squared largest singular value of X, as an upper estimate.

    XᵀX is never formed (for the Amazon data it would be 241,915² with far more
    non-zeros than X). Small matrices solve the smaller Gram matrix exactly;
    large ones run Lanczos (ARPACK) on the operator of the smaller Gram matrix,
    v ↦ X(Xᵀv) or v ↦ Xᵀ(Xv), and return the Ritz value plus its residual norm:
    a Ritz value never exceeds λ_max, and adding the residual makes the result
    an upper bound once Lanczos has found the top eigenvalue. Step sizes of 1/L
    are then safe rather than slightly too long.
    """
    n, d = (int(s) for s in X.shape)
    if n == 0 or d == 0:
        return 0.0
    if X.dtype != np.float64:
        X = X.astype(np.float64)
    rows_side = n <= d  # work in the n x n space of XXᵀ when it is the smaller one
    m = min(n, d)
    if m <= _DENSE_GRAM_LIMIT:
        gram: Matrix = X @ X.T if rows_side else X.T @ X
        dense = gram.toarray() if isinstance(gram, sp.spmatrix | sp.sparray) else np.asarray(gram)
        return max(float(np.linalg.eigvalsh(dense)[-1]), 0.0)

    def apply(v: np.ndarray) -> np.ndarray:
        v = np.asarray(v, dtype=np.float64).reshape(-1)
        if rows_side:
            return np.asarray(X @ (X.T @ v), dtype=np.float64).reshape(-1)
        return np.asarray(X.T @ (X @ v), dtype=np.float64).reshape(-1)

    op = spla.LinearOperator((m, m), matvec=apply, dtype=np.float64)
    # A seeded positive start vector: results are reproducible, and for the
    # non-negative one-hot data the top eigenvector is positive too.
    v0 = np.random.default_rng(0).random(m) + 0.5
    try:
        values, vectors = spla.eigsh(op, k=1, which="LA", v0=v0, tol=1e-8, maxiter=20 * m)
        mu = float(values[0])
        vec = vectors[:, 0]
    except spla.ArpackNoConvergence:
        mu, vec = _power_iteration(apply, v0)
    vec = vec / np.linalg.norm(vec)
    residual = float(np.linalg.norm(apply(vec) - mu * vec))
    return max(mu + residual, 0.0)


def _power_iteration(
    apply: Callable[[np.ndarray], np.ndarray], v0: np.ndarray, iterations: int = 2000
) -> tuple[float, np.ndarray]:
    """Fallback when ARPACK does not converge: plain power iteration."""
    v = v0 / np.linalg.norm(v0)
    mu = 0.0
    for _ in range(iterations):
        w = apply(v)
        mu = float(v @ w)
        norm = float(np.linalg.norm(w))
        if norm == 0.0:
            return 0.0, v
        v = w / norm
    return mu, v


def _link(z: np.ndarray, y: np.ndarray) -> None:
    """Predictions z → residuals z − y, in place."""
    z -= y


def check_shapes(theta: np.ndarray, X: Matrix, y: np.ndarray | None) -> None:
    """Raise a DataError naming the mismatch instead of scipy's bare shape error."""
    n, d = X.shape
    if theta.shape != (d,):
        raise DataError(
            f"θ has shape {theta.shape} but the data has {d} features: "
            "the model, checkpoint and dataset must agree on the dimension"
        )
    if y is not None and y.shape != (n,):
        raise DataError(f"labels have shape {y.shape} but the data has {n} rows")


def as_float_vector(v: np.ndarray) -> np.ndarray:
    """A float64 view of v (a copy only when v is not float64 already)."""
    return np.asarray(v, dtype=np.float64)


class LeastSquares:
    """Linear regression: ℓ(x, y; θ) = ½(xᵀθ − y)².

    The held-out metric is the mean squared error (lower is better). The data
    term's Hessian is XᵀX, so its smoothness constant is exactly λ_max(XᵀX).
    """

    name: ClassVar[str] = "least-squares"
    metric_name: ClassVar[str] = "mse"
    higher_is_better: ClassVar[bool] = False

    def __init__(self, l2: float = 0.0) -> None:
        if not l2 >= 0.0:
            raise ConfigError(f"least-squares: l2 must be a number >= 0, got {l2!r}")
        self.l2 = float(l2)

    def __repr__(self) -> str:
        return f"LeastSquares(l2={self.l2!r})"

    def _residual(self, theta: np.ndarray, X: Matrix, y: np.ndarray) -> np.ndarray:
        theta = as_float_vector(theta)
        y = as_float_vector(y)
        check_shapes(theta, X, y)
        r = np.asarray(X @ theta, dtype=np.float64).reshape(-1)
        r -= y
        return r

    def loss_sum(self, theta: np.ndarray, X: Matrix, y: np.ndarray) -> float:
        r = self._residual(theta, X, y)
        return 0.5 * float(r @ r)

    def grad_sum(self, theta: np.ndarray, X: Matrix, y: np.ndarray) -> np.ndarray:
        return self.block(X, y).grad_sum(theta)

    def block(self, X: Matrix, y: np.ndarray) -> BlockGradient:
        """The gradient over these rows for any θ (residual r = Xθ − y)."""
        return BlockGradient(X, y, _link)

    def metric(self, theta: np.ndarray, X: Matrix, y: np.ndarray) -> float:
        r = self._residual(theta, X, y)
        if r.size == 0:
            return float("nan")
        return float(r @ r) / r.size

    def predict(self, theta: np.ndarray, X: Matrix) -> np.ndarray:
        """xᵀθ for each row."""
        theta = as_float_vector(theta)
        check_shapes(theta, X, None)
        out: np.ndarray = np.asarray(X @ theta, dtype=np.float64).reshape(-1)
        return out

    def smoothness(self, X: Matrix) -> float:
        return gram_lambda_max(X)
