"""The discrete-event simulator: the coordinator's round loop on a virtual clock.

It drives the very objects a real job uses: :func:`codedgd.services.job.prepare.prepare`
builds data, model, policy, plan, partitions and step size; every worker's message is
computed by a real :class:`~codedgd.services.compute.gradient.Computer` on the same
partition rows and coefficients the coordinator would ship; the straggler model is built
and called exactly as in the worker agent; the step (``estimate / N + λθ``) and the
evaluation are the coordinator's :class:`~codedgd.services.job.descent.Descent`. Only the
clock differs: each contacted worker's arrival time comes from the
:class:`~codedgd.services.sim.cost.CostModel` and the straggler delay, arrivals are
offered to the policy in order of virtual time until it can decode, and the workers still
outstanding are cancelled (they stop and cost nothing more).

Laziness that keeps θ identical: with a modelled compute time (``compute="model"``
or ``"none"``) the arrival times do not depend on gradient values, so the order is
known before any gradient is computed and only the workers offered before the round
becomes decodable compute anything. ``compute="measured"`` must time every
contacted worker's real computation first, and so does a round whose parameters carry
lag-wk's threshold: the trigger needs every contacted worker's message, and each
simulated worker keeps the same :class:`~codedgd.services.compute.lazy.LazyUploader` memory
as a real one (a skipped result arrives after the link latency, with no payload).

A simulated round's time is ``arrival of the decoding message + decode + overhead``;
evaluation is excluded, as in the coordinator's round loop. A worker the straggler model ``crash``
takes down is lost when θ_t reaches it and connects again ``restart`` later to take a
lost place (:class:`~codedgd.services.sim.newcomers.Newcomers`), with the coordinator's rules
(``job.replace_timeout``, θ_t to the newcomer if the round still wants its place).
Where the simulation differs from a real run: no result is late (cancelled workers stop
at once), a newcomer's messages skip the shared egress and ingress queues, and
``bytes_up``/``bytes_down`` count payload bytes (8 per float64), not protobuf frames.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from codedgd.services.compute.gradient import Computer, PartitionRows
from codedgd.services.compute.lazy import LazyUploader
from codedgd.services.data.dataset import take_rows
from codedgd.services.errors import ConfigError, DecodeError, JobFailed
from codedgd.services.job import JobConfig
from codedgd.services.job.descent import Descent
from codedgd.services.job.failures import infeasible_message, no_replacement_message
from codedgd.services.job.prepare import Prepared, prepare
from codedgd.services.policies.base import Estimate, Plan
from codedgd.services.records import RoundRecord, move_note
from codedgd.services.sim.cost import (
    COORDINATOR,
    Buckets,
    Calibration,
    CostModel,
    calibrate,
    cpu_done,
    downlink_times,
    join_seconds,
    move_seconds,
    uplink_arrivals,
)
from codedgd.services.sim.newcomers import Newcomers
from codedgd.services.sim.topologies import ring_round, tree_round
from codedgd.services.stragglers import StragglerModel, crash_restart, create_straggler_model

FLOAT_BYTES = 8


@dataclass(frozen=True)
class SimulationResult:
    """What :func:`simulate` returns: the records of ``codedgd run`` and more."""

    job_id: str
    records: tuple[RoundRecord, ...]
    theta: np.ndarray
    cost: CostModel  # with calibrated constants filled in
    calibration: Calibration | None
    gradients_computed: int  # Computer.compute calls made
    gradients_skipped: int  # contacted workers whose result was never needed
    elapsed_seconds: float  # real time the simulation took
    features: int | None = None  # the data's columns (a network's θ does not tell)


RoundCallback = Callable[[RoundRecord, np.ndarray], None]


@dataclass
class _Round:
    """What one simulated round's loop gives the job loop."""

    computations: int  # workers sent θ_t (a replacement that joined counts too)
    estimate: Estimate | None = None
    decode: float = 0.0  # measured seconds of policy.decode
    wait: float = 0.0  # the decoding arrival, seconds after θ_t was sent
    compute_max: float = 0.0
    answered: int = 0
    lost: int = 0  # contacted, then crashed: neither answered nor cancelled
    uploads: int = 0
    bytes_up: int = 0
    responses: dict[int, float] = field(default_factory=dict)
    computes: dict[int, float] = field(default_factory=dict)
    cancels: dict[int, float] = field(default_factory=dict)  # worker → its Cancel's time
    ready: dict[int, float] = field(default_factory=dict)  # WorkerTiming's ready_seconds
    left_out: dict[int, float] = field(default_factory=dict)  # tree: bounds of leaves out
    bytes_down: int | None = None  # None: θ's bytes to each of the computations
    workers_used: tuple[int, ...] | None = None  # None: the estimate's
    cancelled: int | None = None  # None: computations neither answered nor lost
    # Bytes through each NIC side, (node, outgoing) → bytes (the buckets' spending).
    through: dict[tuple[int, bool], float] = field(default_factory=dict)


