"""The search: every candidate policy on the simulator, with the cluster's own delays.

Each candidate (a policy and its parameters valid for the job's n) runs the source job's
data, model, optimizer and seed on the simulator for up to ``rounds`` rounds, ``repeats``
times, each with a different seeded replay of the recorded delays
(:class:`~codedgd.services.stragglers.fitted.ResampledDelay`). Its predicted time to the target
loss is the median over the repeats, with the smallest and largest as the interval; a
repeat reaches the target at the first round from which its loss stays at or below it for
:data:`HOLD` rounds (or to the end of the rounds), and one that never does counts as not
reaching it. The repeats replay one source run: they do not show how far another run of
the same cluster would have moved the prediction (a few rounds of a heavy tail are a noisy
sample of it). With ``draws``, the top candidates are predicted again on that many
redrawn sources (:func:`redraw`: the source's rounds resampled with replacement, the
tail refitted), and each gets the range of those predictions.

The cost model: compute is ``seconds_per_sample`` × rows, calibrated from the source run
(its median compute seconds over the rows a worker computed over in a round: all it
held, or its mini-batch samples), so the candidates pay for the load they give a
worker; links cost nothing, because the recorded excess delays already
hold the source's network time (for messages of the same size: every candidate here
sends one whole gradient per worker; from a ring's or tree's run, whose timings are the
workers' own and hold no network time, every candidate pays a stated :class:`Link`);
decode is timed on this machine. A worker that was
persistently slower than the pool is replayed as a slower machine
(:meth:`~codedgd.services.stragglers.fitted.Observations.load_slowness`), less what a
slower wait explains (its delays spread wider: that part stays at any load), and
``hetero`` candidates give each worker data in proportion to its speed so measured.

The worker-to-worker topologies (ring all-reduce, trees, CodedReduce) are searched only
with a stated :class:`Link`: their messages travel between workers, hop after hop, and a
result file's delays cannot tell the links' time from the straggling. Their candidates
replay the same delays less the source's own round trip at that link
(:func:`star_round_trip`: θ's hop down and one gradient's back; until 2026-11-30 it
stayed in, and the hops came on top of it), and pay the link's latency and bandwidth
on every hop, and the coordinator's NIC (:attr:`Link.coordinator_rate`) on what reaches or
leaves it: a tree's root hears its children one after another. From a ring's or tree's
run the star candidates pay the same links, the coordinator's n messages each way
queued on its NIC; from a star's run its recorded arrivals already hold that queue, and
θ's part of it, each worker's wait for its copy (as the copies went: side by side, or
one after another), is taken out of the delays
(:func:`~codedgd.services.stragglers.fitted.observe` given ``coordinator_egress``) and
put back by every star candidate's own rounds.

The lazy policies searched are those that save the star time with links that cost
nothing: lag-ps, g-lag and lagc contact only the workers (or groups) whose trigger fires,
so a round waits for fewer of them. lag-wk saves uploads only (every worker computes and
the round waits for all), which the free links cannot show, so it is not searched; nor
are the robust policies (they buy safety, not time) or the communication-efficient
codes (smaller messages, which need the link's bandwidth: docs/tuning.md).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import math
import multiprocessing
import os
import signal
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from codedgd.services.codes.frc import divisors
from codedgd.services.codes.tree import TreeShape, shapes
from codedgd.services.errors import ConfigError, JobFailed, PlanError
from codedgd.services.job import Component, JobConfig
from codedgd.services.job.prepare import Prepared, prepare
from codedgd.services.names import SHOWN_PATTERN
from codedgd.services.optim import absolute_lr, lr_times_inverse_l
from codedgd.services.policies.auto import group_size
from codedgd.services.policies.lag import LazyPolicy
from codedgd.services.policies.registry import create
from codedgd.services.policies.tree import CodedReduce
from codedgd.services.records import RoundRecord
from codedgd.services.sim.cost import CostModel
from codedgd.services.sim.engine import FLOAT_BYTES, rows_per_round
from codedgd.services.sim.engines import make_simulator
from codedgd.services.stragglers import StragglerModel
from codedgd.services.stragglers.fitted import (
    MIN_LIVE_ROUNDS,
    DelayFit,
    Observations,
    ResampledDelay,
    fit_delays,
    tail_option,
    typical_fit,
)

SEARCHED = (
    "uncoded",
    "ignore-stragglers",
    "frc",
    "cyclic",
    "erasurehead",
    "hetero",
    "lag-ps",
    "g-lag",
    "lagc",
)
# The lazy policies' trigger weights ξ tried: the authors' (10, see SCHEMES.md) and one a
# tenth of it (more refreshes: closer to the exact path, fewer rounds on stale messages).
LAZY_XI = (1.0, 10.0)
# At the authors' ξ the picked units also refresh, riding along, those past half of their
# trigger (``ride``): the units then refresh together, so fewer rounds wait for anyone
# (docs/lag.md, "Riding along"). At ξ = 1 they refresh often enough that it changes little.
LAZY_RIDE = 0.5
TOPOLOGIES = ("ring-allreduce", "tree", "codedreduce")  # searched with a stated Link
HETEROGENEOUS = 1.25  # slowest / fastest worker beyond which speed-aware loads are tried
# Rounds a candidate's loss must stay at or below the target once there. An approximate
# rule near its noise floor dips below a loss and back: on real processes (n = 8, the
# two-classes scenario) erasurehead r=4 K=2, predicted to reach the target in 1.2 s by
# such a dip, touched it in one run of three. auto's look-ahead asks the same of a rule.
# An exact code or a lazy rule (whose gradient does not depend on who answers first)
# whose loss path is the same in every replay counts its first touch instead: its dip
# is no luck, and a job stops there.
HOLD = 5
# Losses of two replays closer than this (relative) are the same path: what a different
# order of the same sums changes, not a different gradient.
SAME_PATH = 1e-9


class _Held(Exception):
    """A candidate's loss has stayed at or below the target for long enough."""


