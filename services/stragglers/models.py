"""The straggler (delay) models: seeded extra waits after a worker's compute.

Seeding (the choice, documented): each round draws one vector for all n workers
from ``np.random.default_rng([seed, round, STREAM])`` and worker w takes entry w.
So a delay is a pure function of (seed, round, worker, n_workers) and of the
call's own ``compute_seconds``/``load``; every worker process, the coordinator
and the simulator see the same delays in the same round, whichever policy runs
(a paired comparison of policies, not two independent samples). One joint draw
per round is also what "s random workers per round" needs. ``STREAM`` is a
constant domain tag that keeps these draws independent of any other component
that seeds ``default_rng([seed, round])`` (a policy's random choices, say):
correlated delays and choices would bias a comparison.

All delays are *added* after the real computation; none replaces it. A model
that depends on the work done takes it from ``load`` (partitions held / k) or
``compute_seconds`` (the measured compute time of this round).
"""

from __future__ import annotations

import csv
import json
import math
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from codedgd.services.errors import ConfigError, DataError

STREAM = 0x73747261  # "stra": the domain tag of straggler draws (see module docstring)


def _check_count(model: str, count: int, n_workers: int) -> int:
    if isinstance(count, bool) or int(count) != count or not 0 <= count <= n_workers:
        raise ConfigError(
            f"straggler model {model!r}: count must be an integer in 0..{n_workers} "
            f"(the number of workers), got {count!r}"
        )
    return int(count)


def _check_number(model: str, key: str, value: float, *, low: float, strict: bool) -> float:
    ok = math.isfinite(value) and (value > low if strict else value >= low)
    if not ok:
        relation = ">" if strict else ">="
        raise ConfigError(
            f"straggler model {model!r}: {key} must be a finite number {relation} {low:g}, "
            f"got {value!r}"
        )
    return float(value)


class SeededDelay(ABC):
    """Base of the random models: one draw of n_workers values per round, cached.

    The cache holds the last round only: a worker process asks once per round
    for itself, the simulator asks for every worker of a round in a row.
    """

    name: ClassVar[str]

    def __init__(self, *, seed: int, n_workers: int) -> None:
        if isinstance(seed, bool) or int(seed) != seed or seed < 0:
            raise ConfigError(f"the straggler seed must be an integer >= 0, got {seed!r}")
        if isinstance(n_workers, bool) or int(n_workers) != n_workers or n_workers < 1:
            raise ConfigError(f"n_workers must be an integer >= 1, got {n_workers!r}")
        self.seed = int(seed)
        self.n_workers = int(n_workers)
        self._cached: tuple[int, np.ndarray] | None = None

    def _round_values(self, round: int) -> np.ndarray:
        cached = self._cached  # one read: safe if another thread replaces it
        if cached is not None and cached[0] == round:
            return cached[1]
        if round < 0:
            raise ValueError(f"round must be >= 0, got {round}")
        values = self._draw(np.random.default_rng([self.seed, int(round), STREAM]))
        values.flags.writeable = False
        self._cached = (round, values)
        return values

    def _value(self, worker: int, round: int) -> float:
        if not 0 <= worker < self.n_workers:
            raise ValueError(f"worker {worker} out of range 0..{self.n_workers - 1}")
        return float(self._round_values(round)[worker])

    def _values(self, workers: np.ndarray, round: int) -> np.ndarray:
        """:meth:`_value` of many workers at once (the vectorized simulator's call)."""
        if workers.size and not (int(workers.min()) >= 0 and int(workers.max()) < self.n_workers):
            raise ValueError(f"workers out of range 0..{self.n_workers - 1}")
        values: np.ndarray = self._round_values(round)[workers]
        return values

    @abstractmethod
    def _draw(self, rng: np.random.Generator) -> np.ndarray:
        """This round's values for all n_workers workers (float64)."""

    @abstractmethod
    def delay(self, worker: int, round: int, compute_seconds: float, load: float) -> float: ...


