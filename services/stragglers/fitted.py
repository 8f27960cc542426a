"""Delays fitted from a run's records: per-worker speed, the distribution, and its replay.

Used by ``codedgd tune`` (:mod:`codedgd.services.tuning`) and by the ``auto`` policy's
look-ahead, which refits the live rounds' delays every few rounds.

A result file holds, per round, each answering worker's response seconds (θ_t sent →
result in) and its own compute seconds. From them:

- **excess** = response − compute: the seconds a worker spent on anything but its
  gradient (network, queueing, straggling; an injected straggler model's delay too).
  Workers cancelled in a round never answered: their excess is *right-censored* at the
  time of their Cancel (``RoundRecord.cancelled_seconds``; in records of older versions
  the round's decode time, for every worker that did not answer) minus the round's mean
  compute (they were slower than that). A worker the round did not ask is not observed.
- **speed**: each worker's median compute seconds relative to the typical worker's (the
  pool's 25th percentile, so that a pool half of slow machines is measured against its
  fast half; 1 = typical, 2 = twice as slow). All of codedgd's codes give every worker the same
  load, so compute seconds compare directly; a run of a speed-aware plan would not.

The pooled excess is fitted by two families, each by maximum likelihood with the censored
values counted as such: a **shifted exponential** (shift = the smallest observation, rate
= uncensored count / Σ(x − shift)) and a **Pareto** (scale t_m = the smallest observation,
shape α = uncensored count / Σ ln(x / t_m)). Goodness of fit is the Kolmogorov–Smirnov
distance between the fitted CDF and the Kaplan–Meier estimate of the data (scipy's
``ecdf`` on ``CensoredData``), over the observed range: the smaller, the better. The
**empirical** distribution is the data itself: the tuner replays resampled rounds of it
(:class:`ResampledDelay`) and draws each censored value from the better family's tail
beyond its bound (the exponential's where the better is a Pareto with an infinite mean:
:attr:`Fit.tail`).
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from statistics import NormalDist
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from scipy import ndimage

from codedgd.services.errors import ConfigError
from codedgd.services.records import RoundRecord

if TYPE_CHECKING:
    from codedgd.services.codes.tree import TreeShape

MIN_ROUNDS = 5  # of a run `tune` fits: enough to judge the fit and to search with
# The fewest rounds auto's look-ahead refits. Its first decision comes this early because
# the rounds before it run the starting rule blind: on the alternating scenario five of
# them (a quarter of the workers 5x slower) cost as much as 15 rounds of the best rule.
MIN_LIVE_ROUNDS = 2
# The typical worker is the one at this percentile of the pool's per-worker medians: low
# enough to sit among the fast ones when up to three quarters of the pool is slow.
TYPICAL = 25.0
FAMILIES = ("shifted-exponential", "pareto")
# A worker's median delay is persistent slowness when no more than this share of pools of
# equal workers would show one as far above the typical worker by chance.
FAMILY_WISE = 0.05
# The fewest answered rounds whose floor says how much of a slow worker's delay is a slower
# wait rather than a slower machine (Observations.fixed_excess), and the percentile of a
# worker's delays taken for its floor: low, for little of the wait above it; not the least,
# which one lucky round sets.
MIN_FLOOR_ROUNDS = 20
FLOOR = 5.0
BASE = 1.0  # the percentile of the typical workers' delays taken for where their wait starts
# The widest (interquartile range over the typical workers') a worker's rounds outside its
# slow stretches may wait and still be typical.
TYPICAL_WIDTH = 1.5
# The fewest rounds in a row without an answer that Observations.chance_stretch calls
# beyond chance, whatever the rate.
MIN_STRETCH = 10
# A subtree a codedreduce parent left out (ResampledDelay): tries drawn per recorded round,
# and of those that come out after it was left out, how many are kept to replay from.
SUBTREE_DRAWS = 256
SUBTREE_KEPT = 16


def chance_limit(n_workers: int) -> float:
    """Standard errors of a median by which the unluckiest of ``n_workers`` equal workers
    stays below the typical one (the pool's 25th percentile of medians), in all but 5 %
    of pools: 3.2 at n = 8, 3.4 at 16, 3.8 at 64."""
    normal = NormalDist()
    return normal.inv_cdf(1 - FAMILY_WISE / max(n_workers, 1)) - normal.inv_cdf(TYPICAL / 100)


@dataclass(frozen=True)
class Observations:
    """Per-round, per-worker timings of one run (rows: rounds, columns: workers)."""

    excess: np.ndarray  # float64 seconds; NaN where the worker was not contacted
    censored: np.ndarray  # bool: a lower bound (the worker was cancelled)
    compute: np.ndarray  # float64 compute seconds of answering workers; NaN otherwise
    # Standard errors of a median above the typical worker's that count as persistent
    # (:meth:`persistent_excess`); None: :func:`chance_limit` of the pool's size.
    chance_sigmas: float | None = None
    # A codedreduce run's tree, and per round the own seconds (θ_t to message ready) a
    # subtree its parent left out sent after, at the column of the subtree's top worker
    # (NaN elsewhere): the latest of the sibling subtrees its parent used
    # (:func:`observe` given ``tree``). The replay draws such a subtree's unobserved
    # delays conditioned on it (:class:`ResampledDelay`). None: no tree, or not known.
    tree: TreeShape | None = None
    left_out_after: np.ndarray | None = None
    # bool, where a worker was lost (its stream closed, its machine gone: ``excluded``
    # "lost…"), in a tree it or a worker above it: such a round says nothing of its
    # speed. None: none recorded.
    lost: np.ndarray | None = None
    # The coordinator's egress (bytes/s) whose queue was taken out of a star run's
    # delays (:func:`observe` given ``coordinator_egress``), how its copies of θ shared
    # it ("fifo": one after another in worker order; "fair": side by side), and the
    # seconds taken out of each value (rounds × workers; 0 where none). A replay's star
    # rounds put the queue back, in their own contacts. None: the delays hold it.
    coordinator_egress: float | None = None
    coordinator_sharing: str = "fifo"
    queue_taken: np.ndarray | None = None

    def rows_at(self, rows: np.ndarray) -> Observations:
        """These observations' rounds ``rows`` (any order, repeats allowed)."""
        after, lost, queue = self.left_out_after, self.lost, self.queue_taken
        return replace(
            self,
            excess=self.excess[rows],
            censored=self.censored[rows],
            compute=self.compute[rows],
            left_out_after=None if after is None else after[rows],
            lost=None if lost is None else lost[rows],
            queue_taken=None if queue is None else queue[rows],
        )

    @property
    def n_workers(self) -> int:
        return int(self.excess.shape[1])

    @property
    def rounds(self) -> int:
        return int(self.excess.shape[0])

    def speed(self) -> np.ndarray:
        """Each worker's median compute seconds over the typical worker's (1 = typical)."""
        answered = ~np.isnan(self.compute).all(axis=0)
        if not answered.any():
            return np.ones(self.n_workers)
        medians = np.ones(self.n_workers)
        medians[answered] = np.nanmedian(self.compute[:, answered], axis=0)
        pool = float(np.percentile(medians[answered], TYPICAL))
        if not pool > 0:
            return np.ones(self.n_workers)
        out: np.ndarray = np.where(answered, medians / pool, 1.0)  # never answered: unknown
        return out

    def _unanswered(self) -> np.ndarray:
        """Where a worker was done without: cancelled or left out (censored), or, in a
        tree, in a subtree left out (not observed). A star's worker not observed was not
        asked (a lazy round, a place not yet held), which says nothing of its speed."""
        unanswered: np.ndarray = self.censored.copy()
        if self.tree is not None:
            unanswered |= np.isnan(self.excess)
        if self.lost is not None:
            unanswered &= ~self.lost
        return unanswered

    def unanswered_stretch(self) -> np.ndarray:
        """Each worker's most rounds in a row it was done without (cancelled, left out,
        in a subtree left out), not counting rounds it was not asked or was lost in
        (:attr:`lost`): a stretch whose delays the run does not hold, only bounds at
        best."""
        unanswered = self._unanswered()
        answered = ~np.isnan(self.excess) & ~self.censored
        longest = np.zeros(self.n_workers, dtype=np.int64)
        current = np.zeros(self.n_workers, dtype=np.int64)
        for out, seen in zip(unanswered, answered, strict=True):
            current = np.where(seen, 0, current + out)
            longest = np.maximum(longest, current)
        return longest

    def chance_stretch(self) -> np.ndarray:
        """Per worker, the most rounds in a row a worker goes unanswered by chance in a
        pool of equal workers: the shortest stretch L of which the run's n·R starts
        expect fewer than ``FAMILY_WISE`` (p^L·n·R < 0.05), where p is the rate at which
        a round leaves a worker in its place unanswered, and at least ``MIN_STRETCH``.
        In a tree (codedreduce) every parent uses its fastest m − s children, so equal
        workers at level l are used at the rate ((m₀ − s)/m₀)·((m − s)/m)^(l − 1): a leaf
        of 4 × (1 + 3) is done without in half the rounds, and 15 in a row is beyond
        chance in a run of 100. Elsewhere p is the run's own: the share of the values
        asked for that were cancelled (a coded run cancels as many a round, spread
        evenly over equal workers). A worker slow for a stretch is left out round after
        round, beyond it (or is below one that is): how slow it was then is not in the
        run."""
        tree = self.tree
        if tree is None:
            asked = ~np.isnan(self.excess)
            rate = np.full(self.n_workers, float(self.censored.sum() / max(asked.sum(), 1)))
        else:
            top = (tree.root - tree.s) / tree.root
            below = (tree.fanout - tree.s) / tree.fanout
            rate = np.array(
                [1.0 - top * below ** (tree.level(w) - 1) for w in range(self.n_workers)]
            )
        starts = max(self.rounds * self.n_workers, 1)
        out = np.full(self.n_workers, MIN_STRETCH, dtype=np.int64)
        for w, p in enumerate(rate):
            if p >= 1:
                out[w] = self.rounds + 1
            elif p > 0:
                need = math.ceil(math.log(FAMILY_WISE / starts) / math.log(p))
                out[w] = max(MIN_STRETCH, need)
        return out

    def median_compute(self) -> float:
        """The pool's median compute seconds of one worker's round."""
        return float(np.nanmedian(self.compute))

    def persistent_excess(self) -> np.ndarray:
        """Each worker's median excess above the typical worker's median (>= 0), seconds.

        The part of a worker's delay that is there round after round: a slower machine,
        not bad luck. Censored values count at their bound, so a worker cancelled in most
        rounds gets a lower bound. A difference within ``chance_sigmas`` standard errors of
        a median (from the pooled delays' spread) is taken for chance and counts as 0. By
        default that limit grows with the pool (:func:`chance_limit`): at n = 64, a flat
        three took four of 64 equal workers for slow machines. A caller that refits short
        windows often (auto's look-ahead) may set a lower one: a slow worker lost in one
        window's noise costs it more than a chance one, which the next refit corrects.
        """
        medians = np.nanmedian(self.excess, axis=0)
        above = medians - float(np.percentile(medians, TYPICAL))
        # Only what chance cannot explain: a median over R rounds of i.i.d. delays of spread
        # σ varies by about 1.25·σ/√R between workers.
        values = self.excess[~np.isnan(self.excess)]
        q75, q25 = np.percentile(values, [75, 25])
        rounds = np.maximum(np.sum(~np.isnan(self.excess), axis=0), 1)
        sigmas = self.chance_sigmas
        if sigmas is None:
            sigmas = chance_limit(self.n_workers)
        chance = sigmas * 1.25 * (q75 - q25) / 1.349 / np.sqrt(rounds)
        return np.asarray(np.where(above > chance, above, 0.0))

    def load_excess(self) -> np.ndarray:
        """Each recorded delay's part that grows with the worker's load, seconds (rounds ×
        workers; 0 where none, and where the worker was not contacted).

        A worker's delays beyond compute are a floor and a wait above it. A slower
        machine shifts the floor: compute hidden in the delay, which grows with the load.
        A longer wait above it (a slower network stack or queue, or an injected wait
        scaled with the machine: speed-classes' slow workers wait f·e where the others
        wait e) stays what it is at any load. One load cannot otherwise tell the two
        apart: taking every second of the persistent excess to grow, tune predicted
        groups of 4 a third slower than they are on two speed classes at n = 64.

        The shift of a set of delays is how far their floor (``FLOOR``-th percentile) is
        above the typical workers' (theirs), less what a wider wait explains: a wait f
        times as wide (interquartile range) has its floor f times as far above where waits
        start (the typical workers' ``BASE``-th percentile). It counts only beyond what
        chance gives: the largest shift of a typical worker (for as many rounds and as
        wide a wait), and four standard errors of the floor percentile (a pool of a few
        typical workers says little of chance by itself); and never beyond how far the
        delays' median is above the typical workers'. A worker's shift is read over
        all its rounds (slow in every round), or over its slow stretches (slow machines
        that change identity: a floor over its whole run is its fast rounds'), whichever
        explains more. Its slow stretches are the rounds where, with its
        wait narrowed to the typical spread, its floor around the round (the highest
        least value of any ``MIN_FLOOR_ROUNDS`` consecutive rounds holding it,
        :func:`_local_floors`) is above the typical workers' (their 99th percentile of
        those) and at least half-way up to its median such round, and the median at least
        twice as far up as that percentile (less stands out only by the test's own pick);
        and they count only where its other rounds wait as the typical workers do (at most
        ``TYPICAL_WIDTH`` times as wide). In the rounds read, the shift grows (never more
        than the delay has above the typical workers' start); elsewhere nothing.

        Read only from a worker with at least ``MIN_FLOOR_ROUNDS`` answered rounds and at
        most a tenth of them censored (a cancelled worker's delays are bounds), whose
        censored rounds get the median of its others. Any other worker found
        persistently slow keeps its whole :meth:`persistent_excess` growing with load, in
        every round, as before floors were read.
        """
        persistent = self.persistent_excess()
        slow = persistent > 0
        contacted = ~np.isnan(self.excess)
        out = np.where(contacted, persistent[None, :], 0.0)
        answered = np.where(self.censored, np.nan, self.excess)
        typical = answered[:, ~slow]
        typical = typical[~np.isnan(typical)]
        if typical.size < MIN_FLOOR_ROUNDS:
            return out
        # The typical workers' wait: where it starts (``base``), its floor, middle and spread.
        base, floor, q25, middle, q75 = np.percentile(typical, [BASE, FLOOR, 25, 50, 75])
        spread = q75 - q25
        # Seconds per unit of probability near the floor (1 / the density there), read
        # over the floor's 20 points to the quartile: steadier than the floor's own few.
        per_probability = (q25 - floor) / (0.25 - FLOOR / 100)
        if not spread > 0:
            return out

        def wider(values: np.ndarray) -> float:
            """How many times the typical workers' wait ``values``' is (>= 1)."""
            w25, w75 = np.percentile(values, [25, 75])
            return max(float((w75 - w25) / spread), 1.0)

        def shifted(values: np.ndarray) -> float:
            """How far ``values``' floor is above the typical workers', less what a wider
            wait explains: a wait f times as wide has its floor f times as far above
            where waits start."""
            low = float(np.percentile(values, FLOOR))
            return low - float(base) - wider(values) * float(floor - base)

        # What chance gives: the largest shift of a typical worker, per round it has.
        null = [
            (shifted(v), int(v.size))
            for v in (answered[:, w][~np.isnan(answered[:, w])] for w in np.flatnonzero(~slow))
            if v.size >= MIN_FLOOR_ROUNDS
        ]
        if not null:
            return out
        noise = max(max(d, 0.0) * math.sqrt(m) for d, m in null)

        def real(values: np.ndarray) -> float:
            """``values``' shift, or 0 where luck could give it: beyond the largest a
            typical worker shows (for its wait's width and rounds), and beyond four
            standard errors of its floor, which a pool of a few typical workers may not
            show (a percentile's: sqrt(p(1 − p)/m) over the density there, the typical
            workers' made as many times wider as its wait; four, for the order
            statistic's long upper tail)."""
            # (Never more than its median is above the typical workers': a narrow wait
            # lifted whole is not a machine slower than its typical round says.)
            d = min(shifted(values), float(np.median(values)) - float(middle))
            p = FLOOR / 100
            error = math.sqrt(p * (1 - p) / values.size) * wider(values) * per_probability
            limit = max(wider(values) * noise / math.sqrt(values.size), 4 * error)
            return d if d > limit else 0.0

        # Each worker's delays with its wait narrowed to the typical workers' spread: what
        # is left above the typical floor is a shift, which the floors below look for.
        scales = np.ones(self.n_workers)
        for k in np.flatnonzero(slow):
            theirs = answered[:, k][~np.isnan(answered[:, k])]
            if theirs.size >= MIN_FLOOR_ROUNDS:
                scales[k] = wider(theirs)
        narrowed = base + (answered - base) / scales[None, :]
        local = _local_floors(narrowed, MIN_FLOOR_ROUNDS)
        typical_local = local[:, ~slow]
        # (Not their highest: a typical worker may itself be slow in a stretch too short
        # to count as persistent.)
        chance = float(np.percentile(typical_local[np.isfinite(typical_local)], 99))
        for w in range(self.n_workers):
            mine = ~np.isnan(answered[:, w])
            if mine.sum() < MIN_FLOOR_ROUNDS or mine.sum() < 0.9 * contacted[:, w].sum():
                continue
            # Slow in every round (its whole run's floor is shifted), or in stretches
            # (where its floor around a round stands out): whichever explains more.
            readings = [(real(answered[mine, w]), mine)] if slow[w] else []
            slowed = mine & (local[:, w] > chance)
            if slowed.any():
                # The first fast rounds after a stretch can pass the test (a run of a few
                # fast delays and the slow ones before them has a high least): keep
                # those at least half-way up to the typical slow round's floor.
                typical_slow = float(np.median(local[slowed, w])) - base
                slowed &= local[:, w] - base >= typical_slow / 2
                # A stretch just above chance is the luckiest of the pool's waits, picked
                # out by the test itself: a slow stretch stands twice as high.
                if typical_slow < 2 * (chance - base):
                    slowed[:] = False
            rest = mine & ~slowed
            # A worker slow in stretches is typical outside them; one whose other rounds
            # wait as wide is slow throughout, and its stretches are the test's own pick.
            if (
                slowed.sum() >= MIN_FLOOR_ROUNDS
                and rest.sum() >= MIN_FLOOR_ROUNDS
                and wider(answered[rest, w]) <= TYPICAL_WIDTH
            ):
                readings.append((real(answered[slowed, w]), slowed))
            own, slowed = max(readings, key=lambda r: r[0] * r[1].sum(), default=(0.0, mine))
            shift = np.zeros(self.rounds)
            if own > 0:
                shift = np.where(slowed, np.clip(answered[:, w] - base, 0.0, own), 0.0)
            fill = float(np.median(shift[mine]))
            out[:, w] = np.where(mine, shift, np.where(contacted[:, w], fill, 0.0))
        return out

    def slowness(self) -> np.ndarray:
        """How many times longer than a typical worker each worker takes at the run's load.

        Its compute's ratio to the pool's (:meth:`speed`), times 1 + its persistent excess
        over its compute. What the run showed; how much of it a change of load changes is
        :meth:`load_slowness`.
        """
        return self._slowness(self.persistent_excess())

    def load_slowness(self) -> np.ndarray:
        """How many times longer than a typical worker each worker takes for the same
        load, in what grows with the load: as :meth:`slowness`, with the median of its
        :meth:`load_excess` over its rounds for its persistent excess. A worker
        persistently slower than the pool in its floor is taken to be a slower machine,
        whose extra time grows with the data it is given."""
        load = self.load_excess()
        contacted = ~np.isnan(self.excess)
        typical = np.array(
            [float(np.median(load[contacted[:, w], w])) for w in range(self.n_workers)]
        )
        return self._slowness(typical)

    def worker_compute(self) -> np.ndarray:
        """Each worker's median compute seconds (the pool's for one that never answered)."""
        compute = np.full(self.n_workers, self.median_compute())
        answered = ~np.isnan(self.compute).all(axis=0)
        compute[answered] = np.nanmedian(self.compute[:, answered], axis=0)
        return compute

    def _slowness(self, excess: np.ndarray) -> np.ndarray:
        extra = excess / np.maximum(self.worker_compute(), 1e-12)
        out: np.ndarray = np.maximum(self.speed(), 1.0) * (1.0 + extra)
        return out

    def rows(self) -> tuple[np.ndarray, np.ndarray]:
        """Each round's typical excess (the median answered one) and compute seconds (the
        median answering worker's), the yardsticks of :meth:`relative`."""
        answered = np.where(self.censored, np.nan, self.excess)
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a round nobody answered
            typical = np.nan_to_num(np.nanmedian(answered, axis=1))
            compute = np.nanmedian(self.compute, axis=1)
        compute = np.where(np.isfinite(compute) & (compute > 0), compute, np.nan)
        return typical, compute

    def relative(self) -> np.ndarray:
        """Every value's excess beyond its round's typical one, per second of the round's
        compute: what a slower machine keeps from one load to another, all of it taken to
        grow with its compute (as :meth:`slowness` counts it; auto's look-ahead moves
        between loads of one job, on windows too short to read :meth:`load_excess`'s floors).
        NaN where unknown."""
        typical, compute = self.rows()
        out: np.ndarray = np.maximum(self.excess - typical[:, None], 0.0) / compute[:, None]
        return out

    def informed(
        self, history: Sequence[np.ndarray], bounds: Sequence[np.ndarray] = ()
    ) -> Observations:
        """These observations with each censored value informed by the worker's own
        earlier delays: ``history[w]`` holds its :meth:`relative` values answered before,
        ``bounds[w]`` (optional) the relative bounds it was cancelled at since. Taken back
        to this round's typical excess and compute, the median of the answered values
        above the bound replaces it (no longer censored). With none above, the median of
        the earlier bounds above it raises the bound, and the value stays censored (it is
        drawn beyond that); with neither, it stays as observed.

        A worker that a round stops without (a slow one, under a policy that does without
        it) is censored at the round's short decode time in every round it is stopped: the
        pooled tail beyond that bound knows nothing of how slow it was when last waited
        for. Its own last delays above the bound are the best guess of the value hidden
        there, scaled to the load the round gave it; a worker that has become fast
        answers again and refreshes them. An earlier bound is only a bound: taken for the
        value (as it was until 2026-11-29), a worker that was never waited for looked
        as fast as the first of its group, and smaller groups and single workers looked
        faster than they are (on Pareto delays at n = 16 auto moved from groups of 4 to
        single workers, which took five times as long).
        """
        excess, censored = self.excess.copy(), self.censored.copy()
        typical, compute = self.rows()

        def above(i: int, w: int, known: Sequence[np.ndarray]) -> np.ndarray:
            """Worker w's ``known`` relative values, taken to round i, above its bound."""
            past = known[w] if w < len(known) else np.empty(0)
            values: np.ndarray = typical[i] + past * compute[i]
            out: np.ndarray = values[values > excess[i, w]]
            return out

        for i, w in zip(*np.nonzero(censored), strict=True):
            if not np.isfinite(compute[i]):
                continue
            answered = above(i, w, history)
            if answered.size:
                excess[i, w] = float(np.median(answered))
                censored[i, w] = False
            elif (lifted := above(i, w, bounds)).size:
                excess[i, w] = float(np.median(lifted))
        return replace(self, excess=excess, censored=censored)

    def less(self, seconds: np.ndarray) -> Observations:
        """These observations with ``seconds`` (rounds × workers) taken out of every
        value, timed or a bound, and none below 0: network time a replay charges
        otherwise (a star run's round trip, which topology candidates pay hop by hop)."""
        excess = np.where(np.isnan(self.excess), np.nan, np.maximum(self.excess - seconds, 0.0))
        return replace(self, excess=excess)

    def without(self, before: Mapping[int, int]) -> Observations:
        """These observations without worker w's values in the rows before ``before[w]``:
        another machine's, the place's holder until it was replaced. NaN there, as where
        a worker was not contacted."""
        excess, censored, compute = self.excess.copy(), self.censored.copy(), self.compute.copy()
        for w, row in before.items():
            excess[:row, w] = np.nan
            censored[:row, w] = False
            compute[:row, w] = np.nan
        return replace(self, excess=excess, censored=censored, compute=compute)

    def typical_before(self, before: Mapping[int, int], bounded: Iterable[int]) -> Observations:
        """These observations with worker w's rows before ``before[w]`` (emptied by
        :meth:`without`) given each round's typical excess: a newcomer is taken for a
        typical worker until it answers. For a w of ``bounded`` (one an earlier run's
        prior stands in for) as a bound, which :meth:`informed` raises to the prior's."""
        excess, censored = self.excess.copy(), self.censored.copy()
        typical, _ = self.rows()
        bound = set(bounded)
        for w, row in before.items():
            excess[:row, w] = typical[:row]
            censored[:row, w] = w in bound
        return replace(self, excess=excess, censored=censored)


def _local_floors(values: np.ndarray, span: int) -> np.ndarray:
    """Per column, each value's floor around its row: the highest, over the runs of
    ``span`` rows that hold it, of the least value in the run (a grey-scale opening:
    scipy.ndimage.grey_opening). A stretch of at least ``span`` slow rounds keeps its own
    floor, and a value is never given a floor above itself. NaN: skipped; rows without a
    value: NaN."""
    filled = np.where(np.isnan(values), np.inf, values)
    opened = ndimage.grey_opening(filled, size=(min(span, len(filled)), 1), mode="nearest")
    out: np.ndarray = np.where(np.isnan(values), np.nan, np.minimum(opened, filled))
    return out


def _of_the_job(round_: int, workers: Iterable[int], what: str, n_workers: int) -> None:
    """Refuse a record naming workers the job does not have (another job's records)."""
    stray = sorted(w for w in workers if not 0 <= w < n_workers)
    if stray:
        raise ConfigError(
            f"round {round_} {what} workers {stray}, but the job has {n_workers}: the "
            "records are of another job"
        )


def timed_records(records: Sequence[RoundRecord]) -> list[RoundRecord]:
    """The records :func:`observe` reads, in order, one row of its observations each:
    those with per-worker times (a star's responses, or a ring's or tree's own times)."""
    return [r for r in records if r.response_seconds or r.ready_seconds]


def observe(
    records: Sequence[RoundRecord],
    n_workers: int,
    min_rounds: int = MIN_ROUNDS,
    tree: TreeShape | None = None,
    coordinator_egress: float | None = None,
    coordinator_sharing: str = "fifo",
    star_times: str = "arrivals",
) -> Observations:
    """The timings of ``records`` (a run of ``n_workers``), checked to be enough to fit
    (``min_rounds`` rounds with per-worker response times).

    ``coordinator_egress`` (bytes/s), for a star's run: the coordinator's NIC sent θ_t's
    copies at that rate, and each worker's wait for its copy is taken out of its excess
    (a place in a queue, not a slower worker). ``coordinator_sharing`` "fifo": one
    after another in worker order (the simulator's default), the k-th worker asked got
    its copy k·bytes/rate after the round began; "fair": side by side (TCP flows, as
    codedgd's coordinator sends them), each of the m asked after m·bytes/rate, or
    after what the round's first answer took in all if that is less (a link that
    bursts lets the first copies through at once). A
    replay's star rounds put the queue back (:attr:`Observations.coordinator_egress`).
    The copy's bytes are the round's ``bytes_down`` over the workers asked
    (``computations``), a worker lost in the round among them.

    ``star_times`` "own": a star's rounds are read by their workers' own times
    (``ready_seconds``, sent since 2026-12-01), as a ring's are: no network, no queue on
    the coordinator's NIC in them (nothing for ``coordinator_egress`` to take out). A
    worker cancelled at c is then censored at c less the round's longest network time
    among those that answered (response less own time): it had waited at most about
    that long for θ_t. "arrivals" (the default): by their arrivals, as above.

    A ring's or tree's round (``ready_seconds``: each worker's own time from θ_t to its
    message ready) gives each timed worker's excess as that time less its compute: its
    straggling, without the network time a star's response holds. A leaf its parent
    left out (codedreduce) is censored at ``left_out_seconds`` (the longest own time of
    the siblings used) less the round's mean compute; an inner node left out is not
    observed there (its sum waits for its children too: no bound on its own time).

    Given the run's ``tree`` (codedreduce's), each such subtree is kept as a whole: the
    own time by which the latest sibling subtree its parent used was ready, which it
    came after (:attr:`Observations.left_out_after`)."""
    timed = timed_records(records)
    if len(timed) < min_rounds:
        raise ConfigError(
            f"the run has {len(timed)} round(s) with per-worker response times; fitting "
            f"needs at least {min_rounds}: use a longer run (or a probe job of more rounds)"
        )
    excess = np.full((len(timed), n_workers), np.nan)
    censored = np.zeros((len(timed), n_workers), dtype=bool)
    compute = np.full((len(timed), n_workers), np.nan)
    if tree is not None and tree.n_workers != n_workers:
        raise ConfigError(
            f"the run's tree has {tree.n_workers} workers ({tree.describe()}) but the job "
            f"{n_workers}: the records are of another job"
        )
    after = np.full((len(timed), n_workers), np.nan) if tree is not None else None
    lost = np.zeros((len(timed), n_workers), dtype=bool)
    if coordinator_egress is not None and not coordinator_egress > 0:
        raise ConfigError(f"the coordinator's egress must be bytes/s > 0, got {coordinator_egress}")
    if coordinator_sharing not in ("fifo", "fair"):
        raise ConfigError(
            f"the coordinator's copies of θ share its NIC fifo or fair, not {coordinator_sharing!r}"
        )
    if star_times not in ("arrivals", "own"):
        raise ConfigError(
            f"a star's rounds are read by their arrivals or own times, not {star_times!r}"
        )
    star_own = star_times == "own"
    if star_own:
        coordinator_egress = None  # (own times hold no queue)
        for r in timed:
            bare = sorted(set(r.response_seconds) - set(r.ready_seconds))
            if not r.peered and bare:
                raise ConfigError(
                    f"round {r.round} has no own times (WorkerTiming) of workers {bare}, "
                    "only their arrivals: they are of a version before 2026-12-01 or of "
                    "another implementation that sends none; read the run by its arrivals"
                )
    queue_taken = np.zeros((len(timed), n_workers)) if coordinator_egress is not None else None
    for i, r in enumerate(timed):
        peered = r.peered  # a ring's or tree's round: its workers' own times
        own = peered or star_own
        times = r.ready_seconds if own else r.response_seconds
        _of_the_job(r.round, times, "has timings of" if own else "has responses from", n_workers)
        computes = list(r.worker_compute_seconds.values())
        mean_compute = sum(computes) / len(computes) if computes else 0.0
        for w, seconds in times.items():
            c = float(r.worker_compute_seconds.get(w, 0.0))
            excess[i, w] = max(float(seconds) - c, 0.0)
            compute[i, w] = c
        # Cancelled: slower than its Cancel (a lower bound). Records of older versions
        # (and ring or tree rounds) do not say who was cancelled when: every worker that
        # did not answer is taken to be, at the round's decode. A tree's leaf its parent
        # did without: at least as slow as the siblings it used (left_out_seconds).
        if peered:
            _of_the_job(r.round, r.left_out_seconds, "left out", n_workers)
            bounds = {w: float(s) for w, s in r.left_out_seconds.items() if w not in times}
        elif r.cancelled_seconds:
            _of_the_job(r.round, r.cancelled_seconds, "cancelled", n_workers)
            bounds = {w: float(s) for w, s in r.cancelled_seconds.items()}
        elif r.cancelled > 0:
            silent = [w for w in range(n_workers) if w not in r.response_seconds]
            bounds = dict.fromkeys(silent, float(r.wait_seconds))
        else:
            bounds = {}
        if own and not peered and bounds:  # a star's cancel, read by own times
            arrived = r.response_seconds
            network = max((arrived[w] - t for w, t in times.items() if w in arrived), default=0.0)
            bounds = {w: at - max(network, 0.0) for w, at in bounds.items()}
        for w, at in bounds.items():
            excess[i, w] = max(at - mean_compute, 0.0)
            censored[i, w] = True
        gone = {w for w, why in r.excluded.items() if why.startswith("lost")}
        for w in gone:
            if 0 <= w < n_workers:
                below = tree.subtree(w) if tree is not None else (w,)
                lost[i, [v for v in below if np.isnan(excess[i, v])]] = True
        if after is not None and peered and tree is not None:
            for w, at in _subtrees_left_out(tree, r.ready_seconds).items():
                if gone.isdisjoint(tree.subtree(w)):  # (a lost worker was not slow)
                    after[i, w] = at
        if queue_taken is not None and coordinator_egress is not None and not own:
            timed_here = ~np.isnan(excess[i])
            contacted = np.flatnonzero(timed_here | lost[i])  # (in the order sent)
            count = r.computations if r.computations > 0 else contacted.size
            if contacted.size:
                copy_s = r.bytes_down / count / coordinator_egress
                take = timed_here[contacted]
                if coordinator_sharing == "fifo":
                    waited = np.arange(1, contacted.size + 1) * copy_s
                else:
                    # Side by side, every copy arrived when the last did: no one waited
                    # longer than the first to answer took in all (a link that bursts
                    # lets the first copies through at once).
                    first = float(excess[i, contacted[take]].min()) if take.any() else 0.0
                    waited = np.full(contacted.size, min(count * copy_s, first))
                at = contacted[take]
                excess[i, at] = np.maximum(excess[i, at] - waited[take], 0.0)
                queue_taken[i, at] = waited[take]
    missing = [w for w in range(n_workers) if np.isnan(excess[:, w]).all()]
    used = {w for r in timed for w in r.workers_used}
    untimed = [w for w in missing if w in used]
    if untimed and any(r.peered for r in timed):
        # Their messages were summed in, so they took part: each worker sends its own
        # times with its message, and these sent none. (One never used is an inner node
        # a codedreduce parent left out: below.)
        raise ConfigError(
            f"workers {untimed} of the job's {n_workers} sent no own times in any of the "
            f"{len(timed)} rounds (WorkerTiming, with their messages: see the .proto), as a "
            "worker of another implementation or of a version before 2026-11-30 may not: "
            "their delays are unknown. Tune from a star run on the same pool: a probe "
            "(--probe JOB.toml) or a run of uncoded"
        )
    if missing and any(r.peered for r in timed):
        raise ConfigError(
            f"workers {missing} of the job's {n_workers} were timed in none of the "
            f"{len(timed)} rounds: a tree parent (codedreduce) leaves its slowest children "
            "out of its sum, and their own times with them; record more rounds, or a run "
            "with s = 0 (tree, ring-allreduce) or of uncoded on the same pool"
        )
    if missing:
        raise ConfigError(
            f"workers {missing} of the job's {n_workers} appear in none of the "
            f"{len(timed)} timed rounds (neither answered nor cancelled): the records are "
            "of a run that did not use them; record one where every worker is contacted"
        )
    return Observations(
        excess,
        censored,
        compute,
        tree=tree,
        left_out_after=after,
        lost=lost if lost.any() else None,
        coordinator_egress=coordinator_egress,
        coordinator_sharing=coordinator_sharing,
        queue_taken=queue_taken,
    )


def _subtrees_left_out(tree: TreeShape, ready: Mapping[int, float]) -> dict[int, float]:
    """The inner nodes of ``tree`` a used parent (or the root) left out in a round whose
    used workers' own times are ``ready``, each with the time it came after: the latest
    own time in the sibling subtrees its parent used. A parent sends once its own share
    and its fastest children's sums are ready, so a used subtree was ready when the
    last of its used workers was (network time aside: own times hold none)."""
    latest: dict[int, float] = {}

    def subtree(w: int) -> float:
        if w not in latest:
            below = [subtree(c) for c in tree.children(w) if c in ready]
            latest[w] = max([float(ready[w]), *below])
        return latest[w]

    out: dict[int, float] = {}
    for parent in [-1, *(w for w in ready if 0 <= w < tree.n_workers)]:
        kids = tree.children(parent)
        used = [c for c in kids if c in ready]
        if not used:
            continue
        for c in kids:
            if c not in ready and tree.children(c):
                out[c] = max(subtree(u) for u in used)
    return out


def observe_trace(table: np.ndarray, n_workers: int, compute_seconds: float) -> Observations:
    """Observations from a recorded delay trace (rounds × workers, NaN = not recorded)."""
    if table.ndim != 2 or table.shape[1] < n_workers:
        width = table.shape[1] if table.ndim == 2 else 0
        raise ConfigError(
            f"the trace records {width} workers but the job has {n_workers}: record a "
            "trace of this job's workers"
        )
    table = np.asarray(table[:, :n_workers], dtype=np.float64)
    if int(np.sum(~np.isnan(table).all(axis=1))) < MIN_ROUNDS:
        raise ConfigError(f"the trace holds fewer than {MIN_ROUNDS} rounds; fitting needs more")
    missing = [w for w in range(n_workers) if np.isnan(table[:, w]).all()]
    if missing:
        raise ConfigError(f"the trace has no delay for workers {missing}")
    compute = np.where(np.isnan(table), np.nan, compute_seconds)
    return Observations(table, np.zeros(table.shape, dtype=bool), compute)


@dataclass(frozen=True)
class DelayFit:
    """One family fitted to the pooled excess delays."""

    family: str
    params: Mapping[str, float]
    ks: float  # Kolmogorov–Smirnov distance to the Kaplan–Meier estimate (nan: not fitted)
    why_not: str = ""  # why the family could not be fitted

    def cdf(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        if self.family == "shifted-exponential":
            shift, rate = self.params["shift"], self.params["rate"]
            out: np.ndarray = np.where(x < shift, 0.0, 1.0 - np.exp(-rate * (x - shift)))
            return out
        scale, shape = self.params["scale"], self.params["shape"]
        safe = np.maximum(x, scale)
        out = np.where(x < scale, 0.0, 1.0 - (scale / safe) ** shape)
        return out

    def tail_beyond(self, bound: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Draws of X given X > bound (the censored values' completion)."""
        u = rng.random(bound.shape)
        if self.family == "shifted-exponential":
            rate = self.params["rate"]
            lo = np.maximum(bound, self.params["shift"])
            out: np.ndarray = lo - np.log1p(-u) / rate
            return out
        scale, shape = self.params["scale"], self.params["shape"]
        lo = np.maximum(bound, scale)
        out = lo * (1.0 - u) ** (-1.0 / shape)
        return out

    def describe(self) -> str:
        if self.why_not:
            return f"{self.family}: not fitted ({self.why_not})"
        shown = ", ".join(f"{k}={v:.4g}" for k, v in self.params.items())
        return f"{self.family}({shown}), KS distance {self.ks:.3f}"

    def to_dict(self) -> dict[str, Any]:
        """For JSON, which has no NaN: null where a family could not be fitted."""

        def number(value: float) -> float | None:
            return float(value) if math.isfinite(value) else None

        return {
            "family": self.family,
            "params": {k: number(v) for k, v in self.params.items()},
            "ks": number(self.ks),
            "why_not": self.why_not,
        }


@dataclass(frozen=True)
class Fit:
    """The fitted families, best first, and the data they were fitted to."""

    fits: tuple[DelayFit, ...]
    values: np.ndarray  # pooled excess, censored ones at their bound
    censored: np.ndarray

    @property
    def best(self) -> DelayFit:
        return self.fits[0]

    @property
    def tail(self) -> DelayFit:
        """The family a censored value is drawn from beyond its bound: the best fit,
        unless that is a Pareto of shape at most :data:`MIN_TAIL_SHAPE` and the other
        family was fitted. Such a Pareto has an infinite mean, and a draw beyond a bound
        has a median of 2^(1/shape) times it (32 times at 0.2): the fit decides nothing
        but that extrapolation, and the censored data cannot support it. Fitted with the
        scale at the smallest value, a Pareto's shape falls to 0.1-0.3 on exponential
        delays; with three in four values censored (the first of each group of four
        answers), the KS distance of the two families on the observed range were within
        0.03 of each other on auto's refit windows, the log-likelihoods within 0.04 a
        value, and the Pareto was taken for most: a smaller group's rounds then waited
        seconds to hours for workers cancelled before (docs/tuning.md)."""
        best = self.best
        if best.family != "pareto" or best.params.get("shape", math.inf) > MIN_TAIL_SHAPE:
            return best
        return next((f for f in self.fits if f.family != "pareto" and not f.why_not), best)

    @property
    def exact(self) -> int:
        """How many of the values are not censored."""
        return int(np.sum(~self.censored))

    def distance(self, law: DelayFit) -> float:
        """The Kolmogorov–Smirnov distance of ``law`` (fitted to these values or not) to
        their Kaplan–Meier estimate, as each fitted family's ``ks``."""
        return _ks_distance(law, self.values, self.censored)


# A Pareto tail of this shape or less (an infinite mean) is not drawn from: see Fit.tail.
MIN_TAIL_SHAPE = 1.0

# Each family's parameters, in the order a tail option gives them.
_TAIL_KEYS = {"shifted-exponential": ("shift", "rate"), "pareto": ("scale", "shape")}


def tail_option(fit: DelayFit) -> str:
    """A fitted family as text: ``family:key=value,key=value`` (auto's ``tail`` option, as
    ``codedgd tune --write-auto`` writes it; :func:`parse_tail` reads it back)."""
    return f"{fit.family}:" + ",".join(f"{k}={fit.params[k]:.6g}" for k in _TAIL_KEYS[fit.family])


def parse_tail(text: str, owner: str = "auto") -> DelayFit | None:
    """The family :func:`tail_option` wrote (None for ""), or a ConfigError naming what is
    wrong: an unknown family, a missing or unknown parameter, a value out of range."""
    if not text.strip():
        return None
    example = "pareto:scale=0.02,shape=1.5 or shifted-exponential:shift=0.001,rate=50"
    family, _, rest = text.strip().partition(":")
    if family not in _TAIL_KEYS:
        raise ConfigError(
            f"{owner}: tail={text[:60]!r}: the family must be one of {sorted(_TAIL_KEYS)} "
            f"(e.g. {example}, as `codedgd tune --write-auto` writes it)"
        )
    params: dict[str, float] = {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, _, value = item.partition("=")
        try:
            params[key.strip()] = float(value)
        except ValueError:
            params[key.strip()] = math.nan
    keys = _TAIL_KEYS[family]
    if sorted(params) != sorted(keys) or not all(math.isfinite(v) for v in params.values()):
        raise ConfigError(
            f"{owner}: tail={text[:60]!r}: a {family} tail takes {keys[0]}=… and "
            f"{keys[1]}=…, finite numbers (e.g. {example})"
        )
    first, second = params[keys[0]], params[keys[1]]
    low = 0.0 if family == "pareto" else -math.inf  # a Pareto's scale > 0, a shift >= 0
    if not (first > low and first >= 0 and second > 0):
        floor = "> 0" if family == "pareto" else ">= 0"
        raise ConfigError(
            f"{owner}: tail={text[:60]!r}: {keys[0]} must be {floor} seconds and {keys[1]} > 0"
        )
    if family == "pareto" and second <= MIN_TAIL_SHAPE:
        raise ConfigError(
            f"{owner}: tail={text[:60]!r}: a Pareto of shape <= {MIN_TAIL_SHAPE:g} has an "
            "infinite mean, which a run's delays cannot support (see Fit.tail): give "
            "shifted-exponential, or leave tail empty"
        )
    return DelayFit(family, params, math.nan)


NOTHING_TO_FIT = (
    "the run's delays beyond compute are all equal (or fewer than two were seen): nothing to fit"
)


def fit_delays(obs: Observations) -> Fit:
    """Fit every family of :data:`FAMILIES` to the pooled excess (see the module docstring)."""
    seen = ~np.isnan(obs.excess)
    values = obs.excess[seen]
    censored = obs.censored[seen]
    exact = values[~censored]
    if exact.size < 2 or float(np.ptp(exact)) <= 0.0:
        raise ConfigError(
            f"{NOTHING_TO_FIT}; a cluster without stragglers needs no coding (uncoded)"
        )
    fits = [_shifted_exponential(values, censored), _pareto(values, censored)]
    scored = [
        f if f.why_not else DelayFit(f.family, f.params, _ks_distance(f, values, censored))
        for f in fits
    ]
    scored.sort(key=lambda f: (math.isnan(f.ks), f.ks))
    return Fit(tuple(scored), values, censored)


def _ks_distance(law: DelayFit, values: np.ndarray, censored: np.ndarray) -> float:
    """The largest gap between ``law``'s CDF and the Kaplan–Meier estimate of ``values``
    (``censored`` ones at their bound), over the uncensored values."""
    from scipy import stats

    exact = values[~censored]
    km = stats.ecdf(stats.CensoredData(uncensored=exact, right=values[censored]))
    grid = np.unique(exact)
    empirical = km.cdf.evaluate(grid)
    fitted = law.cdf(grid)
    # The ECDF jumps at each grid point: compare against both sides of each step.
    before = np.concatenate([[0.0], empirical[:-1]])
    return float(max(np.max(np.abs(fitted - empirical)), np.max(np.abs(fitted - before))))


def typical_fit(obs: Observations) -> Fit:
    """:func:`fit_delays` over the workers with no persistent excess (the typical ones; a
    slow machine's delays are its own, and pooled in they would make every censored
    worker's draw a slow machine's). A ConfigError when fewer than two are typical, or
    their delays cannot be fitted."""
    typical = obs.persistent_excess() == 0.0
    if typical.sum() < 2:
        raise ConfigError(
            f"{int(typical.sum())} of the {obs.n_workers} workers have no persistent excess "
            "delay: too few typical workers to fit their law"
        )
    return fit_delays(
        replace(
            obs,
            excess=obs.excess[:, typical],
            censored=obs.censored[:, typical],
            compute=obs.compute[:, typical],
            tree=None,  # (some of its workers: no tree)
            left_out_after=None,
            lost=None,
            queue_taken=None,
        )
    )


def _shifted_exponential(values: np.ndarray, censored: np.ndarray) -> DelayFit:
    shift = float(values.min())
    total = float(np.sum(values - shift))
    d = int(np.sum(~censored))
    if total <= 0 or d == 0:
        return DelayFit("shifted-exponential", {}, math.nan, "no spread above the minimum")
    return DelayFit("shifted-exponential", {"shift": shift, "rate": d / total}, math.nan)


def _pareto(values: np.ndarray, censored: np.ndarray) -> DelayFit:
    scale = float(values.min())
    if scale <= 0:
        return DelayFit("pareto", {}, math.nan, "a delay of 0 s: a Pareto law starts above 0")
    logs = float(np.sum(np.log(values / scale)))
    d = int(np.sum(~censored))
    if logs <= 0 or d == 0:
        return DelayFit("pareto", {}, math.nan, "no spread above the minimum")
    return DelayFit("pareto", {"scale": scale, "shape": d / logs}, math.nan)


class ResampledDelay:
    """A straggler model replaying a run's rounds in a seeded random order.

    Round t of the replay is a recorded round drawn with replacement (so the delays within
    a round keep their correlation), each censored value drawn from ``tail``'s law beyond
    its bound. The part of each recorded delay that grows with the worker's load
    (:meth:`Observations.load_excess`: a slow worker's shifted floor) is taken out and
    grown with the load a candidate gives it: the worker waits ``(slowness − 1)·
    compute_seconds`` more, where slowness is its speed times 1 + that part over its
    recorded compute. So a candidate that gives a slow machine less data pays less for
    it, one with the recorded load replays the record as it was, and a longer wait above
    the floor stays as recorded at every load.

    A subtree a codedreduce parent left out (:attr:`Observations.left_out_after`) is not
    a random sample of its workers' rounds: it was the slowest of its siblings. Its
    workers' delays are drawn together, each from its own other rounds, and kept only
    where the subtree comes out ready after the time it was left out at (rejection
    sampling over ``SUBTREE_DRAWS`` tries, its top worker and the fastest m − s children
    of each parent below; up to ``SUBTREE_KEPT`` kept, topped up with the latest of the
    other tries where fewer come out after). Drawn unconditioned, as until commit f7458fe,
    the slowest subtree's rounds looked like anyone's: from such a run on Pareto delays
    at n = 64 tune picked 1.10x the best, now the best (docs/tuning.md). A machine the
    run did without in every round of a stretch is still replayed from its other rounds:
    how slow it was then is in none.
    """

    name: ClassVar[str] = "resampled"

    def __init__(self, obs: Observations, tail: DelayFit, *, seed: int) -> None:
        self.obs = obs
        self.tail = tail
        self.grows = obs.load_excess()  # of each recorded delay: what grows with load
        self._speed = np.maximum(obs.speed(), 1.0)
        self._per_compute = self._speed / np.maximum(obs.worker_compute(), 1e-12)
        self.seed = int(seed)
        self._rows: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._fills = self._subtree_fills()

    def reseeded(self, seed: int) -> ResampledDelay:
        """The same replay under another seed, sharing what was computed from the
        observations (a look-ahead replays them hundreds of times a decision)."""
        out = copy.copy(self)
        out.seed = int(seed)
        out._rows = {}
        return out

    def _row(self, round: int) -> tuple[np.ndarray, np.ndarray]:
        """Round ``round``'s delays without what grows with load, and each worker's
        slowness in what grows (the times its compute it takes)."""
        cached = self._rows.get(round)
        if cached is None:
            rng = np.random.default_rng([self.seed, round, 0x7475])  # "tu"
            pick = int(rng.integers(self.obs.rounds))
            row = self.obs.excess[pick].copy()
            grows = self.grows[pick].copy()
            cens = self.obs.censored[pick]
            if cens.any():
                row[cens] = self.tail.tail_beyond(row[cens], rng)
            for workers, values, drawn_rows in self._fills.get(pick, ()):
                j = int(rng.integers(len(values)))
                row[workers] = values[j]
                grows[workers] = self.grows[drawn_rows[j], workers]
            hole = np.isnan(row)  # not contacted in that round: a value of its own column
            for w in np.flatnonzero(hole):
                column = self.obs.excess[:, w]
                known = ~np.isnan(column)
                drawn = int(rng.choice(np.flatnonzero(known)))
                value = column[drawn]
                if self.obs.censored[drawn, w]:
                    value = float(self.tail.tail_beyond(np.array([value]), rng)[0])
                row[w] = value
                grows[w] = self.grows[drawn, w]
            cached = (np.maximum(row - grows, 0.0), self._speed + grows * self._per_compute)
            if len(self._rows) > 4:
                self._rows.clear()
            self._rows[round] = cached
        return cached

    def _subtree_fills(self) -> dict[int, list[tuple[np.ndarray, np.ndarray, np.ndarray]]]:
        """Per recorded round, each subtree left out there: its workers, and
        ``SUBTREE_KEPT`` draws of their delays (each a row of values and of the rounds
        they were drawn from), those that come out ready after the subtree was left out
        first. Drawn when the replay is built, from a stream of its own (its reseeded
        copies share them); a replayed round picks one."""
        obs, tree, after = self.obs, self.obs.tree, self.obs.left_out_after
        out: dict[int, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}
        if tree is None or after is None:
            return out
        rng = np.random.default_rng([self.seed, 0x7375])  # "su"
        compute = obs.worker_compute()
        known = ~np.isnan(obs.excess)
        wait = tree.fanout - tree.s  # children each parent below level 1 waits for
        for i, head in zip(*np.nonzero(np.isfinite(after)), strict=True):
            workers = list(tree.subtree(int(head)))
            drawn = np.empty((SUBTREE_DRAWS, len(workers)), dtype=np.int64)
            values = np.empty((SUBTREE_DRAWS, len(workers)))
            for j, w in enumerate(workers):
                drawn[:, j] = rng.choice(np.flatnonzero(known[:, w]), size=SUBTREE_DRAWS)
                values[:, j] = obs.excess[drawn[:, j], w]
                cens = obs.censored[drawn[:, j], w]
                if cens.any():
                    values[cens, j] = self.tail.tail_beyond(values[cens, j], rng)
            # When each try's subtree is ready: bottom up, a worker once its own share
            # and its fastest ``wait`` children are.
            ready = values + compute[workers][None, :]
            column = {w: j for j, w in enumerate(workers)}
            for j in reversed(range(len(workers))):  # (numbered level by level)
                kids = [column[c] for c in tree.children(workers[j])]
                if kids:
                    fastest = np.sort(ready[:, kids], axis=1)[:, wait - 1]
                    ready[:, j] = np.maximum(ready[:, j], fastest)
            # The tries that come out after the bound, topped up (where fewer than
            # SUBTREE_KEPT do) with the latest of the rest: a round replayed from one or
            # two draws would repeat them.
            order = np.argsort(-ready[:, 0], kind="stable")
            after_bound = np.flatnonzero(ready[:, 0] >= after[i, head])[:SUBTREE_KEPT]
            rest = order[ready[order, 0] < after[i, head]][: SUBTREE_KEPT - after_bound.size]
            late = np.concatenate([after_bound, rest])
            out.setdefault(int(i), []).append((np.asarray(workers), values[late], drawn[late]))
        return out

    def delay(self, worker: int, round: int, compute_seconds: float, load: float) -> float:
        row, slowness = self._row(round)
        return float(row[worker]) + (float(slowness[worker]) - 1.0) * compute_seconds

    def delays(
        self, workers: np.ndarray, round: int, compute_seconds: np.ndarray, loads: np.ndarray
    ) -> np.ndarray:
        row, slowness = self._row(round)
        out: np.ndarray = row[workers] + (slowness[workers] - 1.0) * compute_seconds
        return out