class _Reach:
    """Watches a run's records: the first round of the latest stretch at or below the
    target (None while above it); stops the run once that stretch is ``hold`` rounds long."""

    def __init__(self, target: float, hold: int = HOLD) -> None:
        self.target = target
        self.hold = hold
        self.records: list[RoundRecord] = []
        self.hit: RoundRecord | None = None
        self.first: RoundRecord | None = None  # the first touch, dip or not

    def __call__(self, record: RoundRecord) -> None:
        self.records.append(record)
        if not record.loss <= self.target:  # (NaN: not there either)
            self.hit = None
            return
        if self.first is None:
            self.first = record
        if self.hit is None:
            self.hit = record
        if record.round - self.hit.round + 1 >= self.hold:
            raise _Held


def candidates(
    n: int,
    policies: Sequence[str] = SEARCHED,
    speeds: Sequence[float] | np.ndarray | None = None,
) -> list[Component]:
    """Every policy × parameters the search tries for ``n`` workers (all valid for n).

    ``hetero`` is tried with ``speeds`` (relative, one per worker) when they differ by
    more than :data:`HETEROGENEOUS`.
    """
    unknown = sorted(set(policies) - set(SEARCHED) - set(TOPOLOGIES))
    if unknown:
        raise ConfigError(
            f"tune cannot search {', '.join(unknown)}; it searches "
            f"{', '.join(SEARCHED + TOPOLOGIES)}"
        )
    out: list[Component] = []
    fractions = sorted({max(1, n // 16), max(1, n // 8), max(1, n // 4), max(1, n // 2)})
    for name in policies:
        if name == "uncoded":
            out.append(Component("uncoded", {}))
        elif name == "ignore-stragglers":
            out += [Component(name, {"s": s}) for s in fractions if s < n]
        elif name == "frc":
            sizes = [d for d in divisors(n) if 2 <= d <= max(2, n // 2)][:4]
            out += [Component(name, {"s": d - 1}) for d in sizes]
        elif name == "cyclic":
            out += [Component(name, {"s": s}) for s in sorted({1, 2, max(1, n // 8)}) if s < n]
        elif name == "erasurehead":
            for r in [d for d in divisors(n) if 2 <= d <= 4]:
                for k in sorted({max(1, n // 4), max(1, n // 2), max(1, 3 * n // 4)}):
                    out.append(Component(name, {"r": r, "K": k}))
        elif name == "lag-ps":
            out += [Component(name, {"xi": xi}) for xi in LAZY_XI]
            out.append(Component(name, {"xi": max(LAZY_XI), "ride": LAZY_RIDE}))
        elif name == "g-lag":  # groups of s + 1, which must divide n
            groups = [d for d in divisors(n) if 2 <= d <= max(2, n // 2)][:2]
            for d in groups:
                out += [Component(name, {"s": d - 1, "xi": xi}) for xi in LAZY_XI]
                out.append(Component(name, {"s": d - 1, "xi": max(LAZY_XI), "ride": LAZY_RIDE}))
        elif name == "lagc":
            tolerated = sorted({1, max(1, n // 8)})
            out += [Component(name, {"s": s, "xi": xi}) for s in tolerated for xi in LAZY_XI]
            out += [
                Component(name, {"s": s, "xi": max(LAZY_XI), "ride": LAZY_RIDE}) for s in tolerated
            ]
        elif name == "hetero" and speeds is not None and len(speeds) == n:
            v = np.asarray(speeds, dtype=np.float64)
            if float(v.max() / v.min()) > HETEROGENEOUS:
                text = ",".join(f"{x:.3g}" for x in v / v.max())
                for s in sorted({0, 1, max(1, n // 8)}):
                    if s < n:
                        out.append(Component(name, {"s": s, "speeds": text}))
        elif name == "ring-allreduce":
            out.append(Component(name, {}))
        elif name == "tree":
            out += [Component(name, tree_options(shape)) for shape in searched_trees(n)]
        elif name == "codedreduce":
            for shape in searched_trees(n):
                m = min(shape[:2])
                for s in sorted({1, m // 2}):
                    if 1 <= s < m:
                        out.append(Component(name, {**tree_options(shape), "s": s}))
    valid = []
    for c in out:
        try:
            policy = create(c.name, c.options)
            policy.plan(n, policy.default_partitions(n))
        except (PlanError, ConfigError):
            continue
        valid.append(c)
    return valid


def step_sizes(steps: Sequence[Any]) -> list[Any]:
    """The step sizes a search tries, each as a job file gives it: a number > 0 (strings
    of numbers, as typed, become numbers), "auto" (1/L) or "F/L" (F times 1/L); the
    first of those that name the same step is kept ("auto" and "1/L" do). A ConfigError
    names a value that is none of these. "F/L" is given back as ``f"{F:g}/L"``."""
    out: list[Any] = []
    seen: set[tuple[str, float]] = set()
    for value in steps:
        try:
            times = lr_times_inverse_l(value)
        except ConfigError:
            times = math.nan
        given: Any
        if times is not None and math.isfinite(times):
            key = ("1/L", times)
            given = "auto" if str(value).strip().lower() == "auto" else f"{times:g}/L"
        else:
            number = absolute_lr(value) if times is None else None
            if number is None:
                raise ConfigError(
                    f"tune --lr {value!r} is not a step size: give a number > 0, auto (1/L), "
                    "or F/L (F times 1/L, e.g. 0.5/L)"
                )
            key, given = ("", number), number
        if key not in seen:
            seen.add(key)
            out.append(given)
    return out


TREE_SHAPES = 4  # trees of two or more levels searched, of the shortest critical paths


def searched_trees(n: int) -> list[tuple[int, int, int]]:
    """The trees (root m₀, fanout m, levels L) the search tries for n workers: the one
    level of n, and of the deeper ones the :data:`TREE_SHAPES` whose critical path (about
    m₀ + (L − 1)·m messages each way) is shortest (at n = 64 all four; a highly composite
    n has dozens, which would multiply the search)."""
    every = shapes(n)
    deep = [shape for shape in every if shape[2] > 1]
    kept = set(sorted(deep, key=lambda sh: (sh[0] + (sh[2] - 1) * sh[1], -sh[0]))[:TREE_SHAPES])
    return [shape for shape in every if shape[2] == 1 or shape in kept]


def tree_options(shape: tuple[int, int, int]) -> dict[str, int]:
    """A tree's options as a job file gives them: fanout and levels, and root only where
    it differs from fanout."""
    root, fanout, levels = shape
    return {"fanout": fanout, "levels": levels} | ({} if root == fanout else {"root": root})


def source_tree(policy: Component) -> TreeShape | None:
    """The tree a run of ``policy`` reduced over (codedreduce's, or tree's), which
    :func:`~codedgd.services.stragglers.fitted.observe` reads its left-out subtrees
    with; None for any other policy, or options no tree has (the run could not have
    run them)."""
    if policy.name not in ("tree", "codedreduce"):
        return None
    try:
        made = create(policy.name, policy.options)
    except (PlanError, ConfigError, TypeError, ValueError):
        return None
    return made.shape if isinstance(made, CodedReduce) else None


@dataclass(frozen=True)
class Link:
    """The links that topology candidates pay for, hop by hop, and the coordinator's NIC.

    Each worker's link has ``latency_seconds`` and ``bandwidth_bytes_per_second``. The
    coordinator is a machine too: every message it sends or receives shares its one NIC,
    of ``coordinator_bandwidth_bytes_per_second`` each way (None: as fast as a worker's
    link, as in a cluster of one instance type; inf: unlimited, the coordinator's side
    never the bottleneck). A star's n copies of θ and n gradients then queue on it,
    where a tree's root hears only its children: what a tree saves. ``burst_bytes``:
    every NIC a token bucket of that many bytes each way, refilled at its rate (tc tbf's
    burst; :class:`~codedgd.services.sim.cost.Buckets`).
    """

    latency_seconds: float
    bandwidth_bytes_per_second: float
    coordinator_bandwidth_bytes_per_second: float | None = None
    # Every NIC's token bucket, bytes each way (CostModel.burst_bytes; 0: none).
    burst_bytes: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.latency_seconds) and self.latency_seconds >= 0):
            raise ConfigError(
                f"the link's latency must be a number of seconds >= 0, got {self.latency_seconds!r}"
            )
        if not self.bandwidth_bytes_per_second > 0:
            raise ConfigError(
                "the link's bandwidth must be a number of bytes/s > 0 (inf: free), got "
                f"{self.bandwidth_bytes_per_second!r}"
            )
        if not (math.isfinite(self.burst_bytes) and self.burst_bytes >= 0):
            raise ConfigError(
                f"the links' burst must be a number of bytes >= 0, got {self.burst_bytes!r}"
            )
        coordinator = self.coordinator_bandwidth_bytes_per_second
        if coordinator is not None and not coordinator > 0:
            raise ConfigError(
                "the coordinator's bandwidth must be a number of bytes/s > 0 (inf: "
                f"unlimited), got {coordinator!r}"
            )

    @property
    def coordinator_rate(self) -> float:
        """The coordinator NIC's bytes/s each way (inf: unlimited)."""
        coordinator = self.coordinator_bandwidth_bytes_per_second
        return self.bandwidth_bytes_per_second if coordinator is None else coordinator

    def charged(self, cost: CostModel) -> CostModel:
        """``cost`` with these links: every hop's latency and bandwidth, and the
        coordinator's NIC as its shared ingress and egress."""
        shared = self.coordinator_rate if math.isfinite(self.coordinator_rate) else None
        return cost.replace(
            latency_seconds=self.latency_seconds,
            bandwidth_bytes_per_second=self.bandwidth_bytes_per_second,
            ingress_bandwidth_bytes_per_second=shared,
            egress_bandwidth_bytes_per_second=shared,
            burst_bytes=self.burst_bytes,
        )

    def to_dict(self) -> dict[str, float | None]:
        """For JSON, which has no inf: null is unlimited."""

        def rate(value: float) -> float | None:
            return value if math.isfinite(value) else None

        return {
            "latency_seconds": self.latency_seconds,
            "bandwidth_bytes_per_second": rate(self.bandwidth_bytes_per_second),
            "coordinator_bandwidth_bytes_per_second": rate(self.coordinator_rate),
            "burst_bytes": self.burst_bytes,
        }


def star_round_trip(obs: Observations, link: Link, theta_bytes: int) -> np.ndarray:
    """The network time (rounds × workers) a star run's recorded delays hold at
    ``link``, beyond what :func:`~codedgd.services.stragglers.fitted.observe` took out:
    θ down (one hop, λ + b/β, less θ's wait on the coordinator's NIC where that was
    taken out, :attr:`Observations.queue_taken`: its own hop overlaps it) and one
    gradient of as many bytes back (λ + b/β; b beyond the links' burst). The gradients'
    queue into the coordinator's NIC is not in it: it follows who was ready first."""
    hop = max(theta_bytes - link.burst_bytes, 0.0) / link.bandwidth_bytes_per_second
    taken = obs.queue_taken if obs.queue_taken is not None else np.zeros(obs.excess.shape)
    # θ reached a worker after its own hop or its wait on the coordinator's NIC, the
    # later of the two; the wait is out already.
    down = np.maximum(hop - taken, 0.0)
    out: np.ndarray = np.where(np.isnan(obs.excess), 0.0, 2 * link.latency_seconds + down + hop)
    return out


LISTED = 8
"""Values of a list option a label shows one by one; a longer list (hetero's speeds at
n = 64) is shown by its count and range (the job file written has every value)."""


def label(c: Component) -> str:
    """``frc s=1``, ``erasurehead r=2 K=4``, ``hetero s=1 speeds=[64: 0.5-1]``."""
    return " ".join([c.name, *(f"{k}={_shown(v)}" for k, v in c.options.items())])


def _shown(value: object) -> str:
    items = str(value).split(",")
    if len(items) <= LISTED:
        return str(value)
    try:
        numbers = [float(v) for v in items]
    except ValueError:
        return f"[{len(items)}: {items[0]},…,{items[-1]}]"
    return f"[{len(items)}: {min(numbers):g}-{max(numbers):g}]"


@dataclass
class Outcome:
    """One candidate's simulated runs."""

    policy: Component
    # The step size it ran at, as the job file gives it (a number, "auto", "F/L"), and
    # that step in numbers. ``lr`` shows in the label when the search was given steps.
    lr: Any = "auto"
    step_size: float = math.nan
    step_shown: bool = False
    times: list[float] = field(default_factory=list)  # to target; inf: not reached
    rounds: list[float] = field(default_factory=list)  # rounds to target; inf: not reached
    round_seconds: list[float] = field(default_factory=list)
    computations: list[float] = field(default_factory=list)  # per round
    bytes_up: list[float] = field(default_factory=list)  # per round
    replication: float = 1.0  # copies of each row across the workers
    exact: bool = True
    error: str = ""
    # Its prediction on each redrawn source (search's ``draws``; empty: not redrawn).
    drawn: list[float] = field(default_factory=list)

    @property
    def label(self) -> str:
        shown = f" lr={self.lr}" if self.step_shown else ""
        return label(self.policy) + shown

    @property
    def predicted(self) -> float:
        return float(np.median(self.times)) if self.times else math.inf

    @property
    def interval(self) -> tuple[float, float]:
        return (min(self.times), max(self.times)) if self.times else (math.inf, math.inf)

    @property
    def reached(self) -> int:
        return sum(1 for t in self.times if math.isfinite(t))

    @property
    def source_interval(self) -> tuple[float, float] | None:
        """The smallest and largest of its predictions on redrawn sources (None: none)."""
        return (min(self.drawn), max(self.drawn)) if self.drawn else None

    def to_dict(self) -> dict[str, Any]:
        finite = [t if math.isfinite(t) else None for t in self.times]
        return {
            "policy": self.policy.to_dict(),
            "label": self.label,
            "lr": self.lr,
            "step_size": self.step_size if math.isfinite(self.step_size) else None,
            "predicted_seconds": self.predicted if math.isfinite(self.predicted) else None,
            "interval_seconds": [v if math.isfinite(v) else None for v in self.interval],
            "times_seconds": finite,
            "rounds_to_target": [r if math.isfinite(r) else None for r in self.rounds],
            "mean_round_seconds": _mean(self.round_seconds),
            "computations_per_round": _mean(self.computations),
            "bytes_up_per_round": _mean(self.bytes_up),
            "replication": self.replication,
            "exact": self.exact,
            "error": self.error,
            # Its predictions on redrawn sources, and their range (null: not redrawn).
            "source_draws_seconds": [t if math.isfinite(t) else None for t in self.drawn],
            "source_interval_seconds": (
                [v if math.isfinite(v) else None for v in self.source_interval]
                if self.source_interval is not None
                else None
            ),
        }


def auto_start(
    outcomes: Sequence[Outcome], obs: Observations | None = None, names: Sequence[str] = ()
) -> tuple[Component, Outcome] | None:
    """``auto`` started where the search says: at the group size r of the best-ranked
    candidate that reached the target and is one of auto's rules
    (:func:`~codedgd.services.policies.auto.group_size`), with that candidate; None when
    no such candidate reached it. Its first rounds then need no data moved, where a
    start at another size has to move to the cluster's first: on real processes a start
    at r = 2 and its move to 4 cost about what the best fixed policy's whole job did
    (docs/tuning.md).

    With the source run's observations, auto gets their :func:`auto_prior`: what its
    look-ahead takes a worker its rounds have not waited for to be, so it can try smaller
    groups than it started with, and their :func:`auto_tail`: the law of the delays it
    draws beyond a censored worker's bound. With ``names`` (:func:`auto_prior_names`),
    the prior's entries follow those machines (auto's ``prior_names``)."""
    prior = auto_prior(obs) if obs is not None else ""
    tail_text = auto_tail(obs) if obs is not None else ""
    for outcome in outcomes:
        if outcome.error or not outcome.reached:
            continue
        r = group_size(outcome.policy.name, outcome.policy.options)
        if r is not None:
            options: dict[str, Any] = {"r": r}
            if prior:
                options["prior"] = prior
                if any(names):
                    options["prior_names"] = ",".join(names)
            if tail_text:
                options["tail"] = tail_text
            return Component("auto", options), outcome
    return None


def auto_prior(obs: Observations) -> str:
    """auto's ``prior`` option from a run's observations: each worker's slowness
    (:meth:`Observations.slowness`, to three digits), or an empty entry for a worker the
    run did not wait for in at least half of the rounds it asked it (and two): a coded
    run cancels its slow workers, whose slowness is then only a lower bound, and a prior
    that called them typical would send auto to groups that wait for them. "" when no
    worker is known, or a known worker's slowness is not finite."""
    slowness = np.maximum(obs.slowness(), 1.0)
    seen = ~np.isnan(obs.excess)
    answered = (seen & ~obs.censored).sum(axis=0)
    known = (answered >= MIN_LIVE_ROUNDS) & (2 * answered >= seen.sum(axis=0))
    if not known.any() or not np.isfinite(slowness[known]).all():
        return ""
    return ",".join(f"{v:.3g}" if k else "" for v, k in zip(slowness, known, strict=True))


def auto_prior_names(records: Sequence[RoundRecord], n: int, source: str) -> list[str]:
    """The name of the machine each place's prior entry was measured on: the holder that
    held the place for most of the rounds (``RoundRecord.holders``; "" where the records
    name none, or two names held it equally long). All "" for files of versions before
    2026-11-30 and the simulator's. A name no worker can be named is refused, naming
    ``source``, the file read."""
    holder: dict[int, str] = {}
    held = [Counter[str]() for _ in range(n)]
    for record in records:
        for w, name in record.holders.items():
            if not (0 <= w < n and SHOWN_PATTERN.fullmatch(name)):
                raise ConfigError(
                    f"{source}: round {record.round} names {name[:70]!r} the holder of place "
                    f"{w}, which is no worker name of a job of {n} workers: the file was not "
                    "written by codedgd, or was edited"
                )
            holder[w] = name
        for w, name in holder.items():
            held[w][name] += 1
    names = []
    for counts in held:
        top = counts.most_common(2)
        unique = top and (len(top) == 1 or top[0][1] > top[1][1])
        names.append(top[0][0] if unique else "")
    return names


def auto_tail(obs: Observations) -> str:
    """auto's ``tail`` option from a run's observations: the family fitted to the delays of
    its typical workers (:attr:`~codedgd.services.stragglers.fitted.Fit.tail`; those with
    no persistent excess), as :func:`~codedgd.services.stragglers.fitted.tail_option`
    writes it; "" when fewer than two of them, or their delays cannot be fitted. The
    slow ones are the prior's (:func:`auto_prior`), and pooled in they would make every
    censored worker's draw theirs: on few-slow at n = 16 a mean excess of 0.05 s where
    the typical workers' is 0.02 s."""
    try:
        tail = typical_fit(obs).tail
    except ConfigError:
        return ""
    return "" if tail.why_not else tail_option(tail)


def _rows_held(prepared: Prepared) -> np.ndarray:
    """Training rows each worker of the plan holds."""
    return rows_per_round(prepared, 0)


def _mean(values: Sequence[float]) -> float | None:
    return float(np.mean(values)) if values else None


def search(
    source: JobConfig,
    obs: Observations,
    tail: DelayFit,
    *,
    target_loss: float,
    rounds: int,
    repeats: int,
    policies: Sequence[str] = SEARCHED,
    data_dir: str | None = None,
    on_step: Callable[[str], None] | None = None,
    delays: Callable[[int], StragglerModel] | None = None,
    cost: CostModel | None = None,
    link: Link | None = None,
    hold: int = HOLD,
    jobs: int = 1,
    steps: Sequence[Any] = (),
    draws: int = 0,
    drawn_top: int = 5,
    network_in_delays: bool = True,
    cores: float | None = None,
) -> list[Outcome]:
    """Simulate every candidate ``repeats`` times; the outcomes, best first.

    ``draws``: predict the best ``drawn_top`` candidates that reached the target again
    on that many redrawn sources (:func:`redraw`), each ``repeats`` times (in ``jobs``
    processes too); their :attr:`Outcome.drawn`.

    ``steps``: the step sizes to run each candidate at (:func:`step_sizes`: numbers,
    "auto" = 1/L, "F/L"); none: the source's own. Given, each outcome's
    label names its step.

    ``delays(repeat)`` and ``cost`` replace the replayed delays and the fitted cost model
    (an exhaustive search under known delays, as bench/bench_tune.py runs it). With a
    ``link``, the worker-to-worker topologies are searched too (all of them when
    ``policies`` is the default), over that link. A run reaches the target where its loss
    stays at or below it for ``hold`` rounds (1: the first touch, where a job given the
    target stops: the truth an exhaustive search measures). With ``jobs`` > 1 (0: one
    per CPU this process may use) the candidates run in that many spawned processes at
    once (not with ``delays``, a callable that need not cross to them): the same
    simulations, so the same outcomes, except through a decode time timed on the machine
    (a ``cost`` without ``decode_seconds``), which the neighbouring processes slow as any
    load would.

    ``network_in_delays`` False: the observed delays hold no network time (a ring's or
    tree's run, whose workers timed themselves, :func:`observe`): every candidate, the
    star's too, pays the ``link`` (which is then required).

    ``cores``: the source's processes shared one machine of that many cores. Every
    candidate that pays the ``link`` pays each message's CPU at both ends too, shared on
    them (:class:`~codedgd.services.sim.cost.CostModel` ``cores``): the topologies, and
    with ``network_in_delays`` False the star's too (whose arrivals, read otherwise,
    hold their own).
    """
    if not network_in_delays and link is None:
        raise ConfigError(
            "the run's timings are its workers' own (a ring or tree run): they hold no "
            "network time, so every candidate needs the links stated (tune "
            "--link-latency SECONDS --link-bandwidth BYTES_PER_S) or measured (tune "
            "--probe-links)"
        )
    if cores is not None and link is None:
        raise ConfigError(
            "cores charge each message's CPU where the candidates pay the links: give the "
            "links too (tune --link-latency SECONDS --link-bandwidth BYTES_PER_S, or "
            "--probe-links)"
        )
    if link is not None and tuple(policies) == SEARCHED:
        policies = SEARCHED + TOPOLOGIES
    hops = [p for p in policies if p in TOPOLOGIES]
    if hops and link is None:
        raise ConfigError(
            f"{', '.join(hops)} {'sends' if len(hops) == 1 else 'send'} gradients between "
            "workers, hop after hop, and a run's "
            "delays do not measure those links: state them (tune --link-latency SECONDS "
            "--link-bandwidth BYTES_PER_S) or measure them on the pool (tune --probe-links) "
            "to search the topologies"
        )
    if repeats < 1 or rounds < 1 or hold < 1:
        raise ConfigError("tune needs --repeats >= 1 and --rounds >= 1 (and hold >= 1)")
    if draws < 0 or drawn_top < 1:
        raise ConfigError("tune needs --source-draws >= 0 (and --top >= 1)")
    if draws and delays is not None:
        raise ConfigError("draws redraw the replayed source: they do not go with given delays")
    n = source.workers
    if obs.n_workers != n:
        raise ConfigError(
            f"the delays are of {obs.n_workers} workers but the job has {n}: they are another job's"
        )
    prepared_source = functools.cache(lambda: prepare(source, data_dir))  # (once, if at all)
    # Seconds per row of the source's cluster: its median compute over the rows a worker
    # computed over in a round (all it held, or its mini-batch samples).
    if cost is None:
        used = rows_per_round(prepared_source(), source.batch_size)
        per_row = obs.median_compute() / max(float(np.median(used)), 1.0)
        cost = CostModel(
            seconds_per_sample=per_row,
            seconds_per_partition=0.0,
            latency_seconds=0.0,
            bandwidth_bytes_per_second=math.inf,
        )
    # (the coordinator sends and hears every candidate's messages as it did the source's)
    over_link = (
        link.charged(cost).replace(sharing=obs.coordinator_sharing, cores=cores)
        if link is not None
        else cost
    )
    if network_in_delays and obs.coordinator_egress is not None:
        # θ's queue on the coordinator's NIC was taken out of the delays: each star
        # candidate's rounds queue their own copies again, as they were sent.
        cost = cost.replace(
            egress_bandwidth_bytes_per_second=obs.coordinator_egress,
            sharing=obs.coordinator_sharing,
        )
    if not network_in_delays:
        cost = over_link
    lrs = step_sizes(steps) if steps else [source.optimizer.get("lr", "auto")]
    trial = _Trial(
        data_dir=data_dir,
        cost=cost,
        over_link=over_link,
        obs=obs,
        # A star's run with the links known: its delays hold its own round trip, which
        # the topologies' hops would pay again; theirs replay the delays without it.
        round_trip=(
            (link, FLOAT_BYTES * prepared_source().dim)
            if network_in_delays and link is not None
            else None
        ),
        tail=tail,
        repeats=repeats,
        target_loss=target_loss,
        hold=hold,
        step_shown=bool(steps),
    )
    configs = [
        _config(source, c, lr, rounds)
        for c in candidates(n, policies, speeds=1.0 / obs.load_slowness())
        for lr in lrs
    ]
    jobs = jobs or _cpus()
    parallel = jobs > 1 and delays is None
    if parallel and len(configs) > 1:
        outcomes = _in_processes([(trial, c) for c in configs], jobs, on_step)
    else:
        outcomes = [trial.run(config, on_step, delays) for config in configs]
    outcomes.sort(key=lambda o: (o.error != "", -o.reached, o.predicted))
    if draws:
        best = [o for o in outcomes if o.reached and not o.error][:drawn_top]
        rng = np.random.default_rng([source.seed, 0x64726177])  # "draw"
        runs: list[tuple[_Trial, JobConfig]] = []
        owners: list[Outcome] = []
        for _ in range(draws):
            drawn = redraw(obs, rng)
            try:
                again = dataclasses.replace(trial, obs=drawn, tail=fit_delays(drawn).tail)
            except ConfigError:
                continue  # (too few distinct values left to fit: a draw of no use)
            for o in best:
                runs.append((again, _config(source, o.policy, o.lr, rounds)))
                owners.append(o)
        if parallel and len(runs) > 1:
            redone = _in_processes(runs, jobs, on_step)
        else:
            redone = [redrawn.run(config, on_step) for redrawn, config in runs]
        for o, outcome in zip(owners, redone, strict=True):
            o.drawn.append(outcome.predicted)
    return outcomes


def _config(source: JobConfig, policy: Component, lr: Any, rounds: int) -> JobConfig:
    """The source job as a candidate runs it: ``policy`` at step ``lr``, ``rounds``
    rounds, no target (the search reads the loss), evaluated every round."""
    return source.replace(
        policy=policy,
        rounds=rounds,
        target_loss=None,
        eval_every=1,
        partitions=0,
        optimizer={**source.optimizer, "lr": lr},
    )


def redraw(obs: Observations, rng: np.random.Generator, tries: int = 20) -> Observations:
    """Another source the cluster could have given: ``obs``'s rounds drawn with
    replacement, as many as it has (whole rounds: who was slow together stays together),
    such that every worker keeps a value. A source of few rounds of a heavy tail holds
    its largest delays in a few rounds, which a draw holds more or less often."""
    for _ in range(tries):
        rows = rng.integers(0, obs.rounds, size=obs.rounds)
        if not np.isnan(obs.excess[rows]).all(axis=0).any():
            break
    else:
        rows = np.arange(obs.rounds)  # (workers seldom seen: the source itself)
    return obs.rows_at(rows)


@dataclass(frozen=True)
class _Trial:
    """How every candidate is run: what :func:`search` was given (sent to the processes)."""

    data_dir: str | None
    cost: CostModel
    over_link: CostModel
    obs: Observations
    # (link, θ bytes) of a star run's round trip in the delays, which topology
    # candidates replay without (:func:`star_round_trip`); None: none in them.
    round_trip: tuple[Link, int] | None
    tail: DelayFit
    repeats: int
    target_loss: float
    hold: int
    step_shown: bool = False

    @functools.cached_property
    def replay(self) -> ResampledDelay:
        """The recorded delays' replay, built once per process (what it reads from the
        observations is the same for every candidate); each repeat reseeds it."""
        return ResampledDelay(self.obs, self.tail, seed=0)

    @functools.cached_property
    def replay_hops(self) -> ResampledDelay:
        """The topology candidates' replay: :attr:`replay`'s, unless the delays hold a
        star's round trip (then without it)."""
        if self.round_trip is None:
            return self.replay
        trip = star_round_trip(self.obs, *self.round_trip)
        return ResampledDelay(self.obs.less(trip), self.tail, seed=0)

    def run(
        self,
        config: JobConfig,
        on_step: Callable[[str], None] | None = None,
        delays: Callable[[int], StragglerModel] | None = None,
    ) -> Outcome:
        """One candidate (``config``'s policy), ``repeats`` times."""
        outcome = Outcome(
            config.policy, config.optimizer.get("lr", "auto"), step_shown=self.step_shown
        )
        try:
            prepared = prepare(config, self.data_dir)
        except (PlanError, ConfigError) as exc:
            outcome.error = str(exc)
            return outcome
        outcome.step_size = prepared.lr
        outcome.replication = float(_rows_held(prepared).sum() / max(prepared.dataset.n_train, 1))
        outcome.exact = bool(prepared.policy.exact)
        on = self.over_link if prepared.plan.topology.kind != "star" else self.cost
        bound = copy.deepcopy(prepared.policy)  # as planned and bound, before any round
        touches: list[_Reach] = []
        for rep in range(self.repeats):
            if on_step is not None:
                on_step(f"{outcome.label} #{rep + 1}")
            # Each repeat is a job of its own: a lazy policy's messages, θ history and
            # warm-up must not carry over from the one before.
            fresh = dataclasses.replace(prepared, policy=copy.deepcopy(bound))
            sim = make_simulator(config, on, prepared=fresh, per_worker=False)
            replay = self.replay if prepared.plan.topology.kind == "star" else self.replay_hops
            sim.straggler = delays(rep) if delays else replay.reseeded(rep)
            sim.metric = False  # (the loss is all a prediction reads)
            reach = _Reach(self.target_loss, self.hold)
            try:
                sim.run(on_record=reach)
            except _Held:
                pass
            except JobFailed as exc:
                outcome.error = str(exc)
                break
            records, hit = reach.records, reach.hit
            touches.append(reach)
            outcome.times.append(hit.wall_seconds if hit else math.inf)
            outcome.rounds.append(hit.round + 1 if hit else math.inf)
            outcome.round_seconds.append(float(np.mean([r.round_seconds for r in records])))
            outcome.computations.append(float(np.mean([r.computations for r in records])))
            outcome.bytes_up.append(float(np.mean([r.bytes_up for r in records])))
        steady = outcome.exact or isinstance(prepared.policy, LazyPolicy)
        if steady and not outcome.error and _same_path(touches):
            outcome.times = [r.first.wall_seconds for r in touches if r.first]
            outcome.rounds = [r.first.round + 1 for r in touches if r.first]
        return outcome


def _same_path(replays: list[_Reach]) -> bool:
    """Whether two or more replays touched the target at the same round along the same
    losses (within :data:`SAME_PATH`): the delays they replayed changed nothing of the
    path there, so (for a rule whose gradient does not depend on who answers first) a
    dip below the target is where any run of it stops, not luck."""
    firsts = [r.first.round for r in replays if r.first is not None]
    if len(replays) < 2 or len(firsts) < len(replays) or len(set(firsts)) > 1:
        return False
    end = firsts[0] + 1
    paths = [np.array([rec.loss for rec in r.records[:end]]) for r in replays]
    return all(np.allclose(path, paths[0], rtol=SAME_PATH, atol=0.0) for path in paths)


BLAS_THREADS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


@contextlib.contextmanager
def _blas_threads(count: int) -> Iterator[None]:
    """Processes started meanwhile use ``count`` BLAS threads (unless the user set them).

    Each process would otherwise start one per CPU: on 2 CPUs, two processes of two
    threads each made the search 1.9x slower than one process (n = 64), where two of
    one thread each made it 1.25x faster."""
    before = {name: os.environ.get(name) for name in BLAS_THREADS}
    for name, value in before.items():
        if value is None:
            os.environ[name] = str(count)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)


def _cpus() -> int:
    """The CPUs this process may run on (all of the machine's where that is not known)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # (not on every platform)
        return os.cpu_count() or 1


def _quiet() -> None:
    """In a search process: Ctrl-C is the parent's to handle (no traceback from each)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _in_processes(
    runs: list[tuple[_Trial, JobConfig]], jobs: int, on_step: Callable[[str], None] | None
) -> list[Outcome]:
    """:meth:`_Trial.run` of every (trial, config) in ``jobs`` spawned processes; the
    outcomes in the runs' order (a tie is then broken as the serial search breaks it)."""
    context = multiprocessing.get_context("spawn")  # no fork of the caller's threads
    processes = min(jobs, len(runs))
    pool = ProcessPoolExecutor(max_workers=processes, mp_context=context, initializer=_quiet)
    try:
        with _blas_threads(max(1, _cpus() // processes)):  # (the processes start here)
            futures = {pool.submit(trial.run, config): i for i, (trial, config) in enumerate(runs)}
        done: dict[int, Outcome] = {}
        for future in as_completed(futures):
            try:
                outcome = future.result()
            except BrokenProcessPool as exc:
                raise JobFailed(
                    f"a search process ended before its candidate was done ({exc}): out of "
                    f"memory, or killed? Each of the {processes} holds the job's data; "
                    "search in fewer (--jobs) or in this process (--jobs 1)"
                ) from exc
            done[futures[future]] = outcome
            if on_step is not None:
                for rep in range(runs[futures[future]][0].repeats):
                    on_step(f"{outcome.label} #{rep + 1}")
        return [done[i] for i in range(len(runs))]
    except BaseException:
        # Interrupted (Ctrl-C) or failed: the candidates still running are not waited for.
        # They ignore SIGINT (_quiet), and at exit the pool joins them: a second Ctrl-C
        # there left the process hung for good. (ProcessPoolExecutor has no public way to
        # stop its processes before Python 3.14.)
        running = getattr(pool, "_processes", None) or {}
        for process in list(running.values()):
            process.terminate()
        raise
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