def rows_per_round(prepared: Prepared, batch_size: int) -> np.ndarray:
    """The training rows each worker of the plan computes over in a round: all rows of its
    partitions, or in a mini-batch job (``batch_size`` > 0) a sample of at most that many
    of each."""

    def rows(p: int) -> int:
        n_p = int(prepared.blocks[p].shape[0])
        return min(batch_size, n_p) if batch_size > 0 else n_p

    return np.array(
        [sum(rows(p) for p in wp.partitions) for wp in prepared.plan.workers], dtype=np.float64
    )


class Simulator:
    """One simulated job: build once, then :meth:`run`."""

    lazy: list[LazyUploader]  # the workers' lag-wk memory
    newcomers: Newcomers  # lost places and the workers coming to take them
    # The held-out metric in every evaluated round's record (NaN without: a caller that
    # reads only the loss, as auto's look-ahead and tune, saves its cost).
    metric: bool = True

    def __init__(
        self,
        config: JobConfig,
        cost: CostModel | None = None,
        *,
        data_dir: str | None = None,
        prepared: Prepared | None = None,
    ) -> None:
        self.config = config
        self.prepared = prepared if prepared is not None else prepare(config, data_dir)
        ds, plan = self.prepared.dataset, self.prepared.plan
        if plan.topology.kind != "star" and config.stragglers.name == "crash":
            raise ConfigError(
                f"policy {config.policy.name!r} sends gradients over a {plan.topology.kind} of "
                "workers, on which the simulator does not model crashes: use another "
                "straggler model (e.g. fail-stop), or run the job on a cluster"
            )
        self.straggler: StragglerModel = create_straggler_model(
            config.stragglers.name,
            config.stragglers.options,
            seed=config.seed,
            n_workers=config.workers,
        )
        self._shares()
        cost = cost if cost is not None else CostModel()
        self.calibration: Calibration | None = None
        if cost.compute == "model" and (
            cost.seconds_per_sample is None or cost.seconds_per_partition is None
        ):
            self.calibration = calibrate(
                self.prepared.model,
                ds.X_train,
                ds.y_train,
                self.prepared.blocks[0],
                self.prepared.theta0,
                batch=config.batch_size,
            )
            cost = cost.replace(
                seconds_per_sample=cost.seconds_per_sample
                if cost.seconds_per_sample is not None
                else self.calibration.seconds_per_sample,
                seconds_per_partition=cost.seconds_per_partition
                if cost.seconds_per_partition is not None
                else self.calibration.seconds_per_partition,
            )
        self.cost = cost
        self.buckets = Buckets(cost)  # every NIC side's token bucket, round to round
        self.computed = 0
        self.skipped = 0
        self._bind_workers()

    def _shares(self) -> None:
        """What each worker's place in the plan costs: rows, partitions, load, result bytes."""
        plan, n = self.prepared.plan, self.config.workers
        self.rows_held = rows_per_round(self.prepared, self.config.batch_size)
        self.parts_held = np.array([len(wp.partitions) for wp in plan.workers], dtype=np.float64)
        self.loads = np.array([plan.load(w) for w in range(n)])
        dim = self.prepared.dim
        self.payload_bytes = [FLOAT_BYTES * plan.payload_length(w, dim) for w in range(n)]

    def move_to(self, plan: Plan) -> tuple[float, int, int]:
        """Re-assign the workers to ``plan`` between rounds (a policy's :meth:`replan`):
        (virtual seconds it takes, bytes of rows shipped, partitions shipped). Each worker
        gets the rows of only the partitions it lacks (:func:`move_seconds`)."""
        lacking = self.prepared.plan.lacking(plan)
        sizes = partition_bytes(self.prepared)
        per_worker = np.array([sum(sizes[p] for p in parts) for parts in lacking], dtype=np.int64)
        seconds = move_seconds(self.cost, per_worker)
        self.prepared.plan = plan
        self._shares()
        self._rebind()
        return seconds, int(per_worker.sum()), sum(len(parts) for parts in lacking)

    def _rebind(self) -> None:
        """The workers' Computers over their new partitions (lag-wk memory and crash
        bookkeeping kept: a re-assignment keeps the places and their holders)."""
        lazy, newcomers = self.lazy, self.newcomers
        self._bind_workers()
        self.lazy, self.newcomers = lazy, newcomers

    def _bind_workers(self) -> None:
        """Each worker's Computer over its partitions, its lag-wk memory, and the crash
        and restart bookkeeping (what the event-by-event round needs)."""
        ds, plan, config = self.prepared.dataset, self.prepared.plan, self.config
        # One copy of each partition, shared by every worker holding it.
        rows: dict[int, PartitionRows] = {}
        for wp in plan.workers:
            for p in wp.partitions:
                if p not in rows:
                    block = self.prepared.blocks[p]
                    rows[p] = PartitionRows(p, take_rows(ds.X_train, block), ds.y_train[block])
        self.computers = [
            Computer(
                self.prepared.model,
                [rows[p] for p in wp.partitions],
                wp.coefficients.astype(np.float64),
                dict(wp.options),
                batch_size=config.batch_size,
                seed=config.seed,
            )
            for wp in plan.workers
        ]
        self.current_round = 0  # the round being simulated (mini-batch samples depend on it)
        # The workers' lag-wk memory, exactly as in the worker agent.
        self.lazy = [LazyUploader() for _ in range(config.workers)]
        # Places lost to a crash, and the crashed workers coming back to take them.
        self.join = [
            join_seconds(self.cost, sum(_nbytes(rows[p]) for p in wp.partitions))
            for wp in plan.workers
        ]
        self.newcomers = Newcomers(self.join, spares=config.spares)

    def modelled_compute(self) -> np.ndarray:
        """Every worker's compute seconds under the cost model (0 for compute="none")."""
        if self.cost.compute == "none":
            return np.zeros(self.config.workers)
        a = self.cost.seconds_per_sample or 0.0
        b = self.cost.seconds_per_partition or 0.0
        out: np.ndarray = a * self.rows_held + b * self.parts_held
        return out

    def run(
        self,
        on_record: Callable[[RoundRecord], None] | None = None,
        on_round: RoundCallback | None = None,
    ) -> SimulationResult:
        started = time.perf_counter()
        cfg, prepared, cost = self.config, self.prepared, self.cost
        model = prepared.model
        descent = Descent(cfg, prepared)
        theta_bytes = FLOAT_BYTES * prepared.dim
        compute_model = self.modelled_compute()
        records: list[RoundRecord] = []
        wall = 0.0
        descent.evaluate_start()
        for t in range(cfg.rounds):
            point = descent.point()
            moved = ""
            if prepared.policy.adapts:
                prepared.policy.between_rounds(t, point)
                plan = prepared.policy.replan()
                if plan is not None:  # the data moves before the round, on the clock
                    seconds, nbytes, parts = self.move_to(plan)
                    wall += seconds
                    self.buckets.after({}, seconds)
                    compute_model = self.modelled_compute()
                    moved = move_note(parts, nbytes, seconds)
            self.current_round = t
            out = self._round(t, point, wall, compute_model, theta_bytes)
            note = prepared.policy.round_note() + moved
            estimate = out.estimate
            assert estimate is not None
            decode_s = cost.decode_seconds if cost.decode_seconds is not None else out.decode
            descent.step(estimate.gradient, point)
            round_s = out.wait + decode_s + cost.round_overhead_seconds
            wall += round_s
            self.buckets.after(out.through, round_s)
            loss = metric = math.nan
            if descent.evaluates(t):
                loss, metric = descent.evaluate(t, metric=self.metric)
            record = RoundRecord(
                round=t,
                wall_seconds=wall,
                round_seconds=round_s,
                wait_seconds=out.wait,
                decode_seconds=decode_s,
                compute_seconds_max=out.compute_max,
                loss=loss,
                metric=metric,
                metric_name=model.metric_name,
                workers_used=(
                    out.workers_used
                    if out.workers_used is not None
                    else tuple(sorted(estimate.workers_used))
                ),
                exact=estimate.exact,
                decode_residual=estimate.residual,
                bytes_up=out.bytes_up,
                bytes_down=(
                    out.bytes_down if out.bytes_down is not None else theta_bytes * out.computations
                ),
                uploads=out.uploads,
                computations=out.computations,
                cancelled=(
                    out.cancelled
                    if out.cancelled is not None
                    else out.computations - out.answered - out.lost
                ),
                late_dropped=0,
                response_seconds=out.responses,
                worker_compute_seconds=out.computes,
                note=note,
                cancelled_seconds=out.cancels,
                ready_seconds=out.ready,
                left_out_seconds=out.left_out,
                topology=prepared.plan.topology.kind,
            )
            prepared.policy.observe(record)
            records.append(record)
            if on_record is not None:
                on_record(record)
            if on_round is not None:
                on_round(record, descent.theta)
            if descent.reached_target(loss):
                break
        descent.finish()
        return SimulationResult(
            job_id="sim-" + uuid.uuid4().hex[:8],
            records=tuple(records),
            theta=np.array(descent.theta, dtype=np.float64),
            cost=cost,
            calibration=self.calibration,
            gradients_computed=self.computed,
            gradients_skipped=self.skipped,
            elapsed_seconds=time.perf_counter() - started,
            features=prepared.dataset.dim,
        )

    # ------------------------------------------------------------ one round

    def _round(
        self,
        t: int,
        point: np.ndarray,
        now: float,
        compute_model: np.ndarray,
        theta_bytes: int,
    ) -> _Round:
        """Round t, starting at virtual time ``now``: the coordinator's round loop, event by event.

        Events (seconds after θ_t is sent): a contacted worker's arrival; a crash
        (straggler model ``crash``) when θ_t reaches a worker; a lost place taken by its
        replacement. They are handled as :meth:`RoundLoop.one_round` handles them.
        """
        cfg, cost, policy = self.config, self.cost, self.prepared.policy
        if self.prepared.plan.topology.kind != "star":
            return self._topology_round(t, point, compute_model)
        newcomers = self.newcomers
        for w in newcomers.settle(now):  # joined between rounds: contacted from this one on
            self.lazy[w] = LazyUploader()  # a fresh worker: no lag-wk memory
            policy.replaced(w)
        spec = policy.begin_round(t, point)
        contacted = [w for w in spec.workers if w not in newcomers.lost]
        vacant = {w for w in spec.workers if w in newcomers.lost}
        outstanding = set(contacted)
        payloads: dict[int, np.ndarray] = {}
        lazy_round = LazyUploader.active(spec.params)
        eager = cost.compute == "measured" or lazy_round
        crash = {
            w: r
            for w in contacted
            if w not in newcomers.replaced
            and (r := crash_restart(self.straggler, w, t, replacement=False)) is not None
        }
        # Measured compute times, or a worker-side trigger that needs every contacted
        # worker's message: compute them all now (a crashing worker computes nothing).
        compute = {w: float(compute_model[w]) for w in contacted}
        if eager:
            for w in contacted:
                if w not in crash:
                    compute[w] = self._compute_now(w, point, payloads, compute[w])
        uploading: dict[int, bool] = {}
        for w in contacted:  # a crashing worker sends nothing (and holds no ingress)
            uploading[w] = w not in crash and self._uploads(w, payloads, spec.params, lazy_round)
        down = downlink_times(
            cost, theta_bytes, len(contacted), self.buckets.level(COORDINATOR, True)
        )
        sizes = [self.payload_bytes[w] if uploading[w] else 0 for w in contacted]
        work = [self._cpu_work(compute[w], theta_bytes, sizes[i]) for i, w in enumerate(contacted)]
        coordinator = float(np.sum(cost.coordinator_cpu(np.array([theta_bytes, *sizes]))))
        coordinator += (len(contacted) - 1) * float(cost.coordinator_cpu(theta_bytes))
        done = cpu_done(cost, down, np.array(work, dtype=np.float64), coordinator)
        ready = np.array([done[i] + self._delay(w, t, compute[w]) for i, w in enumerate(contacted)])
        held_in = self.buckets.level(COORDINATOR, False)
        arrival = uplink_arrivals(cost, ready, sizes, held_in)
        # Each worker's own times (its WorkerTiming): θ_t complete there → result ready.
        own = {w: float(ready[i] - down[i]) for i, w in enumerate(contacted)}
        # (seconds after θ_t was sent, order, kind, worker or place): ties keep arrival
        # order, then push order. A "connect" is a crashed worker back: newcomers
        # connected by then take open places (Newcomers.take), whose "replaced" follows.
        # A connect carries its absolute time: newcomers compare absolute times, and
        # now + (t - now) need not give t back.
        events: list[tuple[float, int, str, int, float]] = []
        order = itertools.count()

        def push(at: float, kind: str, w: int, when: float = math.nan) -> None:
            heapq.heappush(events, (at, next(order), kind, w, when))

        def joins_start(when: float) -> None:
            for place in newcomers.take(when, vacant):
                push(newcomers.joining[place] - now, "replaced", place)

        for i in np.argsort(arrival, kind="stable"):
            w = contacted[int(i)]
            if w in crash:
                push(float(down[int(i)]), "lost", w)
            else:
                push(float(arrival[int(i)]), "arrive", w)
        for connects in newcomers.waiting:
            push(connects - now, "connect", -1, connects)
        for place, joined in newcomers.joining.items():
            push(joined - now, "replaced", place)

        out = _Round(computations=len(contacted))
        out.through = {
            (COORDINATOR, True): float(theta_bytes * len(contacted)),
            (COORDINATOR, False): float(sum(sizes)),
        }
        deadline = cfg.round_timeout
        replace_by: float | None = None
        if not policy.feasible(frozenset(outstanding)):
            replace_by = self._replace_by(t, 0.0, "")
        decodable = policy.feasible(frozenset())
        while not decodable:
            if not events and replace_by is None:
                raise JobFailed(
                    f"round {t}: policy {policy.name!r} could not decode after all "
                    f"{len(contacted)} contacted workers arrived"
                )
            at = events[0][0] if events else math.inf
            # While the round cannot decode without a replacement, replace_timeout rules.
            if at > (replace_by if replace_by is not None else deadline):
                if replace_by is not None:
                    raise JobFailed(
                        no_replacement_message(t, sorted(vacant), cfg.replace_timeout)
                        + self._infeasible(t)
                    )
                raise JobFailed(
                    f"round {t} was not decodable within job.round_timeout="
                    f"{cfg.round_timeout:g} s (simulated{_next(at)}); still waiting for workers "
                    f"{sorted(outstanding | vacant)}"
                )
            _, _, kind, w, when = heapq.heappop(events)
            if kind == "connect":
                joins_start(when)
                continue
            if kind == "replaced":
                newcomers.restore(w)
                self.lazy[w] = LazyUploader()  # a fresh worker: no lag-wk memory
                policy.replaced(w)
                if w in vacant and w not in policy.superseded():
                    # The round still wants this place: θ_t goes to the newcomer.
                    vacant.discard(w)
                    deadline = max(deadline, at + cfg.round_timeout)
                    out.computations += 1
                    contacted.append(w)
                    outstanding.add(w)
                    compute[w] = float(compute_model[w])
                    if eager:
                        compute[w] = self._compute_now(w, point, payloads, compute[w])
                    uploading[w] = self._uploads(w, payloads, spec.params, lazy_round)
                    size = self.payload_bytes[w] if uploading[w] else 0
                    own[w] = self._cpu_work(compute[w], theta_bytes, size)
                    own[w] += self._delay(w, t, compute[w])
                    ready_at = at + cost.link_seconds(theta_bytes) + own[w]
                    arrive = float(uplink_arrivals(cost, np.array([ready_at]), [size], held_in)[0])
                    push(arrive, "arrive", w)
                    if policy.feasible(frozenset(outstanding)):
                        replace_by = None
                continue
            if kind == "lost":
                outstanding.discard(w)
                vacant.add(w)
                out.lost += 1
                lost_at = now + at
                newcomers.crash(w, lost_at, crash[w])
                if math.isfinite(crash[w]):
                    push(at + crash[w], "connect", -1, lost_at + crash[w])
                joins_start(lost_at)  # a newcomer already waiting takes it at once
                if replace_by is None and not policy.feasible(frozenset(outstanding)):
                    why = f"worker {w} was lost in round {t} (disconnected); "
                    replace_by = self._replace_by(t, at, why)
                continue
            if w not in outstanding:
                continue
            outstanding.discard(w)
            if w in policy.superseded():
                continue  # cancelled before it arrived (g-lag: its group is served)
            payload = payloads.get(w)
            if payload is None and uploading[w]:
                payload = self._compute_payload(w, point)
            out.wait = at
            out.answered += 1
            out.compute_max = max(out.compute_max, compute[w])
            out.responses[w] = at
            out.computes[w] = compute[w]
            out.ready[w] = max(own[w], compute[w])
            if uploading[w]:
                out.uploads += 1
                out.bytes_up += self.payload_bytes[w]
                assert payload is not None
                if lazy_round:
                    self.lazy[w].uploaded(payload)
                decodable = policy.offer(w, payload)
            else:
                decodable = policy.offer(w, None)
            for other in policy.superseded() & outstanding:  # served group-mates (g-lag)
                out.cancels.setdefault(other, at)
            # With a wanted place missing, an arrival can make the round need more
            # (cyclic, polynomial, lagc wait past n-s for a near-singular set).
            if (
                not decodable
                and vacant
                and replace_by is None
                and not policy.feasible(frozenset(outstanding))
            ):
                why = f"round {t}: the results so far decode above the policy's tol; "
                replace_by = self._replace_by(t, at, why)
        if not eager:
            self.skipped += out.computations - out.answered - out.lost
        for other in outstanding:  # the rest are cancelled when the round decodes
            out.cancels.setdefault(other, out.wait)
        decode_start = time.perf_counter()
        try:
            out.estimate = policy.decode()
        except DecodeError as exc:
            raise JobFailed(f"round {t}: decoding failed: {exc}") from None
        out.decode = time.perf_counter() - decode_start
        return out

    def _topology_round(self, t: int, point: np.ndarray, compute_model: np.ndarray) -> _Round:
        """A ring's or a tree's round (:mod:`codedgd.services.sim.topologies`)."""
        plan, policy, cost = self.prepared.plan, self.prepared.policy, self.cost
        messages: dict[int, np.ndarray] = {}
        measured: dict[int, float] = {}

        def message(w: int) -> np.ndarray:
            if w not in messages:
                result = self.computers[w].compute(point, None, t)
                self.computed += 1
                messages[w], measured[w] = result.payload, result.seconds
            return messages[w]

        def timing(w: int) -> tuple[float, float]:
            compute = float(compute_model[w])
            if cost.compute == "measured":
                message(w)
                compute = measured[w]
            return compute, self._delay(w, t, compute)

        play = ring_round if plan.topology.kind == "ring" else tree_round
        got = play(plan, policy, t, point, cost, timing, message, self.buckets)
        if got.wait > self.config.round_timeout:
            raise JobFailed(
                f"round {t} was not decodable within job.round_timeout="
                f"{self.config.round_timeout:g} s (simulated: it would decode at {got.wait:.3g} s)"
            )
        return _Round(
            computations=got.computations,
            estimate=got.estimate,
            decode=got.decode,
            wait=got.wait,
            compute_max=got.compute_max,
            answered=got.uploads,
            uploads=got.uploads,
            bytes_up=got.bytes_up,
            responses=got.responses,
            computes=got.computes,
            bytes_down=got.bytes_down,
            cancelled=got.cancelled,
            workers_used=got.contributors,
            ready=got.ready,
            through=got.through,
            left_out=(
                plan.topology.tree.left_out_bounds(got.ready, set(got.contributors))
                if plan.topology.tree is not None
                else {}
            ),
        )

    def _compute_payload(self, w: int, point: np.ndarray) -> np.ndarray:
        self.computed += 1
        return self.computers[w].compute(point, None, self.current_round).payload

    def _compute_now(
        self, w: int, point: np.ndarray, payloads: dict[int, np.ndarray], modelled: float
    ) -> float:
        """Compute w's message now; its compute seconds (measured, or ``modelled``)."""
        result = self.computers[w].compute(point, None, self.current_round)
        self.computed += 1
        payloads[w] = result.payload
        return result.seconds if self.cost.compute == "measured" else modelled

    def _uploads(
        self, w: int, payloads: dict[int, np.ndarray], params: Mapping[str, float], lazy: bool
    ) -> bool:
        return not lazy or self.lazy[w].should_upload(payloads[w], params)

    def _cpu_work(self, compute: float, theta_bytes: int, message_bytes: int) -> float:
        """A worker's CPU seconds in a round: its compute, and on a shared machine
        (``cost.cores``) parsing θ and building its message."""
        return compute + self.cost.worker_cpu(theta_bytes) + self.cost.worker_cpu(message_bytes)

    def _delay(self, w: int, t: int, compute: float) -> float:
        return float(self.straggler.delay(w, t, compute, float(self.loads[w])))

    def _replace_by(self, t: int, at: float, why: str) -> float:
        if self.config.replace_timeout <= 0:
            raise JobFailed(why + self._infeasible(t))
        return at + self.config.replace_timeout

    def _infeasible(self, t: int) -> str:
        lost = [f"worker {w}" for w in sorted(self.newcomers.lost)]
        return infeasible_message(self.prepared.policy.name, t, lost)


def _next(at: float) -> str:
    return (
        f": next arrival at {at:.3g} s" if math.isfinite(at) else ": the workers left never answer"
    )


def partition_bytes(prepared: Prepared) -> list[int]:
    """Each partition's rows and labels in bytes on the wire (:func:`_nbytes`)."""
    ds = prepared.dataset
    return [
        _nbytes(PartitionRows(p, take_rows(ds.X_train, block), ds.y_train[block]))
        for p, block in enumerate(prepared.blocks)
    ]


def _nbytes(part: PartitionRows) -> int:
    """Bytes of a partition's rows and labels on the wire (CSR: data, indices, indptr)."""
    X = part.X
    arrays = [X] if isinstance(X, np.ndarray) else [X.data, X.indices, X.indptr]
    return int(sum(np.asarray(a).nbytes for a in arrays) + part.y.nbytes)
