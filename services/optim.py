"""The optimizer the coordinator (and the simulator) steps once per round.

The round loop asks :meth:`Optimizer.point` where to evaluate the gradient,
broadcasts that θ, decodes the gradient of the full objective there, and calls
:meth:`Optimizer.update`. Plain gradient descent evaluates at the iterate x_t;
Nesterov's method evaluates at a look-ahead y_t, so the two points differ and
the loop must always use :meth:`point`, never :attr:`theta`.

Arrays handed out by :meth:`point` and :attr:`theta` are read-only and never
changed afterwards: every step writes fresh arrays. Policies such as LAG keep
old θ's (θ̂_m) by reference, so mutating in place would silently corrupt them;
one allocation of dim floats per step is cheap next to a round.

Nesterov (the choice, documented): with ``momentum`` unset, the accelerated
gradient method for smooth convex f,

    x_{t+1} = y_t − η_t ∇f(y_t),
    y_{t+1} = x_{t+1} + β_{t+1} (x_{t+1} − x_t),   β_t = (t − 1)/(t + 2),  y_0 = x_0,

which needs no strong-convexity constant and gives f(x_t) − f* = O(L‖x_0 − x*‖²/t²)
with η = 1/L. With ``momentum = β`` (0 ≤ β < 1) it uses that constant β instead:
the strongly convex variant, optimal with β = (√κ − 1)/(√κ + 1) when the condition
number κ = L/μ is known (e.g. because l2 = μ).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from codedgd.services.errors import ConfigError, Diverged

SCHEDULES: dict[str, str] = {
    "constant": "η_t = lr",
    "inverse-sqrt": "η_t = lr / sqrt(1 + t)",
    "inverse-time": "η_t = lr / (1 + decay·t)   (decay default 0.01)",
    "step": "η_t = lr · decay^(t // every)   (decay default 0.5, every default 100)",
}

OPTIONS: dict[str, str] = {
    "lr": 'step size η > 0, "auto" = 1/L of the objective, or "F/L" = F times that (e.g. "0.5/L")',
    "schedule": "step-size schedule: " + ", ".join(SCHEDULES),
    "nesterov": "true for Nesterov's accelerated gradient (default false)",
    "momentum": "constant Nesterov momentum 0 <= β < 1 (default: the (t−1)/(t+2) sequence)",
    "decay": "decay of the inverse-time (> 0) or step (0 < decay <= 1) schedule",
    "every": "steps between decays of the step schedule (integer >= 1)",
}

_DEFAULT_DECAY = {"inverse-time": 0.01, "step": 0.5}
_DEFAULT_EVERY = 100


class Optimizer:
    """Gradient descent, optionally Nesterov-accelerated, with a step-size schedule."""

    def __init__(
        self,
        theta0: np.ndarray,
        lr: float,
        *,
        schedule: str = "constant",
        nesterov: bool = False,
        decay: float | None = None,
        every: int | None = None,
        momentum: float | None = None,
    ) -> None:
        lr_value = absolute_lr(lr)
        if lr_value is None:
            raise ConfigError(
                f"optimizer: lr must be a finite number > 0, got {lr!r}; "
                'try lr = "auto" (1/L of the objective) or a small value such as 0.1'
            )
        if schedule not in SCHEDULES:
            raise ConfigError(
                f"optimizer: unknown schedule {schedule!r}; valid schedules: {', '.join(SCHEDULES)}"
            )
        if decay is not None and schedule not in _DEFAULT_DECAY:
            raise ConfigError(
                f"optimizer: decay has no effect with schedule {schedule!r}; "
                'use schedule = "inverse-time" or "step", or remove decay'
            )
        if every is not None and schedule != "step":
            raise ConfigError(
                f"optimizer: every has no effect with schedule {schedule!r}; "
                'use schedule = "step" or remove every'
            )
        if momentum is not None and not nesterov:
            raise ConfigError("optimizer: momentum needs nesterov = true (or remove momentum)")
        self._decay = float(decay if decay is not None else _DEFAULT_DECAY.get(schedule, 0.0))
        if schedule == "inverse-time" and not (math.isfinite(self._decay) and self._decay > 0):
            raise ConfigError(f"optimizer: inverse-time decay must be > 0, got {decay!r}")
        if schedule == "step" and not 0.0 < self._decay <= 1.0:
            raise ConfigError(f"optimizer: step decay must be in (0, 1], got {decay!r}")
        self._every = int(every) if every is not None else _DEFAULT_EVERY
        if self._every < 1:
            raise ConfigError(f"optimizer: every must be an integer >= 1, got {every!r}")
        if momentum is not None and not 0.0 <= momentum < 1.0:
            raise ConfigError(f"optimizer: momentum must be in [0, 1), got {momentum!r}")

        x0 = np.array(theta0, dtype=np.float64).reshape(-1)  # our own copy
        x0.flags.writeable = False
        self.lr = lr_value
        self.schedule = schedule
        self.nesterov = bool(nesterov)
        self.momentum = momentum
        self._x = x0
        self._y = x0  # the look-ahead point; equals x until Nesterov takes a step
        self._t = 0

    # ------------------------------------------------------------------ state

    @property
    def theta(self) -> np.ndarray:
        """The current iterate x_t (read-only); report the objective here."""
        return self._x

    @property
    def t(self) -> int:
        """Steps taken so far."""
        return self._t

    @property
    def dim(self) -> int:
        return int(self._x.shape[0])

    def point(self) -> np.ndarray:
        """Where the next gradient must be evaluated: x_t, or y_t under Nesterov (read-only)."""
        return self._y

    def step_size(self, t: int | None = None) -> float:
        """η_t of the schedule at step t (default: the step :meth:`update` takes next)."""
        t = self._t if t is None else t
        if self.schedule == "constant":
            return self.lr
        if self.schedule == "inverse-sqrt":
            return self.lr / math.sqrt(1.0 + t)
        if self.schedule == "inverse-time":
            return self.lr / (1.0 + self._decay * t)
        return self.lr * self._decay ** (t // self._every)

    def momentum_at(self, t: int) -> float:
        """β_t applied after the t-th step (t >= 1) under Nesterov."""
        if self.momentum is not None:
            return self.momentum
        return (t - 1) / (t + 2)

    # ------------------------------------------------------------------- step

    def update(self, grad: np.ndarray) -> None:
        """One step with ∇F evaluated at :meth:`point` (the full objective, incl. L2)."""
        grad = np.asarray(grad, dtype=np.float64)
        if grad.shape != self._x.shape:
            raise ValueError(f"gradient has shape {grad.shape}, expected {self._x.shape}")
        eta = self.step_size()
        # x_{t+1} = y_t − η g, with a single allocation.
        x_new = np.multiply(grad, -eta)
        x_new += self._y
        self._t += 1
        if self.nesterov:
            beta = self.momentum_at(self._t)
            # y_{t+1} = x_{t+1} + β (x_{t+1} − x_t), again one allocation.
            y_new = np.subtract(x_new, self._x)
            y_new *= beta
            y_new += x_new
            y_new.flags.writeable = False
        else:
            y_new = x_new
        x_new.flags.writeable = False
        self._x = x_new
        self._y = y_new

    # ------------------------------------------------------------ checkpoints

    def state(self) -> dict[str, Any]:
        """What a checkpoint needs to resume exactly (arrays are read-only, not copied)."""
        return {"t": self._t, "x": self._x, "y": self._y}

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Resume from :meth:`state` (of an optimizer with the same options)."""
        x = np.array(state["x"], dtype=np.float64).reshape(-1)
        y = np.array(state["y"], dtype=np.float64).reshape(-1)
        if x.shape != self._x.shape or y.shape != self._x.shape:
            raise ConfigError(
                f"optimizer checkpoint has dimension {x.shape[0]}, this job has {self.dim}"
            )
        x.flags.writeable = False
        y.flags.writeable = False
        self._t = int(state["t"])
        self._x, self._y = x, y


