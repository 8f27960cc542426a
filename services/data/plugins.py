"""Datasets and models from other packages, found through Python entry points.

A package adds a dataset or a model by declaring an entry point in its
``pyproject.toml`` (docs/data.md has the protocol and examples/ an example package)::

    [project.entry-points."codedgd.datasets"]
    blobs = "my_package.data:BLOBS"
    [project.entry-points."codedgd.models"]
    svm = "my_package.svm:SquaredHingeSVM"

Names are looked up when a job names one that is not built in; a plugin is imported
only then, and a plugin that fails to import is reported by name, entry point and
package, with the fix. Built-in names win over plugins of the same name.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Iterable, Mapping
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Protocol, runtime_checkable

import numpy as np

from codedgd.services.data.dataset import Dataset, Matrix
from codedgd.services.errors import ConfigError, DataError

DATASET_GROUP = "codedgd.datasets"
MODEL_GROUP = "codedgd.models"

_KIND = {DATASET_GROUP: "dataset", MODEL_GROUP: "model"}
_loaded: dict[tuple[str, str, str], Any] = {}


def plugin_names(group: str) -> list[str]:
    """Names of the installed plugins of an entry-point group (nothing is imported)."""
    return sorted({ep.name for ep in entry_points(group=group)})


def _entry_point(group: str, name: str) -> EntryPoint | None:
    found = {ep.value: ep for ep in entry_points(group=group, name=name)}
    if len(found) > 1:
        owners = ", ".join(f"{_package(ep)} ({ep.value})" for ep in found.values())
        raise ConfigError(
            f"several installed packages give {group} {name!r}: {owners}; uninstall all but one"
        )
    return next(iter(found.values()), None)


def _package(ep: EntryPoint) -> str:
    dist = ep.dist
    return f"{dist.name} {dist.version}" if dist is not None else "an unknown package"


def load_plugin(group: str, name: str) -> Any | None:
    """The object an installed plugin's entry point names, or None when none is named so."""
    ep = _entry_point(group, name)
    if ep is None:
        return None
    key = (group, name, ep.value)
    if key not in _loaded:
        try:
            _loaded[key] = ep.load()
        except Exception as exc:
            raise ConfigError(
                f"{_KIND.get(group, group)} plugin {name!r} (entry point {group}: {name} = "
                f"{ep.value}, from {_package(ep)}) failed to load: "
                f"{type(exc).__name__}: {exc}. Fix or reinstall that package, or uninstall it"
            ) from None
    return _loaded[key]


def unknown_name(kind: str, name: str, builtin: Iterable[str], group: str) -> ConfigError:
    """The error for a name neither built in nor installed, with the nearest names."""
    names = [*builtin, *(p for p in plugin_names(group) if p not in builtin)]
    near = difflib.get_close_matches(str(name), names, n=2)
    hint = f" Did you mean {' or '.join(near)}?" if near else ""
    return ConfigError(
        f"unknown {kind} {name!r}.{hint} Available: {', '.join(names)} (plugins are "
        f"packages with a {group!r} entry point, installed where the coordinator and the "
        "workers run)"
    )


def accepted_options(fn: Callable[..., Any], skip: Iterable[str] = ()) -> set[str] | None:
    """The keyword options a plugin's callable accepts; None when it takes **kwargs."""
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return None
    return {
        n
        for n, p in params.items()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and n not in skip
    }


def check_plugin_options(
    kind: str, name: str, fn: Callable[..., Any], options: Mapping[str, Any], skip: Iterable[str]
) -> None:
    accepted = accepted_options(fn, skip)
    if accepted is None:
        return
    unknown_keys = set(options) - accepted
    if unknown_keys:
        raise ConfigError(
            f"{kind} {name!r} has no option(s) {', '.join(sorted(unknown_keys))}; "
            f"its options: {', '.join(sorted(accepted)) or 'none'}"
        )


# ---------------------------------------------------------------- dataset plugins


@runtime_checkable
class DatasetPlugin(Protocol):
    """What a ``codedgd.datasets`` entry point names (an object, a class or a module).

    ``task`` is "classification" (labels of two values, mapped to 0/1: the smaller to 0)
    or "regression"; ``load`` returns all rows as (X, y), X a 2-D numpy array or scipy
    sparse matrix, y one number per row; codedgd checks them and makes the seeded
    train/test split (option ``test_fraction``, default 0.2). ``load``'s keyword
    parameters are the dataset's options (``--data-opt KEY=VALUE``).
    """

    task: str

    def load(self, *, seed: int) -> tuple[Matrix, np.ndarray]: ...


def dataset_plugin(name: str) -> Any | None:
    """The plugin named ``name``, checked to follow the protocol; None if none is installed."""
    plugin = load_plugin(DATASET_GROUP, name)
    if plugin is None:
        return None
    task = getattr(plugin, "task", None)
    if not callable(getattr(plugin, "load", None)) or task not in ("classification", "regression"):
        raise ConfigError(
            f"dataset plugin {name!r} ({type(plugin).__name__}) does not follow the protocol: "
            "it needs task = 'classification' or 'regression' and load(*, seed, **options) "
            "returning (X, y) (docs/data.md)"
        )
    return plugin


def check_plugin_dataset(name: str, plugin: Any, options: Mapping[str, Any]) -> None:
    check_plugin_options(
        "dataset", name, plugin.load, {k: v for k, v in options.items() if k != "test_fraction"},
        skip=("seed",),
    )  # fmt: skip
    fraction = options.get("test_fraction", 0.2)
    if isinstance(fraction, bool) or not isinstance(fraction, int | float) or not 0 < fraction < 1:
        raise ConfigError(
            f"dataset {name!r}: test_fraction must be a number in (0, 1), got {fraction!r}"
        )


def load_plugin_dataset(name: str, plugin: Any, options: Mapping[str, Any], seed: int) -> Dataset:
    from codedgd.services.data.files import check_matrix, split, task_labels

    opts = dict(options)
    fraction = opts.pop("test_fraction", 0.2)
    where = f"dataset plugin {name!r}"
    try:
        result = plugin.load(seed=seed, **opts)
    except (ConfigError, DataError):
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc}") from None
    if not (isinstance(result, tuple) and len(result) == 2):
        raise DataError(f"{where}: load() must return (X, y), got {type(result).__name__}")
    X, y = result
    y = np.asarray(y, dtype=np.float64) if isinstance(y, list | tuple) else y
    check_matrix(X, y, where)
    if not (isinstance(X, np.ndarray)):
        import scipy.sparse as sp

        X = sp.csr_matrix(X, dtype=np.float64)
    else:
        X = np.ascontiguousarray(X, dtype=np.float64)
    y = task_labels(np.asarray(y, dtype=np.float64), plugin.task, where)
    return split(X, y, name=name, task=plugin.task, seed=seed, test_fraction=fraction)
