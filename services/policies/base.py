"""The policy interface: what a coordinator-side aggregation policy decides.

A policy is pure numpy: it never imports grpc and never sleeps. The coordinator's
round loop (real workers over gRPC) and the simulator (virtual clock) drive the
same objects through four calls:

1. :meth:`Policy.plan` once per job: each worker's partitions and encoding;
   then :meth:`Policy.bind` once the data is loaded (step size, row count, and
   smoothness constants of partitions, for the policies that use them);
2. :meth:`Policy.begin_round` at the start of round t: whom to contact and
   which extra parameters to send with θ_t;
3. :meth:`Policy.offer` for every arrival, until it returns True (decodable);
4. :meth:`Policy.decode`: the estimate of g = Σ_j g_j (gradient *sums* over
   partitions; the coordinator divides by the number of training rows).

Notation follows SCHEMES.md: n workers, k partitions, s stragglers.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from codedgd.services.codes.tree import TreeShape
from codedgd.services.compute.ring import reduced_segment, segments
from codedgd.services.errors import ConfigError, PlanError, WorkerFault
from codedgd.services.records import RoundRecord


@dataclass(frozen=True)
class WorkerPlan:
    """One worker's share of a plan.

    The worker computes g_j for every partition j in ``partitions`` and sends
    ``Σ_j Σ_u coefficients[j, u] · chunk_u(g_j)``, where ``chunk_u`` is the u-th of
    ``chunks`` equal pieces of the (zero-padded) gradient: a vector of length
    ``ceil(dim / chunks)``. With ``chunks == 1`` this is ``Σ_j B_ij g_j``.
    """

    partitions: tuple[int, ...]
    coefficients: np.ndarray  # float64, shape (len(partitions), chunks)
    chunks: int = 1
    options: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        shape = (len(self.partitions), self.chunks)
        if self.coefficients.shape != shape:
            raise PlanError(
                f"worker plan coefficients have shape {self.coefficients.shape}, expected {shape}"
            )

    @staticmethod
    def summing(
        partitions: tuple[int, ...], weights: tuple[float, ...] | None = None
    ) -> WorkerPlan:
        """A plan that sends Σ_j w_j g_j (w_j = 1 by default), one chunk."""
        w = np.ones(len(partitions)) if weights is None else np.asarray(weights, dtype=np.float64)
        return WorkerPlan(partitions=partitions, coefficients=w.reshape(-1, 1).astype(np.float64))


TOPOLOGIES = ("star", "ring", "tree")


@dataclass(frozen=True)
class Topology:
    """How a round's gradients travel (the coordinator and the simulator carry each kind).

    - ``star``: every contacted worker sends its message to the coordinator.
    - ``ring``: the workers form a ring (worker i sends to i+1 mod n), reduce-scatter
      their messages, and worker i sends the coordinator the segment it then holds
      (:mod:`codedgd.services.compute.ring`); θ_t reaches them as n segments that they
      all-gather around the ring.
    - ``tree``: a tree of workers of shape ``tree`` below the coordinator
      (:mod:`codedgd.services.codes.tree`): θ_t travels down, each worker adds its own
      message to what it decodes from its fastest m−s children (sibling code ``code``,
      residual within ``tol``) and sends that up; the coordinator hears level 1 only and
      decodes it with the policy's own code (B(m₀, s): ``code`` itself when m₀ = m).
    """

    kind: str = "star"
    tree: TreeShape | None = None
    code: np.ndarray | None = None  # tree: the sibling code B below level 1 (fanout × fanout)
    tol: float = 1e-6  # tree: the largest decode residual an inner node accepts

    def __post_init__(self) -> None:
        if self.kind not in TOPOLOGIES:
            raise PlanError(f"unknown topology {self.kind!r}: one of {', '.join(TOPOLOGIES)}")
        if self.kind == "tree" and (self.tree is None or self.code is None):
            raise PlanError("a tree topology needs its shape and sibling code")


@dataclass(frozen=True)
class Plan:
    """What a policy decides up front for n workers and k partitions."""

    n_workers: int
    n_partitions: int
    workers: tuple[WorkerPlan, ...]
    topology: Topology = field(default_factory=Topology)

    def load(self, worker: int) -> float:
        """Computation load of a worker: its number of partitions / k."""
        return len(self.workers[worker].partitions) / self.n_partitions

    def payload_length(self, worker: int, dim: int) -> int:
        """Floats in ``worker``'s result for a θ of ``dim``: its encoded message, or in a
        ring the reduced segment it holds."""
        if self.topology.kind == "ring":
            start, stop = segments(dim, self.n_workers)[reduced_segment(worker, self.n_workers)]
            return stop - start
        chunks = self.workers[worker].chunks
        return -(-dim // chunks)

    def lacking(self, new: Plan) -> tuple[tuple[int, ...], ...]:
        """For each worker of ``new``: the partitions its new place needs that its place in
        this plan does not hold (what a re-assignment ships it)."""
        if new.n_workers != self.n_workers:
            raise PlanError(
                f"a new plan for {new.n_workers} workers cannot follow one for {self.n_workers}"
            )
        held = [set(wp.partitions) for wp in self.workers]
        return tuple(
            tuple(p for p in wp.partitions if p not in had)
            for had, wp in zip(held, new.workers, strict=True)
        )

    def reporters(self) -> tuple[int, ...]:
        """The workers whose results reach the coordinator (a tree: level 1 only)."""
        tree = self.topology.tree
        if self.topology.kind == "tree" and tree is not None:
            return tree.children(-1)
        return tuple(range(self.n_workers))


@dataclass(frozen=True)
class RoundSpec:
    """What the coordinator does at the start of a round."""

    round: int
    workers: tuple[int, ...]  # the workers to send θ_t to
    params: Mapping[str, float] = field(default_factory=dict)  # sent with θ_t


@dataclass(frozen=True)
class Estimate:
    """A decoded gradient estimate of g = Σ_j g_j."""

    gradient: np.ndarray  # float64, length dim
    workers_used: tuple[int, ...]
    exact: bool
    residual: float = 0.0  # max |aᵀB_F − 1ᵀ| of the decoding system, 0 when trivial


@dataclass(frozen=True)
class OrderDecode:
    """A round's outcome told from the order of arrivals alone (:meth:`Policy.decode_order`).

    The round decodes at the ``count``-th arrival, and its estimate is
    Σ_p ``weights[p]``·g_p over the k partitions: the estimate :meth:`Policy.decode` returns
    after those ``count`` arrivals, written as partition weights (aᵀB for a linear decode).
    """

    count: int
    weights: np.ndarray  # float64, length k
    exact: bool
    workers_used: tuple[int, ...]
    residual: float = 0.0  # the decode's max|aᵀB_F − 1ᵀ|, where it checks one (cyclic)


@dataclass(frozen=True)
class JobContext:
    """What the coordinator knows once the data is loaded, for :meth:`Policy.bind`.

    The coordinator steps θ ← θ − α·(Σ_j g_j / N + λθ): ``n_rows`` is N and
    ``step_size`` is α, the base step size; ``step_size_at(t)`` is the step the
    schedule takes in round t (α itself under the constant schedule, and when None).
    ``rounds`` is the job's round budget, for a policy whose options count rounds.
    ``smoothness(partitions)`` is a smoothness constant of
    f_P(θ) = (1/N)·Σ_{rows x of the partitions P} ℓ(x; θ) (the data term only; the
    L2 term is applied fresh by the coordinator every round). It is computed on
    demand, so policies that do not call it cost nothing.
    """

    n_rows: int
    step_size: float
    smoothness: Callable[[Sequence[int]], float]
    step_size_at: Callable[[int], float] | None = None
    rounds: int | None = None  # the job's round budget (job.rounds), when known

    def step_at(self, t: int) -> float:
        """The step size of round t."""
        return self.step_size if self.step_size_at is None else self.step_size_at(t)


@dataclass(frozen=True)
class Param:
    """A policy parameter as shown by ``codedgd policies`` and checked on input."""

    name: str
    type: type
    default: Any
    help: str


class Policy(ABC):
    """Base class of every aggregation policy (see the module docstring)."""

    name: ClassVar[str]
    summary: ClassVar[str]
    parameters: ClassVar[tuple[Param, ...]] = ()
    exact: ClassVar[bool]

    def divergence_hint(self) -> str:
        """A fix to suggest, beyond a smaller step size, when training diverges ("" if none)."""
        return ""

    @abstractmethod
    def plan(self, n_workers: int, n_partitions: int) -> Plan:
        """Decide partitions and encodings; raise PlanError if n does not fit the code."""

    @abstractmethod
    def begin_round(self, t: int, theta: np.ndarray) -> RoundSpec:
        """Reset per-round state; say whom to contact for round t."""

    @abstractmethod
    def offer(self, worker: int, payload: np.ndarray | None) -> bool:
        """Record an arrival (None: the worker chose not to upload); True once decodable."""

    @abstractmethod
    def decode(self) -> Estimate:
        """Return the estimate of Σ_j g_j from the arrivals so far (requires decodable)."""

    @abstractmethod
    def feasible(self, outstanding: frozenset[int]) -> bool:
        """Could this round still become decodable if (only) ``outstanding`` arrive?

        The coordinator asks when a worker is lost mid-round; False fails the round.
        """

    def arrival_sum(self) -> np.ndarray | None:
        """This round's running sum, if the estimate is the plain sum of every payload.

        A policy whose every payload of the round enters the estimate unweighted (and
        that needs nothing else from it) returns, after :meth:`begin_round`, the float64
        array it sums into. The coordinator then adds each result into that array chunk
        by chunk as the bytes arrive, with no assembled copy, and reports the arrival
        through :meth:`offer_summed` instead of :meth:`offer`. Default None: payloads
        are assembled and offered whole (the simulator always does that).
        """
        return None

    def decides_by_order(self) -> bool:
        """Whether :meth:`decode_order` answers for this policy as configured (default no)."""
        return False

    def decode_order(self, order: np.ndarray) -> OrderDecode | None:
        """The round's outcome from the order of arrivals alone, for the vectorized simulator.

        Called after :meth:`begin_round` instead of offering payloads. ``order``: the
        contacted workers that answer this round, fastest first, every one uploading.
        Returns what :meth:`offer` and :meth:`decode` would give (tests/policies/
        test_decode_order.py offers linear payloads to check every policy that answers),
        or None when the outcome depends on the payloads' values (the default: the
        simulator then offers them one by one). Raises DecodeError when these arrivals
        never make the round decodable.
        """
        return None

    def offer_summed(self, worker: int) -> bool:
        """Record an arrival already added into :meth:`arrival_sum`; True once decodable."""
        raise NotImplementedError(f"{self.name} does not sum payloads on arrival")

    def worker_memory(self, worker: int) -> np.ndarray | None:
        """What the worker holding place ``worker`` must remember from earlier rounds to
        decide as its predecessor would (lag-wk: its last upload), sent with its
        assignment when a job resumes or a newcomer takes the place. Default: nothing."""
        return None

    def superseded(self) -> frozenset[int]:
        """Workers contacted this round whose message is no longer needed.

        The coordinator cancels them at once instead of when the round decodes (g-lag:
        the rest of a group once its first member arrived). Default: none.
        """
        return frozenset()

    def suspects(self) -> dict[int, str]:
        """Workers whose result this round was exposed as wrong since the last call, with why.

        The coordinator throws each out (a worker fault: replaced like a lost worker), so a
        corrupt worker is excluded from the rounds after. Only a policy that can tell a
        wrong result from a right one says anything here (frc's vote); default: none.
        """
        return {}

    # True for a policy that changes itself between rounds (auto): the drivers then ask
    # for its deliberation() before every round and call replan() before every round.
    adapts: ClassVar[bool] = False

    def deliberation(self, t: int, theta: np.ndarray) -> Callable[[], object] | None:
        """Before round t (θ_t given): slow work due now (a look-ahead), or None. Only if
        ``adapts``.

        The returned call must read nothing the rounds go on changing (copy what it needs
        here: θ, the records); its result goes to :meth:`settle`. The simulator runs it at
        once (it takes no virtual time, :meth:`between_rounds`); the coordinator runs it in
        a thread while the rounds go on and settles it before the first round after it has
        finished, so no round waits for it. A driver asks for no new deliberation while
        one is running.
        """
        return None

    def settle(self, outcome: object) -> None:  # noqa: B027 - optional hook
        """A finished :meth:`deliberation`'s result, before the next round begins."""

    def between_rounds(self, t: int, theta: np.ndarray) -> None:
        """Deliberate about round t and settle it at once (a driver without threads)."""
        job = self.deliberation(t, theta)
        if job is not None:
            self.settle(job())

    def replan(self) -> Plan | None:
        """A new plan that takes effect from the next round, or None (only if ``adapts``).

        Read before every round, after any :meth:`settle`. The drivers move the data it needs before
        the round: the coordinator sends every worker its new place (an Assignment with
        ``reassignment`` set, the rows of only the partitions it lacks) and waits for them
        all; the simulator charges the shipping on its clock. Default: None (the plan
        made by :meth:`plan` holds for the whole job).
        """
        return None

    def assigned(self, names: Sequence[str]) -> None:  # noqa: B027 - optional hook
        """The job's places are held, place i by the worker named ``names[i]`` (as the
        coordinator shows it: its Hello name, "#<session>" appended when that name was
        already connected).

        The coordinator calls it once the job is assigned (again when a resumed job is),
        before its first round; the simulator does not (its places are not machines).
        Default: nothing (a place is its data, not its machine)."""

    def replaced(self, worker: int, name: str = "") -> None:  # noqa: B027 - optional hook
        """A newcomer, named ``name`` ("" when it has none: the simulator's), holds place
        ``worker`` from now on (it replaced a lost holder): what the policy knew of the
        old holder's machine is not the newcomer's.

        The coordinator and the simulator call it alike, when the newcomer has taken the
        place; default: nothing (a place is its data, not its machine)."""

    def observe(self, record: RoundRecord) -> None:  # noqa: B027 - optional hook
        """After each round: its record, with when every answering worker's result arrived.

        The coordinator and the simulator call it alike. A policy that adapts to the
        cluster (``auto``) reads the timings; default: nothing.
        """

    def round_note(self) -> str:
        """What the policy changed at the start of this round, and why ("" if nothing).

        Read after :meth:`begin_round`; the coordinator logs it, counts it and writes it
        into the round's record (``RoundRecord.note``), and so does the simulator.
        """
        return ""

    def state(self) -> dict[str, Any]:
        """What the policy remembers across rounds, for a checkpoint (arrays copied).

        Default: nothing; a policy whose rounds are independent given its plan and seed
        (every exact and approximate code here) has no state. The lazy policies keep
        each unit's last message and θ history.
        """
        return {}

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Resume from :meth:`state` of this policy with the same plan, after :meth:`bind`."""
        if state:
            raise ConfigError(
                f"{self.name} keeps no state across rounds, but the checkpoint holds "
                f"{sorted(state)}: it is another policy's"
            )

    def bind(self, context: JobContext) -> None:  # noqa: B027 - optional hook
        """Called once after :meth:`plan` when the data is loaded (default: nothing)."""

    def default_partitions(self, n_workers: int) -> int:
        """Number of partitions k the policy wants for n workers (k = n unless said)."""
        return n_workers


def check_n(n_workers: int, n_partitions: int, *, min_workers: int = 1) -> None:
    if n_workers < min_workers:
        raise PlanError(f"need at least {min_workers} worker(s), got n={n_workers}")
    if n_partitions < 1:
        raise PlanError(f"need at least one partition, got k={n_partitions}")


def check_payload(name: str, worker: int, payload: np.ndarray | None, length: int) -> np.ndarray:
    """The payload as a float64 vector of the planned length, or a WorkerFault."""
    if payload is None:
        raise WorkerFault(
            f"{name}: worker {worker} skipped its upload, but {name}'s workers always upload"
        )
    if payload.shape != (length,):
        raise WorkerFault(
            f"{name}: worker {worker} sent a payload of shape {payload.shape}, expected ({length},)"
        )
    return payload
