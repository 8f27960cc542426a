"""Straggler (delay) models: seeded delays injected after a worker's compute.

Every draw is a pure function of (seed, round, worker, ...): the same job seed
gives every policy the same delays in the same round, in real runs and in the
simulator alike.
"""

from __future__ import annotations

from typing import ClassVar, Protocol


class StragglerModel(Protocol):
    name: ClassVar[str]

    def delay(self, worker: int, round: int, compute_seconds: float, load: float) -> float:
        """Extra seconds worker ``worker`` waits in ``round`` after computing.

        ``compute_seconds`` is its measured compute time in this round and ``load``
        its computation load (partitions held / k); models that scale with load use it.
        """
        ...
