"""The gradient over one fixed block of rows, checked once and then computed every round.

A worker holds the same partitions for a whole job and computes Σ_i ∇ℓ_i over each of
them once per round, with a new θ each time. :class:`BlockGradient` does the per-block
work up front: the label and shape checks, and scipy's transpose view Xᵀ (a CSC matrix
sharing X's arrays, so it costs no memory). What is left per round is the arithmetic
itself, two products and one elementwise link, and one check that θ has the data's
dimension.

That matters when the arithmetic is small. Measured on the transport benchmark (near-empty
partitions, ℓ = 10⁵): rebuilding Xᵀ and re-checking the labels every round made a worker's
gradient cost as much CPU as its gRPC receive and send together (docs/benchmarks.md).

Every linear model's data-term gradient has the form Σ_i ∇ℓ_i = Xᵀ r with
r_i = link(x_iᵀθ, y_i); a model gives its link as a function that overwrites the margins
``z = Xθ`` with ``r`` in place:

- least squares: r = z − y;
- logistic regression: r = σ(z) − y.

Xᵀr goes through the transpose *view*, not a CSR copy of Xᵀ: measured on the Amazon
shape (26,215 x 241,915 CSR, 44 non-zeros a row), ``X.T @ r`` (a scatter over the rows
of X) takes 1.3-1.6 ms against 2.1-2.4 ms for a precomputed CSR copy of Xᵀ (a gather
over 241,915 short rows), on the real data and on a random one-hot matrix alike. For a
dense C-ordered X it is one BLAS gemv with the transpose flag.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np

from codedgd.services.data.dataset import Matrix
from codedgd.services.errors import DataError

# Overwrites z = Xθ with the residual r (same length as y), in place.
Link = Callable[[np.ndarray, np.ndarray], None]


class GradientBlock(Protocol):
    """What a model's ``block(X, y)`` returns: the gradient sum over fixed rows.

    Its methods must be safe to call from two threads at once: a worker's cancelled round
    may still be finishing a partition in its thread when the next round's computation
    starts (keep no per-call state on the block or the model, or keep it per thread).
    """

    def grad_sum(self, theta: np.ndarray) -> np.ndarray:
        """Σ_i ∇ℓ(x_i, y_i; θ) over every row, float64 (no L2 term)."""
        ...

    def grad_sum_rows(self, theta: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """The same over the rows ``rows`` only (a round's mini-batch sample)."""
        ...


class BlockGradient:
    """Σ_i ∇ℓ_i over the rows of one fixed X, y: call :meth:`grad_sum` with each θ.

    Built by a model's ``block(X, y)``, which checks the labels first. The result of
    :meth:`grad_sum` is a fresh float64 vector the caller may keep or modify.
    """

    __slots__ = ("X", "_XT", "_dim", "_link", "y")

    def __init__(self, X: Matrix, y: np.ndarray, link: Link) -> None:
        y = np.asarray(y, dtype=np.float64)
        n, d = (int(s) for s in X.shape)
        if y.shape != (n,):
            raise DataError(f"labels have shape {y.shape} but the data has {n} rows")
        self.X = X
        self.y = y
        self._XT = X.T  # scipy's free CSC view of a CSR matrix; a strided view of an array
        self._link = link
        self._dim = d

    @property
    def dim(self) -> int:
        return self._dim

    def grad_sum(self, theta: np.ndarray) -> np.ndarray:
        """Σ_i ∇ℓ(x_i, y_i; θ), float64, length ``dim`` (no L2 term)."""
        theta = np.asarray(theta, dtype=np.float64)  # no copy for the float64 θ workers get
        if theta.shape != (self._dim,):
            raise DataError(
                f"θ has shape {theta.shape} but the data has {self._dim} features: "
                "the model, checkpoint and dataset must agree on the dimension"
            )
        z = np.asarray(self.X @ theta, dtype=np.float64).reshape(-1)  # fresh: overwritten
        self._link(z, self.y)
        return np.asarray(self._XT @ z, dtype=np.float64).reshape(-1)

    def grad_sum_rows(self, theta: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Σ_i ∇ℓ(x_i, y_i; θ) over the rows ``rows`` only (a round's mini-batch sample)."""
        theta = np.asarray(theta, dtype=np.float64)
        if theta.shape != (self._dim,):
            raise DataError(
                f"θ has shape {theta.shape} but the data has {self._dim} features: "
                "the model, checkpoint and dataset must agree on the dimension"
            )
        X = self.X[rows]
        z = np.asarray(X @ theta, dtype=np.float64).reshape(-1)
        self._link(z, self.y[rows])
        return np.asarray(X.T @ z, dtype=np.float64).reshape(-1)

    def weighted_grad_sum(self, theta: np.ndarray, row_weights: np.ndarray) -> np.ndarray:
        """Σ_i w_i ∇ℓ(x_i, y_i; θ): the weighted sum the vectorized simulator decodes to.

        ``row_weights`` has one float per row (0 leaves the row out).
        """
        theta = np.asarray(theta, dtype=np.float64)
        if theta.shape != (self._dim,) or row_weights.shape != self.y.shape:
            raise DataError(
                f"θ {theta.shape} and row weights {row_weights.shape} do not fit data of "
                f"{self.y.shape[0]} rows and {self._dim} features"
            )
        z = np.asarray(self.X @ theta, dtype=np.float64).reshape(-1)
        self._link(z, self.y)
        z *= row_weights
        return np.asarray(self._XT @ z, dtype=np.float64).reshape(-1)
