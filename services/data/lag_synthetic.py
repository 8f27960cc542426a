"""LAG's synthetic least-squares setup (Chen et al., NeurIPS 2018, §5): heterogeneous workers.

Worker m (m = 1..M) owns the ``dim`` rows of X_m = growth^{m−1}·q_m q_mᵀ + I, with q_m a
seeded random unit vector, and targets y_m = X_m θ* + noise. The smoothness constants
L_m = λ_max(X_mᵀX_m) grow geometrically with m, which is what lets LAG skip most of the
uploads of the smooth workers. The data comes split: block m is worker m's rows, so a job
uses k = M partitions (n = M workers for the policies that hold one partition each).
The held-out set repeats the design with fresh noise.
"""

from __future__ import annotations

import numpy as np

from codedgd.services.data.dataset import Dataset
from codedgd.services.data.synthetic import is_int, is_real
from codedgd.services.errors import ConfigError


def check_lag_synthetic(*, workers: int, dim: int, growth: float, noise: float) -> None:
    """The options' values, checked without generating anything (also on job submit)."""
    if not is_int(workers) or workers < 1:
        raise ConfigError(f"lag-synthetic workers must be an integer >= 1, got {workers!r}")
    if not is_int(dim) or dim < 1:
        raise ConfigError(f"lag-synthetic dim must be an integer >= 1, got {dim!r}")
    if not is_real(growth) or not growth > 0:
        raise ConfigError(f"lag-synthetic growth must be positive, got {growth!r}")
    if not is_real(noise) or not noise >= 0:
        raise ConfigError(f"lag-synthetic noise must be >= 0, got {noise!r}")


def make_lag_synthetic(
    *,
    workers: int = 9,
    dim: int = 50,
    growth: float = 1.3,
    noise: float = 0.1,
    seed: int = 0,
) -> Dataset:
    """The M blocks X_m = growth^{m−1} q_m q_mᵀ + I (dim × dim each); deterministic for a seed."""
    check_lag_synthetic(workers=workers, dim=dim, growth=growth, noise=noise)
    rng = np.random.default_rng([seed, 0x1A6])
    eye = np.eye(dim)
    blocks_X = []
    for m in range(workers):
        q = rng.standard_normal(dim)
        q /= np.linalg.norm(q)
        blocks_X.append(growth**m * np.outer(q, q) + eye)
    X = np.vstack(blocks_X)
    theta_star = rng.standard_normal(dim)
    clean = X @ theta_star
    y = clean + noise * rng.standard_normal(X.shape[0])
    y_test = clean + noise * rng.standard_normal(X.shape[0])
    blocks = tuple(np.arange(m * dim, (m + 1) * dim, dtype=np.int64) for m in range(workers))
    return Dataset(
        name="lag-synthetic",
        task="regression",
        X_train=X,
        y_train=y,
        X_test=X.copy(),
        y_test=y_test,
        blocks=blocks,
    )
