"""``auto``: groups of workers that share partitions, with the group size r and the round's
rule chosen online by a look-ahead.

Groups of r workers share r partitions (frc's, erasurehead's and g-lag's placement). An
eager round waits for the K-th arrival or until every group has one (K = n: exact, frc
with s = r − 1; smaller K: erasurehead's early stop, unbiased by the 1/(1−p) rescaling;
r = 1 is uncoded or ignore-stragglers). A lazy round (a trigger weight ξ in ``lazy``) is
g-lag's with s = r − 1: only the groups whose LAG trigger fires are asked, each one's
first arrival used, and the step takes the other groups' last messages (with ``ride``,
the groups near their trigger are asked along, see g-lag's option). Auto keeps a
g-lag on its groups that follows the eager rounds too (each group's latest message and
the θ it was computed at, θ's moves), so a switch to lazy rounds goes on from them and
a switch back needs nothing; LAG's warm-up (every group asked, the first D rounds)
counts the job's rounds of either kind. The job starts at the configured r (without
one, :func:`default_size`, within ``sizes``) in lazy
rounds at the largest weight (``start=lazy``, the default once :meth:`bind` has the
data: their first D rounds ask every group, as exact rounds do) or with K = n
(``start=exact``, ``lazy=none``, or unbound). At round ``first`` (2) and then every
``window`` rounds an attached chooser (the coordinator
and the simulator attach :class:`codedgd.services.sim.lookahead.Lookahead`) refits the
delays of the last rounds, simulates the next rounds from the current θ under every
candidate: (r, K) in ``sizes`` × ``choices`` and (r, ξ) in ``sizes`` × ``lazy`` (with
lazy choices, a decision is also due at round D, when their warm-up ends; in a lazy
start's warm-up decisions choose only among the lazy rules at its ξ, i.e. the group size,
and come every ``first`` rounds while they keep up with the rounds), and the policy
switches to the one predicted to save the most time over the job's remaining rounds, net
of the cost of moving data. The decision is a :meth:`deliberation`: the coordinator runs
it in a thread while the rounds go on, and it takes effect at the first round after it
has finished (the note names the round whose θ it started from); the simulator takes it
at once.

Changing K or ξ needs no data movement. Changing r does: the groups change, and each
worker needs the partitions of its new group (the lazy rounds' messages start afresh).
:meth:`replan` hands the drivers the new plan; the coordinator ships every worker only
the partitions it lacks between two rounds (going to a smaller r ships nothing) and
times it, the simulator charges it on its clock. Every switch is said
(:meth:`round_note`: logged, counted, written into the round's record), and a checkpoint
keeps the rule in use and the lazy rounds' memory, so a resumed job is assigned with
that r and goes on as it would have. With lazy choices the simulator runs the job on its
events engine (stale messages are no order of arrivals).

A smaller group waits for workers the larger one's rounds may never have waited for (a
group's first arrival ends its part of the round; its other members are cancelled), so
the look-ahead does not try a smaller group size while one of its groups would hold
unheard workers only. ``prior`` gives each worker's slowness from an earlier run on the
pool (``codedgd tune --write-auto`` writes it, for the workers that run waited for): it
stands in for a worker until the worker answers, and a worker it knows is never unheard.
With ``prior_names`` (the machine each entry was measured on, which tune writes from a run
whose delays were the machines' own) the entries follow the machines to the places they
hold (:meth:`assigned`, :meth:`replaced`); without, they are by place. ``tail`` is the
law censored delays are drawn from, until it no longer fits the job's own rounds (the
look-ahead's test).

Without a chooser (a policy object used alone) it stays at its start rule.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from codedgd.services.codes.erasurehead import erasure_probability
from codedgd.services.codes.frc import divisors
from codedgd.services.errors import ConfigError, PlanError
from codedgd.services.names import SHOWN_PATTERN, machine, match_machines
from codedgd.services.policies.base import Estimate, JobContext, Param, Plan, RoundSpec
from codedgd.services.policies.erasurehead import ErasureHead
from codedgd.services.policies.frc import FractionalRepetition
from codedgd.services.policies.lag import D_PARAM, DEFAULT_D, check_ride
from codedgd.services.policies.lag_coded import GroupLag
from codedgd.services.policies.registry import create, register
from codedgd.services.records import RoundRecord
from codedgd.services.stragglers.fitted import MIN_LIVE_ROUNDS, parse_tail

log = logging.getLogger(__name__)

# The lazy rounds' ride (g-lag's: a round that asks some group also asks the groups past
# half of their trigger). With LAG's own rule (1) the groups drift into refreshing a round
# or two apart, and each such round waits for someone; riding along keeps them together.
# On bench_tune's scenarios (bench_ride), fixed g-lag with ξ = 10 at groups of 4 took
# 0.63-0.74 of its time with 1 (0, 0.5 and 0.7 alike; docs/lag.md, "Riding along",
# and docs/tuning.md).
DEFAULT_RIDE = 0.5


@dataclass(frozen=True, order=True)
class Choice:
    """One configuration auto can run: group size r and stop rule K, or with ``xi`` > 0
    g-lag's lazy rounds on the same groups (LAG's trigger weight ξ; every picked group
    waited for, so K = n)."""

    r: int
    k: int
    xi: float = 0.0

    @property
    def lazy(self) -> bool:
        return self.xi > 0

    def __str__(self) -> str:
        return f"r={self.r} lazy xi={self.xi:g}" if self.lazy else f"r={self.r} K={self.k}"


class Chooser(Protocol):
    """Picks the (r, K) for the next rounds from the rounds so far."""

    def choose(
        self,
        t: int,
        theta: np.ndarray,
        records: Sequence[RoundRecord],
        current: Choice,
        choices: Sequence[Choice],
        memory: Mapping[str, Any] | None = None,
    ) -> tuple[Choice, str]:
        """(the choice to use from round t on, why) given the last rounds' records, and
        ``memory``: what lazy rounds on the current groups go on from (g-lag's
        :meth:`~codedgd.services.policies.lag.LazyPolicy.state`; None without lazy
        choices)."""
        ...

    def renew(self, worker: int, prior: float | None, since: int = 0) -> None:
        """A new machine holds place ``worker``: what is known of the old one (its
        delays, its prior) no longer speaks for it; ``prior`` is the new one's slowness
        from the prior (None: not known), and ``since`` the first round it held the place
        (the records of earlier rounds at that place are the old one's). Called between
        decisions."""
        ...


def _ints(text: str, what: str) -> set[int]:
    try:
        return {int(v) for v in text.split(",") if v.strip()}
    except ValueError:
        raise PlanError(f"auto: {what}={text!r}: give whole numbers, comma-separated") from None


def _weights(text: str) -> tuple[float, ...]:
    """The lazy option's trigger weights ξ ("none": no lazy choice)."""
    if text.strip().lower() == "none":
        return ()
    try:
        values = {float(v) for v in text.split(",") if v.strip()}
    except ValueError:
        raise ConfigError(
            f"auto: lazy={text!r}: give trigger weights xi > 0, comma-separated, or none"
        ) from None
    bad = sorted(v for v in values if not (v > 0 and math.isfinite(v)))
    if bad:
        raise ConfigError(f"auto: lazy weights {bad} are not > 0: give xi > 0, or lazy=none")
    return tuple(sorted(values))


def _prior(text: object) -> tuple[float | None, ...]:
    """The prior option: each worker's slowness (1 = a typical worker; None where the
    entry is empty: not known), or () for none."""
    if not isinstance(text, str):
        raise ConfigError(
            f"auto: prior must be a string of numbers, comma-separated, one per worker "
            f'(e.g. prior = "1,1,4.2,1"), got {text!r}'
        )
    if not text.strip():
        return ()
    try:
        values = tuple(float(v) if v.strip() else None for v in text.split(","))
    except ValueError:
        raise ConfigError(
            f"auto: prior={text[:60]!r}: give one slowness per worker (its compute and "
            "persistent extra delay in units of a typical worker's compute: 1 = typical, 2 "
            "= one compute more; empty: not known), comma-separated, as `codedgd tune "
            "--write-auto` writes them"
        ) from None
    bad = [i for i, v in enumerate(values) if v is not None and not (v >= 1.0 and math.isfinite(v))]
    if bad:
        shown = ", ".join(f"worker {i}: {values[i]:g}" for i in bad[:8])
        raise ConfigError(
            f"auto: prior values are not finite numbers >= 1 ({shown}): a slowness is how "
            "many times a typical worker's compute a worker's compute and persistent extra "
            "delay take for the same load (1 = typical)"
        )
    return values


def _prior_names(text: object) -> tuple[str, ...]:
    """The prior_names option: the name of the machine each prior entry was measured on
    ("" where none is known), or () for none: the prior is then by place."""
    if not isinstance(text, str):
        raise ConfigError(
            f"auto: prior_names must be a string of worker names, comma-separated, one per "
            f'prior entry (e.g. prior_names = "a,b,c,d"), got {text!r}'
        )
    if not text.strip():
        return ()
    names = tuple(v.strip() for v in text.split(","))
    bad = [v for v in names if v and SHOWN_PATTERN.fullmatch(v) is None]
    if bad:
        raise ConfigError(
            f"auto: prior_names has {bad[0][:70]!r}, which no worker can be named (letters, "
            "digits and . _ : @ + - only): give the names the coordinator showed for the "
            "source run's workers, as `codedgd tune --write-auto` writes them"
        )
    return names


# The fixed policies auto has among its rules: those on its placement, groups of r workers
# sharing r partitions (:func:`group_size`).
GROUP_POLICIES = ("uncoded", "ignore-stragglers", "frc", "erasurehead", "lag-ps", "g-lag")


def default_size(n_workers: int) -> int:
    """The group size auto starts at without ``r``: 4 where 4 divides n and n >= 8, else 2
    where n is even, else 1.

    Groups of 4 were the best fixed group size in every case measured at n = 64 and on
    real processes at n = 8, and auto started there took 1.00 and 0.92-1.13 of the best
    fixed policy's time; a start at 2 was 1.33-1.77x behind on the real processes (its
    rounds before the move to 4, and the move, cost about what the best policy's whole
    job did). At n = 16, where groups of 2 were best on three of six scenarios, the start
    at 4 costs 1.3-1.5x there (docs/tuning.md, How well it picks)."""
    if n_workers >= 8 and n_workers % 4 == 0:
        return 4
    return 2 if n_workers % 2 == 0 else 1


def group_size(name: str, options: Mapping[str, Any]) -> int | None:
    """The group size r of the fixed policy ``name`` with ``options`` when auto has it among
    its rules (groups of r workers sharing r partitions: uncoded, ignore-stragglers and
    lag-ps at r = 1; frc and g-lag at s + 1; erasurehead at its r), or None for a policy of
    another placement (cyclic, lagc, hetero, the topologies, frc voting out corrupt
    workers). ``codedgd tune --write-auto`` starts auto at the best such policy's r, so
    its rounds there need no data moved."""
    if name not in GROUP_POLICIES:
        return None
    if name in ("uncoded", "ignore-stragglers", "lag-ps"):
        return 1
    policy = create(name, options)  # (its defaults, and a clear error for bad options)
    if isinstance(policy, ErasureHead):
        return policy.r
    if isinstance(policy, GroupLag):
        return policy.s + 1
    if isinstance(policy, FractionalRepetition) and not policy.byzantine:
        return policy.s + 1
    return None


@register
class Auto(ErasureHead):
    name = "auto"
    summary = (
        "adaptive: groups of r workers share r partitions; at round `first`, then every "
        "`window` rounds, a look-ahead on the simulator, with the delays refitted from the "
        "last rounds, picks "
        "the group size r (moving data when it pays) and the round's rule: how many "
        "arrivals to wait for (K = n: exact frc; fewer: erasurehead) or g-lag's lazy "
        "trigger xi"
    )
    exact = False
    adapts = True
    parameters = (
        Param(
            "r",
            int,
            0,
            "starting group size: workers sharing r partitions (r divides n); 0: 4 where 4 "
            "divides n and n >= 8, else 2 where n is even, else 1 (with sizes given, the "
            "largest of them up to that, else the smallest); `codedgd tune RESULTS.json "
            "--write-auto JOB.toml` sets it from a run on your cluster",
        ),
        Param(
            "sizes",
            str,
            "",
            "the group sizes r to choose among, comma-separated, each dividing n (default: "
            "those of 1, 2, 4 and the starting r that divide n; a starting r given must be "
            "among those given); a change of r moves data",
        ),
        Param("window", int, 10, "rounds between decisions, and rounds refitted (>= 5)"),
        Param(
            "first",
            int,
            MIN_LIVE_ROUNDS,
            f"the round of the first decision (>= {MIN_LIVE_ROUNDS}: a fit needs them); "
            "in a lazy start's warm-up (its first D rounds, exact ones) decisions choose "
            "only the group size, and come every `first` rounds while each takes effect "
            "within that many",
        ),
        Param(
            "choices",
            str,
            "",
            "the K values to choose among, comma-separated (default n/4, n/2, 3n/4 and n); "
            "rounds before the first decision run the start rule regardless",
        ),
        Param(
            "start",
            str,
            "lazy",
            "the rule until the first decision: lazy (g-lag's rounds at the largest lazy "
            "weight; the first D rounds ask every group, as exact ones) or exact (K = n); "
            "with lazy=none, exact",
        ),
        Param(
            "lazy",
            str,
            "1,10",
            "g-lag's trigger weights xi to choose among as well, comma-separated (lazy "
            "rounds on the same groups: only groups whose trigger fires are asked, the "
            "others' last messages reused); none: eager rules only",
        ),
        D_PARAM,
        Param(
            "ride",
            float,
            DEFAULT_RIDE,
            "lazy rounds: in a round that asks some group, also ask those past this fraction "
            "of their trigger (g-lag's ride; 1: LAG's own rule)",
        ),
        Param(
            "prior",
            str,
            "",
            "each worker's slowness from an earlier run: its compute and persistent extra "
            "delay in units of a typical worker's compute (1 = typical; empty: not known), "
            "comma-separated, one per worker: the look-ahead's guess for a worker the job's "
            "rounds have not waited for (a smaller group size is not tried while one of its "
            "groups would hold only unheard workers the prior does not know); `codedgd tune "
            "--write-auto` writes it",
        ),
        Param(
            "prior_names",
            str,
            "",
            "the name of the worker each prior entry was measured on, comma-separated, in "
            "the prior's order: the entries follow those machines to whatever places they "
            "hold (a name the source run did not have: not known); empty: the prior is by "
            "place. `codedgd tune --write-auto` writes it from a run whose delays were the "
            "machines' own (no straggler model)",
        ),
        Param(
            "tail",
            str,
            "",
            "the law of the delays the look-ahead draws beyond a censored worker's bound "
            "(family:params, e.g. pareto:scale=0.02,shape=1.5), instead of one fitted to "
            "each refit window (its few values, most of them censored), until it no longer "
            "fits the job's own rounds (tested at every decision, over up to its last 60 "
            "timed rounds; then their fit, logged); `codedgd tune "
            "--write-auto` writes the one it fitted to the run it read",
        ),
    )

    def __init__(
        self,
        r: int = 0,
        window: int = 10,
        choices: str = "",
        sizes: str = "",
        first: int = MIN_LIVE_ROUNDS,
        lazy: str = "1,10",
        D: int = DEFAULT_D,
        start: str = "lazy",
        ride: float = DEFAULT_RIDE,
        prior: str = "",
        tail: str = "",
        prior_names: str = "",
    ) -> None:
        if r < 0:
            raise ConfigError(f"auto: r must be a group size >= 1 (or 0: by n), got r={r}")
        super().__init__(r=r, K=0, delta=1.0)
        self.r_asked = r  # 0: default_size(n) at plan()
        if window < 5:
            raise ConfigError(f"auto: window must be >= 5 rounds (a fit needs them), got {window}")
        if first != 0 and first < MIN_LIVE_ROUNDS:
            raise ConfigError(
                f"auto: first must be >= {MIN_LIVE_ROUNDS} rounds (a fit needs them), got {first}"
            )
        if start not in ("lazy", "exact"):
            raise ConfigError(f"auto: start={start!r}: choose lazy or exact")
        if D < 1:
            raise ConfigError(f"auto: D must be >= 1 round of history, got D={D}")
        self.ride = check_ride("auto", ride)
        self.window = window
        self.first = first or MIN_LIVE_ROUNDS  # (0, the earlier default: the same)
        self.start = start
        self.choices_text = choices
        self.sizes_text = sizes
        self.weights = _weights(lazy)  # the lazy ξ values
        self.prior = _prior(prior)  # each worker's slowness from an earlier run (or None), or ()
        # The machines the prior's entries were measured on (by their names), or (): the
        # prior is by place. With them, the entries as given are kept here, and the
        # prior in use is theirs for the machines holding the places (assigned()).
        self.prior_names = _prior_names(prior_names)
        self._measured = self.prior
        self._holders: list[str] = []  # each place's holder's name (assigned, replaced)
        self.tail = parse_tail(tail)  # the delays' law beyond a bound (None: fitted live)
        self.D = D
        self.xi = 0.0  # in use: 0 = eager rounds
        self.choices: tuple[int, ...] = ()  # the K values
        self.sizes: tuple[int, ...] = ()  # the r values
        self.chooser: Chooser | None = None
        self.switches = 0
        self.moves = 0  # switches of r (data moved)
        self._k_parts = 0
        self._context: JobContext | None = None
        # g-lag on the groups in use: runs the lazy rounds, and follows the eager ones
        # (their group messages, the θ history), so a switch to lazy goes on from them.
        self._memory: GroupLag | None = None
        self._records: deque[RoundRecord] = deque(maxlen=window)
        self._note = ""
        self._pending: tuple[int, Choice, str] | None = None
        self._asked: int | None = None  # the round of the latest deliberation
        self._lag: int | None = None  # rounds from it to the one it took effect at
        # Places new machines took (→ their prior entry, and the first round they held
        # it), not yet told the chooser.
        self._replaced: dict[int, tuple[float | None, int]] = {}
        self._replanned: Plan | None = None
        self._ran = Choice(r, 0)

    def plan(self, n_workers: int, n_partitions: int) -> Plan:
        valid = divisors(n_workers)
        if self.r_asked and self.r_asked not in valid:
            raise PlanError(
                f"auto: the starting group size r={self.r_asked} does not divide "
                f"n={n_workers}: choose among {valid} (or r=0: by n)"
            )
        if self.sizes_text.strip():
            sizes = _ints(self.sizes_text, "sizes")
            bad = sorted(r for r in sizes if r not in valid)
            if bad:
                raise PlanError(
                    f"auto: sizes {bad} do not divide n={n_workers}: choose among {valid}"
                )
            if self.r_asked and self.r_asked not in sizes:
                raise PlanError(
                    f"auto: the starting group size r={self.r_asked} is not among sizes "
                    f"{sorted(sizes)}: add it to sizes, or start at one of them"
                )
        else:
            sizes = {r for r in (1, 2, 4) if r in valid}
        if self.r_asked == 0:  # by n, within the sizes given: the largest up to it
            start = default_size(n_workers)
            self.r = max((r for r in sizes if r <= start), default=min(sizes, default=start))
        plan = super().plan(n_workers, n_partitions)
        self._k_parts = n_partitions
        if self.choices_text.strip():
            wanted = _ints(self.choices_text, "choices")
        else:
            wanted = {math.ceil(n_workers * f) for f in (0.25, 0.5, 0.75)} | {n_workers}
        bad = sorted(k for k in wanted if not 1 <= k <= n_workers)
        if bad:
            raise PlanError(f"auto: choices {bad} are not in 1..n={n_workers}")
        self.choices = tuple(sorted(wanted))
        self.sizes = tuple(sorted(sizes | {self.r}))
        if self.prior and len(self.prior) != n_workers:
            raise PlanError(
                f"auto: prior has {len(self.prior)} values but the job has {n_workers} "
                "workers: give one slowness per worker (tune --write-auto on a run of this "
                "pool writes them)"
            )
        if self.prior_names and len(self.prior_names) != len(self.prior):
            raise PlanError(
                f"auto: prior_names has {len(self.prior_names)} names but prior has "
                f"{len(self.prior)} values: give one name per prior entry (the worker it was "
                "measured on), as tune --write-auto writes them, or no prior_names"
            )
        self._use(Choice(self.r, n_workers))
        self._ran = self.current
        return plan

    def bind(self, context: JobContext) -> None:
        """The job's data: lazy rounds become possible (they need its smoothness
        constants), and with ``start=lazy`` the job starts in them (an unbound policy
        starts exact). A ``first`` at or past the job's last round is warned about:
        auto will change nothing, and runs its start rule throughout."""
        if context.rounds is not None and self.first >= context.rounds - 1:
            # (A decision at the last round would settle after it on the coordinator.)
            log.warning(
                "auto: first = %d is at or past the job's last round (%d: rounds = %d, "
                "numbered from 0): auto will change nothing and runs its start rule "
                "throughout. Give first < %d for it to adapt (or keep it so, to measure the "
                "start rule alone)",
                self.first,
                context.rounds - 1,
                context.rounds,
                context.rounds - 1,
            )
        self._context = context
        self._memory = self._lazy_rounds(None)
        if self._memory is not None and self.start == "lazy" and self._ran.k == self._n:
            self._use(Choice(self.r, self._n, max(self.weights)))
            self._ran = self.current

    def _lazy_rounds(self, before: GroupLag | None) -> GroupLag | None:
        """g-lag on groups of the r in use, bound to the job (None without lazy choices);
        with the θ history and rounds of ``before`` (the groups' messages are not its)."""
        if not self.weights or self._context is None:
            return None
        memory = GroupLag(s=self.r - 1, D=self.D, xi=self.xi or self.weights[0], ride=self.ride)
        memory.plan(self._n, self._k_parts)
        memory.bind(self._context)
        if before is not None:
            kept = before.state()
            units = len(memory.groups)
            memory.load_state(
                {**kept, "latest": None, "theta_hat": None, "has": np.zeros(units, dtype=bool)}
            )
        return memory

    @property
    def current(self) -> Choice:
        """The rule in use."""
        return Choice(self.r, self.k, self.xi)

    def options(self) -> tuple[Choice, ...]:
        """Every rule the chooser may pick."""
        eager = [Choice(r, k) for r in self.sizes for k in self.choices]
        lazy = [Choice(r, self._n, xi) for r in self.sizes for xi in self.weights]
        return tuple(eager + lazy)

    def attach(self, chooser: Chooser) -> None:
        """Let ``chooser`` pick the rule every ``window`` rounds."""
        self.chooser = chooser

    def _regroup(self, r: int) -> Plan:
        """The plan with groups of r (sets r; the K in use is kept)."""
        self.r = r
        plan = self._plan_groups(self._n, self._k_parts, r)
        self._use(self.current)
        self._memory = self._lazy_rounds(self._memory)
        return plan

    def _use(self, choice: Choice) -> None:
        self.k = choice.k
        self.xi = choice.xi
        self.p = erasure_probability(self._n, self.r, choice.k)
        self.scale = 1.0 / (1.0 - self.p) if self.scaled else 1.0
        if self._memory is not None and choice.lazy:
            self._memory.history.xi = choice.xi

    def decides_by_order(self) -> bool:
        # Lazy rounds step with stale messages, which an order of arrivals cannot tell.
        return not self.weights

    def deliberation(
        self, t: int, theta: np.ndarray
    ) -> Callable[[], tuple[int, Choice, str]] | None:
        """At round ``first``, then ``window`` rounds after the latest decision began (and
        with lazy choices, at round D, when their warm-up ends, if none began there): the
        chooser's call on copies of θ_t, the last rounds' records and the lazy rounds'
        memory (slow: the coordinator runs it in a thread while rounds go on);
        :meth:`settle` takes its answer."""
        if self.chooser is not None:  # (no decision runs now: safe to tell it)
            for worker, (prior, since) in sorted(self._replaced.items()):
                self.chooser.renew(worker, prior, since)
            self._replaced.clear()
        if (
            self.chooser is None
            or len(self._records) < MIN_LIVE_ROUNDS
            or self._pending is not None
        ):
            return None  # (a settled choice not yet taken: the next looks ahead from it)
        # Lazy rules ask every group until round D (LAG's warm-up): a decision before it
        # sees them no faster than exact rounds, so one more is due when it ends.
        warm = bool(self.weights) and self._asked is not None and self._asked < self.D <= t
        if self._asked is None:
            due = t >= self.first
        else:
            # In a lazy start's warm-up a move to another group size restarts nothing
            # (every group is asked anyway) and each round at too large a size costs:
            # decide every `first` rounds until it ends. (Decided at round 2 and then at
            # D, auto lost up to a quarter of its time to the best fixed rule at n = 16
            # where pairs are best: at round 2 some pair held two workers never heard
            # from, so pairs were not tried, and the rounds to D ran at groups of 4.)
            # Only while decisions keep up with the rounds (the last took effect within
            # `first` rounds of the one it looked from): on the coordinator a decision
            # takes tens of short rounds (n = 8 here), and more of them would only share
            # the cores with the workers.
            since = t - self._asked
            quick = self._lag is not None and self._lag < self.first
            early = quick and self.current.lazy and t < self.D and since >= self.first
            due = since >= self.window or warm or early
        if not due:
            return None
        self._asked = t
        chooser, current, options = self.chooser, self.current, self.options()
        if current.lazy and t < self.D:
            # In the warm-up, lazy rounds ask every group: exact rounds, which make the same
            # progress per round whatever r, so a look-ahead from a few rounds compares
            # their round times fairly. Not so against eager stop rules (K < n), which look
            # fast from a few rounds and stall later: those wait for the decision at D.
            options = tuple(c for c in options if c.lazy and c.xi == current.xi)
        records, point = list(self._records), np.array(theta, copy=True)
        memory = self._memory.state() if self._memory is not None else None

        def decide() -> tuple[int, Choice, str]:
            choice, why = chooser.choose(t, point, records, current, options, memory)
            return t, choice, why

        return decide

    def settle(self, outcome: object) -> None:
        """The chooser's answer: it takes effect at the next :meth:`begin_round` (after
        :meth:`replan`, when it changes r)."""
        match outcome:  # what decide() returned
            case (int() as t, Choice() as choice, str() as why):
                # Every decision, kept or not, with its reason (-vv): a switch is also
                # in the round's note; a choice kept is said only here.
                log.debug("the look-ahead from round %d chose %s: %s", t, choice, why)
                self._pending = (t, choice, why)
            case _:
                raise TypeError(f"auto: settle() takes what its deliberation returned: {outcome!r}")

    def replan(self) -> Plan | None:
        """The plan of a new group size, once, when the pending choice changes r."""
        plan, self._replanned = self._replanned, None
        pending = self._pending
        if pending is not None and pending[1].r != self.r:
            plan = self._regroup(pending[1].r)
            self.moves += 1
        return plan

    def begin_round(self, t: int, theta: np.ndarray) -> RoundSpec:
        self._note = ""
        pending, self._pending = self._pending, None
        if pending is not None:
            asked, choice, why = pending
            self._lag = t - asked  # rounds the decision took to take effect
            if choice.r != self.r:
                raise PlanError(
                    f"auto: round {t} is to run with r={choice.r} but the plan has r={self.r}: "
                    "the driver must call replan() and move the data before begin_round()"
                )
            if choice.lazy and self._memory is None:
                raise PlanError(f"auto: {choice} is lazy, but lazy=none or the job is not bound")
            if choice != self._ran:
                self._use(choice)
                since = f"; looked ahead from round {asked}" if asked != t else ""
                self._note = f"auto: {self._ran} -> {choice} ({why}{since})"
                self.switches += 1
        self._ran = self.current  # what the last round ran: a switch is told against it
        spec = super().begin_round(t, theta)  # (eager rounds' state; lazy ones leave it)
        if self._memory is None:
            return spec
        if self.xi > 0:
            return self._memory.begin_round(t, theta)
        self._memory.follow(t, theta)
        return spec

    def offer(self, worker: int, payload: np.ndarray | None) -> bool:
        if self.xi > 0:
            assert self._memory is not None
            return self._memory.offer(worker, payload)
        used = len(self._used)
        done = super().offer(worker, payload)  # (checks the payload)
        if self._memory is not None and len(self._used) > used:  # its group's first
            self._memory.keep(worker, payload)
        return done

    def decode(self) -> Estimate:
        if self.xi > 0:
            assert self._memory is not None
            return self._memory.decode()
        return super().decode()

    def feasible(self, outstanding: frozenset[int]) -> bool:
        if self.xi > 0:
            assert self._memory is not None
            return self._memory.feasible(outstanding)
        return super().feasible(outstanding)

    def superseded(self) -> frozenset[int]:
        if self.xi > 0:
            assert self._memory is not None
            return self._memory.superseded()
        return super().superseded()

    def observe(self, record: RoundRecord) -> None:
        self._records.append(record)

    def assigned(self, names: Sequence[str]) -> None:
        """The machines holding the places: with ``prior_names``, each place's prior entry
        becomes its holder's (matched by name, :func:`~codedgd.services.names.
        match_machines`; not known for a machine the source run did not have), and the
        mapping is logged. Without, the prior stays by place."""
        self._holders = list(names)
        if not self.prior_names or len(names) != len(self._measured):
            return
        own = [machine(n) for n in self.prior_names]
        twice = sorted({n for n in own if n and own.count(n) > 1})
        if twice:
            log.warning(
                "auto: prior_names names %s at more than one place: one machine held both "
                "(one after the other), so its entries are not used",
                ", ".join(twice)[:200],
            )
        matched = match_machines(self.prior_names, names)
        prior = tuple(None if i is None else self._measured[i] for i in matched)
        for w, value in enumerate(prior):
            if w >= len(self.prior) or value != self.prior[w]:
                self._replaced[w] = (value, self._next_round())
        self.prior = prior
        if all(i is None for i in matched):
            log.warning(
                "auto: no worker holding a place is named as one of the prior's machines "
                "(prior_names: %s): the prior is not used. Name the workers as on the "
                "source run (codedgd worker --name; codedgd run names its own local-0, "
                "local-1, …), or leave prior_names out for the prior to stay by place",
                ",".join(self.prior_names)[:200],
            )
            return
        log.info(
            "auto: the prior follows the machines by name: %s",
            ", ".join(
                f"{w}={name} " + ("not known" if v is None else f"{v:.3g}")
                for w, (name, v) in enumerate(zip(names, prior, strict=True))
            ),
        )

    def replaced(self, worker: int, name: str = "") -> None:
        """A newcomer holds place ``worker``: the prior's entry for it was the old
        machine's slowness, so it goes (the look-ahead takes the newcomer as unheard
        until it answers) or, with ``prior_names``, becomes the newcomer's own if the
        source run had it; either is logged. The look-ahead forgets the old machine's
        delays at its next decision (it runs in a thread: not now)."""
        value: float | None = None
        if self.prior_names and 0 <= worker < len(self._holders):
            self._holders[worker] = name
            i = match_machines(self.prior_names, self._holders)[worker]
            value = None if i is None else self._measured[i]
        old = self.prior[worker] if 0 <= worker < len(self.prior) else None
        self._replaced[worker] = (value, self._next_round())
        if value is not None:
            log.info(
                "auto: a new worker, %s, holds place %d: its own prior slowness %.3g "
                "(from the source run) replaces %s",
                name,
                worker,
                value,
                "none" if old is None else f"{old:.3g}",
            )
        elif old is not None:
            log.info(
                "auto: a new worker%s holds place %d: its prior slowness %.3g (the old "
                "machine's, from tune) is dropped",
                f", {name}," if name else "",
                worker,
                old,
            )
        if old is not None or value is not None:
            self._set_prior(worker, value)

    def _next_round(self) -> int:
        """The first round whose record is not yet observed: a machine that takes a place
        now answers for it from that round on (mid-round, it is the one waited for)."""
        return self._records[-1].round + 1 if self._records else 0

    def _set_prior(self, worker: int, value: float | None) -> None:
        self.prior = tuple(value if w == worker else v for w, v in enumerate(self.prior))

    def round_note(self) -> str:
        return self._note

    def state(self) -> dict[str, Any]:
        # In use, so a resumed job goes on with them; and what lazy rounds go on from.
        state: dict[str, Any] = {"k": self.k, "r": self.r, "xi": self.xi}
        if self.prior:  # entries dropped for newcomers stay dropped in a resumed job
            state["prior_dropped"] = [w for w, v in enumerate(self.prior) if v is None]
        if self._memory is not None:
            state["lazy"] = self._memory.state()
        return state

    def load_state(self, state: Mapping[str, Any]) -> None:
        k = state.get("k")
        if not (isinstance(k, int) and 1 <= k <= self._n):
            raise ConfigError(f"auto: the checkpoint's K={k!r} is not in 1..n={self._n}")
        # Checkpoints before r could change hold only K; they ran at the job's r, which
        # without one was 2 then.
        r = state.get("r", self.r if self.r_asked else 2)
        if not (isinstance(r, int) and r >= 1 and self._n % r == 0):
            raise ConfigError(f"auto: the checkpoint's r={r!r} does not divide n={self._n}")
        xi = state.get("xi", 0.0)  # checkpoints before lazy choices: eager
        if not (isinstance(xi, int | float) and xi >= 0 and math.isfinite(xi)):
            raise ConfigError(f"auto: the checkpoint's xi={xi!r} is not a weight >= 0")
        if xi > 0 and not self.weights:
            raise ConfigError(
                f"auto: the checkpoint ran lazy rounds (xi={xi:g}) but this job has lazy=none: "
                "resume with the job's lazy option as it was"
            )
        if r != self.r:  # the job is assigned with the r it ran with (read replan())
            self._replanned = self._regroup(r)
        self._use(Choice(r, k, float(xi)))
        dropped = state.get("prior_dropped", [])
        if not (isinstance(dropped, list) and all(isinstance(w, int) for w in dropped)):
            raise ConfigError(f"auto: the checkpoint's prior_dropped={dropped!r} is not a list")
        for worker in dropped:
            if 0 <= worker < len(self.prior):
                self._set_prior(worker, None)
                self._replaced[worker] = (None, 0)  # the chooser built from the job's prior
        lazy = state.get("lazy")
        if self._memory is not None and isinstance(lazy, Mapping):
            self._memory.load_state(lazy)
        self._ran = self.current
