"""A job's preparation before round 0, the same for the coordinator and the simulator.

:func:`prepare` builds the policy and asks it for the plan (so an n that does not fit
the code fails before any data is read), loads the dataset, splits its training rows
into the job's seeded partitions (or takes the dataset's own split), chooses the step
size and binds the policy to the data. It blocks (data loading, smoothness constants):
the coordinator calls it in a thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from codedgd.services.data import check_owner_partitions, load_dataset
from codedgd.services.data.dataset import Dataset, Matrix, partition_rows, take_rows
from codedgd.services.errors import ConfigError
from codedgd.services.job.config import JobConfig
from codedgd.services.models import (
    check_target_loss,
    create_model,
    objective_smoothness,
    parameter_count,
)
from codedgd.services.models import initial_theta as model_theta0
from codedgd.services.models.base import Model
from codedgd.services.models.saved import load_model
from codedgd.services.optim import absolute_lr, create_optimizer, lr_times_inverse_l
from codedgd.services.policies import create
from codedgd.services.policies.base import JobContext, Plan, Policy


@dataclass
class Prepared:
    """What a job needs before its first round (built off the event loop)."""

    dataset: Dataset
    model: Model
    policy: Policy
    plan: Plan
    blocks: list[np.ndarray]  # partition p's row indices into the training set
    lr: float
    theta0: np.ndarray  # where the descent starts: the model's θ₀, or job.init_from's θ

    @property
    def dim(self) -> int:
        """θ's length: the data's features for a linear model, a network's parameters."""
        return int(self.theta0.shape[0])


def prepare(config: JobConfig, data_dir: str | None) -> Prepared:
    """Load data, build model and policy, plan, and choose the step size (blocking)."""
    policy = create(config.policy.name, config.policy.options, seed=config.seed)
    model = create_model(config.model.name, config.model.options)
    if config.target_loss is not None:
        check_target_loss(config.model.name, config.target_loss, "job.target_loss")
    n = config.workers
    k = config.partitions or policy.default_partitions(n)
    plan = policy.plan(n, k)  # before loading data: a wrong n fails fast
    check_guard(config, plan)
    dataset = load_dataset(
        config.data.name, config.data.options, seed=config.seed, data_dir=data_dir
    )
    if k > dataset.n_train:
        raise ConfigError(f"{k} partitions but only {dataset.n_train} training rows")
    if dataset.blocks is not None:
        check_owner_partitions(dataset.name, len(dataset.blocks), k)
        blocks = [np.asarray(b, dtype=np.int64) for b in dataset.blocks]
    else:
        blocks = partition_rows(dataset.n_train, k, config.seed)
    lr = choose_lr(config, model, dataset.X_train)
    policy.bind(job_context(config, model, dataset, blocks, lr))
    theta0 = model_theta0(model, dataset.dim, config.seed)
    if config.init_from is not None:
        theta0 = initial_theta(config, parameter_count(model, dataset.dim))
    return Prepared(dataset, model, policy, plan, blocks, lr, theta0)


def check_guard(config: JobConfig, plan: Plan) -> None:
    """job.max_norm_ratio (the norm guard) needs results to compare: n >= 3, a star."""
    if not config.max_norm_ratio:
        return
    if config.workers < 3:
        raise ConfigError(
            f"job.max_norm_ratio needs n >= 3 workers to compare results with (n = "
            f"{config.workers}): use more workers or leave the guard off"
        )
    if plan.topology.kind != "star":
        raise ConfigError(
            f"job.max_norm_ratio judges results sent to the coordinator, but "
            f"{config.policy.name} sums them among the workers ({plan.topology.kind}): leave "
            "the guard off for worker-to-worker policies"
        )


def initial_theta(config: JobConfig, dim: int | None = None) -> np.ndarray:
    """θ of job.init_from's model file, checked against the job's model (and ``dim``)."""
    assert config.init_from is not None
    saved = load_model(config.init_from)
    if saved.model.get("name") != config.model.name:
        raise ConfigError(
            f"job.init_from {config.init_from} holds a {saved.model.get('name')!r} model, but "
            f"the job trains {config.model.name!r}: start from a model of the same kind"
        )
    if dim is not None and saved.dim != dim:
        raise ConfigError(
            f"job.init_from {config.init_from} has {saved.dim} parameters, but the job's model "
            f"has {dim}: start from a model trained on the same features"
        )
    return np.array(saved.theta, dtype=np.float64)


def job_context(
    config: JobConfig, model: Model, dataset: Dataset, blocks: list[np.ndarray], lr: float
) -> JobContext:
    """The policy's view of the loaded job (smoothness computed only when asked)."""
    n_rows = dataset.n_train

    def smoothness(partitions: Sequence[int]) -> float:
        rows = np.sort(np.concatenate([blocks[p] for p in partitions]))
        return float(model.smoothness(take_rows(dataset.X_train, rows))) / n_rows

    # The same schedule the job's optimizer follows (its step sizes depend on the options only).
    schedule = create_optimizer({**config.optimizer, "lr": lr}, np.zeros(1)).step_size
    return JobContext(
        n_rows=n_rows,
        step_size=lr,
        smoothness=smoothness,
        step_size_at=schedule,
        rounds=config.rounds,
    )


def choose_lr(config: JobConfig, model: Model, X: Matrix) -> float:
    """The step size: a number, "auto" = 1/L for the objective (1/N)Σℓ + (λ/2)‖θ‖², or
    "F/L" = F times that."""
    lr = config.optimizer.get("lr", "auto")
    times = lr_times_inverse_l(lr)
    if times is not None:
        return times / float(objective_smoothness(model, X))
    number = absolute_lr(lr)
    if number is None:
        raise ConfigError(
            f'optimizer.lr must be a positive number, "auto" (1/L) or "F/L" (e.g. "0.5/L"), '
            f"got {lr!r}"
        )
    return number
