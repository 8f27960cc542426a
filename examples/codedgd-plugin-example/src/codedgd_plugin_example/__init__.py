"""An example codedgd plugin: a model and a dataset, each a few lines of numpy.

``SquaredHingeSVM`` (entry point ``codedgd.models: svm``) is a linear SVM with the
squared hinge loss, labels {0, 1} (read as −1/+1), metric accuracy. ``BLOBS``
(``codedgd.datasets: blobs``) is two seeded Gaussian blobs with a bias column.
The protocols are in codedgd's docs/data.md.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

__all__ = ["BLOBS", "Blobs", "SquaredHingeSVM"]


class SquaredHingeSVM:
    """Σ_i max(0, 1 − s_i x_iᵀθ)², s_i = 2y_i − 1; codedgd adds the L2 term (λ/2)‖θ‖²."""

    metric_name = "accuracy"
    higher_is_better = True

    def __init__(self, margin: float = 1.0) -> None:
        if not margin > 0:
            raise ValueError(f"margin must be > 0, got {margin!r}")
        self.margin = float(margin)

    def _slack(self, theta: np.ndarray, X, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        signs = 2.0 * np.asarray(y, dtype=np.float64) - 1.0
        slack = np.maximum(0.0, self.margin - signs * np.asarray(X @ theta).reshape(-1))
        return slack, signs

    def loss_sum(self, theta: np.ndarray, X, y: np.ndarray) -> float:
        slack, _ = self._slack(theta, X, y)
        return float(slack @ slack)

    def grad_sum(self, theta: np.ndarray, X, y: np.ndarray) -> np.ndarray:
        slack, signs = self._slack(theta, X, y)
        return np.asarray(X.T @ (-2.0 * signs * slack), dtype=np.float64).reshape(-1)

    def metric(self, theta: np.ndarray, X, y: np.ndarray) -> float:
        if len(y) == 0:
            return float("nan")
        predicted = np.asarray(X @ theta).reshape(-1) > 0
        return float(np.mean(predicted == (np.asarray(y) > 0.5)))

    def predict(self, theta: np.ndarray, X) -> np.ndarray:
        return (np.asarray(X @ theta).reshape(-1) > 0).astype(np.float64)

    def smoothness(self, X) -> float:
        """2·λ_max(XᵀX): the squared hinge's second derivative is at most 2."""
        dense = X.toarray() if sp.issparse(X) else np.asarray(X)
        return 2.0 * float(np.linalg.norm(dense, 2) ** 2) if dense.size else 0.0


class Blobs:
    """Two Gaussian blobs ``separation`` apart along a seeded direction, plus a bias column."""

    task = "classification"
    description = "two seeded Gaussian blobs (options: rows, dim, separation)"

    def load(
        self, *, seed: int, rows: int = 400, dim: int = 5, separation: float = 3.0
    ) -> tuple[np.ndarray, np.ndarray]:
        if rows < 2 or dim < 1:
            raise ValueError(f"blobs needs rows >= 2 and dim >= 1, got rows={rows}, dim={dim}")
        rng = np.random.default_rng(seed)
        y = rng.integers(0, 2, size=rows).astype(np.float64)
        direction = rng.normal(size=dim)
        direction /= np.linalg.norm(direction)
        X = rng.normal(size=(rows, dim)) + np.outer(y - 0.5, separation * direction)
        return np.hstack([X, np.ones((rows, 1))]), y


BLOBS = Blobs()