def objective_gradient(
    gradient_sum: np.ndarray, n_rows: int, l2: float, point: np.ndarray
) -> np.ndarray:
    """∇F at ``point`` for F = (1/N)Σℓ + (λ/2)‖θ‖², from the decoded sum of data gradients.

    The coordinator and the simulator both step with this, so their θ agree bit
    for bit. One allocation; the L2 term only when λ ≠ 0.
    """
    grad: np.ndarray = np.divide(gradient_sum, n_rows)
    if l2:
        grad += l2 * point
    return grad


def check_converging(t: int, loss: float, lr: float, hint: str = "") -> None:
    """Fail the job once the training loss is no longer a finite number: it diverged.

    Stepping on from inf or NaN only burns rounds (every later loss is NaN), and a result
    file cannot hold such a loss; the rounds before this one are kept.
    """
    if math.isfinite(loss):
        return
    raise Diverged(
        f"round {t}: the training loss is {loss:g}: gradient descent diverged. Use a smaller "
        f"step size (this job's is {lr:g}; --lr auto picks 1/L)" + (f"; {hint}" if hint else "")
    )


def create_optimizer(
    options: Mapping[str, Any], theta0: np.ndarray, *, smoothness: float | None = None
) -> Optimizer:
    """Build the optimizer of a job's ``[optimizer]`` section.

    ``options`` keys: see :data:`OPTIONS`; values may be strings as typed on a
    command line. ``lr = "auto"`` (the default) means 1/L for the smoothness
    constant L of the full objective (``"F/L"``: F times that), which the caller passes
    as ``smoothness``
    (see :func:`codedgd.services.models.objective_smoothness`).
    """
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        valid = "; ".join(f"{k}: {v}" for k, v in OPTIONS.items())
        raise ConfigError(
            f"optimizer has no option(s) {', '.join(map(repr, unknown))}; valid options: {valid}"
        )
    raw_lr = options.get("lr", "auto")
    times = lr_times_inverse_l(raw_lr)
    if times is not None:
        if smoothness is None:
            raise ConfigError(
                f"optimizer: lr = {raw_lr!r} needs the smoothness constant L of the objective"
            )
        if not (math.isfinite(smoothness) and smoothness > 0):
            raise ConfigError(
                f"optimizer: lr = {raw_lr!r} needs L > 0, but the objective has "
                f"L = {smoothness!r}; give lr as a number"
            )
        lr = times / smoothness
    else:
        lr = _as_float("lr", raw_lr)
    schedule = options.get("schedule", "constant")
    if not isinstance(schedule, str):
        raise ConfigError(
            f"optimizer: schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}"
        )
    return Optimizer(
        theta0,
        lr,
        schedule=schedule.strip().lower(),
        nesterov=_as_bool("nesterov", options.get("nesterov", False)),
        decay=_as_float("decay", options["decay"]) if "decay" in options else None,
        every=_as_int("every", options["every"]) if "every" in options else None,
        momentum=_as_float("momentum", options["momentum"]) if "momentum" in options else None,
    )


