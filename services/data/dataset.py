"""The in-memory dataset type every loader returns, and seeded partitioning."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeAlias

import numpy as np
import scipy.sparse as sp

from codedgd.services.errors import DataError

Matrix: TypeAlias = np.ndarray | sp.csr_matrix
Task: TypeAlias = Literal["classification", "regression", "multiclass"]

# Assignment option key (followed by the partition index) carrying a partition's fingerprint.
FINGERPRINT_PREFIX = "data.fingerprint."


@dataclass(frozen=True)
class Dataset:
    """A train/test split. Labels are {0, 1} floats for classification, class indices
    0..C−1 (as floats) for multiclass."""

    name: str
    task: Task
    X_train: Matrix
    y_train: np.ndarray
    X_test: Matrix
    y_test: np.ndarray
    # Row blocks of data owners when the data comes split (e.g. LAG's synthetic setup,
    # one block per worker); None: the coordinator splits rows with a seeded shuffle.
    blocks: tuple[np.ndarray, ...] | None = None

    @property
    def dim(self) -> int:
        return int(self.X_train.shape[1])

    @property
    def n_train(self) -> int:
        return int(self.X_train.shape[0])


def partition_rows(n_rows: int, k: int, seed: int) -> list[np.ndarray]:
    """Split row indices 0..n_rows-1 into k near-equal blocks after a seeded shuffle.

    Block j gets rows ``perm[j::k]``-style balanced sizes (sizes differ by at most one);
    each block's indices are sorted so slicing a CSR matrix stays cheap.
    """
    if k < 1 or k > n_rows:
        raise ValueError(f"cannot split {n_rows} rows into {k} partitions")
    perm = np.random.default_rng(seed).permutation(n_rows)
    return [np.sort(block) for block in np.array_split(perm, k)]


def take_rows(X: Matrix, rows: np.ndarray) -> Matrix:
    if sp.issparse(X):
        return sp.csr_matrix(X[rows])
    return np.ascontiguousarray(X[rows])


def fingerprint(X: Matrix, y: np.ndarray) -> str:
    """A short digest of a partition's rows: workers that load data from their own
    ``--data-dir`` prove they hold the same rows the coordinator planned with."""
    import hashlib

    h = hashlib.sha256()
    h.update(np.asarray(X.shape, dtype=np.int64).tobytes())
    if sp.issparse(X):
        csr = sp.csr_matrix(X)
        for part in (csr.indptr.astype(np.int64), csr.indices.astype(np.int64), csr.data):
            h.update(np.ascontiguousarray(part, dtype=part.dtype).tobytes())
    else:
        h.update(np.ascontiguousarray(X, dtype=np.float64).tobytes())
    h.update(np.ascontiguousarray(y, dtype=np.float64).tobytes())
    return h.hexdigest()[:16]


def split(
    X: Matrix, y: np.ndarray, *, name: str, task: str, seed: int, test_fraction: float = 0.2
) -> Dataset:
    """The seeded train/test split every loaded dataset gets (the same rows for a seed)."""
    if not 0 < test_fraction < 1:
        raise DataError(f"{name}: test_fraction must be in (0, 1), got {test_fraction}")
    n = int(y.shape[0])
    n_test = round(n * test_fraction)
    if n - n_test < 1:
        raise DataError(f"{name}: test_fraction {test_fraction} leaves no training rows")
    perm = np.random.default_rng([seed, 0x5717]).permutation(n)
    test, train = np.sort(perm[:n_test]), np.sort(perm[n_test:])
    return Dataset(
        name=name,
        task=task,  # type: ignore[arg-type]
        X_train=take_rows(X, train),
        y_train=y[train],
        X_test=take_rows(X, test),
        y_test=y[test],
    )
