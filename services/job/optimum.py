"""The optimal training objective F* of a job's problem, solved once and cached.

Targets stated relative to the optimum ("within 1 % of the optimal loss": F ≤ F*·(1 + 0.01))
tell exact schemes from approximate ones: ErasureHead and ignore-stragglers converge to a
neighbourhood of θ*, so they reach a loose target early and a tight one late or never.

F(θ) = (1/N) Σ ℓ(x_i, y_i; θ) + (λ/2)‖θ‖² over the job's training rows (the objective every
round record reports) is minimised by scipy's L-BFGS-B with the model's own loss and
gradient sums, to a projected gradient of 1e-10 · max(1, ‖∇F(0)‖). The result is cached
by the problem's identity (dataset and its options, model and its options, seed: the seed
draws the train/test split) under ``$CODEDGD_CACHE_DIR`` (default
``$XDG_CACHE_HOME/codedgd``, else ``~/.cache/codedgd``), so each problem is solved once per
machine.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from codedgd.services.data.dataset import Matrix
from codedgd.services.errors import ConfigError
from codedgd.services.models import objective
from codedgd.services.models.base import Model

VERSION = 1  # bump when the solver changes what it returns


@dataclass(frozen=True)
class Optimum:
    """F* and how it was found."""

    loss: float
    gradient_norm: float  # ‖∇F‖ at the solution
    iterations: int
    converged: bool
    key: str = ""

    def target(self, gap: float) -> float:
        """The loss within ``gap`` (relative) of the optimum: F*·(1 + gap)."""
        if not (math.isfinite(gap) and gap > 0):
            raise ConfigError(f"a target gap must be a number > 0 (0.01 = within 1 %), got {gap!r}")
        if not self.loss > 0:
            raise ConfigError(
                f"the optimal loss is {self.loss:.3g}: a target relative to it means nothing; "
                "give an absolute --target-loss"
            )
        return self.loss * (1.0 + gap)


def cache_dir() -> Path:
    """Where solved optima are kept."""
    if os.environ.get("CODEDGD_CACHE_DIR"):
        return Path(os.environ["CODEDGD_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "codedgd"


def problem_key(data: dict[str, Any], model: dict[str, Any], seed: int) -> str:
    """The cache key of a problem: its dataset, model and split seed."""
    doc = json.dumps({"v": VERSION, "data": data, "model": model, "seed": seed}, sort_keys=True)
    return hashlib.sha256(doc.encode()).hexdigest()[:32]


def solve(model: Model, X: Matrix, y: np.ndarray) -> Optimum:
    """Minimise F with L-BFGS-B (see the module docstring)."""
    from scipy.optimize import minimize

    n = int(X.shape[0])
    dim = int(X.shape[1])
    block = model.block(X, y)
    l2 = float(model.l2)

    def f_and_grad(theta: np.ndarray) -> tuple[float, np.ndarray]:
        value = objective(model, theta, X, y)
        grad = block.grad_sum(theta) / n + l2 * theta
        return value, grad

    theta0 = np.zeros(dim)
    _, g0 = f_and_grad(theta0)
    tol = 1e-10 * max(1.0, float(np.linalg.norm(g0)))
    res = minimize(
        f_and_grad,
        theta0,
        jac=True,
        method="L-BFGS-B",
        options={"maxiter": 20000, "maxcor": 20, "gtol": tol, "ftol": 1e-15},
    )
    value, grad = f_and_grad(np.asarray(res.x))
    gnorm = float(np.linalg.norm(grad))
    if not math.isfinite(value):
        raise ConfigError("the optimal loss came out non-finite: the data or model is broken")
    return Optimum(float(value), gnorm, int(res.nit), bool(gnorm <= 1e-6 * max(1.0, value)))


def optimum(
    model: Model,
    X: Matrix,
    y: np.ndarray,
    *,
    key: str,
    directory: Path | None = None,
) -> Optimum:
    """F* of this problem: from the cache, else solved and cached."""
    where = (directory or cache_dir()) / f"optimum-{key}.json"
    try:
        doc = json.loads(where.read_text(encoding="utf-8"))
        cached = Optimum(**doc)
        if cached.key == key and math.isfinite(cached.loss):
            return cached
    except (OSError, ValueError, TypeError):
        pass  # not cached yet, or a file cut short: solve again
    found = solve(model, X, y)
    found = Optimum(found.loss, found.gradient_norm, found.iterations, found.converged, key)
    try:
        where.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(
            "w", dir=where.parent, delete=False, suffix=".tmp", encoding="utf-8"
        ) as fh:
            json.dump(asdict(found), fh)
        os.replace(fh.name, where)
    except OSError:
        pass  # a read-only cache costs a solve next time, nothing else
    return found


def job_optimum(config: Any, data_dir: str | None = None) -> Optimum:
    """F* of a job's problem (its data, model and seed), cached."""
    from codedgd.services.data import load_dataset
    from codedgd.services.models import create_model

    model = create_model(config.model.name, config.model.options)
    dataset = load_dataset(
        config.data.name, config.data.options, seed=config.seed, data_dir=data_dir
    )
    key = problem_key(config.data.to_dict(), config.model.to_dict(), config.seed)
    return optimum(model, dataset.X_train, dataset.y_train, key=key)
