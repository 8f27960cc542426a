"""The in-memory dataset type every loader returns, and seeded partitioning."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeAlias

import numpy as np
import scipy.sparse as sp

Matrix: TypeAlias = np.ndarray | sp.csr_matrix
Task: TypeAlias = Literal["classification", "regression"]


@dataclass(frozen=True)
class Dataset:
    """A train/test split. Labels are {0, 1} floats for classification."""

    name: str
    task: Task
    X_train: Matrix
    y_train: np.ndarray
    X_test: Matrix
    y_test: np.ndarray

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