class NoDelay:
    """No injected delay: the workers' real speeds only."""

    name: ClassVar[str] = "none"

    def delay(self, worker: int, round: int, compute_seconds: float, load: float) -> float:
        return 0.0

    def delays(
        self, workers: np.ndarray, round: int, compute_seconds: np.ndarray, loads: np.ndarray
    ) -> np.ndarray:
        return np.zeros(len(workers))


class ExponentialDelay(SeededDelay):
    """i.i.d. Exp(mean μ) seconds after compute, the model of ErasureHead's experiments."""

    name: ClassVar[str] = "exponential"

    def __init__(self, mean: float, *, seed: int, n_workers: int) -> None:
        super().__init__(seed=seed, n_workers=n_workers)
        self.mean = _check_number(self.name, "mean", mean, low=0.0, strict=False)

    def _draw(self, rng: np.random.Generator) -> np.ndarray:
        return rng.standard_exponential(self.n_workers) * self.mean

    def delay(self, worker: int, round: int, compute_seconds: float, load: float) -> float:
        return self._value(worker, round)

    def delays(
        self, workers: np.ndarray, round: int, compute_seconds: np.ndarray, loads: np.ndarray
    ) -> np.ndarray:
        return self._values(workers, round).copy()


class ShiftedExponentialDelay(SeededDelay):
    """T = a·load + Exp(rate λ/load), added after the real compute.

    The load-scaled model of the gradient-coding papers (ErasureHead §4 with
    a = 1): a worker with c/n of the data waits c/n·a plus an exponential of mean
    (c/n)/λ. One standard exponential E per (round, worker) is drawn and scaled
    by load/λ, so policies with different loads still share the randomness.
    """

    name: ClassVar[str] = "shifted-exponential"

    def __init__(self, shift: float, rate: float, *, seed: int, n_workers: int) -> None:
        super().__init__(seed=seed, n_workers=n_workers)
        self.shift = _check_number(self.name, "shift", shift, low=0.0, strict=False)
        self.rate = _check_number(self.name, "rate", rate, low=0.0, strict=True)

    def _draw(self, rng: np.random.Generator) -> np.ndarray:
        return rng.standard_exponential(self.n_workers)

    def delay(self, worker: int, round: int, compute_seconds: float, load: float) -> float:
        if load < 0:
            raise ValueError(f"load must be >= 0, got {load}")
        e = self._value(worker, round)
        return load * (self.shift + e / self.rate)

    def delays(
        self, workers: np.ndarray, round: int, compute_seconds: np.ndarray, loads: np.ndarray
    ) -> np.ndarray:
        if loads.size and float(loads.min()) < 0:
            raise ValueError("loads must be >= 0")
        out: np.ndarray = loads * (self.shift + self._values(workers, round) / self.rate)
        return out


class ParetoDelay(SeededDelay):
    """Pareto(scale t_m, shape α) seconds: heavy-tailed, P(T > t) = (t_m/t)^α for t ≥ t_m.

    Mean α·t_m/(α − 1) for α > 1 (infinite otherwise). numpy's ``pareto`` is the
    Lomax law, so the classical Pareto sample is t_m·(1 + Lomax). With ``by_load`` the
    sample is multiplied by the worker's load (partitions held / k), so coded policies
    that give a worker more data pay for it, as with the shifted exponential.
    """

    name: ClassVar[str] = "pareto"

    def __init__(
        self, scale: float, shape: float, *, seed: int, n_workers: int, by_load: bool = False
    ) -> None:
        super().__init__(seed=seed, n_workers=n_workers)
        self.scale = _check_number(self.name, "scale", scale, low=0.0, strict=True)
        self.shape = _check_number(self.name, "shape", shape, low=0.0, strict=True)
        self.by_load = by_load

    def _draw(self, rng: np.random.Generator) -> np.ndarray:
        return self.scale * (1.0 + rng.pareto(self.shape, self.n_workers))

    def delay(self, worker: int, round: int, compute_seconds: float, load: float) -> float:
        value = self._value(worker, round)
        return load * value if self.by_load else value

    def delays(
        self, workers: np.ndarray, round: int, compute_seconds: np.ndarray, loads: np.ndarray
    ) -> np.ndarray:
        values = self._values(workers, round)
        out: np.ndarray = loads * values if self.by_load else values.copy()
        return out


