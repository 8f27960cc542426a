"""A trained model on disk: θ and what it means, in one ``.npz`` file.

The file is a NumPy ``.npz`` archive (a zip of ``.npy`` arrays, readable with
``numpy.load`` and by any zip and npy reader) holding two entries:

- ``theta``: float64, shape (dim,): the model's parameters, little-endian;
- ``meta``: a 0-d unicode array holding one JSON object:

  ``format``      ``"codedgd.model.v1"``
  ``model``       ``{"name": ..., "options": {...}}`` (e.g. logistic with its l2)
  ``dim``         the number of parameters (= features for the linear models, no bias term)
  ``features``    the data's columns the model takes (a network's input size; optional)
  ``task``        ``"classification"`` (labels 0/1; predictions are P(y = 1)) or ``"regression"``
  ``dataset``     ``{"name": ..., "options": {...}}`` it was trained on, and its ``seed``
  ``rounds``      rounds trained; ``loss``, ``metric``, ``metric_name``: the last evaluated
  ``job``         the whole job document (codedgd.services.job.JobConfig)
  ``theta_sha256`` SHA-256 of ``theta``'s bytes: a file cut short or altered is refused

Files are written atomically (a temporary file, fsync, rename), so a reader never sees
half of one.
"""

from __future__ import annotations

import hashlib
import json
import math
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from codedgd.services.errors import ConfigError, DataError
from codedgd.services.files import atomic_open

FORMAT = "codedgd.model.v1"


@dataclass(frozen=True)
class SavedModel:
    """A trained model: θ and what it means (see the module docstring)."""

    theta: np.ndarray
    model: dict[str, Any]  # {"name": ..., "options": {...}}
    task: str
    dataset: dict[str, Any]  # {"name": ..., "options": {...}, "seed": ...}
    rounds: int
    loss: float | None = None
    metric: float | None = None
    metric_name: str = ""
    job: dict[str, Any] = field(default_factory=dict)
    features: int | None = None  # the data's columns (None: as many as parameters)

    @property
    def dim(self) -> int:
        return int(self.theta.shape[0])

    def meta(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "model": self.model,
            "dim": self.dim,
            "task": self.task,
            "dataset": self.dataset,
            "rounds": self.rounds,
            "loss": _finite(self.loss),
            "metric": _finite(self.metric),
            "metric_name": self.metric_name,
            "job": self.job,
            "theta_sha256": _digest(self.theta),
            **({"features": self.features} if self.features is not None else {}),
        }

    @staticmethod
    def from_meta(meta: dict[str, Any], theta: np.ndarray, source: str) -> SavedModel:
        """The model of a ``meta`` document and θ, checked (``source`` names them in errors)."""
        if not isinstance(meta, dict):
            raise DataError(f"{source}: the model's description is not a JSON object")
        if meta.get("format") != FORMAT:
            raise DataError(
                f"{source} is not a codedgd model (format {meta.get('format')!r}, "
                f"expected {FORMAT!r})"
            )
        theta = np.ascontiguousarray(theta, dtype="<f8")
        if theta.ndim != 1 or theta.shape[0] != meta.get("dim"):
            raise DataError(
                f"{source}: θ has shape {theta.shape} but the model says dim = {meta.get('dim')}"
            )
        if meta.get("theta_sha256") != _digest(theta):
            raise DataError(f"{source}: θ does not match its checksum: the file is damaged")
        if not np.all(np.isfinite(theta)):
            raise DataError(f"{source}: θ holds values that are not finite numbers")
        try:
            return SavedModel(
                theta=theta,
                model=dict(meta["model"]),
                task=str(meta["task"]),
                dataset=dict(meta["dataset"]),
                rounds=int(meta["rounds"]),
                loss=meta.get("loss"),
                metric=meta.get("metric"),
                metric_name=str(meta.get("metric_name", "")),
                job=dict(meta.get("job") or {}),
                features=int(meta["features"]) if meta.get("features") is not None else None,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise DataError(f"{source}: the model's description is incomplete ({exc})") from None


def save_model(path: str | Path, saved: SavedModel) -> Path:
    """Write ``saved`` to ``path`` (.npz) atomically; the path written."""
    target = Path(path)
    meta = np.array(json.dumps(saved.meta(), allow_nan=False))
    with atomic_open(target, "wb") as f:
        np.savez(f, theta=np.ascontiguousarray(saved.theta, dtype="<f8"), meta=meta)
    return target


def load_model(path: str | Path) -> SavedModel:
    """Read a model file; ConfigError for a missing file, DataError for a bad one."""
    source = Path(path)
    if not source.is_file():
        raise ConfigError(f"model file {source} does not exist")
    try:
        with np.load(source, allow_pickle=False) as archive:
            if "theta" not in archive or "meta" not in archive:
                raise DataError(f"{source} is not a codedgd model (no theta and meta entries)")
            theta = archive["theta"]
            meta = json.loads(str(archive["meta"]))
    except (zipfile.BadZipFile, EOFError, OSError, ValueError) as exc:
        raise DataError(
            f"{source} is cut short or not a codedgd model file ({type(exc).__name__}: {exc})"
        ) from None
    if not isinstance(meta, dict):
        raise DataError(f"{source} is not a codedgd model (its meta is not a JSON object)")
    return SavedModel.from_meta(meta, theta, str(source))


def model_path(result: str | Path) -> Path:
    """Where a run's model goes beside its result file: results/x.json → results/x.model.npz."""
    base = Path(result)
    return base.with_name(base.stem + ".model.npz")


def _digest(theta: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(theta, dtype="<f8").tobytes()).hexdigest()


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None
