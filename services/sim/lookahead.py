"""The ``auto`` policy's look-ahead: which stop rule gets furthest, simulated from here.

Every ``window`` rounds :class:`Lookahead.choose` refits the delays of the last rounds
(:func:`~codedgd.services.stragglers.fitted.observe`, censored fits, resampled replay),
then runs each candidate stop rule K (erasurehead on the same groups, K = n being exact)
on the simulator (the vectorized engine; the events one for mini-batch rounds) for
``horizon`` rounds **from the current θ**, on the job's own data and model, all with the
same replayed delays (a paired comparison), averaged over ``replays`` replays. Every
candidate gets the time the current K's ``horizon`` rounds take; the one with the lowest
loss then wins, and the policy switches only when it makes more than ``margin`` (20 %)
more progress than the current K, so noise does not flap it.

The coordinator attaches one to an ``auto`` job with a cost model fitted from the live
rounds (compute per row from the reported compute seconds, links free: the recorded delays
hold them); the simulator attaches one with its own cost model. Each decision simulates
|choices| × horizon rounds: a weighted gradient and a loss evaluation each, on the
process that holds the data.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from codedgd.services.errors import CodedGDError
from codedgd.services.job import Component, JobConfig
from codedgd.services.job.prepare import Prepared
from codedgd.services.models import objective
from codedgd.services.policies.registry import create
from codedgd.services.records import RoundRecord
from codedgd.services.sim.cost import CostModel
from codedgd.services.sim.engine import Simulator, rows_per_round
from codedgd.services.sim.vectorized import VectorizedSimulator, not_vectorizable
from codedgd.services.stragglers.fitted import (
    DelayFit,
    Observations,
    ResampledDelay,
    fit_delays,
    observe,
)


class Lookahead:
    """Chooses ``auto``'s K by simulating the next rounds (see the module docstring)."""

    def __init__(
        self,
        config: JobConfig,
        prepared: Prepared,
        cost: CostModel | None = None,
        *,
        horizon: int | None = None,
        margin: float = 0.2,
        replays: int = 2,
    ) -> None:
        self.config = config
        self.prepared = prepared
        self.cost = cost
        self.horizon = horizon
        self.margin = margin
        self.replays = replays
        self.decisions = 0

    def _cost(self, records: Sequence[RoundRecord], obs_compute: float) -> CostModel:
        decode = float(np.median([r.decode_seconds for r in records]))
        if self.cost is not None:
            return self.cost.replace(decode_seconds=decode)
        rows = float(np.median(rows_per_round(self.prepared, self.config.batch_size)))
        return CostModel(
            seconds_per_sample=obs_compute / max(rows, 1.0),
            seconds_per_partition=0.0,
            latency_seconds=0.0,
            bandwidth_bytes_per_second=math.inf,
            decode_seconds=decode,
        )

    def _curve(
        self,
        seed: int,
        theta: np.ndarray,
        k: int,
        obs: Observations,
        tail: DelayFit,
        cost: CostModel,
        horizon: int,
        until: float,
    ) -> list[tuple[float, float]]:
        """(virtual seconds, loss) of stop rule K from θ: ``horizon`` rounds, or as many as
        fit in ``until`` seconds (at most 20·horizon)."""
        n = self.config.workers
        policy = self.prepared.policy
        r = int(getattr(policy, "r", 1))
        scaled = bool(getattr(policy, "scaled", True))
        options = {"r": r, "K": k, "scaled": scaled}
        candidate = create("erasurehead", options)
        plan = candidate.plan(n, len(self.prepared.blocks))
        prepared = dataclasses.replace(
            self.prepared, policy=candidate, plan=plan, theta0=np.array(theta, copy=True)
        )
        rounds = horizon if math.isinf(until) else 20 * horizon
        config = self.config.replace(
            rounds=rounds,
            target_loss=None,
            eval_every=1,
            init_from=None,
            policy=Component("erasurehead", options),
            stragglers=Component("none", {}),
        )
        # The vectorized engine where it can (most jobs); mini-batch rounds on the events one.
        sim: Simulator
        if not_vectorizable(config, prepared, cost):
            sim = Simulator(config, cost, prepared=prepared)
        else:
            sim = VectorizedSimulator(config, cost, prepared=prepared, per_worker=False)
        sim.straggler = ResampledDelay(obs, tail, seed=seed)
        curve: list[tuple[float, float]] = []

        def keep(record: RoundRecord) -> None:
            curve.append((record.wall_seconds, record.loss))
            if record.wall_seconds >= until:
                raise _Enough

        # Enough time used; or diverged or stuck: its curve so far competes either way.
        with contextlib.suppress(_Enough, CodedGDError):
            sim.run(on_record=keep)
        return curve

    def choose(
        self,
        t: int,
        theta: np.ndarray,
        records: Sequence[RoundRecord],
        current: int,
        choices: Sequence[int],
    ) -> tuple[int, str]:
        try:
            obs = observe(records, self.config.workers)
            tail = fit_delays(obs).best
        except CodedGDError as exc:
            return current, f"no refit: {exc}"
        cost = self._cost(records, obs.median_compute())
        horizon = self.horizon or len(records)
        ds = self.prepared.dataset
        start_loss = float(objective(self.prepared.model, theta, ds.X_train, ds.y_train))
        # The current rule's next `horizon` rounds set the time every candidate gets.
        order = [current, *[k for k in choices if k != current]]
        at: dict[int, float] = dict.fromkeys(order, 0.0)
        spans = []
        for replay in range(self.replays):  # the same replayed delays for every K
            seed = t * self.replays + replay
            until = math.inf
            for k in order:
                curve = self._curve(seed, theta, k, obs, tail, cost, horizon, until)
                if k == current:
                    until = curve[-1][0] if curve else 0.0
                    spans.append(until)
                at[k] += _loss_at(curve, until, start_loss) / self.replays
        self.decisions += 1
        horizon_s = float(np.mean(spans))
        allowed = [k for k in at if k in choices]  # the warm-up K need not be a choice
        best = min(allowed, key=lambda k: (at[k], -k))
        progress = start_loss - at[current] if current in at else math.inf
        gain = at.get(current, math.inf) - at[best]
        shown = ", ".join(f"K={k}: {at[k]:.6g}" for k in sorted(at))
        if current not in choices or (best != current and gain > self.margin * max(progress, 0.0)):
            return best, f"predicted loss after {horizon_s:.3g} s: {shown}"
        return current, f"kept; predicted loss after {horizon_s:.3g} s: {shown}"


class _Enough(Exception):
    """A look-ahead candidate has used the time it was given."""


def _loss_at(curve: list[tuple[float, float]], when: float, start: float) -> float:
    """The loss of the last round done by ``when`` (the start's if none)."""
    done = [loss for wall, loss in curve if wall <= when + 1e-12]
    return done[-1] if done else start
