"""The ``auto`` policy's look-ahead: which rule saves the most time, simulated from here.

Every ``window`` rounds :meth:`Lookahead.choose` refits the delays of the last rounds
(:func:`~codedgd.services.stragglers.fitted.observe`, censored fits, resampled replay;
censored values informed by each worker's own earlier delays, or their bounds raised by
its earlier bounds, and drawn beyond them from the better-fitting family's tail, or
the exponential's where that is a Pareto with an infinite mean: ``Fit.tail``; with
auto's ``tail`` option, from that law until it no longer fits the job's own rounds:
:data:`TAIL_TEST_ROUNDS`), then
runs candidates on the simulator (the vectorized engine; the events one for mini-batch
rounds) **from the current θ**, on the job's own data and model, all with the
same replayed delays (a paired comparison), ``replays`` times:

1. the current (r, K) for ``horizon`` rounds: it gets from the current loss to L (its
   lowest) in T seconds;
2. every other candidate (erasurehead with groups of r and stop rule K, or g-lag on
   groups of r with trigger weight ξ, going on from the job's lazy memory: see
   :meth:`Lookahead._rule`) until it reaches
   L, or has used T / (1 − margin) seconds (beyond that it cannot win), and for
   horizon / 2 rounds more once it has: τ seconds to get below L **and stay there** (an
   approximate rule at its noise floor dips below a loss and back; it does not count).
   A lazy rule on groups of another size starts their messages afresh (its first round
   asks every group): what that round takes beyond the rule's other rounds is paid once
   (below), not counted in τ, and its budget starts after it.
3. with a lazy rule in use and candidates that restart, the current rule restarted too:
   T′ to its lowest loss L′, its restart left out likewise. Those candidates are judged
   against T′ and L′ (the same phase of the lazy rounds' rhythm: groups refreshed
   together fire together again, and a window holds that burst or not).

A candidate that reaches L in τ would make the current's progress ``T / τ`` (or ``T′/τ``)
times as fast, so over the job's remaining rounds (``rounds − t``; with a target
loss, as many as its curve says it needs, progress shrinking geometrically; each taking
T / horizon) it saves ``remaining · (1 − τ / T)`` seconds, **minus the cost of moving
data** when its r differs from the current one (each worker is shipped the rows of the
partitions its new group has and it lacks) and of a restart round. The policy switches
to the candidate that saves the most, if it is at least ``margin`` (20 %) faster than
the current (so noise does not flap it) and saves more than the move costs. The cost of
a move: on the coordinator, measured (seconds per row shipped at the job's start, then
at each move); in the simulator, its cost model's links
(:func:`~codedgd.services.sim.cost.move_seconds`).

The coordinator attaches one to an ``auto`` job with a cost model fitted from the live
rounds (compute per row from the reported compute seconds, links free: the recorded
delays hold them); the simulator attaches one with its own cost model. A decision
simulates at most ``replays`` × (horizon + |candidates| × 1.75 horizon) rounds, each a
weighted gradient and a loss evaluation, on the process that holds the data, over at
most ``rows`` training rows (a larger job is sampled, each partition alike: see
:meth:`Lookahead._sampled`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from codedgd.services.data.dataset import take_rows
from codedgd.services.errors import CodedGDError
from codedgd.services.job import Component, JobConfig
from codedgd.services.job.prepare import Prepared, job_context
from codedgd.services.models import objective
from codedgd.services.optim import objective_gradient
from codedgd.services.policies.auto import Choice
from codedgd.services.policies.base import JobContext, Plan, Policy
from codedgd.services.policies.lag import DEFAULT_D
from codedgd.services.policies.registry import create
from codedgd.services.records import RoundRecord
from codedgd.services.sim.cost import CostModel, move_seconds
from codedgd.services.sim.engine import Simulator, partition_bytes, rows_per_round
from codedgd.services.sim.vectorized import VectorizedSimulator, not_vectorizable
from codedgd.services.stragglers.fitted import (
    MIN_LIVE_ROUNDS,
    DelayFit,
    Observations,
    ResampledDelay,
    fit_delays,
    observe,
    timed_records,
    typical_fit,
)

log = logging.getLogger(__name__)

Shipping = Callable[[Plan, Plan], float]
"""Seconds to move a job's workers from the first plan to the second."""

# Standard errors above the typical worker at which a worker of a refit window counts as
# persistently slow: flat, not grown with n as tune's whole-run records are
# (:func:`~codedgd.services.stragglers.fitted.chance_limit`). A window is short (W rounds),
# so a slow worker barely stands out of it, and missing one costs more than a chance one
# the next refit corrects: with 3.4 at n = 16, auto on two-classes lost its slow half and
# went from 0.97 to 1.08 of the best fixed policy (docs/tuning.md).
LIVE_SIGMAS = 3.0

