"""A model from an installed package (a ``codedgd.models`` entry point), held to the protocol.

The entry point names a class (or factory) whose instances have::

    metric_name: str             # the held-out metric's name, e.g. "accuracy"
    higher_is_better: bool       # for the metric
    loss_sum(theta, X, y) -> float         # Σ_i ℓ(x_i, y_i; θ) over the rows, no L2 term
    grad_sum(theta, X, y) -> np.ndarray    # Σ_i ∇ℓ(x_i, y_i; θ), length X.shape[1], no L2
    metric(theta, X, y) -> float           # on held-out rows

and optionally ``smoothness(X)`` (a Lipschitz constant of Σ_i ∇ℓ, for ``lr = "auto"`` and
LAG), ``predict(theta, X)`` (for ``codedgd predict``) and ``block(X, y)`` (an object whose
``grad_sum(theta)`` is the gradient over fixed rows, for speed). :class:`PluginModel`
wraps it as a :class:`~codedgd.services.models.base.Model`: the L2 term stays the
coordinator's, and a gradient of the wrong shape or a missing method is reported by the
plugin's name instead of failing somewhere deeper.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from codedgd.services.data.dataset import Matrix, take_rows
from codedgd.services.errors import ConfigError, DataError

REQUIRED = ("loss_sum", "grad_sum", "metric")


class PluginModel:
    """A plugin's model behind the :class:`Model` protocol (name, l2, checks)."""

    def __init__(self, name: str, inner: Any, l2: float) -> None:
        missing = [m for m in REQUIRED if not callable(getattr(inner, m, None))]
        metric_name = getattr(inner, "metric_name", None)
        higher = getattr(inner, "higher_is_better", None)
        if missing or not isinstance(metric_name, str) or not isinstance(higher, bool):
            lacks = [*missing]
            if not isinstance(metric_name, str):
                lacks.append("metric_name (a str)")
            if not isinstance(higher, bool):
                lacks.append("higher_is_better (a bool)")
            raise ConfigError(
                f"model plugin {name!r} ({type(inner).__name__}) does not follow the "
                f"protocol: it lacks {', '.join(lacks)} (docs/data.md)"
            )
        self.name = name
        self.metric_name = metric_name
        self.higher_is_better = higher
        self.l2 = float(l2)
        self.inner = inner

    def __repr__(self) -> str:
        return f"PluginModel({self.name!r}, {self.inner!r}, l2={self.l2!r})"

    def loss_sum(self, theta: np.ndarray, X: Matrix, y: np.ndarray) -> float:
        return float(self.inner.loss_sum(theta, X, y))

    def grad_sum(self, theta: np.ndarray, X: Matrix, y: np.ndarray) -> np.ndarray:
        return self._checked(self.inner.grad_sum(theta, X, y), int(X.shape[1]))

    def _checked(self, g: Any, dim: int) -> np.ndarray:
        out = np.array(g, dtype=np.float64).reshape(-1) if np.ndim(g) <= 1 else None
        if out is None or out.shape != (dim,):
            raise DataError(
                f"model plugin {self.name!r}: grad_sum returned shape {np.shape(g)}, but the "
                f"data has {dim} features: return one number per feature"
            )
        return out

    def block(self, X: Matrix, y: np.ndarray) -> Any:
        y = np.asarray(y, dtype=np.float64)
        if y.shape != (int(X.shape[0]),):
            raise DataError(f"labels have shape {y.shape} but the data has {X.shape[0]} rows")
        inner_block = getattr(self.inner, "block", None)
        return _Block(self, X, y, inner_block(X, y) if callable(inner_block) else None)

    def metric(self, theta: np.ndarray, X: Matrix, y: np.ndarray) -> float:
        return float(self.inner.metric(theta, X, y))

    def predict(self, theta: np.ndarray, X: Matrix) -> np.ndarray:
        fn = getattr(self.inner, "predict", None)
        if not callable(fn):
            raise ConfigError(f"model plugin {self.name!r} has no predict(theta, X)")
        return np.asarray(fn(theta, X), dtype=np.float64).reshape(-1)

    def smoothness(self, X: Matrix) -> float:
        fn = getattr(self.inner, "smoothness", None)
        if not callable(fn):
            raise ConfigError(
                f"model plugin {self.name!r} gives no smoothness(X), so the step size cannot "
                "be chosen for it: pass one (--lr 0.1, [optimizer] lr = 0.1)"
            )
        return float(fn(X))


class _Block:
    """grad_sum over fixed rows: the plugin's own block when it has one, else its grad_sum."""

    __slots__ = ("X", "_inner", "_model", "y")

    def __init__(self, model: PluginModel, X: Matrix, y: np.ndarray, inner: Any) -> None:
        self._model, self.X, self.y, self._inner = model, X, y, inner

    @property
    def dim(self) -> int:
        return int(self.X.shape[1])

    def grad_sum(self, theta: np.ndarray) -> np.ndarray:
        if self._inner is not None:
            return self._model._checked(self._inner.grad_sum(theta), self.dim)
        return self._model.grad_sum(theta, self.X, self.y)

    def grad_sum_rows(self, theta: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """The plugin's grad_sum over the rows ``rows`` only (a mini-batch sample)."""
        return self._model.grad_sum(theta, take_rows(self.X, rows), self.y[rows])
