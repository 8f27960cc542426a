"""The trained model of a job, as the model file holds it (:mod:`codedgd.services.models.saved`)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from codedgd.services.data import dataset_task
from codedgd.services.job.config import JobConfig
from codedgd.services.models.saved import SavedModel
from codedgd.services.records import RoundRecord


def trained_model(
    config: JobConfig,
    theta: np.ndarray | Sequence[float],
    records: Sequence[RoundRecord],
    features: int | None = None,
) -> SavedModel:
    """θ after the job's last round, with the job that made it and how far it got
    (``features``: the data's columns, which a network's θ does not tell)."""
    # From the end: the last round is always evaluated, and a long job's older records
    # are on disk (RecordLog), not to be read back for this.
    last = next((r for r in reversed(records) if not math.isnan(r.loss)), None)
    return SavedModel(
        theta=np.asarray(theta, dtype=np.float64),
        model={"name": config.model.name, "options": dict(config.model.options)},
        task=dataset_task(config.data.name, config.data.options),
        dataset={
            "name": config.data.name,
            "options": dict(config.data.options),
            "seed": config.seed,
        },
        rounds=len(records),
        loss=last.loss if last else None,
        metric=last.metric if last else None,
        metric_name=last.metric_name if last else "",
        job=config.to_dict(),
        features=features,
    )
