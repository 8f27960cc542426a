"""Gradient oracles by name, and the training objective the coordinator reports.

Users pick a model with ``[model] name = "logistic"`` and its options (``l2``);
:func:`create_model` checks both and names the valid choices on a mistake. The neural
networks ``mlp`` and ``cnn`` run on PyTorch (:mod:`codedgd.services.models.neural`, the
``codedgd[torch]`` extra). Installed packages add models through the ``codedgd.models``
entry points (:mod:`codedgd.services.models.plugin`, docs/data.md).

θ's length and starting point are the model's: a linear model has one parameter per
feature and starts at zero; a network has its own parameter count and seeded
initialisation (:func:`parameter_count`, :func:`initial_theta`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, cast

import numpy as np

from codedgd.services.data.dataset import Matrix
from codedgd.services.data.plugins import (
    MODEL_GROUP,
    check_plugin_options,
    load_plugin,
    plugin_names,
    unknown_name,
)
from codedgd.services.errors import ConfigError
from codedgd.services.models.base import Model, refuse_unknown_options
from codedgd.services.models.least_squares import LeastSquares
from codedgd.services.models.logistic import LogisticRegression, roc_auc
from codedgd.services.models.neural import NETWORKS
from codedgd.services.models.plugin import PluginModel

__all__ = [
    "MODELS",
    "LeastSquares",
    "LogisticRegression",
    "Model",
    "check_target_loss",
    "create_model",
    "initial_theta",
    "model_names",
    "objective",
    "objective_smoothness",
    "parameter_count",
    "roc_auc",
]

MODELS: dict[str, str] = {
    "logistic": "binary logistic regression, labels {0,1}; metric ROC AUC (higher is better)",
    "least-squares": "linear least squares ½Σ(xᵀθ − y)²; metric MSE (lower is better)",
    **NETWORKS,
}

_CLASSES: dict[str, type[LogisticRegression] | type[LeastSquares]] = {
    "logistic": LogisticRegression,
    "least-squares": LeastSquares,
}

# Options every model accepts, with a one-line meaning for error messages.
_OPTIONS: dict[str, str] = {"l2": "L2 regularisation λ >= 0 of the objective (default 0)"}


def check_target_loss(name: str, target: float, what: str) -> None:
    """Refuse a target loss ``what`` that model ``name``'s objective can never reach: one
    below 0 for a built-in model (each is a loss that is never negative plus ½λ‖θ‖² with
    λ >= 0). A plugin's objective may be anything, so its targets are taken as given."""
    if name in MODELS and target < 0:
        raise ConfigError(
            f"{what} = {target:g} is below 0, but the {name} objective is never negative: "
            "the job could never reach it. Give a target >= 0 (the loss a run reaches, or "
            "codedgd tune --target-gap to state it relative to the optimum)"
        )


def model_names() -> list[str]:
    """Every model a job can name: the built-in ones, then installed plugins'."""
    return [*MODELS, *(p for p in plugin_names(MODEL_GROUP) if p not in MODELS)]


def create_model(name: str, options: Mapping[str, Any] | None = None) -> Model:
    """Build a model by name; ``options`` may hold ``l2`` (a number >= 0, or a numeric string).

    A name that is not built in is looked up among the ``codedgd.models`` plugins; a
    plugin's other options go to its constructor.
    """
    if name in NETWORKS:
        from codedgd.services.models.neural import NeuralNetwork

        return cast(Model, NeuralNetwork(name, dict(options or {})))
    cls = _CLASSES.get(name)
    if cls is None:
        return _plugin_model(str(name), dict(options or {}))
    opts = dict(options or {})
    refuse_unknown_options(name, opts, _OPTIONS)
    l2 = _nonnegative_float(name, "l2", opts.get("l2", 0.0))
    return cls(l2=l2)


def _plugin_model(name: str, opts: dict[str, Any]) -> Model:
    factory = load_plugin(MODEL_GROUP, name) if isinstance(name, str) else None
    if factory is None:
        raise unknown_name("model", name, MODELS, MODEL_GROUP)
    if not callable(factory):
        raise ConfigError(
            f"model plugin {name!r} names a {type(factory).__name__}, not a class or factory: "
            "its entry point must name a callable that returns the model (docs/data.md)"
        )
    l2 = _nonnegative_float(name, "l2", opts.pop("l2", 0.0))
    check_plugin_options("model", name, factory, opts, skip=("l2",))
    try:
        inner = factory(**opts)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"model {name!r}: {exc}") from None
    return cast(Model, PluginModel(name, inner, l2))


def _nonnegative_float(model: str, key: str, value: Any) -> float:
    if isinstance(value, bool):
        number = math.nan
    else:
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = math.nan
    if not (math.isfinite(number) and number >= 0.0):
        raise ConfigError(f"model {model!r}: {key} must be a finite number >= 0, got {value!r}")
    return number


def parameter_count(model: Model, features: int) -> int:
    """θ's length for data of ``features`` columns: the model's own count (a network's
    parameters), else one per feature."""
    count = getattr(model, "parameter_count", None)
    return int(count(features)) if callable(count) else int(features)


def initial_theta(model: Model, features: int, seed: int) -> np.ndarray:
    """Where the descent starts: the model's own seeded θ₀ (a network's initial
    weights), else zeros."""
    start = getattr(model, "initial_theta", None)
    if callable(start):
        return np.asarray(start(features, seed), dtype=np.float64)
    return np.zeros(parameter_count(model, features))


def objective(model: Model, theta: np.ndarray, X: Matrix, y: np.ndarray) -> float:
    """F(θ) = (1/N) Σ_i ℓ(x_i, y_i; θ) + (λ/2)‖θ‖², the objective the coordinator reports.

    Its gradient is grad_sum/N + λθ: the coordinator divides the decoded sum by N
    (the training rows) and adds λθ, exactly as here.
    """
    n = int(X.shape[0])
    if n == 0:
        raise ConfigError("cannot evaluate the objective on a dataset with no rows")
    theta = np.asarray(theta, dtype=np.float64)
    return model.loss_sum(theta, X, y) / n + 0.5 * model.l2 * float(theta @ theta)


def objective_smoothness(model: Model, X: Matrix) -> float:
    """L of F: smoothness(X)/N + λ; ``lr = "auto"`` uses the step 1/L."""
    n = int(X.shape[0])
    if n == 0:
        raise ConfigError("cannot compute a smoothness constant on a dataset with no rows")
    return model.smoothness(X) / n + model.l2
