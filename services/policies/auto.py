"""``auto``: erasurehead's placement, with the stop rule chosen online by a look-ahead.

Groups of r workers share r partitions (frc's and erasurehead's placement). What a round
waits for is the one choice that needs no data movement: stop at the K-th arrival or once
every group has one (K = n: exact, frc with s = r − 1; smaller K: erasurehead's early
stop, unbiased by the 1/(1−p) rescaling). The round starts exact (K = n). Every
``window`` rounds an attached chooser (the coordinator and the simulator attach
:class:`codedgd.services.sim.lookahead.Lookahead`) refits the delays of the last rounds
and simulates the next rounds from the current θ under every candidate K; the policy
switches to the K the simulator predicts gets furthest in the same time, and says so
(:meth:`round_note`: logged, counted, written into the round's record).

Without a chooser (a policy object used alone) it stays at K = n. Changing r, the lazy
thresholds, or moving data to a new assignment is not done yet (docs/tuning.md).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from codedgd.services.codes.erasurehead import erasure_probability
from codedgd.services.errors import ConfigError, PlanError
from codedgd.services.policies.base import Param, Plan, RoundSpec
from codedgd.services.policies.erasurehead import ErasureHead
from codedgd.services.policies.registry import register
from codedgd.services.records import RoundRecord


class Chooser(Protocol):
    """Picks the stop rule for the next rounds from the rounds so far."""

    def choose(
        self,
        t: int,
        theta: np.ndarray,
        records: Sequence[RoundRecord],
        current: int,
        choices: Sequence[int],
    ) -> tuple[int, str]:
        """(K to use from round t on, why) given the last rounds' records."""
        ...


@register
class Auto(ErasureHead):
    name = "auto"
    summary = (
        "adaptive: groups of r workers share r partitions; every `window` rounds a "
        "look-ahead on the simulator, with the delays refitted from the last rounds, picks "
        "how many arrivals to wait for (K = n: exact frc; fewer: erasurehead)"
    )
    exact = False
    adapts = True
    parameters = (
        Param("r", int, 2, "group size: workers sharing the same r partitions (r must divide n)"),
        Param("window", int, 10, "rounds between decisions, and rounds refitted (>= 5)"),
        Param(
            "choices",
            str,
            "",
            "the K values to choose among, comma-separated (default n/4, n/2, 3n/4 and n); "
            "rounds before the first decision wait for every group (K = n) regardless",
        ),
    )

    def __init__(self, r: int = 2, window: int = 10, choices: str = "") -> None:
        super().__init__(r=r, K=0, delta=1.0)
        if window < 5:
            raise ConfigError(f"auto: window must be >= 5 rounds (a fit needs them), got {window}")
        self.window = window
        self.choices_text = choices
        self.choices: tuple[int, ...] = ()
        self.chooser: Chooser | None = None
        self.switches = 0
        self._records: deque[RoundRecord] = deque(maxlen=window)
        self._note = ""
        self._pending: tuple[int, int, str] | None = None

    def plan(self, n_workers: int, n_partitions: int) -> Plan:
        plan = super().plan(n_workers, n_partitions)
        if self.choices_text.strip():
            try:
                wanted = {int(v) for v in self.choices_text.split(",")}
            except ValueError:
                raise PlanError(
                    f"auto: choices={self.choices_text!r}: give K values, comma-separated"
                ) from None
        else:
            wanted = {math.ceil(n_workers * f) for f in (0.25, 0.5, 0.75)} | {n_workers}
        bad = sorted(k for k in wanted if not 1 <= k <= n_workers)
        if bad:
            raise PlanError(f"auto: choices {bad} are not in 1..n={n_workers}")
        self.choices = tuple(sorted(wanted))
        self._use(n_workers)
        return plan

    def attach(self, chooser: Chooser) -> None:
        """Let ``chooser`` pick K every ``window`` rounds."""
        self.chooser = chooser

    def _use(self, k: int) -> None:
        self.k = k
        self.p = erasure_probability(self._n, self.r, k)
        self.scale = 1.0 / (1.0 - self.p) if self.scaled else 1.0

    def between_rounds(self, t: int, theta: np.ndarray) -> None:
        """Every ``window`` rounds, ask the chooser (slow: the coordinator runs it in a
        thread); the switch takes effect in :meth:`begin_round` of the same round."""
        due = t > 0 and t % self.window == 0 and len(self._records) >= 5
        if due and self.chooser is not None:
            k, why = self.chooser.choose(t, theta, list(self._records), self.k, self.choices)
            self._pending = (t, k, why)

    def begin_round(self, t: int, theta: np.ndarray) -> RoundSpec:
        self._note = ""
        pending, self._pending = self._pending, None
        if pending is not None and pending[0] == t and pending[1] != self.k:
            _, k, why = pending
            self._note = f"auto: K {self.k} -> {k} ({why})"
            self.switches += 1
            self._use(k)
        return super().begin_round(t, theta)

    def observe(self, record: RoundRecord) -> None:
        self._records.append(record)

    def round_note(self) -> str:
        return self._note

    def state(self) -> dict[str, Any]:
        return {"k": self.k}  # the K in use: a resumed job goes on with it

    def load_state(self, state: Mapping[str, Any]) -> None:
        k = state.get("k")
        if not (isinstance(k, int) and 1 <= k <= self._n):
            raise ConfigError(f"auto: the checkpoint's K={k!r} is not in 1..n={self._n}")
        self._use(k)