class _ChosenWorkers(SeededDelay):
    """Picks ``count`` distinct workers per round (value 1.0 for chosen, 0.0 otherwise)."""

    def __init__(self, count: int, *, seed: int, n_workers: int) -> None:
        super().__init__(seed=seed, n_workers=n_workers)
        self.count = _check_count(self.name, count, self.n_workers)

    def _draw(self, rng: np.random.Generator) -> np.ndarray:
        chosen = np.zeros(self.n_workers)
        chosen[rng.choice(self.n_workers, size=self.count, replace=False)] = 1.0
        return chosen

    def chosen(self, round: int) -> tuple[int, ...]:
        """The workers that straggle in ``round`` (for reports and tests)."""
        return tuple(int(w) for w in np.flatnonzero(self._round_values(round)))


class FixedDelay(_ChosenWorkers):
    """``count`` random workers per round sleep an extra ``delay`` seconds."""

    name: ClassVar[str] = "fixed"

    def __init__(self, count: int, delay: float, *, seed: int, n_workers: int) -> None:
        super().__init__(count, seed=seed, n_workers=n_workers)
        self.seconds = _check_number(self.name, "delay", delay, low=0.0, strict=False)

    def delay(self, worker: int, round: int, compute_seconds: float, load: float) -> float:
        return self.seconds * self._value(worker, round)

    def delays(
        self, workers: np.ndarray, round: int, compute_seconds: np.ndarray, loads: np.ndarray
    ) -> np.ndarray:
        out: np.ndarray = self.seconds * self._values(workers, round)
        return out


class SlowdownDelay(_ChosenWorkers):
    """``count`` random workers per round take κ× their compute time.

    The extra wait is (κ − 1)·compute_seconds, so a straggler's total time is
    κ times what it really spent computing in that round.
    """

    name: ClassVar[str] = "slowdown"

    def __init__(self, count: int, factor: float, *, seed: int, n_workers: int) -> None:
        super().__init__(count, seed=seed, n_workers=n_workers)
        self.factor = _check_number(self.name, "factor", factor, low=1.0, strict=False)

    def delay(self, worker: int, round: int, compute_seconds: float, load: float) -> float:
        if compute_seconds < 0:
            raise ValueError(f"compute_seconds must be >= 0, got {compute_seconds}")
        return (self.factor - 1.0) * compute_seconds * self._value(worker, round)

    def delays(
        self, workers: np.ndarray, round: int, compute_seconds: np.ndarray, loads: np.ndarray
    ) -> np.ndarray:
        if compute_seconds.size and float(compute_seconds.min()) < 0:
            raise ValueError("compute_seconds must be >= 0")
        out: np.ndarray = (self.factor - 1.0) * compute_seconds * self._values(workers, round)
        return out


