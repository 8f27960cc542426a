"""A worker that lies on purpose: the test instrument behind ``codedgd worker --corrupt``.

Like the straggler models, this exists to try the coordinator's defences for real
(robust aggregation, the coded vote, the norm guard; see docs/reliability.md), never
to train. The worker computes its honest message and then, before it leaves, replaces
it by one of:

- ``scale:F``: the message times F (``scale:1e6`` is the classic poisoned gradient);
- ``sign``: the message negated (gradient *ascent*; its norm looks perfectly normal);
- ``noise:S``: the message plus Gaussian noise of standard deviation S per coordinate,
  seeded by the worker's place and the round (a rerun corrupts identically).

Only star jobs' results are corrupted (a ring's or a tree's partial sums are not).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from codedgd.services.errors import ConfigError

KINDS = ("scale", "sign", "noise")
_USAGE = "expected scale:F, sign or noise:S (e.g. --corrupt scale:1e6)"


@dataclass(frozen=True)
class Corruption:
    kind: str
    value: float = 0.0

    @staticmethod
    def parse(text: str) -> Corruption:
        """``scale:1e6``, ``sign`` or ``noise:0.5``; a ConfigError naming the fix otherwise."""
        kind, _, value = text.strip().partition(":")
        if kind not in KINDS:
            raise ConfigError(f"--corrupt {text!r}: unknown kind {kind!r}; {_USAGE}")
        if kind == "sign":
            if value:
                raise ConfigError(f"--corrupt {text!r}: sign takes no value; {_USAGE}")
            return Corruption("sign")
        try:
            number = float(value)
        except ValueError:
            raise ConfigError(f"--corrupt {text!r}: {kind} needs a number; {_USAGE}") from None
        if not math.isfinite(number) or (kind == "noise" and number <= 0):
            raise ConfigError(
                f"--corrupt {text!r}: {kind} needs a finite"
                + (" positive" if kind == "noise" else "")
                + f" number; {_USAGE}"
            )
        return Corruption(kind, number)

    def apply(self, payload: np.ndarray, worker: int, round_: int) -> np.ndarray:
        """The lie sent instead of ``payload`` (a new array; ``payload`` is unchanged)."""
        if self.kind == "scale":
            return payload * self.value
        if self.kind == "sign":
            return -payload
        rng = np.random.default_rng((0xC0DED, worker, round_))
        return payload + rng.normal(0.0, self.value, size=payload.shape)

    def __str__(self) -> str:
        return self.kind if self.kind == "sign" else f"{self.kind}:{self.value:g}"
