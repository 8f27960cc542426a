"""A worker's computation for one job: per-partition gradient sums, then encoding.

Pure numpy/scipy and synchronous: the worker service runs :meth:`Computer.compute`
in a thread (numpy releases the GIL), so its event loop stays free to receive a
Cancel. Cancellation is checked between partitions. With ``batch_size`` (mini-batch
rounds), each partition's gradient is over the round's sample of its rows, scaled to
estimate its full sum (:mod:`codedgd.services.compute.batches`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from codedgd.services.codes.encoding import encode
from codedgd.services.compute.batches import batch_rows, batch_scale
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
        *,
        batch_size: int = 0,
        seed: int = 0,
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
        self.batch_size = int(batch_size)  # 0: every row of every partition, every round
        self.seed = int(seed)

    def compute(
        self, theta: np.ndarray, cancel: CancelFlag | None = None, round_: int = 0
    ) -> ComputeResult:
        """This worker's message at θ (in mini-batch rounds, on round ``round_``'s sample)."""
        start = time.perf_counter()
        if self.coefficients.shape[1] == 1:
            payload = self._compute_summed(theta, cancel, round_)
        else:
            grads = np.empty((len(self.partitions), theta.shape[0]), dtype=np.float64)
            for row in range(len(self._blocks)):
                _check(cancel)
                grads[row] = self._gradient(row, theta, round_)
            payload = encode(grads, self.coefficients)
        _check(cancel)
        return ComputeResult(payload, time.perf_counter() - start)

    def rows_used(self, row: int, round_: int) -> np.ndarray | None:
        """The rows of the ``row``-th partition held that round ``round_`` uses (None: all)."""
        part = self.partitions[row]
        return batch_rows(self.seed, round_, part.index, int(part.X.shape[0]), self.batch_size)

    def _gradient(self, row: int, theta: np.ndarray, round_: int) -> np.ndarray:
        block = self._blocks[row]
        rows = self.rows_used(row, round_) if self.batch_size > 0 else None
        if rows is None:
            return block.grad_sum(theta)
        g = block.grad_sum_rows(theta, rows)
        g *= batch_scale(int(self.partitions[row].X.shape[0]), rows)
        return g

    def _compute_summed(
        self, theta: np.ndarray, cancel: CancelFlag | None, round_: int
    ) -> np.ndarray:
        """Σ_j c_j g_j accumulated in place: no (p, ℓ) matrix, no copy for c_j = 1."""
        payload: np.ndarray | None = None
        for row in range(len(self._blocks)):
            _check(cancel)
            g = self._gradient(row, theta, round_)
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
