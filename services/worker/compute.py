"""A worker's computation for one job: per-partition gradient sums, then encoding.

Pure numpy/scipy and synchronous: the worker service runs :meth:`Computer.compute`
in a thread (numpy releases the GIL), so its event loop stays free to receive a
Cancel. Cancellation is checked between partitions.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from services.codes.encoding import encode
from services.data.dataset import Matrix
from services.models.base import Model


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
        self.coefficients = np.asarray(coefficients, dtype=np.float64)
        self.options = dict(options or {})

    def compute(self, theta: np.ndarray, cancel: threading.Event | None = None) -> ComputeResult:
        start = time.perf_counter()
        grads = np.empty((len(self.partitions), theta.shape[0]), dtype=np.float64)
        for row, part in enumerate(self.partitions):
            if cancel is not None and cancel.is_set():
                raise Cancelled
            grads[row] = self.model.grad_sum(theta, part.X, part.y)
        if cancel is not None and cancel.is_set():
            raise Cancelled
        payload = encode(grads, self.coefficients)
        return ComputeResult(payload, time.perf_counter() - start)