class SpeedClasses:
    """``count`` slow workers take ``factor``× as long as the rest, at everything they do.

    Mixed instance types: a slow worker's round (compute plus an optional i.i.d.
    Exp(``mean``) wait ``e``) takes ``factor``·(compute + e), so its delay is
    (factor − 1)·compute + factor·e, and a fast worker's is e. Which workers are slow is
    drawn from the seed (on a stream of this model's own): once for the whole job
    (``every = 0``, the default), or afresh every ``every`` rounds (slow machines that
    change identity). With ``calm``, every other period of ``every`` rounds has no slow
    worker at all (straggling whose intensity alternates). ``count < 0`` means half the
    workers. ``pool`` seeds who is slow apart from the per-round waits (default: the job
    seed), so two runs can share a cluster's slow machines but not its luck.
    """

    name: ClassVar[str] = "speed-classes"
    STREAM: ClassVar[int] = 0x73706564  # "sped"

    def __init__(
        self,
        count: int = -1,
        factor: float = 2.0,
        mean: float = 0.0,
        every: int = 0,
        calm: bool = False,
        pool: int = -1,
        *,
        seed: int,
        n_workers: int,
    ) -> None:
        if isinstance(seed, bool) or int(seed) != seed or seed < 0:
            raise ConfigError(f"the straggler seed must be an integer >= 0, got {seed!r}")
        if isinstance(pool, bool) or int(pool) != pool:
            raise ConfigError(
                f"straggler model {self.name!r}: pool must be an integer seed (< 0: the "
                f"job's), got {pool!r}"
            )
        self.n_workers = int(n_workers)
        self.count = self.n_workers // 2 if count < 0 else _check_count(self.name, count, n_workers)
        self.factor = _check_number(self.name, "factor", factor, low=1.0, strict=False)
        self.mean = _check_number(self.name, "mean", mean, low=0.0, strict=False)
        if isinstance(every, bool) or int(every) != every or every < 0:
            raise ConfigError(
                f"straggler model {self.name!r}: every must be a number of rounds >= 0 "
                f"(0: the slow workers never change), got {every!r}"
            )
        self.every = int(every)
        if calm and self.every == 0:
            raise ConfigError(
                f"straggler model {self.name!r}: calm alternates periods of `every` rounds; "
                "give every > 0"
            )
        self.calm = bool(calm)
        self.seed = int(seed)
        self.pool = int(pool) if pool >= 0 else self.seed  # who is slow: the machines
        self._wait = ExponentialDelay(self.mean, seed=seed, n_workers=n_workers)
        self._slow: tuple[int, np.ndarray] | None = None

    def slow(self, round: int) -> np.ndarray:
        """A boolean per worker: slow in ``round``."""
        period = round // self.every if self.every else 0
        cached = self._slow
        if cached is not None and cached[0] == period:
            return cached[1]
        mask = np.zeros(self.n_workers, dtype=bool)
        if not (self.calm and period % 2 == 1):
            rng = np.random.default_rng([self.pool, STREAM, self.STREAM, period])
            mask[rng.choice(self.n_workers, size=self.count, replace=False)] = True
        mask.flags.writeable = False
        self._slow = (period, mask)
        return mask

    def delay(self, worker: int, round: int, compute_seconds: float, load: float) -> float:
        if not 0 <= worker < self.n_workers:
            raise ValueError(f"worker {worker} out of range 0..{self.n_workers - 1}")
        e = self._wait.delay(worker, round, compute_seconds, load) if self.mean else 0.0
        if not self.slow(round)[worker]:
            return e
        return (self.factor - 1.0) * compute_seconds + self.factor * e

    def delays(
        self, workers: np.ndarray, round: int, compute_seconds: np.ndarray, loads: np.ndarray
    ) -> np.ndarray:
        e = self._wait.delays(workers, round, compute_seconds, loads) if self.mean else 0.0
        e = np.broadcast_to(np.asarray(e, dtype=np.float64), (len(workers),))
        slow = self.slow(round)[workers]
        out: np.ndarray = np.where(slow, (self.factor - 1.0) * compute_seconds + self.factor * e, e)
        return out


class _ChosenOnce:
    """``count`` workers chosen once for the job from the seed, from round ``start`` on.

    The choice is on a stream of the model's own (``STREAM``), so every process and the
    simulator agree on who is chosen, and fail-stop and crash choose independently.
    """

    name: ClassVar[str]
    STREAM: ClassVar[int]

    def __init__(self, count: int, start: int = 0, *, seed: int, n_workers: int) -> None:
        if isinstance(seed, bool) or int(seed) != seed or seed < 0:
            raise ConfigError(f"the straggler seed must be an integer >= 0, got {seed!r}")
        if isinstance(n_workers, bool) or int(n_workers) != n_workers or n_workers < 1:
            raise ConfigError(f"n_workers must be an integer >= 1, got {n_workers!r}")
        self.count = _check_count(self.name, count, int(n_workers))
        if isinstance(start, bool) or int(start) != start or start < 0:
            raise ConfigError(
                f"straggler model {self.name!r}: start must be a round number >= 0, got {start!r}"
            )
        self.start = int(start)
        self.n_workers = int(n_workers)
        rng = np.random.default_rng([int(seed), STREAM, self.STREAM])
        chosen = rng.choice(self.n_workers, size=self.count, replace=False)
        self.failed: tuple[int, ...] = tuple(sorted(int(w) for w in chosen))
        self._failed = frozenset(self.failed)

    def _check_worker(self, worker: int) -> None:
        if not 0 <= worker < self.n_workers:
            raise ValueError(f"worker {worker} out of range 0..{self.n_workers - 1}")


