"""A worker's computation for one job: per-partition gradient sums, then encoding.

Pure numpy/scipy and synchronous: the worker service runs :meth:`Computer.compute`
in a thread (numpy releases the GIL), so its event loop stays free to receive a
Cancel. Cancellation is checked between partitions.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from codedgd.services.codes.encoding import encode
from codedgd.services.data.dataset import Matrix
from codedgd.services.models.base import Model


class Cancelled(Exception):
    """The round was cancelled while computing."""


@dataclass(frozen=True)
class PartitionRows:
    index: int
    X: Matrix
    y: np.ndarray


@dataclass(frozen=True)
class ComputeResult:
    payload: np.ndarray
    seconds: float


class CancelFlag:
    """Set once to stop a round's work; the compute thread polls it between partitions.

    Nothing ever waits on it, so it needs no lock (a threading.Event builds a Condition
    and a Lock, per round): an attribute read and write are atomic in CPython.
    """

    __slots__ = ("_set",)

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set


class Computer:
    """Computes one worker's encoded message for a given θ."""

    def __init__(
        self,
        model: Model,
        partitions: Sequence[PartitionRows],
        coefficients: np.ndarray,
        options: Mapping[str, str] | None = None,
    ) -> None:
        if coefficients.shape[0] != len(partitions):
            raise ValueError(
                f"{len(partitions)} partitions but {coefficients.shape[0]} coefficient rows"
            )
        self.model = model
        self.partitions = list(partitions)
        # Checked once, here (a DataError refuses the assignment), not every round.
        self._blocks = [model.block(part.X, part.y) for part in self.partitions]
        self.coefficients = np.asarray(coefficients, dtype=np.float64)
        self.options = dict(options or {})

    def compute(self, theta: np.ndarray, cancel: CancelFlag | None = None) -> ComputeResult:
        start = time.perf_counter()
        if self.coefficients.shape[1] == 1:
            payload = self._compute_summed(theta, cancel)
        else:
            grads = np.empty((len(self.partitions), theta.shape[0]), dtype=np.float64)
            for row, block in enumerate(self._blocks):
                _check(cancel)
                grads[row] = block.grad_sum(theta)
            payload = encode(grads, self.coefficients)
        _check(cancel)
        return ComputeResult(payload, time.perf_counter() - start)

    def _compute_summed(self, theta: np.ndarray, cancel: CancelFlag | None) -> np.ndarray:
        """Σ_j c_j g_j accumulated in place: no (p, ℓ) matrix, no copy for c_j = 1."""
        payload: np.ndarray | None = None
        for row, block in enumerate(self._blocks):
            _check(cancel)
            g = block.grad_sum(theta)
            c = float(self.coefficients[row, 0])
            if payload is None:
                payload = g if c == 1.0 else c * g
            elif c == 1.0:
                payload += g
            else:
                payload += c * g
        return payload if payload is not None else np.zeros(theta.shape[0])


def _check(cancel: CancelFlag | None) -> None:
    if cancel is not None and cancel.is_set():
        raise Cancelled
