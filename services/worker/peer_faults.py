"""A worker that misbehaves towards its peers on purpose: ``codedgd worker --peer-fault``.

A test instrument, like ``--corrupt``: it lets tests and benchmarks check that a ring's
or a tree's round survives a bad peer, and that the fault really fired.

- ``silent:R``: from round R on, nothing reaches this worker's peers (no θ passed on, no
  partial sum, no cancel), while its stream to the coordinator stays open and its
  heartbeats go on: a peer that hangs without failing, which only a deadline catches.
- ``shape:R``: from round R on, every tensor pushed to a peer is one value short: a
  member of the job sending what its peers must refuse without losing their round.

The first time a fault fires the worker logs it at WARNING, naming the instrument.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from codedgd.services.errors import ConfigError

log = logging.getLogger("codedgd.worker")
KINDS = ("silent", "shape")
_USAGE = "expected silent:ROUND or shape:ROUND (e.g. --peer-fault silent:3)"


@dataclass
class PeerFault:
    kind: str
    start: int  # the first round it applies to
    fired: int = field(default=0)  # pushes dropped or altered

    @staticmethod
    def parse(text: str) -> PeerFault:
        kind, _, value = text.partition(":")
        if kind not in KINDS:
            raise ConfigError(f"--peer-fault {text!r}: unknown kind {kind!r}; {_USAGE}")
        try:
            start = int(value)
        except ValueError:
            raise ConfigError(f"--peer-fault {text!r}: {kind} needs a round; {_USAGE}") from None
        if start < 0:
            raise ConfigError(f"--peer-fault {text!r}: the round must be >= 0; {_USAGE}")
        return PeerFault(kind, start)

    def _fire(self) -> None:
        if self.fired == 0:
            log.warning(
                "TEST INSTRUMENT --peer-fault %s:%d fired: %s",
                self.kind,
                self.start,
                "sending nothing to peers"
                if self.kind == "silent"
                else "pushing tensors one value short",
            )
        self.fired += 1

    def silences(self, round_: int) -> bool:
        """Should a push of ``round_`` be dropped?"""
        if self.kind == "silent" and round_ >= self.start:
            self._fire()
            return True
        return False

    def reshaped(self, round_: int, array: np.ndarray) -> np.ndarray:
        """The tensor to push in ``round_`` (one value short once ``shape`` applies)."""
        if self.kind == "shape" and round_ >= self.start and array.shape[0] > 1:
            self._fire()
            return array[:-1]
        return array