class FailStop(_ChosenOnce):
    """``count`` workers stop answering from round ``start`` on: their delay is infinite.

    A failed worker still receives θ and computes, but its result never leaves: the
    coordinator cancels it each round once the round decodes without it, and a policy
    that needs it waits until ``job.round_timeout`` fails the job (in a real run and in
    the simulator alike). This is a worker that hangs, connected, so it is never
    replaced; :class:`Crash` is one that disconnects.
    """

    name: ClassVar[str] = "fail-stop"
    STREAM: ClassVar[int] = 0x6661696C  # "fail": independent of the per-round draws

    def delay(self, worker: int, round: int, compute_seconds: float, load: float) -> float:
        self._check_worker(worker)
        return math.inf if round >= self.start and worker in self._failed else 0.0

    def delays(
        self, workers: np.ndarray, round: int, compute_seconds: np.ndarray, loads: np.ndarray
    ) -> np.ndarray:
        out = np.zeros(len(workers))
        if round >= self.start and self.failed:
            out[np.isin(workers, self.failed)] = math.inf
        return out


class Crash(_ChosenOnce):
    """``count`` workers crash (disconnect) on receiving θ of round ``start`` or later.

    Only the workers that held the chosen places when the job began crash; each does so
    once, and a worker that takes a place mid-job (``Assignment.replacement``) never
    does. A crashed worker drops its connection with everything it held; ``restart``
    seconds later it connects again as a new worker, which takes a lost place (its
    assignment and data, then θ of the round in progress if that round still wants it).
    ``restart < 0`` (the default): it never comes back. Whether the job waits for the
    return is ``job.replace_timeout``'s to say. It adds no delay to any round.
    """

    name: ClassVar[str] = "crash"
    STREAM: ClassVar[int] = 0x63727368  # "crsh"

    def __init__(
        self,
        count: int,
        start: int = 0,
        restart: float = -1.0,
        *,
        seed: int,
        n_workers: int,
    ) -> None:
        super().__init__(count, start, seed=seed, n_workers=n_workers)
        if isinstance(restart, bool) or not isinstance(restart, int | float) or math.isnan(restart):
            raise ConfigError(
                f"straggler model {self.name!r}: restart must be seconds >= 0, or < 0 for "
                f"never, got {restart!r}"
            )
        self.restart = float(restart) if restart >= 0 else math.inf

    def delay(self, worker: int, round: int, compute_seconds: float, load: float) -> float:
        self._check_worker(worker)
        return 0.0

    def crash(self, worker: int, round: int, replacement: bool) -> float | None:
        """Seconds until it comes back (inf: never) if ``worker`` crashes on θ of ``round``.

        None: it does not crash. ``replacement``: the worker took its place mid-job.
        """
        self._check_worker(worker)
        if replacement or round < self.start or worker not in self._failed:
            return None
        return self.restart


