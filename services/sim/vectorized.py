"""The vectorized simulator: a round in a few numpy calls, for large n and many candidates.

The event engine (:class:`~codedgd.services.sim.engine.Simulator`) offers arrivals to the
policy one at a time and computes each needed worker's gradient with its own
:class:`~codedgd.services.compute.gradient.Computer`: a few microseconds of Python per
worker and per round, which is what limits it at thousands of workers. Many rounds need
none of that. When

- the policy's round is decided by the order of arrivals alone
  (:meth:`Policy.decides_by_order`: uncoded, ignore-stragglers, erasurehead, frc without a
  vote, cyclic: its decoding vector depends only on who arrived), so its
  :meth:`Policy.decode_order` gives the arrival it decodes at and the estimate as
  partition weights Σ_p w_p g_p;
- the topology is a star, nothing crashes (no replacements to play), and compute times are
  modelled (``compute = "model"`` or ``"none"``), so arrival times do not depend on
  gradient values;

a round is: every contacted worker's delay in one call
(:func:`~codedgd.services.stragglers.delays_of`), arrival times from the same cost model
functions, one stable argsort (the event engine's tie order), ``decode_order``, and the
estimate as one weighted gradient over the training rows (for the built-in linear models,
one product each way; other models sum their partitions' gradients). The records, the
optimizer step and the evaluation are the event engine's own (:meth:`Simulator.run`).

What differs from the event engine, by design: the decode time is a constant (the cost
model's ``decode_seconds``, or the median of timed real decodes of this policy on random
payloads before round 0) where the event engine times every round's decode (and with a
burst, the time the NICs' buckets refill by, so the next rounds' waits differ too); and with
``per_worker=False`` the records leave out the per-worker response and compute times
(they are what makes 10,000-worker records large). tests/sim/test_vectorized.py checks
that both engines give the same round times, records and θ.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from codedgd.services.errors import ConfigError, DecodeError, JobFailed
from codedgd.services.job import JobConfig
from codedgd.services.job.prepare import Prepared, prepare
from codedgd.services.models.block import BlockGradient
from codedgd.services.policies.base import Estimate
from codedgd.services.sim.cost import COORDINATOR, CostModel, downlink_times, uplink_arrivals
from codedgd.services.sim.engine import Simulator, _Round
from codedgd.services.stragglers import delays_of


def not_vectorizable(config: JobConfig, prepared: Prepared, cost: CostModel) -> str:
    """Why the vectorized engine cannot run this job ("" when it can)."""
    if prepared.plan.topology.kind != "star":
        return f"its topology is a {prepared.plan.topology.kind}, not a star"
    if not prepared.policy.decides_by_order():
        if config.policy.name == "auto":  # (its lazy rounds: the only reason it cannot)
            return "auto's lazy rounds step with stale messages (--param lazy=none: eager only)"
        return f"policy {config.policy.name!r} reads the results' values to decode"
    if config.stragglers.name == "crash":
        return "the straggler model crashes workers (replacements are played event by event)"
    if cost.compute == "measured":
        return 'compute = "measured" times every worker\'s real gradient'
    if cost.cores is not None:
        return "its workers share the cost model's cores, round by round"
    if config.batch_size:
        return "its rounds use mini-batches (job.batch_size), sampled round by round"
    return ""


class VectorizedSimulator(Simulator):
    """One simulated job whose rounds are computed in bulk (see the module docstring)."""

    def __init__(
        self,
        config: JobConfig,
        cost: CostModel | None = None,
        *,
        data_dir: str | None = None,
        prepared: Prepared | None = None,
        per_worker: bool = True,
    ) -> None:
        prepared = prepared if prepared is not None else prepare(config, data_dir)
        why = not_vectorizable(config, prepared, cost if cost is not None else CostModel())
        if why:
            raise ConfigError(
                f"the vectorized simulator cannot run this job: {why}; "
                "use the event engine (--engine events)"
            )
        self.per_worker = per_worker
        super().__init__(config, cost, data_dir=data_dir, prepared=prepared)
        self._decode_s = (
            self.cost.decode_seconds
            if self.cost.decode_seconds is not None
            else self._timed_decode()
        )

    def _bind_workers(self) -> None:
        """Which partition every training row belongs to, and one gradient over all rows."""
        ds, blocks = self.prepared.dataset, self.prepared.blocks
        k = len(blocks)
        owner = np.full(ds.n_train, k, dtype=np.int64)  # k: in no partition (weight 0)
        overlap = False
        for p, block in enumerate(blocks):
            overlap = overlap or bool(np.any(owner[block] != k))
            owner[block] = p
        whole = self.prepared.model.block(ds.X_train, ds.y_train)
        self._owner = owner
        self._whole: BlockGradient | None = (
            whole if isinstance(whole, BlockGradient) and not overlap else None
        )
        self._parts: list[Any] | None = None
        if self._whole is None:  # a plugin model: partition by partition
            from codedgd.services.data.dataset import take_rows

            self._parts = [
                self.prepared.model.block(take_rows(ds.X_train, b), ds.y_train[b]) for b in blocks
            ]
        self._sizes = np.asarray(self.payload_bytes, dtype=np.float64)

    def _rebind(self) -> None:
        """A re-assignment: only the result sizes depend on the plan here."""
        self._sizes = np.asarray(self.payload_bytes, dtype=np.float64)

    def _timed_decode(self, repeats: int = 5) -> float:
        """Median seconds of the policy's real decode after a random order of arrivals."""
        policy, plan = self.prepared.policy, self.prepared.plan
        dim = self.prepared.dim
        rng = np.random.default_rng([self.config.seed, 0x64656364])  # "decd"
        payloads = [rng.standard_normal(plan.payload_length(w, dim)) for w in range(plan.n_workers)]
        times = []
        for _ in range(repeats):
            spec = policy.begin_round(0, np.zeros(dim))
            for w in rng.permutation(np.asarray(spec.workers, dtype=np.int64)):
                if policy.offer(int(w), payloads[int(w)].copy()):
                    break
            start = time.perf_counter()
            policy.decode()
            times.append(time.perf_counter() - start)
        return float(np.median(times))

    def _round(
        self,
        t: int,
        point: np.ndarray,
        now: float,
        compute_model: np.ndarray,
        theta_bytes: int,
    ) -> _Round:
        cfg, cost, policy = self.config, self.cost, self.prepared.policy
        spec = policy.begin_round(t, point)
        contacted = np.asarray(spec.workers, dtype=np.int64)
        compute = compute_model[contacted]
        delay = delays_of(self.straggler, contacted, t, compute, self.loads[contacted])
        own = compute + delay  # each worker's own times: θ_t complete there → result ready
        held_out = self.buckets.level(COORDINATOR, True)
        ready = downlink_times(cost, theta_bytes, len(contacted), held_out) + own
        sizes = self._sizes[contacted]
        arrival = uplink_arrivals(cost, ready, sizes, self.buckets.level(COORDINATOR, False))
        by_time = np.argsort(arrival, kind="stable")
        answering = by_time[np.isfinite(arrival[by_time])]
        try:
            outcome = policy.decode_order(contacted[answering])
        except DecodeError:
            outcome = None
        if outcome is None or arrival[answering[outcome.count - 1]] > cfg.round_timeout:
            if len(answering) < len(contacted) or outcome is not None:
                silent = sorted(int(w) for w in contacted[~np.isfinite(arrival)])
                raise JobFailed(
                    f"round {t} was not decodable within job.round_timeout="
                    f"{cfg.round_timeout:g} s (simulated); still waiting for workers {silent}"
                )
            raise JobFailed(
                f"round {t}: policy {policy.name!r} could not decode after all "
                f"{len(contacted)} contacted workers arrived"
            )
        used = answering[: outcome.count]
        self.computed += outcome.count
        self.skipped += len(contacted) - outcome.count
        out = _Round(computations=len(contacted))
        out.through = {
            (COORDINATOR, True): float(theta_bytes * len(contacted)),
            (COORDINATOR, False): float(sizes.sum()),
        }
        out.wait = float(arrival[used[-1]])
        out.decode = self._decode_s
        out.answered = out.uploads = outcome.count
        out.bytes_up = int(sizes[used].sum())
        out.compute_max = float(compute[used].max())
        if self.per_worker:
            out.responses = {int(contacted[i]): float(arrival[i]) for i in used}
            out.computes = {int(contacted[i]): float(compute[i]) for i in used}
            out.ready = {int(contacted[i]): float(own[i]) for i in used}
            # The others are cancelled when the round decodes (a served group's members
            # too: this engine does not cancel them earlier).
            late = np.ones(len(contacted), dtype=bool)
            late[used] = False
            out.cancels = dict.fromkeys((int(w) for w in contacted[late]), out.wait)
        out.estimate = Estimate(
            self._gradient(point, outcome.weights),
            outcome.workers_used,
            exact=outcome.exact,
            residual=outcome.residual,
        )
        return out

    def _gradient(self, theta: np.ndarray, weights: np.ndarray) -> np.ndarray:
        """Σ_p weights[p]·g_p(θ)."""
        if self._whole is not None:
            row_weights = np.append(weights, 0.0)[self._owner]
            return self._whole.weighted_grad_sum(theta, row_weights)
        assert self._parts is not None
        out = np.zeros(self.prepared.dim)
        for p in np.flatnonzero(weights):
            out += weights[p] * self._parts[int(p)].grad_sum(theta)
        return out


__all__ = ["VectorizedSimulator", "not_vectorizable"]
