"""The round loop of one job on the coordinator.

Round t: ``policy.begin_round`` says whom to contact; the data plane sends θ_t to them
(:mod:`.dataplane`); every event of the job's inbox (:mod:`.inbox`) is handled in order:
an arrival is offered to the policy until it can decode (for a policy that sums every
payload, ``Policy.arrival_sum``, results were added into that sum as their chunks
arrived), a loss may make the round wait for a replacement, a replacement the round
still wants gets θ_t. The workers still busy are cancelled; the estimate is decoded (in a
thread for large ℓ), the descent steps (:class:`~codedgd.services.job.descent.Descent`),
and a :class:`RoundRecord` is published.

When a lost worker makes the round undecodable (``policy.feasible``), the round waits
``job.replace_timeout`` seconds for a replacement (even past ``job.round_timeout``), then
the job fails with an error naming the worker: the coordinator keeps serving other jobs.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace

import numpy as np
from prometheus_client import Histogram

from codedgd.services.coordinator.assignment import Moved
from codedgd.services.coordinator.dataplane import DataPlane
from codedgd.services.coordinator.guard import NormGuard
from codedgd.services.coordinator.inbox import Inbox, Lost, Replaced
from codedgd.services.coordinator.metrics import CoordinatorMetrics
from codedgd.services.coordinator.places import Places
from codedgd.services.coordinator.silence import (
    COORDINATOR,
    RECENT_ROUNDS,
    RESOLVE_AFTER,
    Stall,
    peer_deadline,
    silent_roots,
)
from codedgd.services.errors import DecodeError, JobFailed, WorkerFault
from codedgd.services.job import JobConfig
from codedgd.services.job.descent import Descent
from codedgd.services.job.failures import infeasible_message, no_replacement_message
from codedgd.services.job.prepare import Prepared
from codedgd.services.machine import Machine, this_machine
from codedgd.services.policies.base import Estimate, Plan, Policy
from codedgd.services.records import RoundRecord, move_note

log = logging.getLogger("codedgd.coordinator")

# A decode that took less than this last round runs on the event loop (the thread
# hand-off would cost more); longer ones run in a thread so the loop stays free.
INLINE_DECODE_SECONDS = 0.002


@dataclass(frozen=True)
class Outcome:
    """What one round produced, before the step."""

    estimate: Estimate
    wait_seconds: float
    decode_seconds: float
    compute_max: float
    bytes_up: int
    bytes_down: int
    uploads: int
    computations: int
    cancelled: int
    late: int
    responses: dict[int, float]  # worker → seconds from θ_t sent to its result received
    computes: dict[int, float]  # worker → its reported compute seconds
    contributors: tuple[int, ...] = ()  # workers whose messages are in the estimate
    excluded: dict[int, str] = field(default_factory=dict)  # the others, and why
    attempts: int = 1
    restarts: tuple[str, ...] = ()  # why each earlier attempt was abandoned
    cancels: dict[int, float] = field(default_factory=dict)  # worker → its Cancel's seconds
    ready: dict[int, float] = field(default_factory=dict)  # ring, tree: WorkerTiming's
    left_out: dict[int, float] = field(default_factory=dict)  # tree: bounds of leaves out


class RoundLoop:
    """Runs one job's rounds over its places, inbox and data plane."""

    def __init__(
        self,
        job_id: str,
        config: JobConfig,
        places: Places,
        inbox: Inbox,
        plane: DataPlane,
        metrics: CoordinatorMetrics,
        throw_out: Callable[[int, str], None],
        release_silent: Callable[[int, str], None] | None = None,
        heartbeat_seconds: float = 5.0,
        move: Callable[[Plan], Awaitable[Moved]] | None = None,
    ) -> None:
        self.job_id = job_id
        self.config = config
        self.places = places
        self.inbox = inbox
        self.plane = plane
        self.metrics = metrics
        self.throw_out = throw_out  # worker index, reason: disconnect it, its place is lost
        # worker index, reason: a silent peer; its place is lost, it is released from the job
        self.release_silent = release_silent or throw_out
        self.heartbeat_seconds = heartbeat_seconds  # how often workers report progress
        self.move = move  # re-assigns the places to a policy's new plan between rounds
        self._round_times: deque[float] = deque(maxlen=RECENT_ROUNDS)  # the peer deadline's
        self._stalls: dict[tuple[int, int], Stall] = {}  # (reporter, peer) → its wait
        self._stall_round: tuple[int, int] = (-1, -1)  # the (round, attempt) they are of
        self._deferred: set[int] = set()  # blamed once this attempt, given time to report
        self._lost_why: dict[int, str] = {}  # this attempt's lost workers, and why
        self._last_decode = math.inf  # seconds policy.decode itself took last round
        self._histograms: dict[int, tuple[Histogram, Histogram]] = {}
        self.guard: NormGuard | None = None  # job.max_norm_ratio's, made in run()
        self._late_counted = 0  # inbox.late already in a round's record
        # A policy's deliberation (auto's look-ahead), running in a thread while rounds go on.
        self._deliberating: asyncio.Future[object] | None = None
        self._deliberation_timing = (0, 0.0, 0.0)  # (round begun before, seconds, CPU)
        # Each place's holder and its machine, as last recorded.
        self._named: dict[int, tuple[str, Machine]] = {}

    async def run(
        self,
        descent: Descent,
        on_round: Callable[[int], None],
        on_record: Callable[[RoundRecord], None],
        *,
        start: int = 0,
        wall: float = 0.0,
        after_round: Callable[[int], Awaitable[None]] | None = None,
    ) -> None:
        """Rounds ``start``, ``start`` + 1, ... of the job, until job.rounds or job.target_loss.

        ``on_round(t)`` is called as round t starts, ``on_record`` with each round's record
        (θ after the round is ``descent.theta`` then), ``after_round(t)`` after it (a
        checkpoint). A resumed job starts past 0, its descent restored and ``wall`` the
        training seconds of the rounds before.
        """
        cfg = self.config
        prepared = descent.prepared
        model, policy = prepared.model, prepared.policy
        if cfg.max_norm_ratio:
            scales = [float(np.abs(w.coefficients).sum()) for w in prepared.plan.workers]
            self.guard = NormGuard(cfg.max_norm_ratio, scales, memory=5 * cfg.workers)
        # The children every round updates, looked up once (labels() takes a lock).
        round_hist = self.metrics.round_duration.labels(policy.name)
        wait_hist = self.metrics.wait_duration.labels(policy.name)
        decode_hist = self.metrics.decode_duration.labels(policy.name)
        rounds_done = self.metrics.rounds.labels(policy.name)
        self.metrics.job_info.info(
            {
                "policy": policy.name,
                "model": cfg.model.name,
                "dataset": cfg.data.name,
                "workers": str(cfg.workers),
            }
        )
        await asyncio.to_thread(descent.evaluate_start)  # the yardstick of divergence
        for t in range(start, cfg.rounds):
            on_round(t)
            self.metrics.round.set(t)
            point = descent.point()
            moved = ""
            if policy.adapts:
                self._deliberate(t, point, policy)
                plan = policy.replan()
                if plan is not None:  # the data moves before the round, on the clock
                    moved, seconds = await self._move(t, plan, prepared)
                    wall += seconds
            round_start = time.perf_counter()
            out = await self.one_round(t, point, policy)
            note = policy.round_note() + moved
            if note:
                log.info("job %s round %d: %s", self.job_id, t, note)
                self.metrics.policy_switches.labels(policy.name).inc()
            estimate = out.estimate
            descent.step(estimate.gradient, point)
            round_s = time.perf_counter() - round_start
            self._round_times.append(round_s)
            wall += round_s
            loss = metric = math.nan
            cancelled = False
            if descent.evaluates(t):
                # The step is taken: a cancel (the coordinator's shutdown) waits for the
                # evaluation and the round's record, so the records and the descent agree
                # and a checkpoint taken then is consistent.
                evaluation = asyncio.ensure_future(asyncio.to_thread(descent.evaluate, t))
                try:
                    loss, metric = await asyncio.shield(evaluation)
                except asyncio.CancelledError:
                    cancelled = True
                    loss, metric = await evaluation
                self.metrics.loss.set(loss)
                self.metrics.metric.labels(model.metric_name).set(metric)
            holders, machines = self._new_holders()
            record = RoundRecord(
                round=t,
                wall_seconds=wall,
                round_seconds=round_s,
                wait_seconds=out.wait_seconds,
                decode_seconds=out.decode_seconds,
                compute_seconds_max=out.compute_max,
                loss=loss,
                metric=metric,
                metric_name=model.metric_name,
                workers_used=out.contributors,
                exact=estimate.exact,
                decode_residual=estimate.residual,
                bytes_up=out.bytes_up,
                bytes_down=out.bytes_down,
                uploads=out.uploads,
                computations=out.computations,
                cancelled=out.cancelled,
                late_dropped=out.late,
                response_seconds=out.responses,
                worker_compute_seconds=out.computes,
                note=note,
                excluded=out.excluded,
                attempts=out.attempts,
                restarts=out.restarts,
                cancelled_seconds=out.cancels,
                ready_seconds=out.ready,
                left_out_seconds=out.left_out,
                holders=holders,
                topology=self.plane.name,
                machines=machines,
                coordinator_machine=this_machine() if machines else None,
            )
            policy.observe(record)
            round_hist.observe(round_s)
            wait_hist.observe(out.wait_seconds)
            decode_hist.observe(out.decode_seconds)
            rounds_done.inc()
            on_record(record)
            if cancelled:
                raise asyncio.CancelledError
            if after_round is not None:
                await after_round(t)
            if descent.reached_target(loss):
                log.info("job %s reached target loss %.6g at round %d", self.job_id, loss, t)
                break
        descent.finish()

    def _new_holders(self) -> tuple[dict[int, str], dict[int, Machine]]:
        """The places whose holder's name or machine changed since the last record (every
        place in this loop's first), and the machines those holders said they run on: which
        process answered for which place, and where, in the records."""
        now = {w: (s.name, s.machine) for w, s in enumerate(self.places.holders)}
        changed = {w: held for w, held in now.items() if self._named.get(w) != held}
        self._named.update(changed)
        # (A holder back under its name from another machine is listed again.)
        names = {w: name for w, (name, _) in changed.items()}
        machines = {w: machine for w, (_, machine) in changed.items() if machine.known}
        return names, machines

    def _deliberate(self, t: int, point: np.ndarray, policy: Policy) -> None:
        """Before round t: settle the policy's deliberation if it has finished, and start
        the next one due, in a thread: no round waits for a look-ahead. (One that is still
        running when the job ends is left to finish; its answer is dropped.)"""
        running = self._deliberating
        if running is not None:
            if not running.done():
                return
            self._deliberating = None
            policy.settle(running.result())  # a look-ahead's own failure fails the job
            begun, took, cpu = self._deliberation_timing
            self.metrics.deliberation_duration.observe(took)
            self.metrics.deliberation_lag_rounds.observe(t - begun)
            log.debug(
                "job %s: the look-ahead begun before round %d took %.3g s (%.3g s of CPU); "
                "its choice applies from round %d",
                self.job_id,
                begun,
                took,
                cpu,
                t,
            )
        job = policy.deliberation(t, point)
        if job is not None:
            running = asyncio.ensure_future(asyncio.to_thread(self._timed, t, job))
            # Retrieved here so one still running when the job ends is not logged as lost;
            # settle() above still raises what it raised.
            running.add_done_callback(lambda f: f.cancelled() or f.exception())
            self._deliberating = running

    def _timed(self, t: int, job: Callable[[], object]) -> object:
        """Run a deliberation (in its thread), keeping when it began and how long it took."""
        start, cpu = time.perf_counter(), time.thread_time()
        try:
            return job()
        finally:
            self._deliberation_timing = (t, time.perf_counter() - start, time.thread_time() - cpu)

    async def _move(self, t: int, plan: Plan, prepared: Prepared) -> tuple[str, float]:
        """Re-assign the places to ``plan`` before round t: (the note's words, seconds)."""
        if self.move is None:
            raise JobFailed(
                f"round {t}: policy {prepared.policy.name!r} changed its plan, but this job "
                "cannot move data between rounds"
            )
        moved = await self.move(plan)
        self.metrics.reassignment_duration.observe(moved.seconds)
        if self.guard is not None:  # a worker's result scale follows its coefficients
            scales = [float(np.abs(w.coefficients).sum()) for w in plan.workers]
            self.guard.scales = [v if v > 0 else 1.0 for v in scales]
        log.info(
            "job %s round %d: re-assigned %d partition(s), %d rows (%.3g MB), in %.3g s",
            self.job_id,
            t,
            moved.partitions,
            moved.rows,
            moved.nbytes / 1e6,
            moved.seconds,
        )
        return move_note(moved.partitions, moved.nbytes, moved.seconds), moved.seconds

    async def one_round(self, t: int, point: np.ndarray, policy: Policy) -> Outcome:
        """Round t at ``point``: from θ_t out to the decoded estimate.

        On a worker-to-worker plane a round that waits for a replacement starts again, as
        attempt 1, 2, ..., once it has joined (:attr:`DataPlane.restarts`).
        """
        attempt, sent_before, asked_before = 0, 0, 0
        restarts: list[str] = []
        while True:
            try:
                outcome = await self._attempt(t, point, policy, attempt)
            except _Restart as restart:
                self.plane.cancel(t, restart.contacted)
                sent_before += restart.bytes_down
                asked_before += restart.computations
                why = (
                    "; ".join(
                        f"worker {w} {reason}" for w, reason in sorted(self._lost_why.items())
                    )
                    or "workers " + ", ".join(map(str, sorted(restart.vacant))) + " lost"
                )

                restarts.append(f"attempt {attempt}: {why}")
                attempt += 1
                self.metrics.round_restarts.inc()
                log.info(
                    "job %s: round %d starts again (attempt %d) after %s",
                    self.job_id,
                    t,
                    attempt,
                    why,
                )
                continue
            return replace(
                outcome,
                bytes_down=outcome.bytes_down + sent_before,
                computations=outcome.computations + asked_before,  # every attempt's, as metered
                attempts=attempt + 1,
                restarts=tuple(restarts),
            )

    def stalled(
        self, reporter: int, round_: int, attempt: int, peer: int, waited: float, received: int = 0
    ) -> None:
        """``reporter`` has waited ``waited`` seconds for ``peer``'s data in (round_,
        attempt) past the round's deadline, having had ``received`` messages of it from
        ``peer`` (a silent PeerFailure)."""
        if (round_, attempt) != self._stall_round:
            return  # an older round's, or one not started here yet
        since = asyncio.get_running_loop().time() - max(0.0, waited)
        key = (reporter, peer)
        if key not in self._stalls:
            self._stalls[key] = Stall(
                reporter, frozenset({peer}), since, f"data of round {round_}", received
            )

    async def _attempt(self, t: int, point: np.ndarray, policy: Policy, attempt: int) -> Outcome:
        places, inbox, plane = self.places, self.inbox, self.plane
        spec = policy.begin_round(t, point)
        contacted = [w for w in spec.workers if w not in places.lost]
        blocked = plane.unreachable(places.lost)  # reporters that cannot report this round
        # Results are added into the policy's sum chunk by chunk as they arrive, when
        # the policy sums every payload (Policy.arrival_sum) and no norm guard must see
        # each result whole first; else assembled and offered.
        outstanding = plane.reporters(contacted) - blocked
        guard = self.guard
        if guard is not None:
            guard.end_round()
        inbox.open_round(t, policy.arrival_sum() if guard is None else None, outstanding, attempt)
        responses: dict[int, float] = {}
        computes: dict[int, float] = {}
        below: dict[int, tuple[int, ...]] = {}  # a tree's reporters: the workers in their sums
        ready: dict[int, float] = {}  # ring, tree: each worker's own times (WorkerTiming)
        timed: dict[int, tuple[int, ...]] = {}  # reporter → the workers it sent timings of

        def feasible() -> bool:
            """Could the round still decode, counting the arrivals the guard holds back?"""
            held = guard.held if guard is not None else frozenset()
            return policy.feasible(frozenset(outstanding | held))

        def fault(worker: int, reason: str, *, offered: bool, corrupt: bool = True) -> None:
            """Throw a worker out for its result; unless the policy counted that result, its
            loss (the next event) vacates the place for a replacement this round. A corrupt
            result (the guard's or a vote's finding) bans its sender from the job."""
            if not offered:
                outstanding.add(worker)
            for seen in (responses, computes, below):
                seen.pop(worker, None)
            for w in timed.pop(worker, ()):
                ready.pop(w, None)
                computes.pop(w, None)
            if corrupt:
                self.metrics.stragglers.labels("outvoted" if offered else "norm_guard").inc()
                places.banned.add(places[worker].name)
            self.throw_out(worker, reason)

        def offer(arrivals: list[tuple[int, np.ndarray | None]], summed: bool) -> bool:
            """Offer arrivals in order until one makes the round decodable."""
            done = False
            for worker, payload in arrivals:
                if done:
                    break
                try:
                    done = policy.offer_summed(worker) if summed else policy.offer(worker, payload)
                except WorkerFault as exc:
                    fault(worker, str(exc), offered=False, corrupt=False)
                for exposed, reason in policy.suspects().items():
                    fault(exposed, reason, offered=True)
            return done

        # Wanted, lost (or cut off), not replaced yet.
        vacant = {w for w in spec.workers if w in places.lost or w in blocked}
        places.vacant = vacant  # the replacer fills these places first
        self._lost_why = {w: "lost before this attempt began" for w in places.lost}
        cancelled: set[int] = set()  # told to stop: the round did without them
        loop = asyncio.get_running_loop()
        deadline_at = loop.time() + self.config.round_timeout
        replace_by: float | None = None  # waiting for a replacement until then
        if not feasible():
            replace_by = self._await_replacement(t, policy, loop.time())
        # Peers report each other silent past this deadline; 1.5 deadlines after θ_t
        # went out, the reports of a round that cannot decode yet are resolved.
        cfg = self.config
        deadline = (
            peer_deadline(
                self._round_times,
                cfg.peer_deadline_factor,
                cfg.peer_deadline_min,
                cfg.round_timeout,
            )
            if plane.peered
            else 0.0
        )
        self._stalls = {}
        self._stall_round = (t, attempt)
        self._deferred = set()
        bytes_down = plane.send_theta(t, point, spec.params, contacted, attempt, deadline)
        sent_at = time.perf_counter()  # θ_t is queued to every contacted worker's stream
        sent_loop = loop.time()
        # By then every live worker's heartbeat has said whether θ_t reached it.
        silence_at = (
            sent_loop + max(RESOLVE_AFTER * deadline, deadline + 1.5 * self.heartbeat_seconds)
            if deadline
            else None
        )
        self.metrics.bytes_down.inc(bytes_down)
        # A tree's workers below the contacted ones compute too; a newcomer sent θ_t
        # mid-round (a star's) joins ``contacted``.
        deeper = plane.computing(contacted, places.lost) - len(contacted)
        self.metrics.computations.inc(deeper + len(contacted))
        compute_max = 0.0
        uploads = 0
        cancelled_early = 0
        cancels: dict[int, float] = {}  # worker → seconds from θ_t sent to its Cancel
        # Decodable before any arrival: no one contacted, or (lazy policies) enough stale
        # messages count already.
        decodable = policy.feasible(frozenset())
        while not decodable:
            # While the round cannot decode without a replacement, replace_timeout rules
            # (it may be longer than round_timeout); else round_timeout.
            try:
                # Results often arrive together: take one already queued without arming
                # a timer (a deadline already past still fails at the next wait).
                event = inbox.events.get_nowait()
            except asyncio.QueueEmpty:
                event = None
            wake = replace_by if replace_by is not None else deadline_at
            for_silence = silence_at is not None and silence_at < wake
            try:
                if event is None:
                    async with asyncio.timeout_at(silence_at if for_silence else wake):
                        event = await inbox.events.get()
            except TimeoutError:
                if for_silence:  # the round is stuck: blame the silent peers at its root
                    self._resolve_silence(t, attempt, outstanding, sent_loop, loop.time())
                    silence_at = loop.time() + (RESOLVE_AFTER - 1) * deadline
                    continue
                if replace_by is not None:  # no replacement in time
                    lost = "".join(
                        f"worker {w} {why}; " for w, why in sorted(self._lost_why.items())
                    )
                    raise JobFailed(
                        no_replacement_message(t, sorted(vacant), self.config.replace_timeout)
                        + lost
                        + self._infeasible_message(t, policy)
                    ) from None
                raise JobFailed(
                    f"round {t} was not decodable within job.round_timeout="
                    f"{self.config.round_timeout:g} s; still waiting for workers "
                    f"{sorted(outstanding | vacant)}"
                ) from None
            if isinstance(event, Replaced):
                w = event.worker
                if not places.holds(w, event.session) or w in places.lost:
                    continue  # stale: that newcomer was lost again since
                # A new machine: not what was known of the old one.
                policy.replaced(w, places[w].name)
                if plane.restarts:
                    if replace_by is not None and not plane.unreachable(places.lost) & vacant:
                        # Every place the round waits for is held again: start it over.
                        raise _Restart(contacted, bytes_down, vacant, deeper + len(contacted))
                    continue  # the round goes on without it; it takes part from the next
                if w in vacant and w not in policy.superseded():
                    # The round still wants this worker: send it θ_t, with a round's time.
                    vacant.discard(w)
                    deadline_at = max(deadline_at, loop.time() + self.config.round_timeout)
                    sent = plane.send_theta_to(w)
                    bytes_down += sent
                    self.metrics.bytes_down.inc(sent)
                    self.metrics.computations.inc()
                    contacted.append(w)
                    outstanding.add(w)
                    if inbox.summing is not None:
                        inbox.expecting.add(w)
                    if feasible():
                        replace_by = None
                continue
            if isinstance(event, Lost):
                if not places.holds(event.worker, event.session):
                    continue  # stale: the index has a new holder since
                # The worker, and any reporter it cuts off (a ring's everyone, a tree's
                # ancestors whose group can no longer decode).
                gone = ({event.worker} | plane.unreachable(places.lost)) & outstanding
                self._lost_why[event.worker] = f"lost: {event.reason}"
                vacant.update(w for w in gone if w in spec.workers)
                outstanding -= gone
                inbox.expecting.difference_update(gone)
                if guard is not None:  # fewer arrivals to come: the held ones may be judged
                    released, faults = guard.settle(len(outstanding))
                    for worker, reason in faults.items():
                        fault(worker, reason, offered=False)
                    decodable = offer(released, summed=False)
                    if decodable:
                        break
                if replace_by is None and not feasible():
                    why = f"worker {event.worker} was lost in round {t} ({event.reason}); "
                    replace_by = self._await_replacement(t, policy, loop.time(), why)
                continue
            if event.result.round != t:
                inbox.late += 1  # completed after its round had decoded: dropped
                self.metrics.stragglers.labels("late_dropped").inc()
                continue
            if event.worker not in outstanding:
                continue
            outstanding.discard(event.worker)
            if event.payload is not None or event.summed:
                uploads += 1
                self.metrics.uploads.inc()
            else:
                self.metrics.uploads_skipped.inc()
            compute_hist, response_hist = self._worker_histograms(event.worker)
            compute_hist.observe(event.result.compute_seconds)
            response_hist.observe(event.received - sent_at)
            compute_max = max(compute_max, event.result.compute_seconds)
            responses[event.worker] = event.received - sent_at
            computes[event.worker] = event.result.compute_seconds
            if event.result.contributors:
                below[event.worker] = tuple(event.result.contributors)
            # A ring's or tree's own times, or a star worker's (its arrival less the
            # network: none from workers of versions before 2026-12-01).
            for timing in event.result.timings:  # checked on arrival (check_timings)
                ready[timing.worker] = timing.ready_seconds
                computes[timing.worker] = timing.compute_seconds
            timed[event.worker] = tuple(int(timing.worker) for timing in event.result.timings)
            if guard is not None and not event.summed:
                arrivals, faults = guard.admit(event.worker, event.payload, len(outstanding))
                for worker, reason in faults.items():
                    fault(worker, reason, offered=False)
            else:
                arrivals = [(event.worker, event.payload)]
            decodable = offer(arrivals, event.summed)
            if not decodable:
                superseded = policy.superseded() & outstanding
                if superseded:
                    cancels.update(dict.fromkeys(superseded, event.received - sent_at))
                    self._cancel(t, superseded)
                    outstanding -= superseded
                    cancelled.update(superseded)
                    cancelled_early += len(superseded)
                # With a wanted worker missing, an arrival can make the round need more
                # than it did at the loss (cyclic, polynomial and lagc wait past n-s for a
                # near-singular set): fail or wait for a replacement now, not at
                # round_timeout. With no one missing, every arrival keeps it feasible.
                if vacant and replace_by is None and not feasible():
                    why = (
                        f"round {t}: the results so far decode above the policy's tol (a "
                        "near-singular set; see its tol and code options) and the workers "
                        "left cannot fix that; "
                    )
                    replace_by = self._await_replacement(t, policy, loop.time(), why)
        decodable_at = time.perf_counter()
        inbox.expecting.clear()  # the sum is final: later chunks of this round are dropped
        unfinished = set(inbox.summed_prefix) - responses.keys()
        if unfinished:  # no policy decodes so today (uncoded waits for every place)
            raise JobFailed(
                f"round {t} decoded without place(s) {sorted(unfinished)}, part of whose "
                "result is in the sum: the estimate would be wrong"
            )
        self._cancel(t, outstanding)
        cancelled.update(outstanding)
        try:
            if self._last_decode < INLINE_DECODE_SECONDS:
                estimate, self._last_decode = _timed(policy.decode)
            else:
                estimate, self._last_decode = await asyncio.to_thread(_timed, policy.decode)
        except DecodeError as exc:
            self.metrics.decode_errors.inc()
            raise JobFailed(f"round {t}: decoding failed: {exc}") from None
        decode_s = time.perf_counter() - decodable_at
        late, self._late_counted = inbox.late - self._late_counted, inbox.late
        contributors = plane.contributors(estimate.workers_used, below)
        return Outcome(
            estimate=estimate,
            wait_seconds=decodable_at - sent_at,
            decode_seconds=decode_s,
            compute_max=compute_max,
            bytes_up=inbox.bytes_up,
            bytes_down=bytes_down,
            uploads=uploads,
            computations=deeper + len(contacted),
            cancelled=len(outstanding) + cancelled_early,
            late=late,
            responses=responses,
            computes=computes,
            contributors=contributors,
            excluded=self._excluded(set(contributors), set(contacted), cancelled),
            cancels={**dict.fromkeys(outstanding, decodable_at - sent_at), **cancels},
            ready=ready,
            left_out=plane.left_out_bounds(ready, contributors),
        )

    def _excluded(self, used: set[int], contacted: set[int], cancelled: set[int]) -> dict[int, str]:
        """Every place of the plan not in the estimate, with why."""
        out: dict[int, str] = {}
        reporters = self.plane.reporters(range(len(self.places)))
        for w in range(len(self.places)):
            if w in used:
                continue
            if w in self._lost_why:
                out[w] = self._lost_why[w]
            elif w not in reporters:
                out[w] = self.plane.left_out(w, used)
            elif w in cancelled:
                out[w] = "cancelled: the round decoded without its result"
            elif w not in contacted:
                out[w] = "not asked to compute this round"
            else:
                out[w] = "its result was not used by the policy's decode"
        return out

    def _resolve_silence(
        self, t: int, attempt: int, outstanding: set[int], sent_loop: float, now: float
    ) -> None:
        """Round t cannot decode 1.5 deadlines after θ_t went out: release the workers
        at the root of the silent peers' reports (the coordinator's own missing
        reporters among the waited-for). A worker whose heartbeat since θ_t went out
        says θ_t never reached it waits for the worker that should have passed it on."""
        stalls = list(self._stalls.values())
        places = self.places
        alive: set[int] = set()  # heard from since θ_t went out, and working on round t
        for w in range(len(places)):
            session = places[w]
            if w in places.lost or session.progress_at < sent_loop:
                continue  # lost, or not heard from since: nothing known
            progress = session.progress
            begun = (
                progress is not None
                and progress[0] == self.job_id
                and (progress[1], progress[2]) >= (t, attempt)
            )
            if begun:
                alive.add(w)
            source = self.plane.theta_source(w)
            if not begun and source != COORDINATOR:
                stalls.append(Stall(w, frozenset({source}), sent_loop, f"θ of round {t}"))
        missing = outstanding - self.places.lost
        if missing:
            stalls.append(Stall(COORDINATOR, frozenset(missing), sent_loop, f"result of round {t}"))
        for worker, reason in silent_roots(stalls, now).items():
            if worker in self.places.lost:
                continue
            if worker in alive and worker not in self._deferred:
                # It is working on the round and may itself be waiting, its wait begun
                # later than its peers' (a slower compute on a loaded machine) and not
                # yet reported: blaming it now could release a healthy worker. Once more
                # half a deadline; then its report, if any, is in.
                self._deferred.add(worker)
                log.info(
                    "job %s: round %d: worker %d is reported %s, but it is working on the "
                    "round: waiting for its own report before blaming it",
                    self.job_id,
                    t,
                    worker,
                    reason,
                )
                continue
            log.warning("job %s: round %d: worker %d is %s", self.job_id, t, worker, reason)
            self.metrics.stragglers.labels("silent_peer").inc()
            self.release_silent(worker, reason)

    def _worker_histograms(self, worker: int) -> tuple[Histogram, Histogram]:
        """Worker ``worker``'s compute and response histograms (labels() once per job)."""
        pair = self._histograms.get(worker)
        if pair is None:
            label = str(worker)
            pair = (
                self.metrics.worker_compute.labels(label),
                self.metrics.worker_response.labels(label),
            )
            self._histograms[worker] = pair
        return pair

    def _cancel(self, t: int, workers: set[int] | frozenset[int]) -> None:
        """Cancel{t} to these workers: their result for round t is not needed."""
        if not workers:
            return
        self.plane.cancel(t, workers)
        self.metrics.stragglers.labels("cancelled").inc(len(workers))

    def _await_replacement(self, t: int, policy: Policy, now: float, why: str = "") -> float:
        """The time until which round t waits for lost workers' replacements, or fail."""
        wait = self.config.replace_timeout
        if wait <= 0:
            raise JobFailed(why + self._infeasible_message(t, policy))
        log.warning(
            "job %s: round %d cannot decode without lost worker(s) %s; waiting up to %g s "
            "for new workers to take their place",
            self.job_id,
            t,
            sorted(self.places.lost),
            wait,
        )
        return now + wait

    def _infeasible_message(self, t: int, policy: Policy) -> str:
        return infeasible_message(policy.name, t, self.places.lost_labels())


class _Restart(Exception):
    """A worker-to-worker round starts over: the replacement it waited for has joined."""

    def __init__(
        self, contacted: list[int], bytes_down: int, vacant: set[int], computations: int
    ) -> None:
        self.contacted = contacted
        self.bytes_down = bytes_down
        self.vacant = set(vacant)
        self.computations = computations  # the attempt's: its workers computed it too


def _timed(decode: Callable[[], Estimate]) -> tuple[Estimate, float]:
    """The estimate and the seconds ``decode`` itself took (not a thread's handoff: under
    load that alone can pass INLINE_DECODE_SECONDS and keep a fast decode off the loop)."""
    start = time.perf_counter()
    estimate = decode()
    return estimate, time.perf_counter() - start