_RELATIVE = re.compile(r"^\s*([^/\s]*)\s*/\s*L\s*$", re.IGNORECASE)
# F of "F/L": digits, a point, an exponent; no sign, underscores or other scripts' digits.
_MULTIPLE = re.compile(r"^(\d+\.?\d*|\.\d+)(e[+-]?\d+)?$", re.IGNORECASE | re.ASCII)


def lr_times_inverse_l(value: Any) -> float | None:
    """The step size ``value`` as a multiple of 1/L, or None for an absolute one.

    ``"auto"`` is 1/L (1.0), ``"0.5/L"`` half of it (0.5); a number (or a string of one,
    as typed on a command line) is absolute: None. A malformed ``"F/L"`` (F not a finite
    number > 0) is a ConfigError naming the value and the forms that are meant."""
    if not isinstance(value, str):
        return None
    text = value.strip().lower()
    if text == "auto":
        return 1.0
    match = _RELATIVE.match(text)
    if match is None:
        return None
    factor = match.group(1)
    times = float(factor) if _MULTIPLE.match(factor) else math.nan
    if not (math.isfinite(times) and times > 0):
        raise ConfigError(
            f'optimizer: lr = {value!r} is not a step size: "F/L" needs a number F > 0 '
            '(e.g. "0.5/L" for half of 1/L), or give "auto" (1/L) or a number'
        )
    return times


def absolute_lr(value: Any) -> float | None:
    """``value`` as a step size in numbers (a finite number > 0, or a string of one), or
    None when it is not one (``"auto"`` and ``"F/L"`` are not: see
    :func:`lr_times_inverse_l`)."""
    try:
        number = math.nan if isinstance(value, bool) else float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) and number > 0 else None


def _as_float(key: str, value: Any) -> float:
    if not isinstance(value, bool):
        try:
            number = float(value)
        except (TypeError, ValueError):
            pass
        else:
            if math.isfinite(number):
                return number
    raise ConfigError(f"optimizer: {key} must be a finite number, got {value!r} ({OPTIONS[key]})")


def _as_int(key: str, value: Any) -> int:
    number = _as_float(key, value)
    if not number.is_integer():
        raise ConfigError(f"optimizer: {key} must be an integer, got {value!r} ({OPTIONS[key]})")
    return int(number)


def _as_bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("1", "true", "yes", "on"):
        return True
    if isinstance(value, str) and value.strip().lower() in ("0", "false", "no", "off"):
        return False
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise ConfigError(f"optimizer: {key} must be true or false, got {value!r}")
