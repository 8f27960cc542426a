"""The embedded default dataset: seeded synthetic classification or regression data.

Classification labels come from a logistic model with a random true θ*, so
logistic regression can fit them well (held-out AUC well above 0.5);
regression targets are y = Xθ* + noise. ``density < 1`` gives a CSR matrix.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import scipy.sparse as sp

from codedgd.services.data.dataset import Dataset, Matrix, take_rows
from codedgd.services.errors import ConfigError


def check_synthetic(
    *, task: str, rows: int, dim: int, density: float, noise: float, test_fraction: float
) -> None:
    """The options' values, checked without generating anything (also on job submit)."""
    if task not in ("classification", "regression"):
        raise ConfigError(f"synthetic task must be classification or regression, got {task!r}")
    if not is_int(rows) or rows < 2:
        raise ConfigError(f"synthetic rows must be an integer >= 2, got {rows!r}")
    if not is_int(dim) or dim < 1:
        raise ConfigError(f"synthetic dim must be an integer >= 1, got {dim!r}")
    if not is_real(density) or not 0 < density <= 1:
        raise ConfigError(f"synthetic density must be in (0, 1], got {density!r}")
    if not is_real(test_fraction) or not 0 < test_fraction < 1:
        raise ConfigError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
    if not is_real(noise) or not noise >= 0:
        raise ConfigError(f"synthetic noise must be >= 0, got {noise!r}")


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_real(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def make_synthetic(
    *,
    task: Literal["classification", "regression"] = "classification",
    rows: int = 4000,
    dim: int = 50,
    density: float = 1.0,
    noise: float = 0.1,
    test_fraction: float = 0.2,
    seed: int = 0,
) -> Dataset:
    """Generate a train/test split; deterministic for a seed."""
    check_synthetic(
        task=task, rows=rows, dim=dim, density=density, noise=noise, test_fraction=test_fraction
    )
    rng = np.random.default_rng([seed, 0x5EED])
    X: Matrix
    if density < 1:
        X = sp.random(
            rows,
            dim,
            density=density,
            format="csr",
            random_state=rng,
            data_rvs=rng.standard_normal,
            dtype=np.float64,
        )
        scale = 1.0 / np.sqrt(max(density * dim, 1.0))
    else:
        X = rng.standard_normal((rows, dim))
        scale = 1.0 / np.sqrt(dim)
    theta_star = rng.standard_normal(dim) * 3.0 * scale
    margin = np.asarray(X @ theta_star).ravel()
    if task == "classification":
        p = 1.0 / (1.0 + np.exp(-margin))
        y = (rng.random(rows) < p).astype(np.float64)
    else:
        y = margin + noise * rng.standard_normal(rows)
    n_test = max(1, round(rows * test_fraction))
    perm = np.random.default_rng([seed, 0x5717]).permutation(rows)
    test, train = np.sort(perm[:n_test]), np.sort(perm[n_test:])
    return Dataset(
        name="synthetic",
        task=task,
        X_train=take_rows(X, train),
        y_train=y[train],
        X_test=take_rows(X, test),
        y_test=y[test],
    )
