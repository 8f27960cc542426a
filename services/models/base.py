"""Gradient oracles: what a worker computes and the coordinator evaluates.

A model's data term is a *sum* over rows, so per-partition sums add up to the
full-data sum that gradient codes recover. The training objective is

    F(θ) = (1/N) Σ_i ℓ(x_i, y_i; θ) + (λ/2)‖θ‖²,

and the L2 term is applied by the coordinator, never by workers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Protocol

import numpy as np

from codedgd.services.data.dataset import Matrix
from codedgd.services.errors import ConfigError
from codedgd.services.models.block import GradientBlock


class Model(Protocol):
    name: ClassVar[str]
    metric_name: ClassVar[str]  # held-out metric: "auc" or "mse"
    higher_is_better: ClassVar[bool]
    l2: float

    def loss_sum(self, theta: np.ndarray, X: Matrix, y: np.ndarray) -> float:
        """Σ_i ℓ(x_i, y_i; θ) over the rows of X (no L2 term)."""
        ...

    def grad_sum(self, theta: np.ndarray, X: Matrix, y: np.ndarray) -> np.ndarray:
        """Σ_i ∇ℓ(x_i, y_i; θ) over the rows of X, float64, length dim (no L2 term)."""
        ...

    def block(self, X: Matrix, y: np.ndarray) -> GradientBlock:
        """``grad_sum`` over these fixed rows for any θ, the data checked once (here).

        A worker binds each of its partitions once per job: a bad label or shape is
        reported when it takes the assignment, and no round repeats the checks.
        """
        ...

    def metric(self, theta: np.ndarray, X: Matrix, y: np.ndarray) -> float:
        """The held-out metric (AUC for classification, MSE for regression)."""
        ...

    def predict(self, theta: np.ndarray, X: Matrix) -> np.ndarray:
        """What the model says of each row of X (a probability of 1, or a value)."""
        ...

    def smoothness(self, X: Matrix) -> float:
        """A smoothness constant L of the data term Σ_i ℓ (for step sizes and LAG)."""
        ...


def refuse_unknown_options(
    model: str, options: Mapping[str, Any], valid: Mapping[str, str]
) -> None:
    """A ConfigError naming the options ``model`` does not have, and every one it has."""
    unknown = sorted(set(options) - set(valid))
    if unknown:
        listed = "; ".join(f"{k}: {v}" for k, v in valid.items())
        raise ConfigError(
            f"model {model!r} has no option(s) {', '.join(map(repr, unknown))}; "
            f"valid options: {listed}"
        )
