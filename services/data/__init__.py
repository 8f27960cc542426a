"""Datasets: the embedded synthetic default, loaders of real datasets, a user's own
files (``file``) and datasets of installed plugins (the ``codedgd.datasets`` entry points).

Real datasets are read from a data directory: ``--data-dir`` or the
``CODEDGD_DATA_DIR`` environment variable. They are never shipped with codedgd.
A user's files and plugin datasets are read by the coordinator, which sends workers
their rows (docs/data.md).
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from codedgd.services.data.dataset import Dataset, partition_rows, take_rows
from codedgd.services.data.files import check_file_options, load_file
from codedgd.services.data.lag_synthetic import check_lag_synthetic, make_lag_synthetic
from codedgd.services.data.plugins import (
    DATASET_GROUP,
    check_plugin_dataset,
    dataset_plugin,
    load_plugin_dataset,
    plugin_names,
    unknown_name,
)
from codedgd.services.data.synthetic import check_synthetic, is_real, make_synthetic
from codedgd.services.errors import ConfigError, DataError

DATA_DIR_ENV = "CODEDGD_DATA_DIR"

DATASETS: dict[str, str] = {
    "synthetic": "seeded synthetic data (options: rows, dim, task, density, noise, test_fraction)",
    "amazon": "Amazon Employee Access, one-hot with pairwise interactions (241,915 dims, sparse)",
    "covtype": "Forest Covertype subset, classes 1 vs 2 (54 features + bias)",
    "kc-house": "King County house sales, price × 1e-6, one-hot least squares (sparse)",
    "lag-synthetic": "LAG's heterogeneous least squares, X_m = growth^(m-1) q_m q_m^T + I, "
    "split among workers (options: workers, dim, growth, noise)",
    "file": "your own LIBSVM/svmlight, CSV or .npz file or directory of shards (options: "
    "path, format, label, task, delimiter, bias, test_fraction; docs/data.md)",
    "fashion-mnist": "Fashion-MNIST's IDX files, 10 classes of 28x28 images (options: path, "
    "default /usr/share/datasets/fashion-mnist from Debian's dataset-fashion-mnist; rows, "
    "test_rows); for the mlp and cnn models",
}

# Datasets generated from the seed: never read from disk, so workers always get rows inline.
GENERATORS: dict[str, Callable[..., Dataset]] = {
    "synthetic": make_synthetic,
    "lag-synthetic": make_lag_synthetic,
}
# Their option checks, run on submit with the generator's defaults filled in.
CHECKS: dict[str, Callable[..., None]] = {
    "synthetic": check_synthetic,
    "lag-synthetic": check_lag_synthetic,
}


def is_generated(name: str) -> bool:
    """True for datasets whose rows the coordinator always sends to workers inline: those
    made from the seed, a user's ``file`` (read where the coordinator runs) and plugin
    datasets. Only the real datasets of a data directory may be read by workers."""
    return name not in _REAL


def dataset_names() -> list[str]:
    """Every dataset a job can name: the built-in ones, then installed plugins'."""
    return [*DATASETS, *(p for p in plugin_names(DATASET_GROUP) if p not in DATASETS)]


def resolve_data_dir(explicit: str | Path | None) -> Path:
    """The directory of the real datasets: the explicit option, else $CODEDGD_DATA_DIR."""
    raw = explicit if explicit else os.environ.get(DATA_DIR_ENV)
    if not raw:
        raise DataError(
            f"no data directory: pass --data-dir DIR or set {DATA_DIR_ENV} to the folder "
            "holding the real datasets (e.g. shared/datasets)"
        )
    path = Path(raw).expanduser()
    if not path.is_dir():
        raise DataError(
            f"data directory {path} does not exist or is not a directory: fix --data-dir "
            f"or {DATA_DIR_ENV}"
        )
    return path


# The real datasets of a data directory (workers started with --data-dir read them too).
_REAL = ("amazon", "covtype", "kc-house")


def _loaders() -> dict[str, Callable[..., Dataset]]:
    from codedgd.services.data import loaders

    return {
        "amazon": loaders.load_amazon,
        "covtype": loaders.load_covtype,
        "kc-house": loaders.load_kc_house,
    }


