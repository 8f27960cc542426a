"""Prometheus metrics of the coordinator (one registry per coordinator instance).

Names carry their units (``_seconds``, ``_bytes``), counters end in ``_total``,
and no label takes unbounded values (never a round number or a job id): workers
are labelled by their plan index, bounded by n. Label values known up front
(straggler reasons, traffic directions) are created at zero, so a dashboard
shows 0 rather than "no data" before the first straggler.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info

# Why a worker's result was not used in a round (the ``reason`` of codedgd_stragglers_total):
# cancelled once the round decoded, late_dropped when it arrived after its round,
# lost when its stream broke, rejected when it could not join, silent when nothing (not
# even a heartbeat) came from it for --worker-timeout, silent_peer when a ring's or tree's
# peers waited for it past the round's deadline (it is released from the job).
STRAGGLER_REASONS = (
    "cancelled",
    "late_dropped",
    "lost",
    "rejected",
    "norm_guard",
    "outvoted",
    "silent",
    "silent_peer",
)

ROUND_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
)


class CoordinatorMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.round_duration = Histogram(
            "codedgd_round_duration_seconds",
            "Time of one round, broadcast to step done.",
            ["policy"],
            buckets=ROUND_BUCKETS,
            registry=r,
        )
        self.wait_duration = Histogram(
            "codedgd_round_wait_seconds",
            "Time from broadcast until the policy could decode.",
            ["policy"],
            buckets=ROUND_BUCKETS,
            registry=r,
        )
        self.decode_duration = Histogram(
            "codedgd_decode_duration_seconds",
            "Time to decode a round's gradient.",
            ["policy"],
            buckets=ROUND_BUCKETS,
            registry=r,
        )
        self.worker_compute = Histogram(
            "codedgd_worker_compute_seconds",
            "Compute time reported by a worker for a round.",
            ["worker"],
            buckets=ROUND_BUCKETS,
            registry=r,
        )
        self.worker_response = Histogram(
            "codedgd_worker_response_seconds",
            "Time from broadcast until a worker's result arrived.",
            ["worker"],
            buckets=ROUND_BUCKETS,
            registry=r,
        )
        self.stragglers = Counter(
            "codedgd_stragglers_total",
            "Workers not used in a round, by reason (cancelled, late_dropped, lost, rejected; "
            "of the rejected, norm_guard and outvoted count corrupt results; silent: no "
            "heartbeat for --worker-timeout; silent_peer: a ring's or tree's peer released "
            "for sending nothing past the round's deadline).",
            ["reason"],
            registry=r,
        )
        for reason in STRAGGLER_REASONS:
            self.stragglers.labels(reason)
        self.gradient_bytes = Counter(
            "codedgd_gradient_bytes_total",
            "Bytes of θ sent (down) and results received (up).",
            ["direction"],
            registry=r,
        )
        # ``direction``: θ sent down to workers, results coming up. The children every
        # round touches are looked up once (labels() takes a lock).
        self.bytes_down = self.gradient_bytes.labels("down")
        self.bytes_up = self.gradient_bytes.labels("up")
        self.rounds = Counter("codedgd_rounds_total", "Rounds completed.", ["policy"], registry=r)
        self.uploads = Counter(
            "codedgd_uploads_total", "Worker gradient messages received.", registry=r
        )
        self.uploads_skipped = Counter(
            "codedgd_uploads_skipped_total",
            "Worker results that said 'computed, not uploaded' (lazy aggregation).",
            registry=r,
        )
        self.computations = Counter(
            "codedgd_computations_total",
            "Gradient computations requested from workers.",
            registry=r,
        )
        self.decode_errors = Counter(
            "codedgd_decode_errors_total",
            "Rounds whose decoding failed (residual, infeasible).",
            registry=r,
        )
        self.round = Gauge("codedgd_round", "Current round of the running job.", registry=r)
        self.loss = Gauge(
            "codedgd_loss", "Training objective after the last evaluated round.", registry=r
        )
        self.metric = Gauge(
            "codedgd_heldout_metric",
            "Held-out metric (AUC or MSE) after the last evaluated round.",
            ["name"],
            registry=r,
        )
        self.workers_connected = Gauge(
            "codedgd_workers_connected", "Workers with an open stream.", registry=r
        )
        self.workers_missing = Gauge(
            "codedgd_workers_missing",
            "More idle workers the job about to start waits for (0: it waits for none).",
            registry=r,
        )
        self.jobs = Counter(
            "codedgd_jobs_total", "Jobs finished, by final state.", ["state"], registry=r
        )
        self.replacements = Counter(
            "codedgd_workers_replaced_total",
            "Lost workers whose place a newly connected worker took during a job.",
            registry=r,
        )
        self.policy_switches = Counter(
            "codedgd_policy_switches_total",
            "Changes a policy made to itself between rounds (auto: the group size r and "
            "the stop rule K).",
            ["policy"],
            registry=r,
        )
        self.round_restarts = Counter(
            "codedgd_round_restarts_total",
            "Rounds of a ring or tree started again once a lost worker's replacement joined.",
            registry=r,
        )
        self.assignment_bytes = Counter(
            "codedgd_assignment_bytes_total",
            "Bytes of plans and training rows sent to workers: at job start, to newcomers, "
            "and when a policy moves data between rounds.",
            registry=r,
        )
        self.reassignment_duration = Histogram(
            "codedgd_reassignment_duration_seconds",
            "Pauses between rounds to move data to a policy's new plan (auto changing its "
            "group size): first message sent to the last worker's acknowledgement.",
            registry=r,
        )
        self.deliberation_duration = Histogram(
            "codedgd_deliberation_duration_seconds",
            "Wall time of a policy's deliberation (auto's look-ahead), run in a thread "
            "beside the rounds: how late its choice comes.",
            buckets=(0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
            registry=r,
        )
        self.deliberation_lag_rounds = Histogram(
            "codedgd_deliberation_lag_rounds",
            "Rounds between the round a deliberation started from and the first round "
            "its choice applies to.",
            buckets=(1, 2, 5, 10, 20, 50, 100, 200),
            registry=r,
        )
        self.job_info = Info(
            "codedgd_job",
            "The running job's policy, model, dataset and number of workers.",
            registry=r,
        )