# auto's tail option (the law `tune --write-auto` fitted to an earlier run) gives way to
# the job's own when it no longer fits them: tested at every decision once the job has
# TAIL_TEST_ROUNDS timed rounds, pooled over decisions (the last TAIL_POOL_ROUNDS kept),
# against their own fit over the typical workers. It gives way when its
# Kolmogorov–Smirnov distance to their Kaplan–Meier estimate is TAIL_MARGIN beyond
# their own fit's and beyond KS_CRITICAL / sqrt(the uncensored values) (the 5 % critical
# value of a law not fitted to them: with few values only a law far off gives way). Early,
# because a stale law does its harm in the warm-up's decisions (rounds 2-10): from a run
# of light exponential delays, auto on Pareto ones moved to single workers at round 6
# (read from the round records by a diagnostic script; tested at 10 or 30 rounds, by
# bench_auto_stale_tail, the test came after that and changed nothing). On the job's own
# law the option's distance was within 0.02 of their fit's (docs/tuning.md, "A tail that
# no longer fits").
TAIL_TEST_ROUNDS = 4
TAIL_POOL_ROUNDS = 60
TAIL_MARGIN = 0.1
KS_CRITICAL = 1.36


class Lookahead:
    """Chooses ``auto``'s (r, K) by simulating the next rounds (see the module docstring)."""

    def __init__(
        self,
        config: JobConfig,
        prepared: Prepared,
        cost: CostModel | None = None,
        *,
        shipping: Shipping | None = None,
        horizon: int | None = None,
        margin: float = 0.2,
        replays: int = 2,
        memory: int = 6,
        rows: int = 8192,
    ) -> None:
        self.config = config
        self.prepared = prepared
        self.cost = cost
        self.shipping = shipping
        self.horizon = horizon
        self.margin = margin
        self.replays = replays
        self.decisions = 0
        self._plans: dict[int, Plan] = {}
        self._sizes: list[int] | None = None  # each partition's bytes on the wire
        # Each worker's latest answered delays, over decisions: what a censored delay hides.
        self.memory = memory
        self.rows = rows  # most training rows a decision simulates on (see _sampled)
        self._sample: tuple[Prepared, float] | None = None
        self._contexts: dict[bool, JobContext] = {}  # (whole data?) -> a lazy rule's binding
        self._history: list[np.ndarray] = [np.empty(0)] * config.workers
        self._bounds: list[np.ndarray] = [np.empty(0)] * config.workers  # cancelled at
        # The decision at which each worker last answered a round (-inf: never).
        self._heard = [-math.inf] * config.workers
        # Each replaced place's first round of its new machine (renew): the rounds before
        # it, while still in the window, are the old one's.
        self._new_from: dict[int, int] = {}
        # auto's prior (each worker's slowness on an earlier run) stands in for a worker
        # until it answers, as a bound: its delay is at least what that slowness means in
        # relative terms (its excess beyond the typical worker's, per second of compute),
        # and beyond that drawn from the fitted tail; and it is never unheard. An empty
        # entry: not known (the earlier run never waited for it). (Until 2026-11-29 as a
        # delay: a typical worker's censored delays were then all typical, the pool's tail
        # was lost, and on Pareto delays auto moved to single workers.)
        prior = tuple(getattr(prepared.policy, "prior", ()) or ())
        if len(prior) != config.workers:
            prior = ()
        self.tail: DelayFit | None = getattr(prepared.policy, "tail", None)
        # The job's own timed rounds, pooled over decisions while a tail option holds
        # (round → its observed row: excess, censored, compute), and why the option gave
        # way to their fit ("" while it holds).
        self._pool: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self.stale = ""
        self.known = {w for w, v in enumerate(prior) if v is not None}
        for w in self.known:
            self._bounds[w] = _prior_bound(prior[w])

    @staticmethod
    def warm() -> None:
        """Import what a decision needs (scipy.stats: a second or more, once per process),
        so the first decision is not that much later than the rounds it starts from."""
        importlib.import_module("scipy.stats")

    def _sampled(self) -> tuple[Prepared, float]:
        """(the job with at most ``rows`` training rows, the fraction of rows it keeps).

        A decision simulates hundreds of rounds, each a gradient and a loss over the
        training rows; on a job of 40,000 rows it took seconds (rounds there take tens
        of milliseconds, so the choice came 20-50 rounds late). Every partition keeps
        the same fraction of its rows (seeded), the held-out set too, and the cost model
        charges each kept row for the rows it stands for, so the simulated seconds are
        the job's. Mini-batch jobs are not sampled: their rounds are small already.
        """
        if self._sample is None:
            self._sample = _subsample(self.prepared, self.rows, self.config)
        return self._sample

    def _misleads(self, theta: np.ndarray) -> bool:
        """Whether the sample's gradient at θ is further from the job's than
        :data:`SAMPLE_OFF` times the job's own length. Near the optimum the job's
        gradient is small and the sample's is not (its optimum is elsewhere): simulated on
        the sample, every rule makes progress toward that other optimum, which the job
        would not make. (At a step of 2/L, n = 64, decided on the sample from round 30,
        auto moved to early stops that stalled and took 2-3x the best fixed rule's time.)"""
        sample = self._sampled()[0]
        job = _gradient(self.prepared, theta)
        off = float(np.linalg.norm(_gradient(sample, theta) - job))
        return off > SAMPLE_OFF * float(np.linalg.norm(job))

    def _cost(
        self, records: Sequence[RoundRecord], obs_compute: float, whole: bool = False
    ) -> CostModel:
        """The cost model a decision simulates with: on the sample of rows (each charged
        for the rows it stands for), or with ``whole``, on all of them."""
        decode = float(np.median([r.decode_seconds for r in records]))
        sample, kept = (self.prepared, 1.0) if whole else self._sampled()
        if self.cost is not None:
            per_row = self.cost.seconds_per_sample
            return self.cost.replace(
                decode_seconds=decode,
                seconds_per_sample=per_row / kept if per_row is not None else None,
            )
        rows = float(np.median(rows_per_round(sample, self.config.batch_size)))
        return CostModel(
            seconds_per_sample=obs_compute / max(rows, 1.0),
            seconds_per_partition=0.0,
            latency_seconds=0.0,
            bandwidth_bytes_per_second=math.inf,
            decode_seconds=decode,
        )

    def _remember(self, seen: Observations) -> None:
        """Keep each worker's latest delays (``memory`` of them, as
        :meth:`Observations.relative` values) for the decisions to come
        (:meth:`Observations.informed`): every answered delay, and apart from them, a
        cancelled worker's bound when it exceeds what was known of it (it was at least
        that slow; a bound, not a delay).

        A worker that answered in these rounds speaks for itself: what was remembered of
        it before is dropped. (Kept, the slow delays of a phase that had ended hid a
        calm one for two or three decisions: on the alternating scenario auto moved
        back to smaller groups 15-25 rounds into the calm phase; now 5.)"""
        relative = seen.relative()
        for w in range(seen.n_workers):
            past, cuts = list(self._history[w]), list(self._bounds[w])
            if (~seen.censored[:, w] & ~np.isnan(seen.excess[:, w])).any():
                self._heard[w] = self.decisions
                past, cuts = [], []
            for value, cut in zip(relative[:, w], seen.censored[:, w], strict=True):
                if np.isnan(value):
                    continue
                if not cut:
                    past.append(float(value))
                elif not (past or cuts) or value > float(np.median(past or cuts)):
                    cuts.append(float(value))
            self._history[w] = np.asarray(past[-self.memory :], dtype=np.float64)
            self._bounds[w] = np.asarray(cuts[-self.memory :], dtype=np.float64)

    def _remaining(self, t: int, start: float, curve: list[tuple[float, float]]) -> float:
        """Rounds the job has left at the current rule's pace: to job.rounds, or with a
        target loss, the rounds the current rule's ``curve`` (from loss ``start``) says it
        needs to get there. Progress is taken to shrink geometrically, at the rate its
        second half of the curve shrank against its first; a target it would never reach
        at that rate leaves job.rounds."""
        left = float(max(self.config.rounds - t, 0))
        target = self.config.target_loss
        losses = [loss for _, loss in curve]
        if target is None or not math.isfinite(target) or len(losses) < 4:
            return left
        reached = next((i + 1 for i, loss in enumerate(losses) if loss <= target), None)
        if reached is not None:
            return float(min(reached, left))
        half = len(losses) // 2
        first, second = start - losses[half - 1], losses[half - 1] - losses[-1]
        if not (first > 0 and second > 0 and math.isfinite(first + second)):
            return left
        gap, rate = losses[-1] - target, second / first  # per half of the curve
        if rate >= 1.0:
            halves = gap / second
        elif gap >= second * rate / (1.0 - rate):
            return left  # not at this rate: it slows down before it gets there
        else:
            halves = math.ceil(
                math.log(1.0 - gap * (1.0 - rate) / (second * rate)) / math.log(rate)
            )
        return float(min(left, len(losses) + halves * (len(losses) - half)))

    def plan_for(self, r: int) -> Plan:
        """The placement of groups of r (what a candidate with that r runs)."""
        if r not in self._plans:
            policy = create("erasurehead", {"r": r, "K": self.config.workers})
            self._plans[r] = policy.plan(self.config.workers, len(self.prepared.blocks))
        return self._plans[r]

    def _blind(self, r: int, unheard: Sequence[int]) -> bool:
        """Would groups of r hold one of ``unheard`` workers only (so that its rounds wait
        for delays never seen)? A group with a worker heard from ends its part of a round
        with that worker's answer at the latest; a censored delay drawn beyond its bound
        for the others decides little there."""
        if not unheard:
            return False
        silent = set(unheard)
        groups: dict[tuple[int, ...], list[int]] = {}
        for w, assignment in enumerate(self.plan_for(r).workers):
            groups.setdefault(tuple(assignment.partitions), []).append(w)
        return any(all(w in silent for w in members) for members in groups.values())

    def move_cost(self, r: int) -> float:
        """Predicted seconds to move the job from its current plan to groups of r."""
        current = self.prepared.plan
        target = self.plan_for(r)
        if self.shipping is not None:
            return self.shipping(current, target)
        cost = self.cost if self.cost is not None else CostModel()
        if self._sizes is None:  # (each partition's rows, copied once: not per decision)
            self._sizes = partition_bytes(self.prepared)
        sizes = self._sizes
        nbytes = [sum(sizes[p] for p in parts) for parts in current.lacking(target)]
        return move_seconds(cost, nbytes)

    def restarts(self, choice: Choice, memory: Mapping[str, Any] | None) -> bool:
        """Whether ``choice``'s first round asks every group afresh where it otherwise
        would not: a lazy rule on groups of another size than the lazy memory's (their
        messages start with none), past LAG's warm-up (in which every group is asked
        anyway)."""
        if not choice.lazy or memory is None or _goes_on(memory, self.config.workers // choice.r):
            return False
        depth = int(getattr(self.prepared.policy, "D", DEFAULT_D))
        return int(memory.get("rounds", 0)) + 1 > depth

    def _rule(
        self, choice: Choice, data: Prepared, whole: bool, memory: Mapping[str, Any] | None
    ) -> tuple[str, dict[str, Any], Policy, Plan]:
        """(name, options, policy, plan) of the rule ``choice`` runs, on ``data``.

        Eager: erasurehead with groups of r and stop rule K. Lazy: g-lag on the same
        groups, going on from the job's lazy rounds (``memory``: each group's θ̂ and the
        θ history): each group's latest message is recomputed on ``data`` at its θ̂ (on a
        sample of rows the job's own messages are sums over other rows), and groups of
        another r than the memory's start with none (the first round asks them all)."""
        n = self.config.workers
        if not choice.lazy:
            scaled = bool(getattr(self.prepared.policy, "scaled", True))
            options: dict[str, Any] = {"r": choice.r, "K": choice.k, "scaled": scaled}
            eager = create("erasurehead", options)
            return "erasurehead", options, eager, eager.plan(n, len(data.blocks))
        if memory is None:
            raise CodedGDError(f"auto: {choice} is lazy, but the decision has no lazy memory")
        depth = int(getattr(self.prepared.policy, "D", DEFAULT_D))
        ride = float(getattr(self.prepared.policy, "ride", 1.0))
        options = {"s": choice.r - 1, "xi": choice.xi, "D": depth, "ride": ride}
        lazy = create("g-lag", options)
        plan = lazy.plan(n, len(data.blocks))
        lazy.bind(self._context_of(data, whole))
        units = n // choice.r
        held = np.asarray(memory["has"], dtype=bool)
        if _goes_on(memory, units):
            theta_hat = np.asarray(memory["theta_hat"], dtype=np.float64)
            latest = np.zeros_like(theta_hat)
            ds, model = data.dataset, data.model
            for u in np.flatnonzero(held):
                rows = np.concatenate(
                    [data.blocks[p] for p in plan.workers[u * choice.r].partitions]
                )
                latest[u] = model.grad_sum(
                    theta_hat[u], take_rows(ds.X_train, rows), ds.y_train[rows]
                )
            state = {**memory, "latest": latest, "theta_hat": theta_hat, "has": held}
        else:
            state = {**memory, "latest": None, "theta_hat": None, "has": np.zeros(units, bool)}
        lazy.load_state(state)
        return "g-lag", options, lazy, plan

    def _context_of(self, data: Prepared, whole: bool) -> JobContext:
        """What a lazy rule is bound to on ``data`` (its smoothness constants remembered:
        they are eigenvalues, and every decision binds several rules)."""
        if whole not in self._contexts:
            ds = data.dataset
            context = job_context(self.config, data.model, ds, data.blocks, data.lr)
            known: dict[tuple[int, ...], float] = {}

            def smoothness(partitions: Sequence[int]) -> float:
                key = tuple(partitions)
                if key not in known:
                    known[key] = context.smoothness(partitions)
                return known[key]

            self._contexts[whole] = dataclasses.replace(context, smoothness=smoothness)
        return self._contexts[whole]

    def _curve(
        self,
        seed: int,
        theta: np.ndarray,
        choice: Choice,
        delays: ResampledDelay,
        cost: CostModel,
        rounds: int,
        until: float = math.inf,
        goal: float = -math.inf,
        settle: int = 0,
        whole: bool = False,
        memory: Mapping[str, Any] | None = None,
    ) -> list[tuple[float, float]]:
        """(virtual seconds, loss) of ``choice`` from θ: ``rounds`` rounds, or until it has
        used ``until`` seconds without reaching loss ``goal`` (beyond its first round
        where that round :meth:`restarts` the lazy messages), or reached it and gone on
        for ``settle`` more rounds (to tell a loss that stays there from a noisy dip). On
        the sample of rows, or with ``whole``, on all of them. A lazy choice goes on from
        ``memory`` (see :meth:`_rule`)."""
        fresh = self.restarts(choice, memory)
        data = self.prepared if whole else self._sampled()[0]
        name, options, candidate, plan = self._rule(choice, data, whole, memory)
        prepared = dataclasses.replace(
            data, policy=candidate, plan=plan, theta0=np.array(theta, copy=True)
        )
        config = self.config.replace(
            rounds=rounds,
            target_loss=None,
            eval_every=1,
            init_from=None,
            policy=Component(name, options),
            stragglers=Component("none", {}),
        )
        # The vectorized engine where it can (most jobs); mini-batch rounds on the events one.
        sim: Simulator
        if not_vectorizable(config, prepared, cost):
            sim = Simulator(config, cost, prepared=prepared)
        else:
            sim = VectorizedSimulator(config, cost, prepared=prepared, per_worker=False)
        sim.straggler = delays.reseeded(seed)
        sim.metric = False  # (the loss is all a decision reads)
        curve: list[tuple[float, float]] = []
        reached_at: list[int] = []

        def keep(record: RoundRecord) -> None:
            curve.append((record.wall_seconds, record.loss))
            if record.loss <= goal and not reached_at:
                reached_at.append(len(curve))
            if reached_at:
                if len(curve) - reached_at[0] >= settle:
                    raise _Enough
            elif record.wall_seconds - (curve[0][0] if fresh else 0.0) >= until:
                raise _Enough

        # Enough time used, or there; or diverged or stuck: its curve so far competes.
        with contextlib.suppress(_Enough, CodedGDError):
            sim.run(on_record=keep)
        return curve

    def _tail(self, records: Sequence[RoundRecord], seen: Observations) -> DelayFit:
        """The law censored delays are drawn from beyond their bound: the tail option
        while it fits the job's own rounds (see :data:`TAIL_TEST_ROUNDS`), then their
        own fit, refitted at every decision; without the option, these rounds' fit."""
        if self.tail is None:
            return fit_delays(seen).tail
        for i, r in enumerate(timed_records(records)):  # (observe's rows, in order)
            self._pool[r.round] = (seen.excess[i], seen.censored[i], seen.compute[i])
        for t in sorted(self._pool)[:-TAIL_POOL_ROUNDS]:
            del self._pool[t]
        if len(self._pool) < TAIL_TEST_ROUNDS:
            return self.tail
        rows = [self._pool[t] for t in sorted(self._pool)]
        pooled = dataclasses.replace(
            seen,
            excess=np.array([e for e, _, _ in rows]),
            censored=np.array([c for _, c, _ in rows]),
            compute=np.array([c for _, _, c in rows]),
            lost=None,  # (rows of other windows: the fit reads none of these)
            queue_taken=None,
        )
        try:
            own = typical_fit(pooled)
        except CodedGDError:
            return self.tail
        if self.stale:
            return own.tail
        given, fitted = own.distance(self.tail), own.tail.ks
        if given > max(fitted + TAIL_MARGIN, KS_CRITICAL / math.sqrt(max(own.exact, 1))):
            self.stale = (
                f"the tail option is {given:.2f} from them in KS distance, their own fit "
                f"{fitted:.2f}"
            )
            log.info(
                "auto: the tail option no longer fits the job's delays (KS distance %.2f "
                "over its last %d rounds, against %.2f of their own fit, %s): censored "
                "delays are drawn from their fit from now on",
                given,
                len(rows),
                fitted,
                own.tail.family,
            )
            return own.tail
        return self.tail

    def renew(self, worker: int, prior: float | None, since: int = 0) -> None:
        """A new machine holds place ``worker`` from round ``since`` on: the prior's entry
        and the delays kept of the old one go; with ``prior`` (the new machine's own
        slowness from the prior) it stands in for it as an entry given at the start
        does, else it is unheard until it answers. The window's records of that place
        before ``since`` are the old machine's: they are not read as the new one's, which
        is taken for a typical worker there (:meth:`Observations.typical_before`; until
        2026-11-30 they were, for up to a window after the replacement)."""
        self._new_from[worker] = since
        self._history[worker] = np.empty(0)
        self._heard[worker] = -math.inf
        if prior is None:
            self.known.discard(worker)
            self._bounds[worker] = np.empty(0)
        else:
            self.known.add(worker)
            self._bounds[worker] = _prior_bound(prior)

    def _old_holders(self, records: Sequence[RoundRecord]) -> dict[int, int]:
        """Each replaced place → how many of the observed rows of ``records`` (those
        :func:`observe` reads) are its old machine's: those of rounds before the new one
        took it."""
        rounds = [r.round for r in timed_records(records)]
        out = {w: sum(1 for t in rounds if t < since) for w, since in self._new_from.items()}
        return {w: rows for w, rows in out.items() if rows}

    def choose(
        self,
        t: int,
        theta: np.ndarray,
        records: Sequence[RoundRecord],
        current: Choice,
        choices: Sequence[Choice],
        memory: Mapping[str, Any] | None = None,
    ) -> tuple[Choice, str]:
        timed = len(timed_records(records))
        if timed < MIN_LIVE_ROUNDS:  # (observe's own words are advice for tune's user)
            return current, (
                f"no refit: {timed} of the last {len(records)} rounds timed its workers "
                f"(a fit needs {MIN_LIVE_ROUNDS})"
            )
        try:
            seen = dataclasses.replace(
                observe(records, self.config.workers, MIN_LIVE_ROUNDS), chance_sigmas=LIVE_SIGMAS
            )
            old = self._old_holders(records)
            seen = seen.without(old)
            self._remember(seen)
            # (A newcomer's prior bounds the rounds before it only until it answers: from
            # then on its own delays speak for it.)
            standing = {w for w in self.known if self._heard[w] != self.decisions}
            obs = seen.typical_before(old, standing).informed(self._history, self._bounds)
            # The family is fitted to what these rounds saw (not to the values informed
            # from earlier ones, which are guesses, not delays), and a censored value is
            # drawn from the better-fitting family's tail beyond its bound, as tune draws
            # it, unless that is a Pareto with an infinite mean (Fit.tail). (Until
            # 2026-11-29 from Pareto's, always: fitted from the smallest delay up, its
            # shape can fall far below 1 on exponential delays; at 0.2 a draw's median is
            # 32 times its bound. That was hidden while earlier bounds stood in for
            # values, see Observations.informed.)
            # auto's tail option (the law tune fitted to a whole earlier run) where given:
            # a window's few values, three in four of them censored at groups of 4, say
            # little of the tail (fitted from a decision's first two rounds, a Pareto of
            # shape 1.5 came out at 4.4, and auto moved to single workers that waited for
            # every worker's tail).
            tail = self._tail(records, seen)
        except CodedGDError as exc:
            return current, f"no refit: {exc}"
        delays = ResampledDelay(obs, tail, seed=0)  # reseeded for each replay
        horizon = self.horizon or len(records)
        sample, kept = self._sampled()
        # Near the optimum the sample is no stand-in: see _misleads. Then on every row.
        near = kept < 1.0 and self._misleads(theta)
        if near:
            sample, kept = self.prepared, 1.0
        cost = self._cost(records, obs.median_compute(), whole=near)
        ds, model = sample.dataset, sample.model
        start_loss = float(objective(model, theta, ds.X_train, ds.y_train))
        # A smaller group waits for workers the current rounds may never have waited
        # for: with one not heard from lately, its delay is unknown (its censored value
        # is only a bound), and the simulator would take it for a typical worker. A prior
        # says what it was on an earlier run.
        unheard = [
            w
            for w in range(self.config.workers)
            if w not in self.known and self._heard[w] < self.decisions - 5
        ]
        blind = {r for r in {c.r for c in choices} if r < current.r and self._blind(r, unheard)}
        others = [
            c for c in choices if c != current and c.r not in blind and (memory or not c.lazy)
        ]
        spans: list[float] = []
        goals: list[float] = []
        # A lazy rule's rounds have a rhythm: the groups refreshed together fire together
        # again some rounds later, and a window holds that burst or not. A candidate that
        # restarts is judged just after its burst (the restart round is paid once, apart),
        # so it is compared with the current rule restarted too: in the same phase.
        restarting = [c for c in others if self.restarts(c, memory)]
        anew = {**memory, "theta_hat": None} if restarting and current.lazy and memory else None
        phased: list[float] = []
        phased_goals: list[float] = []
        first: list[tuple[float, float]] = []  # the current rule's curve, first replay
        taken: dict[Choice, list[float]] = {c: [] for c in others}
        # What a restart round (every group asked afresh) costs beyond the candidate's
        # other rounds: paid once, not at every round of the horizon (see restarts).
        once: dict[Choice, list[float]] = {c: [] for c in others}
        for replay in range(self.replays):  # the same replayed delays for every choice
            seed = t * self.replays + replay
            curve = self._curve(
                seed, theta, current, delays, cost, horizon, whole=near, memory=memory
            )
            first = first or curve
            span, goal = _progress(curve, start_loss)
            spans.append(span)
            goals.append(goal)
            if anew is not None:
                again = self._curve(
                    seed, theta, current, delays, cost, horizon, whole=near, memory=anew
                )
                lapse, low = _progress(again, start_loss)
                fresh = bool(again) and lapse > again[0][0]
                phased.append(lapse - (_restart_cost(again) if fresh else 0.0))
                phased_goals.append(low)
            for c in others:
                base, aim = (
                    (phased[-1], phased_goals[-1]) if phased and c in restarting else (span, goal)
                )
                budget = base / (1.0 - self.margin)
                trial = self._curve(
                    seed,
                    theta,
                    c,
                    delays,
                    cost,
                    20 * horizon,
                    budget,
                    aim,
                    horizon // 2,
                    whole=near,
                    memory=memory,
                )
                reached = _reached(trial, goal)
                # (Reached in the restart round itself: that round's time is its time. A
                # trial that failed in its first round has no rounds.)
                fresh = bool(trial) and self.restarts(c, memory) and reached > trial[0][0]
                extra = _restart_cost(trial) if fresh else 0.0
                taken[c].append(reached - extra)
                once[c].append(extra)
        self.decisions += 1
        span = float(np.mean(spans))
        # What each candidate is compared with: the current rule as it goes on, or
        # restarted (above).
        against = {
            c: float(np.mean(phased)) if phased and c in restarting else span for c in others
        }
        pace_start, pace = start_loss, first  # what the rounds left are read from
        if kept < 1.0 and self.config.target_loss is not None:
            # A target is a loss of the whole data, and near the optimum the sample's
            # loss is no stand-in for it (its optimum is elsewhere): the current rule's
            # curve is simulated once more, on every row, for the rounds left.
            whole = self.prepared.dataset
            pace_start = float(objective(model, theta, whole.X_train, whole.y_train))
            on_all = self._cost(records, obs.median_compute(), whole=True)
            seed = t * self.replays
            pace = self._curve(
                seed, theta, current, delays, on_all, horizon, whole=True, memory=memory
            )
        remaining = self._remaining(t, pace_start, pace) * span / horizon
        tau = {c: float(np.mean(v)) for c, v in taken.items()}
        ships = {c: self.move_cost(c.r) if c.r != current.r else 0.0 for c in others}
        restart = {c: float(np.mean(once[c])) for c in others}
        moves = {c: ships[c] + restart[c] for c in others}
        saved = {
            c: remaining * (1.0 - tau[c] / against[c]) - moves[c] if against[c] > 0 else -math.inf
            for c in others
        }
        shown = ", ".join(
            f"{c}: {tau[c]:.3g} s"
            + (f" + move {ships[c]:.3g} s" if ships[c] else "")
            + (f" + restart {restart[c]:.3g} s" if restart[c] else "")
            for c in sorted(others)
            if math.isfinite(tau[c])
        )
        summary = (
            f"{current} needs {span:.3g} s to reach loss {float(np.mean(goals)):.6g}; "
            f"{shown or 'no other choice gets there within the margin'}; "
            f"{remaining:.3g} s left"
        )
        # What the censored delays were drawn from: the hidden term of most decisions.
        law = ", ".join(f"{k}={v:.3g}" for k, v in tail.params.items())
        if self.stale:
            origin = f"the job's last {len(self._pool)} rounds' fit ({self.stale})"
        elif self.tail is not None:
            origin = "the tail option"
        else:
            origin = "these rounds' fit"
        summary += f"; censored delays drawn from {tail.family}({law}), {origin}"
        if phased:
            summary += (
                f"; restarted as a move would be, {current} needs {float(np.mean(phased)):.3g} s "
                f"(what {', '.join(map(str, sorted(restarting)))} are compared with)"
            )
        if near:
            summary += "; on every row (the sample's gradient is off the job's here)"
        if blind:
            summary += (
                f"; groups of {', '.join(map(str, sorted(blind)))} not tried: workers "
                f"{unheard} not heard from lately"
            )
        fast = [c for c in others if tau[c] <= (1.0 - self.margin) * against[c] and saved[c] > 0]
        if current not in choices:  # the warm-up rule is not a choice: take the best one
            best = min(choices, key=lambda c: (tau.get(c, span) + moves.get(c, 0.0), c.r, -c.k))
            return best, summary
        if fast:
            best = max(fast, key=lambda c: (saved[c], -c.r, c.k))
            return best, f"saves {saved[best]:.3g} s: {summary}"
        return current, f"kept; {summary}"


class _Enough(Exception):
    """A look-ahead candidate has used the time it was given, or reached the goal."""


def _progress(curve: list[tuple[float, float]], start: float) -> tuple[float, float]:
    """(seconds, loss) of a curve's progress: when it first reached its lowest loss, and
    that loss. No progress at all: the whole curve's seconds, at the starting loss."""
    if not curve:
        return 0.0, start
    finite = [(wall, loss) for wall, loss in curve if math.isfinite(loss)]
    lowest = min(finite, key=lambda point: point[1], default=None)
    if lowest is None or lowest[1] >= start:
        return curve[-1][0], start
    return lowest


def _goes_on(memory: Mapping[str, Any], units: int) -> bool:
    """Whether lazy rounds on ``units`` groups go on from ``memory``'s messages (its
    groups are of that size), rather than start with none."""
    held = np.asarray(memory.get("has", ()), dtype=bool)
    return held.shape == (units,) and memory.get("theta_hat") is not None


def _restart_cost(curve: list[tuple[float, float]]) -> float:
    """Seconds a curve's first round took beyond the mean of its other rounds (0 with
    fewer than two rounds, or times not finite): what a restart round (every group
    asked) costs once. The mean, not the median: most lazy rounds ask no group and take
    next to nothing, and against their median the whole first round would count."""
    if len(curve) < 2:
        return 0.0
    first, last = curve[0][0], curve[-1][0]
    extra = first - (last - first) / (len(curve) - 1)
    return max(extra, 0.0) if math.isfinite(extra) else 0.0


def _reached(curve: list[tuple[float, float]], goal: float) -> float:
    """Seconds a curve took to reach ``goal`` and stay there to its end (inf if it did
    not): an approximate rule at its noise floor dips below a loss and back above it."""
    above = [i for i, (_, loss) in enumerate(curve) if not loss <= goal]
    first = above[-1] + 1 if above else 0
    return curve[first][0] if first < len(curve) else math.inf


# How far (relative to the job's gradient) the sample's may be before a decision
# simulates on every row.
SAMPLE_OFF = 0.5


def _gradient(data: Prepared, theta: np.ndarray) -> np.ndarray:
    """∇F(θ) on ``data``'s training rows, as the coordinator steps with it."""
    ds, model = data.dataset, data.model
    total = model.grad_sum(theta, ds.X_train, ds.y_train)
    return objective_gradient(total, max(int(ds.X_train.shape[0]), 1), model.l2, theta)


def _prior_bound(slowness: float) -> np.ndarray:
    """What a prior entry stands in for, until its worker answers: its delay's lower
    bound, in the relative terms of excess per second of compute (slowness − 1)."""
    return np.array([max(float(slowness) - 1.0, 0.0)])


def _subsample(prepared: Prepared, rows: int, config: JobConfig) -> tuple[Prepared, float]:
    """``prepared`` with at most ``rows`` training rows, every partition keeping the same
    fraction of its own (seeded by the job), and the held-out set that fraction too (at
    least 200 rows); and the fraction. Mini-batch jobs, and jobs no larger, as they are."""
    ds = prepared.dataset
    n_rows = sum(int(block.shape[0]) for block in prepared.blocks)
    if config.batch_size or n_rows <= rows:
        return prepared, 1.0
    fraction = rows / n_rows
    rng = np.random.default_rng([config.seed, 0x6C6F6F6B])  # "look"
    kept: list[np.ndarray] = []
    blocks: list[np.ndarray] = []
    start = 0
    for block in prepared.blocks:
        size = max(1, round(int(block.shape[0]) * fraction))
        kept.append(np.sort(rng.choice(block, size=size, replace=False)))
        blocks.append(np.arange(start, start + size))
        start += size
    chosen = np.concatenate(kept)
    n_test = int(ds.y_test.shape[0])
    tested = np.sort(
        rng.choice(n_test, size=min(n_test, max(200, round(n_test * fraction))), replace=False)
    )
    dataset = dataclasses.replace(
        ds,
        X_train=take_rows(ds.X_train, chosen),
        y_train=ds.y_train[chosen],
        X_test=take_rows(ds.X_test, tested),
        y_test=ds.y_test[tested],
        blocks=None,
    )
    # The fraction each simulated row stands for, as the cost model charges it.
    return dataclasses.replace(prepared, dataset=dataset, blocks=blocks), start / n_rows
