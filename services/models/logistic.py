"""Binary logistic regression with labels {0, 1}, and a rank-based ROC AUC.

With margins z_i = x_iᵀθ and signs s_i = 2y_i − 1,

    ℓ_i = log(1 + exp(−s_i z_i)),        ∇ℓ_i = (σ(z_i) − y_i) x_i.

Both are computed without overflow for any margin: the loss through
``np.logaddexp(0, −s z)`` and σ through ``scipy.special.expit``. The gradient
is one sparse product each way (Xθ, then Xᵀr) plus O(N) elementwise work done
in place, so on CSR data it costs what the bare scipy expression costs. A worker
binds its partitions once (:meth:`LogisticRegression.block`): the labels are checked
then, not every round.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from scipy.special import expit

from codedgd.services.data.dataset import Matrix
from codedgd.services.errors import ConfigError, DataError
from codedgd.services.models.block import BlockGradient
from codedgd.services.models.least_squares import as_float_vector, check_shapes, gram_lambda_max


def roc_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """ROC AUC of ``scores`` for binary ``labels`` (1 = positive), ties counted as ½.

    This is the Mann–Whitney statistic: AUC = (R₊ − n₊(n₊+1)/2) / (n₊n₋) where
    R₊ sums the (1-based) ranks of the positives and tied scores share the mean
    rank of their run, which is exactly P(score₊ > score₋) + ½·P(tie). One sort,
    O(N log N), no pairwise loop. Returns NaN when a class is absent (AUC is
    undefined) or any score is NaN (θ diverged): a visible "no value" rather
    than a misleading number.
    """
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    positive = np.asarray(labels).reshape(-1) > 0.5
    if scores.shape != positive.shape:
        raise DataError(f"{scores.size} scores but {positive.size} labels")
    n = scores.size
    n_pos = int(np.count_nonzero(positive))
    n_neg = n - n_pos
    if n_pos == 0 or n_neg == 0 or bool(np.isnan(scores).any()):
        return float("nan")
    order = np.argsort(scores, kind="stable")
    ordered = scores[order]
    # Start of each run of equal scores (±inf compare equal to themselves, so
    # saturated scores still form one tied run).
    starts = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1])))
    ends = np.append(starts[1:], n)
    mean_rank = (starts + 1 + ends) / 2.0  # mean of the ranks starts+1 .. ends
    ranks = np.repeat(mean_rank, ends - starts)
    rank_sum_pos = float(ranks[positive[order]].sum())
    return (rank_sum_pos - n_pos * (n_pos + 1) / 2.0) / (float(n_pos) * float(n_neg))


def _link(z: np.ndarray, y: np.ndarray) -> None:
    """Margins z → residuals σ(z) − y, in place."""
    expit(z, out=z)
    z -= y


def _check_binary(y: np.ndarray) -> None:
    """Labels must be 0/1: ±1 labels would give a silently wrong gradient."""
    if y.size and not bool(np.all((y == 0.0) | (y == 1.0))):
        bad = y[(y != 0.0) & (y != 1.0)][:3]
        raise DataError(
            f"logistic regression needs labels in {{0, 1}}, found {bad.tolist()}: "
            "map the classes to 0/1 in the dataset loader"
        )


class LogisticRegression:
    """Binary logistic regression, labels {0, 1}; held-out metric ROC AUC.

    ``l2`` is carried for the coordinator (it adds (λ/2)‖θ‖² to the objective);
    workers' sums never include it, so partition sums add up exactly.
    """

    name: ClassVar[str] = "logistic"
    metric_name: ClassVar[str] = "auc"
    higher_is_better: ClassVar[bool] = True

    def __init__(self, l2: float = 0.0) -> None:
        if not l2 >= 0.0:
            raise ConfigError(f"logistic: l2 must be a number >= 0, got {l2!r}")
        self.l2 = float(l2)

    def __repr__(self) -> str:
        return f"LogisticRegression(l2={self.l2!r})"

    def _margins(
        self, theta: np.ndarray, X: Matrix, y: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        theta = as_float_vector(theta)
        y = as_float_vector(y)
        check_shapes(theta, X, y)
        _check_binary(y)
        # X @ θ is a fresh array, so callers may overwrite it in place.
        z = np.asarray(X @ theta, dtype=np.float64).reshape(-1)
        return z, y

    def loss_sum(self, theta: np.ndarray, X: Matrix, y: np.ndarray) -> float:
        z, y = self._margins(theta, X, y)
        # −s·z with s = 2y − 1, i.e. z where y = 0 and −z where y = 1.
        np.multiply(z, 1.0 - 2.0 * y, out=z)
        return float(np.logaddexp(0.0, z, out=z).sum())

    def grad_sum(self, theta: np.ndarray, X: Matrix, y: np.ndarray) -> np.ndarray:
        return self.block(X, y).grad_sum(theta)

    def block(self, X: Matrix, y: np.ndarray) -> BlockGradient:
        """The gradient over these rows for any θ, the labels checked once, here."""
        y = as_float_vector(y)
        _check_binary(y)
        return BlockGradient(X, y, _link)

    def metric(self, theta: np.ndarray, X: Matrix, y: np.ndarray) -> float:
        # σ is monotone, so the raw margins rank exactly like the probabilities,
        # and unlike σ(z) they do not saturate into false ties for large |z|.
        theta = as_float_vector(theta)
        check_shapes(theta, X, np.asarray(y))
        return roc_auc(np.asarray(X @ theta).reshape(-1), y)

    def predict(self, theta: np.ndarray, X: Matrix) -> np.ndarray:
        """P(y = 1 | x) = σ(xᵀθ) for each row."""
        theta = as_float_vector(theta)
        check_shapes(theta, X, None)
        z = np.asarray(X @ theta, dtype=np.float64).reshape(-1)
        out: np.ndarray = 0.5 * (1.0 + np.tanh(0.5 * z))  # σ(z), without overflow
        return out

    def smoothness(self, X: Matrix) -> float:
        """0.25·λ_max(XᵀX): σ' ≤ ¼, so the data term's Hessian is ⪯ ¼XᵀX."""
        return 0.25 * gram_lambda_max(X)