def check_dataset_options(
    name: str, options: Mapping[str, Any], data_dir: str | Path | None = None
) -> None:
    """Validate a dataset name and its option names (and the data directory) without loading."""
    if name == "file":
        _check_file(options, data_dir)
        return
    if name == "fashion-mnist":
        accepted = {"path", "rows", "test_rows"}
        unknown = set(options) - accepted
        if unknown:
            raise ConfigError(
                f"dataset 'fashion-mnist' has no option(s) {', '.join(sorted(unknown))}; "
                f"its options: {', '.join(sorted(accepted))}"
            )
        return
    if name not in DATASETS:
        plugin = dataset_plugin(name)
        if plugin is None:
            raise unknown_name("dataset", name, DATASETS, DATASET_GROUP)
        check_plugin_dataset(name, plugin, options)
        return
    fn: Callable[..., Dataset] = GENERATORS[name] if name in GENERATORS else _loaders()[name]
    accepted = {p for p in inspect.signature(fn).parameters if p not in ("data_dir", "seed")}
    unknown = set(options) - accepted
    if unknown:
        raise ConfigError(
            f"dataset {name!r} has no option(s) {', '.join(sorted(unknown))}; "
            f"its options: {', '.join(sorted(accepted)) or 'none'}"
        )
    if name in GENERATORS:  # the values too: nothing to load, so nothing else to wait for
        defaults = {k: v.default for k, v in inspect.signature(fn).parameters.items()}
        values = {key: options.get(key, defaults[key]) for key in accepted}
        CHECKS[name](**values)
    else:
        fraction = options.get("test_fraction", 0.2)  # a real dataset's one option
        if not is_real(fraction) or not 0 < fraction < 1:
            raise ConfigError(
                f"dataset {name!r}: test_fraction must be a number in (0, 1), got {fraction!r}"
            )
        try:
            resolve_data_dir(data_dir)
        except DataError as exc:
            raise ConfigError(
                f"{exc} (the data directory is the coordinator's: `codedgd run --data-dir`, "
                f"`codedgd coordinator --data-dir`, or {DATA_DIR_ENV} where it runs)"
            ) from None


def _check_file(options: Mapping[str, Any], data_dir: str | Path | None) -> None:
    accepted = {p for p in inspect.signature(load_file).parameters if p not in ("data_dir", "seed")}
    unknown_keys = set(options) - accepted
    if unknown_keys:
        raise ConfigError(
            f"dataset 'file' has no option(s) {', '.join(sorted(unknown_keys))}; "
            f"its options: {', '.join(sorted(accepted))}"
        )
    check_file_options(**{"path": "", **dict(options)}, data_dir=data_dir)


# The learning task of each dataset whose task is fixed; synthetic's is its `task` option.
_TASK = {
    "amazon": "classification",
    "covtype": "classification",
    "kc-house": "regression",
    "lag-synthetic": "regression",
    "fashion-mnist": "multiclass",
}


def data_owners(name: str, options: Mapping[str, Any]) -> int | None:
    """How many owners a dataset comes split among (each one partition), or None.

    Known before generating it, so a job with another k is refused on submit.
    """
    if name == "lag-synthetic":
        workers = options.get("workers", 9)
        return workers if isinstance(workers, int) and not isinstance(workers, bool) else None
    return None


def check_owner_partitions(name: str, owners: int, k: int) -> None:
    """A dataset split among ``owners`` needs k = owners partitions, one per owner."""
    if k != owners:
        raise ConfigError(
            f"dataset {name!r} comes split among {owners} data owners: use k = {owners} "
            f"partitions (got k = {k}; with policies that use k = n, run n = {owners} workers)"
        )


def dataset_task(name: str, options: Mapping[str, Any]) -> str:
    """ "classification" (0/1 labels), "multiclass" (class indices) or "regression" (real
    targets): what the data is for."""
    if name in ("synthetic", "file"):
        return str(options.get("task", "classification"))
    if name in _TASK:
        return _TASK[name]
    plugin = dataset_plugin(name)
    if plugin is None:
        raise unknown_name("dataset", name, DATASETS, DATASET_GROUP)
    return str(plugin.task)


def load_dataset(
    name: str, options: Mapping[str, Any], *, seed: int, data_dir: str | Path | None = None
) -> Dataset:
    """Load a dataset by name with a seeded train/test split."""
    check_dataset_options(name, options, data_dir)
    if name == "file":
        return load_file(seed=seed, data_dir=data_dir, **dict(options))
    if name == "fashion-mnist":
        from codedgd.services.data.idx import load_fashion_mnist

        try:
            return load_fashion_mnist(seed=seed, **dict(options))
        except TypeError as exc:
            raise ConfigError(f"fashion-mnist dataset: {exc}") from None
    if name not in DATASETS:
        plugin = dataset_plugin(name)
        return load_plugin_dataset(name, plugin, options, seed)
    if name in GENERATORS:
        try:
            return GENERATORS[name](seed=seed, **dict(options))
        except TypeError as exc:
            raise ConfigError(f"{name} dataset: {exc}") from None
    return _loaders()[name](resolve_data_dir(data_dir), seed=seed, **dict(options))


__all__ = [
    "DATASETS",
    "Dataset",
    "check_dataset_options",
    "check_owner_partitions",
    "data_owners",
    "dataset_names",
    "dataset_task",
    "is_generated",
    "load_dataset",
    "make_lag_synthetic",
    "make_synthetic",
    "partition_rows",
    "resolve_data_dir",
    "take_rows",
]
