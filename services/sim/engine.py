"""The discrete-event simulator: the coordinator's round loop on a virtual clock.

It drives the very objects a real job uses: :func:`services.coordinator.runner.prepare`
builds data, model, policy, plan, partitions and step size; every worker's message
is computed by a real :class:`~services.worker.compute.Computer` on the same
partition rows and coefficients the coordinator would ship; the straggler model is
built and called exactly as in the worker agent; the optimizer, the gradient
``estimate / N + λθ`` and the evaluation are the runner's. Only the clock differs:
each contacted worker's arrival time comes from the :class:`~services.sim.cost.CostModel`
and the straggler delay, arrivals are offered to the policy in order of virtual time
until it can decode, and the workers still outstanding are cancelled (they stop and
cost nothing more).

Laziness that keeps θ identical: with a modelled compute time (``compute="model"``
or ``"none"``) the arrival times do not depend on gradient values, so the order is
known before any gradient is computed and only the workers offered before the round
becomes decodable compute anything. ``compute="measured"`` must time every
contacted worker's real computation first, and so does a round whose parameters carry
lag-wk's threshold: the trigger needs every contacted worker's message, and each
simulated worker keeps the same :class:`~services.worker.lazy.LazyUploader` memory as a
real one (a skipped result arrives after the link latency, with no payload).

A simulated round's time is ``arrival of the decoding message + decode + overhead``;
evaluation is excluded, as in the real runner. Where the simulation differs from a
real run: no worker is lost, no result is late (cancelled workers stop at once), and
``bytes_up``/``bytes_down`` count payload bytes (8 per float64), not protobuf frames.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from services.coordinator.runner import Prepared, _evaluate, prepare
from services.data.dataset import take_rows
from services.errors import DecodeError, JobFailed
from services.job import JobConfig
from services.reports import RoundRecord
from services.sim.cost import (
    Calibration,
    CostModel,
    calibrate,
    downlink_times,
    uplink_arrivals,
)
from services.stragglers import StragglerModel, create_straggler_model
from services.worker.compute import Computer, PartitionRows
from services.worker.lazy import LazyUploader

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


RoundCallback = Callable[[RoundRecord, np.ndarray], None]


class Simulator:
    """One simulated job: build once, then :meth:`run`."""

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
        self.straggler: StragglerModel = create_straggler_model(
            config.stragglers.name,
            config.stragglers.options,
            seed=config.seed,
            n_workers=config.workers,
        )
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
            )
            for wp in plan.workers
        ]
        self.rows_held = np.array(
            [
                sum(int(self.prepared.blocks[p].shape[0]) for p in wp.partitions)
                for wp in plan.workers
            ],
            dtype=np.float64,
        )
        self.parts_held = np.array([len(wp.partitions) for wp in plan.workers], dtype=np.float64)
        self.loads = np.array([plan.load(w) for w in range(config.workers)])
        self.payload_bytes = [
            FLOAT_BYTES * plan.payload_length(w, ds.dim) for w in range(config.workers)
        ]
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
                np.zeros(ds.dim),
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
        self.computed = 0
        self.skipped = 0
        # The workers' lag-wk memory, exactly as in the worker agent.
        self.lazy = [LazyUploader() for _ in range(config.workers)]

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
        from services.models import objective
        from services.optim import check_converging, create_optimizer, objective_gradient

        started = time.perf_counter()
        cfg, prepared, cost = self.config, self.prepared, self.cost
        ds, model, policy = prepared.dataset, prepared.model, prepared.policy
        opt_options = dict(cfg.optimizer)
        opt_options["lr"] = prepared.lr
        optimizer = create_optimizer(opt_options, np.zeros(ds.dim))
        n_rows = ds.n_train
        theta_bytes = FLOAT_BYTES * ds.dim
        compute_model = self.modelled_compute()
        records: list[RoundRecord] = []
        wall = 0.0
        for t in range(cfg.rounds):
            point = optimizer.point()
            spec = policy.begin_round(t, point)
            contacted = list(spec.workers)
            if not policy.feasible(frozenset(contacted)):
                raise JobFailed(f"policy {policy.name!r} cannot decode round {t}")
            payloads: dict[int, np.ndarray] = {}
            lazy_round = LazyUploader.active(spec.params)
            if cost.compute == "measured" or lazy_round:
                # Measured compute times, or a worker-side trigger that needs every
                # contacted worker's message: compute them all now.
                compute = np.empty(len(contacted))
                for i, w in enumerate(contacted):
                    result = self.computers[w].compute(point)
                    self.computed += 1
                    payloads[w] = result.payload
                    compute[i] = result.seconds
                if cost.compute != "measured":
                    compute = compute_model[contacted] if contacted else np.zeros(0)
            else:
                compute = compute_model[contacted] if contacted else np.zeros(0)
            uploading = {
                w: not lazy_round or self.lazy[w].should_upload(payloads[w], spec.params)
                for w in contacted
            }
            down = downlink_times(cost, theta_bytes, len(contacted))
            delay = np.array(
                [
                    float(self.straggler.delay(w, t, float(compute[i]), float(self.loads[w])))
                    for i, w in enumerate(contacted)
                ]
            )
            ready = down + compute + delay
            sizes = [self.payload_bytes[w] if uploading[w] else 0 for w in contacted]
            arrival = uplink_arrivals(cost, ready, sizes)
            order = np.argsort(arrival, kind="stable")
            decodable = policy.feasible(frozenset())
            wait = 0.0
            compute_max = 0.0
            uploads = 0
            answered = 0
            bytes_up = 0
            responses: dict[int, float] = {}
            computes: dict[int, float] = {}
            for i in order:
                if decodable:
                    break
                w = contacted[int(i)]
                if w in policy.superseded():
                    continue  # cancelled before it arrived (g-lag: its group is served)
                payload = payloads.get(w)
                if payload is None:
                    payload = self.computers[w].compute(point).payload
                    self.computed += 1
                wait = float(arrival[i])
                answered += 1
                compute_max = max(compute_max, float(compute[i]))
                responses[w] = wait
                computes[w] = float(compute[i])
                if uploading[w]:
                    uploads += 1
                    bytes_up += self.payload_bytes[w]
                    if lazy_round:
                        self.lazy[w].uploaded(payload)
                    decodable = policy.offer(w, payload)
                else:
                    decodable = policy.offer(w, None)
            if not decodable:
                raise JobFailed(
                    f"round {t}: policy {policy.name!r} could not decode after all "
                    f"{len(contacted)} contacted workers arrived"
                )
            if wait > cfg.round_timeout:
                raise JobFailed(
                    f"round {t} was not decodable within job.round_timeout="
                    f"{cfg.round_timeout:g} s (simulated: {wait:.3g} s)"
                )
            if cost.compute != "measured" and not lazy_round:
                self.skipped += len(contacted) - answered
            decode_start = time.perf_counter()
            try:
                estimate = policy.decode()
            except DecodeError as exc:
                raise JobFailed(f"round {t}: decoding failed: {exc}") from None
            measured_decode = time.perf_counter() - decode_start
            decode_s = cost.decode_seconds if cost.decode_seconds is not None else measured_decode
            optimizer.update(objective_gradient(estimate.gradient, n_rows, model.l2, point))
            round_s = wait + decode_s + cost.round_overhead_seconds
            wall += round_s
            loss = metric = math.nan
            if t % cfg.eval_every == 0 or t == cfg.rounds - 1:
                loss, metric = _evaluate(model, optimizer.theta, ds, objective)
                check_converging(t, loss, prepared.lr, policy.divergence_hint())
            record = RoundRecord(
                round=t,
                wall_seconds=wall,
                round_seconds=round_s,
                wait_seconds=wait,
                decode_seconds=decode_s,
                compute_seconds_max=compute_max,
                loss=loss,
                metric=metric,
                metric_name=model.metric_name,
                workers_used=tuple(sorted(estimate.workers_used)),
                exact=estimate.exact,
                decode_residual=estimate.residual,
                bytes_up=bytes_up,
                bytes_down=theta_bytes * len(contacted),
                uploads=uploads,
                computations=len(contacted),
                cancelled=len(contacted) - answered,
                late_dropped=0,
                response_seconds=responses,
                worker_compute_seconds=computes,
            )
            records.append(record)
            if on_record is not None:
                on_record(record)
            if on_round is not None:
                on_round(record, optimizer.theta)
            if cfg.target_loss is not None and not math.isnan(loss) and loss <= cfg.target_loss:
                break
        return SimulationResult(
            job_id="sim-" + uuid.uuid4().hex[:8],
            records=tuple(records),
            theta=np.array(optimizer.theta, dtype=np.float64),
            cost=cost,
            calibration=self.calibration,
            gradients_computed=self.computed,
            gradients_skipped=self.skipped,
            elapsed_seconds=time.perf_counter() - started,
        )


def simulate(
    config: JobConfig,
    cost: CostModel | None = None,
    *,
    data_dir: str | None = None,
    on_record: Callable[[RoundRecord], None] | None = None,
    on_round: RoundCallback | None = None,
) -> SimulationResult:
    """Simulate one job on a virtual clock (see the module docstring)."""
    return Simulator(config, cost, data_dir=data_dir).run(on_record=on_record, on_round=on_round)
