"""The descent a job drives, whoever delivers its rounds' estimates.

:class:`Descent` holds θ and the optimizer of a prepared job. Each round the caller asks
for the point the workers' gradients are taken at (:meth:`Descent.point`), then steps
with the decoded estimate of Σ_j g_j (:meth:`Descent.step`: ``g/N + λθ``). The loss and
held-out metric are evaluated on the job's schedule, and ``job.target_loss`` ends it.

A descent that makes things worse fails the job as *diverged* (:class:`Diverged`): a loss
that is no longer a finite number, one that grew to :data:`GROWTH` times the loss at the
start (θ_0, evaluated once before round 0), or, at the end, a last loss above the start.
The coordinator's round loop and the simulator both step through this class, so their θ
agree bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from codedgd.services.errors import Diverged
from codedgd.services.job.config import JobConfig
from codedgd.services.job.prepare import Prepared
from codedgd.services.models import objective
from codedgd.services.optim import check_converging, create_optimizer, objective_gradient

# A loss this many times the start's fails the job at once: the step size is far too large.
GROWTH = 10.0


class Descent:
    """θ, the optimizer and the evaluation schedule of one prepared job."""

    def __init__(self, config: JobConfig, prepared: Prepared) -> None:
        self.config = config
        self.prepared = prepared
        options = dict(config.optimizer)
        options["lr"] = prepared.lr
        self.optimizer = create_optimizer(options, prepared.theta0)
        self.steps = 0
        self.start_loss: float | None = None  # the loss at θ_0
        self.last_loss: float | None = None

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

    def evaluate_start(self) -> float:
        """The training loss at θ_0, the yardstick of divergence (blocking; once)."""
        if self.start_loss is None:
            ds, model = self.prepared.dataset, self.prepared.model
            with np.errstate(over="ignore", invalid="ignore"):
                self.start_loss = float(
                    objective(model, self.optimizer.theta, ds.X_train, ds.y_train)
                )
        return self.start_loss

    def evaluate(self, t: int, *, metric: bool = True) -> tuple[float, float]:
        """The training objective and held-out metric at θ after round t (blocking; the
        metric NaN without ``metric``).

        A loss that is no longer finite, or that grew to GROWTH times the start's, fails
        the job (Diverged, naming the step size).
        """
        prepared = self.prepared
        ds, model = prepared.dataset, prepared.model
        theta = self.optimizer.theta
        # A diverging θ overflows: the loss comes out inf or NaN and check_converging says
        # so, in place of numpy's overflow warnings.
        with np.errstate(over="ignore", invalid="ignore"):
            loss = float(objective(model, theta, ds.X_train, ds.y_train))
            held_out = float(model.metric(theta, ds.X_test, ds.y_test)) if metric else math.nan
        check_converging(t, loss, prepared.lr, prepared.policy.divergence_hint())
        start = self.evaluate_start()
        if math.isfinite(start) and loss > GROWTH * start and loss > start + 1e-12:
            raise Diverged(
                f"round {t}: the training loss grew from {start:.6g} at the start to "
                f"{loss:.6g}: gradient descent diverged. Use a smaller step size (this job's "
                f"is {prepared.lr:g}; --lr auto picks 1/L)"
                + (f"; {hint}" if (hint := prepared.policy.divergence_hint()) else "")
            )
        self.last_loss = loss
        return loss, held_out

    def finish(self) -> None:
        """At the job's end: a last loss above the start's means the descent diverged."""
        start, last = self.start_loss, self.last_loss
        if start is None or last is None or not last > start:
            return
        raise Diverged(
            f"the training loss ended at {last:.6g}, above {start:.6g} at the start: gradient "
            f"descent diverged. Use a smaller step size (this job's is {self.prepared.lr:g}; "
            "--lr auto picks 1/L)"
        )

    # ------------------------------------------------------------ checkpoints

    def state(self) -> dict[str, Any]:
        """What resuming after the last step needs (see :mod:`.checkpoint`); arrays are
        copies or read-only, so the state can be written out while rounds go on."""
        return {
            "optimizer": self.optimizer.state(),
            "steps": self.steps,
            "start_loss": self.start_loss,
            "last_loss": self.last_loss,
            "policy": self.prepared.policy.state(),
        }

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Resume from :meth:`state` of the same job (prepared from the same config)."""
        self.optimizer.load_state(state["optimizer"])
        self.steps = int(state["steps"])
        start, last = state["start_loss"], state["last_loss"]
        self.start_loss = None if start is None else float(start)
        self.last_loss = None if last is None else float(last)
        self.prepared.policy.load_state(state["policy"])

    def reached_target(self, loss: float) -> bool:
        target = self.config.target_loss
        return target is not None and not math.isnan(loss) and loss <= target