class TraceDelay:
    """Replays recorded delays: row = round, column = worker.

    Formats (chosen by the file's suffix):

    - ``.json``: a list of rounds, each a list of per-worker seconds
      (``null`` = not recorded), or an object ``{"delays": <that list>}``;
    - ``.csv``: a header ``round,worker,delay`` then one line per entry.

    A round or worker the trace does not cover is an error naming what the
    trace does cover, never a silent zero; ``cycle = true`` replays the trace
    from its start after its last round.
    """

    name: ClassVar[str] = "trace"

    def __init__(self, path: str | Path, *, n_workers: int, cycle: bool = False) -> None:
        self.path = Path(path)
        self.cycle = bool(cycle)
        self.table = load_trace(self.path)
        self.n_workers = int(n_workers)
        if self.table.shape[1] < self.n_workers:
            raise ConfigError(
                f"trace {self.path} records {self.table.shape[1]} workers but the job has "
                f"{self.n_workers}: record a trace with every worker or use fewer workers"
            )

    def delay(self, worker: int, round: int, compute_seconds: float, load: float) -> float:
        n_rounds = self.table.shape[0]
        row = round % n_rounds if self.cycle else round
        value = math.nan
        if 0 <= row < n_rounds and 0 <= worker < self.table.shape[1]:
            value = float(self.table[row, worker])
        if math.isnan(value):
            raise DataError(
                f"trace {self.path} has no delay for worker {worker} in round {round} "
                f"(it covers rounds 0..{n_rounds - 1} and workers 0..{self.table.shape[1] - 1}"
                + ("" if self.cycle else "; set cycle = true to replay it from the start")
                + ")"
            )
        return value

    def delays(
        self, workers: np.ndarray, round: int, compute_seconds: np.ndarray, loads: np.ndarray
    ) -> np.ndarray:
        n_rounds = self.table.shape[0]
        row = round % n_rounds if self.cycle else round
        if not 0 <= row < n_rounds or (workers.size and int(workers.max()) >= self.table.shape[1]):
            return np.array([self.delay(int(w), round, 0.0, 0.0) for w in workers])  # the error
        out = self.table[row, workers]
        if np.isnan(out).any():
            self.delay(int(workers[np.flatnonzero(np.isnan(out))[0]]), round, 0.0, 0.0)
        return np.array(out, dtype=np.float64)


def load_trace(path: Path) -> np.ndarray:
    """Read a delay trace into a (rounds, workers) float64 array, NaN where missing."""
    if not path.is_file():
        raise ConfigError(
            f"trace file {path} does not exist: give the path of a .json or .csv trace"
        )
    suffix = path.suffix.lower()
    try:
        if suffix == ".json":
            table = _trace_from_json(path)
        elif suffix == ".csv":
            table = _trace_from_csv(path)
        else:
            raise ConfigError(f"trace file {path} must end in .json or .csv, got {suffix!r}")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, csv.Error) as exc:
        raise DataError(f"cannot read trace {path}: {exc}") from None
    if table.size == 0:
        raise DataError(f"trace {path} holds no delays")
    finite = table[~np.isnan(table)]
    if not bool(np.all(np.isfinite(finite) & (finite >= 0))):
        raise DataError(f"trace {path} has a negative or infinite delay; delays are seconds >= 0")
    return table


def _trace_from_json(path: Path) -> np.ndarray:
    doc: Any = json.loads(path.read_text(encoding="utf-8"))
    if isinstance(doc, dict):
        doc = doc.get("delays")
    if not isinstance(doc, list) or not all(isinstance(row, list) for row in doc):
        raise DataError(
            f"trace {path} must be a list of rounds, each a list of per-worker delays "
            '(or {"delays": [...]})'
        )
    width = max((len(row) for row in doc), default=0)
    table = np.full((len(doc), width), np.nan)
    for r, row in enumerate(doc):
        for w, value in enumerate(row):
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise DataError(f"trace {path}: round {r}, worker {w} is {value!r}, not seconds")
            table[r, w] = float(value)
    return table


def _trace_from_csv(path: Path) -> np.ndarray:
    with path.open(newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        header = [h.strip().lower() for h in next(reader, [])]
        if header != ["round", "worker", "delay"]:
            raise DataError(f"trace {path} must start with the header round,worker,delay")
        entries: list[tuple[int, int, float]] = []
        for line_no, line in enumerate(reader, start=2):
            if not line or all(not cell.strip() for cell in line):
                continue
            try:
                r, w, d = int(line[0]), int(line[1]), float(line[2])
            except (ValueError, IndexError):
                raise DataError(
                    f"trace {path} line {line_no}: expected round,worker,delay, got {line!r}"
                ) from None
            if r < 0 or w < 0:
                raise DataError(f"trace {path} line {line_no}: negative round or worker")
            entries.append((r, w, d))
    if not entries:
        return np.zeros((0, 0))
    arr = np.array(entries, dtype=np.float64)
    rows, cols = arr[:, 0].astype(np.int64), arr[:, 1].astype(np.int64)
    table = np.full((int(rows.max()) + 1, int(cols.max()) + 1), np.nan)
    table[rows, cols] = arr[:, 2]
    return table
