"""Straggler models by name: ``[stragglers] name = "exponential"`` and their options.

:data:`STRAGGLER_MODELS` describes each model and its parameters for help texts;
:func:`create_straggler_model` checks names, options and values and names the
valid choices on a mistake. How draws are seeded: see
:mod:`codedgd.services.stragglers.models`.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from codedgd.services.errors import ConfigError
from codedgd.services.stragglers.base import StragglerModel
from codedgd.services.stragglers.models import (
    Crash,
    ExponentialDelay,
    FailStop,
    FixedDelay,
    NoDelay,
    ParetoDelay,
    SeededDelay,
    ShiftedExponentialDelay,
    SlowdownDelay,
    SpeedClasses,
    TraceDelay,
)

__all__ = [
    "STRAGGLER_MODELS",
    "Crash",
    "ExponentialDelay",
    "FailStop",
    "FixedDelay",
    "NoDelay",
    "Param",
    "ParetoDelay",
    "SeededDelay",
    "ShiftedExponentialDelay",
    "SlowdownDelay",
    "SpeedClasses",
    "StragglerInfo",
    "StragglerModel",
    "TraceDelay",
    "crash_restart",
    "create_straggler_model",
    "delays_of",
]

_REQUIRED = object()


@dataclass(frozen=True)
class Param:
    """One option of a straggler model: name, type, default and meaning."""

    name: str
    type: type
    default: Any
    help: str

    @property
    def required(self) -> bool:
        return self.default is _REQUIRED

    def describe(self) -> str:
        default = "required" if self.required else f"default {self.default!r}"
        return f"{self.name} ({self.type.__name__}, {default}): {self.help}"


@dataclass(frozen=True)
class StragglerInfo:
    """What ``codedgd run --help`` shows for a straggler model."""

    description: str
    parameters: tuple[Param, ...]

    def describe(self) -> str:
        lines = [self.description, *("  " + p.describe() for p in self.parameters)]
        return "\n".join(lines)


STRAGGLER_MODELS: dict[str, StragglerInfo] = {
    "none": StragglerInfo("no injected delay: the workers' real speeds only", ()),
    "exponential": StragglerInfo(
        "every worker sleeps an i.i.d. Exp(mean) delay after computing (ErasureHead)",
        (Param("mean", float, 0.05, "mean delay in seconds, >= 0"),),
    ),
    "shifted-exponential": StragglerInfo(
        "extra delay T = shift·load + Exp(rate/load) after computing; load = partitions held / k",
        (
            Param("shift", float, 0.0, "seconds per unit load, >= 0"),
            Param("rate", float, 10.0, "λ > 0 (mean of the exponential part: load/λ seconds)"),
        ),
    ),
    "pareto": StragglerInfo(
        "heavy-tailed Pareto(scale, shape) delay: P(T > t) = (scale/t)^shape for t >= scale",
        (
            Param("scale", float, 0.01, "t_m > 0, the smallest delay in seconds"),
            Param("shape", float, 2.0, "α > 0 (mean α·scale/(α−1) when α > 1)"),
            Param(
                "by_load",
                bool,
                False,
                "multiply the draw by the worker's load (partitions held / k), as "
                "shifted-exponential does: a worker holding more data is slower",
            ),
        ),
    ),
    "fixed": StragglerInfo(
        "count random workers per round sleep an extra fixed delay",
        (
            Param("count", int, 1, "stragglers per round, 0..n"),
            Param("delay", float, 1.0, "extra seconds, >= 0"),
        ),
    ),
    "slowdown": StragglerInfo(
        "count random workers per round take factor× their compute time",
        (
            Param("count", int, 1, "stragglers per round, 0..n"),
            Param("factor", float, 5.0, "slow-down κ >= 1 (extra delay (κ−1)·compute time)"),
        ),
    ),
    "speed-classes": StragglerInfo(
        "count workers (mixed instance types) take factor× as long at everything: compute "
        "and an optional Exp(mean) wait; chosen once from the seed, or afresh every E rounds",
        (
            Param("count", int, -1, "slow workers, 0..n; < 0: half of them"),
            Param("factor", float, 2.0, "how many times slower, >= 1"),
            Param("mean", float, 0.0, "mean of every worker's i.i.d. Exp wait, seconds >= 0"),
            Param("every", int, 0, "redraw the slow workers every this many rounds; 0: never"),
            Param(
                "calm",
                bool,
                False,
                "every other period of `every` rounds has no slow worker (alternating intensity)",
            ),
            Param("pool", int, -1, "seed of who is slow (< 0: the job seed); waits keep theirs"),
        ),
    ),
    "fail-stop": StragglerInfo(
        "count workers, chosen once from the seed, stop answering from round start on "
        "(infinite delay: they hang, the job goes on only if the policy tolerates them)",
        (
            Param("count", int, 1, "failed workers, 0..n"),
            Param("start", int, 0, "the first round they do not answer, >= 0"),
        ),
    ),
    "crash": StragglerInfo(
        "count workers, chosen once from the seed, disconnect on the first θ they receive "
        "of round start or later, and connect again as new workers restart seconds later",
        (
            Param("count", int, 1, "crashing workers, 0..n"),
            Param("start", int, 0, "the first round whose θ they crash on, >= 0"),
            Param(
                "restart",
                float,
                -1.0,
                "seconds until a crashed worker connects again; < 0: never",
            ),
        ),
    ),
    "trace": StragglerInfo(
        "replay recorded per-worker per-round delays",
        (
            Param(
                "path",
                str,
                _REQUIRED,
                "a .json [[round0 delays...], ...] or .csv (round,worker,delay) file",
            ),
            Param("cycle", bool, False, "replay from the start after the last recorded round"),
        ),
    ),
}


def _build_none(o: Mapping[str, Any], seed: int, n: int) -> StragglerModel:
    return NoDelay()


def _build_exponential(o: Mapping[str, Any], seed: int, n: int) -> StragglerModel:
    return ExponentialDelay(o["mean"], seed=seed, n_workers=n)


def _build_shifted(o: Mapping[str, Any], seed: int, n: int) -> StragglerModel:
    return ShiftedExponentialDelay(o["shift"], o["rate"], seed=seed, n_workers=n)


def _build_pareto(o: Mapping[str, Any], seed: int, n: int) -> StragglerModel:
    return ParetoDelay(o["scale"], o["shape"], seed=seed, n_workers=n, by_load=o["by_load"])


def _build_fixed(o: Mapping[str, Any], seed: int, n: int) -> StragglerModel:
    return FixedDelay(o["count"], o["delay"], seed=seed, n_workers=n)


def _build_slowdown(o: Mapping[str, Any], seed: int, n: int) -> StragglerModel:
    return SlowdownDelay(o["count"], o["factor"], seed=seed, n_workers=n)


def _build_speed_classes(o: Mapping[str, Any], seed: int, n: int) -> StragglerModel:
    return SpeedClasses(
        o["count"], o["factor"], o["mean"], o["every"], o["calm"], o["pool"], seed=seed, n_workers=n
    )


def _build_fail_stop(o: Mapping[str, Any], seed: int, n: int) -> StragglerModel:
    return FailStop(o["count"], o["start"], seed=seed, n_workers=n)


def _build_crash(o: Mapping[str, Any], seed: int, n: int) -> StragglerModel:
    return Crash(o["count"], o["start"], o["restart"], seed=seed, n_workers=n)


def _build_trace(o: Mapping[str, Any], seed: int, n: int) -> StragglerModel:
    return TraceDelay(o["path"], n_workers=n, cycle=o["cycle"])


_BUILDERS: dict[str, Callable[[Mapping[str, Any], int, int], StragglerModel]] = {
    "none": _build_none,
    "exponential": _build_exponential,
    "shifted-exponential": _build_shifted,
    "pareto": _build_pareto,
    "fixed": _build_fixed,
    "slowdown": _build_slowdown,
    "speed-classes": _build_speed_classes,
    "fail-stop": _build_fail_stop,
    "crash": _build_crash,
    "trace": _build_trace,
}


def create_straggler_model(
    name: str, options: Mapping[str, Any] | None = None, *, seed: int, n_workers: int
) -> StragglerModel:
    """Build a straggler model by name with checked options.

    ``seed`` is the job's seed (every delay is a pure function of it, the round and
    the worker); ``n_workers`` is n. Option values may be strings as typed on a
    command line. Unknown names, unknown options and bad values raise ConfigError.
    """
    info = STRAGGLER_MODELS.get(name)
    if info is None:
        near = difflib.get_close_matches(str(name), STRAGGLER_MODELS, n=2)
        hint = f" Did you mean {' or '.join(near)}?" if near else ""
        raise ConfigError(
            f"unknown straggler model {name!r}.{hint} Valid models: {', '.join(STRAGGLER_MODELS)}"
        )
    given = dict(options or {})
    known = {p.name: p for p in info.parameters}
    unknown = sorted(set(given) - set(known))
    if unknown:
        valid = "; ".join(p.describe() for p in info.parameters) or "none"
        raise ConfigError(
            f"straggler model {name!r} has no option(s) {', '.join(map(repr, unknown))}; "
            f"its options: {valid}"
        )
    values: dict[str, Any] = {}
    for p in info.parameters:
        if p.name in given:
            values[p.name] = _coerce(name, p, given[p.name])
        elif p.required:
            raise ConfigError(f"straggler model {name!r} needs the option {p.describe()}")
        else:
            values[p.name] = p.default
    return _BUILDERS[name](values, seed, n_workers)


def crash_restart(
    model: StragglerModel, worker: int, round: int, *, replacement: bool
) -> float | None:
    """If ``worker`` crashes on receiving θ of ``round``: seconds until it connects again.

    inf: it never does; None: it does not crash (every model but :class:`Crash`).
    ``replacement``: the worker took its place mid-job (such a worker never crashes).
    """
    if isinstance(model, Crash):
        return model.crash(worker, round, replacement)
    return None


def delays_of(
    model: StragglerModel,
    workers: np.ndarray,
    round: int,
    compute_seconds: np.ndarray,
    loads: np.ndarray,
) -> np.ndarray:
    """Every listed worker's delay in ``round`` at once: ``model.delay`` of each.

    The built-in models draw one vector per round and answer from it in one call; a model
    without a ``delays`` method is asked worker by worker.
    """
    many = getattr(model, "delays", None)
    if many is not None:
        return np.asarray(many(workers, round, compute_seconds, loads), dtype=np.float64)
    return np.array(
        [
            model.delay(int(w), round, float(c), float(ld))
            for w, c, ld in zip(workers, compute_seconds, loads, strict=True)
        ],
        dtype=np.float64,
    )


def _coerce(model: str, p: Param, value: Any) -> Any:
    problem = f"straggler model {model!r}: {p.name} must be {p.type.__name__}, got {value!r}"
    if p.type is bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
        raise ConfigError(problem)
    if p.type is str:
        if isinstance(value, str) and value:
            return value
        raise ConfigError(problem)
    if isinstance(value, bool):
        raise ConfigError(problem)
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(problem) from None
    if p.type is int:
        if not (math.isfinite(number) and number.is_integer()):
            raise ConfigError(problem)
        return int(number)
    return number
