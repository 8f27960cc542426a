"""The descent a job drives, whoever delivers its rounds' estimates.

:class:`Descent` holds θ and the optimizer of a prepared job. Each round the caller asks
for the point the workers' gradients are taken at (:meth:`Descent.point`), then steps
with the decoded estimate of Σ_j g_j (:meth:`Descent.step`: ``g/N + λθ``). The loss and
held-out metric are evaluated on the job's schedule, a diverging loss fails the job, and
``job.target_loss`` ends it. The coordinator's round loop and the simulator both step
through this class, so their θ agree bit for bit.
"""

from __future__ import annotations

import math

import numpy as np

from codedgd.services.job.config import JobConfig
from codedgd.services.job.prepare import Prepared
from codedgd.services.models import objective
from codedgd.services.optim import check_converging, create_optimizer, objective_gradient


class Descent:
    """θ, the optimizer and the evaluation schedule of one prepared job."""

    def __init__(self, config: JobConfig, prepared: Prepared) -> None:
        self.config = config
        self.prepared = prepared
        options = dict(config.optimizer)
        options["lr"] = prepared.lr
        self.optimizer = create_optimizer(options, prepared.theta0)
        self.steps = 0

    @property
    def theta(self) -> np.ndarray:
        return self.optimizer.theta

    def point(self) -> np.ndarray:
        """Where round t's gradients are taken (θ_t, or Nesterov's look-ahead)."""
        return self.optimizer.point()

    def step(self, gradient_sum: np.ndarray, point: np.ndarray) -> None:
        """Step with the decoded estimate of the data gradients' sum at ``point``."""
        model = self.prepared.model
        n_rows = self.prepared.dataset.n_train
        self.optimizer.update(objective_gradient(gradient_sum, n_rows, model.l2, point))
        self.steps += 1

    def evaluates(self, t: int) -> bool:
        """Is round t one whose loss and metric are evaluated (job.eval_every, and the last)?"""
        return t % self.config.eval_every == 0 or t == self.config.rounds - 1

    def evaluate(self, t: int) -> tuple[float, float]:
        """The training objective and held-out metric at θ after round t (blocking).

        A loss that is no longer finite fails the job (JobFailed, naming the step size).
        """
        prepared = self.prepared
        ds, model = prepared.dataset, prepared.model
        theta = self.optimizer.theta
        # A diverging θ overflows: the loss comes out inf or NaN and check_converging says
        # so, in place of numpy's overflow warnings.
        with np.errstate(over="ignore", invalid="ignore"):
            loss = float(objective(model, theta, ds.X_train, ds.y_train))
            metric = float(model.metric(theta, ds.X_test, ds.y_test))
        check_converging(t, loss, prepared.lr, prepared.policy.divergence_hint())
        return loss, metric

    def reached_target(self, loss: float) -> bool:
        target = self.config.target_loss
        return target is not None and not math.isnan(loss) and loss <= target
