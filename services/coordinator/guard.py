"""The norm guard (``job.max_norm_ratio``): results far larger than their peers' are faults.

A worker that sends its gradient scaled by 10^6 passes every check of shape, dtype and
finiteness, and one such message moves θ arbitrarily far. The guard compares each
arrival's size with what honest workers have been sending:

    size(w) = ‖payload_w‖₂ / Σ_{j,u} |coefficients_w[j, u]|

(the norm per unit of the code's coefficients, so a cyclic code's heavier rows are not
mistaken for attacks), and throws out a worker whose size exceeds ``ratio`` times the
median size of recently accepted arrivals (the last ``memory`` of them, across workers
and rounds). Until it has seen three arrivals (the first round) it holds them back and
judges them against their own median, so a worker corrupt from the very start is caught
too, unless fewer than three arrivals come at all (then they are accepted unjudged).

The guard sees only sizes: a sign-flipped or subtly wrong gradient passes. The robust
policies (``median``, ``trimmed-mean``, ``frc`` with ``byzantine`` > 0) handle those.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np

# Arrivals needed before a median means anything against one outlier.
QUORUM = 3

Arrival = tuple[int, np.ndarray | None]


class NormGuard:
    """Judges one job's arrivals; :meth:`admit` says which to offer and which to throw out."""

    def __init__(self, ratio: float, scales: Sequence[float], memory: int) -> None:
        self.ratio = ratio
        self.scales = [s if s > 0 else 1.0 for s in scales]  # worker → Σ|coefficients|
        self.history: deque[float] = deque(maxlen=max(memory, QUORUM))
        self._held: dict[int, tuple[np.ndarray, float]] = {}  # before the first judgement

    @property
    def held(self) -> frozenset[int]:
        """Workers whose arrival is held back, not yet offered to the policy."""
        return frozenset(self._held)

    def end_round(self) -> None:
        self._held.clear()

    def admit(
        self, worker: int, payload: np.ndarray | None, still_coming: int
    ) -> tuple[list[Arrival], dict[int, str]]:
        """(arrivals to offer now, in order; workers to throw out, with why).

        ``still_coming``: how many more arrivals this round may bring.
        """
        if payload is None:  # a lazy policy's skip carries no vector to judge
            return [(worker, None)], {}
        size = float(np.linalg.norm(payload)) / self.scales[worker]
        if len(self.history) >= QUORUM:
            reference = float(np.median(self.history))
            problem = self._judge(worker, size, reference)
            if problem:
                return [], {worker: problem}
            self.history.append(size)
            return [(worker, payload)], {}
        self._held[worker] = (payload, size)
        return self.settle(still_coming)

    def settle(self, still_coming: int) -> tuple[list[Arrival], dict[int, str]]:
        """Judge the held arrivals once there are enough of them, or no more will come."""
        if not self._held or (len(self._held) < QUORUM and still_coming > 0):
            return [], {}
        held, self._held = self._held, {}
        if len(held) < QUORUM:  # too few to tell an outlier: accept them
            self.history.extend(size for _, size in held.values())
            return [(w, p) for w, (p, _) in held.items()], {}
        reference = float(np.median([size for _, size in held.values()]))
        released: list[Arrival] = []
        faults: dict[int, str] = {}
        for w, (payload, size) in held.items():
            problem = self._judge(w, size, reference)
            if problem:
                faults[w] = problem
            else:
                released.append((w, payload))
                self.history.append(size)
        return released, faults

    def _judge(self, worker: int, size: float, reference: float) -> str:
        if reference > 0 and size > self.ratio * reference:
            return (
                f"norm guard: worker {worker}'s result is {size / reference:.3g} times the "
                f"size of recent results (job.max_norm_ratio = {self.ratio:g})"
            )
        return ""
