"""The job description: one training run, as users write it (TOML, CLI flags, JSON).

A job file looks like::

    [job]
    workers = 4          # n
    rounds = 100
    seed = 0
    target_loss = 0.35   # optional: stop once the training objective is below

    [data]
    name = "synthetic"   # synthetic | amazon | covtype | kc-house
    rows = 4000          # dataset options (see `codedgd run --help`)

    [model]
    name = "logistic"    # logistic | least-squares
    l2 = 1e-4

    [policy]
    name = "ignore-stragglers"
    s = 1                # policy parameters (see `codedgd policies`)

    [optimizer]
    lr = "auto"          # a number, "auto" = 1/L of the objective, or "F/L" (e.g. "0.5/L")
    nesterov = false

    [stragglers]
    name = "exponential"
    mean = 0.05

The same document travels to the coordinator as JSON (SubmitJob) and to every
worker inside its Assignment. Validation here catches what can be caught
without data; the coordinator checks the rest (policy plan, dataset) on submit.
"""

from __future__ import annotations

import json
import math
import tomllib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from codedgd.services.errors import ConfigError

SECTIONS = ("job", "data", "model", "policy", "optimizer", "stragglers")


@dataclass(frozen=True)
class Component:
    """A named component with options: a dataset, model, policy, straggler model."""

    name: str
    options: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, **dict(self.options)}


@dataclass(frozen=True)
class JobConfig:
    """Everything that defines one training run. Every random choice derives from ``seed``."""

    workers: int = 4
    rounds: int = 100
    seed: int = 0
    partitions: int = 0  # k; 0 = the policy's default (k = n unless the policy says)
    target_loss: float | None = None
    eval_every: int = 1  # evaluate loss and held-out metric every this many rounds
    round_timeout: float = 300.0  # seconds a round may wait for decodability before failing
    # (while it waits for a lost worker's replacement, replace_timeout applies instead)
    # Seconds a round that lost a worker it cannot decode without waits for a replacement
    # worker to connect and take the lost worker's place (0: the job fails at once).
    replace_timeout: float = 0.0
    # Idle workers standing by to take a lost worker's place at once: `codedgd run` starts
    # this many beyond `workers`, and the simulator has as many connected from the start.
    # A coordinator started by hand uses whatever idle workers are connected: it starts none.
    spares: int = 0
    # A model file (codedgd.services.models.saved, read where the job runs) whose θ the job
    # starts from instead of zeros: the same model and dimension.
    init_from: str | None = None
    # The norm guard (0: off): an arrival whose norm, per unit of its coefficients, is more
    # than this many times the median of recent arrivals' is a worker fault (thrown out).
    max_norm_ratio: float = 0.0
    # Worker-to-worker topologies (ring, tree): a worker reports a peer silent when it has
    # waited for the peer's data longer than max(peer_deadline_min, peer_deadline_factor x
    # the longest of the job's last 20 rounds) (round_timeout until 3 rounds are timed);
    # the coordinator throws out the workers at the root of such waits (RoundStart's
    # peer_deadline_seconds in the .proto).
    peer_deadline_factor: float = 10.0
    peer_deadline_min: float = 5.0
    # Mini-batch rounds: each round uses a seeded sample of this many rows of every
    # partition (the same on every worker holding it; codedgd.services.compute.batches),
    # scaled to estimate the partition's full sum. 0: every row, every round.
    batch_size: int = 0
    data: Component = field(default_factory=lambda: Component("synthetic"))
    model: Component = field(default_factory=lambda: Component("logistic", {"l2": 1e-4}))
    policy: Component = field(default_factory=lambda: Component("uncoded"))
    optimizer: Mapping[str, Any] = field(default_factory=lambda: {"lr": "auto"})
    stragglers: Component = field(default_factory=lambda: Component("none"))

    def __post_init__(self) -> None:
        _check_int("job.workers", self.workers, minimum=1)
        _check_int("job.rounds", self.rounds, minimum=1)
        _check_int("job.seed", self.seed, minimum=0)
        _check_int("job.partitions", self.partitions, minimum=0)
        _check_int("job.eval_every", self.eval_every, minimum=1)
        _check_int("job.spares", self.spares, minimum=0)
        _check_int("job.batch_size", self.batch_size, minimum=0)
        if (
            isinstance(self.round_timeout, bool)
            or not isinstance(self.round_timeout, int | float)
            or not 0 < self.round_timeout < math.inf
        ):
            raise ConfigError(
                "job.round_timeout must be a positive, finite number of seconds (for no "
                f"practical limit, a large one such as 86400), got {self.round_timeout!r}"
            )
        if (
            isinstance(self.replace_timeout, bool)
            or not isinstance(self.replace_timeout, int | float)
            or not 0 <= self.replace_timeout < math.inf
        ):
            raise ConfigError(
                "job.replace_timeout must be a number of seconds >= 0 (0: fail at once), "
                f"got {self.replace_timeout!r}"
            )
        if self.spares and not self.replace_timeout:
            raise ConfigError(
                f"job.spares = {self.spares} needs job.replace_timeout > 0: a round that "
                "cannot decode without a lost worker waits that long for a spare to take its "
                "place, and with 0 it fails at once (e.g. --replace-timeout 30)"
            )
        if self.init_from is not None and (
            not isinstance(self.init_from, str) or not self.init_from
        ):
            raise ConfigError(f"job.init_from must be a model file's path, got {self.init_from!r}")
        if (
            isinstance(self.max_norm_ratio, bool)
            or not isinstance(self.max_norm_ratio, int | float)
            or not (self.max_norm_ratio == 0 or 1 < self.max_norm_ratio < math.inf)
        ):
            raise ConfigError(
                "job.max_norm_ratio must be 0 (no norm guard) or a finite number > 1 (e.g. "
                f"100), got {self.max_norm_ratio!r}"
            )
        if (
            isinstance(self.peer_deadline_factor, bool)
            or not isinstance(self.peer_deadline_factor, int | float)
            or not 1 < self.peer_deadline_factor < math.inf
        ):
            raise ConfigError(
                "job.peer_deadline_factor must be a finite number > 1 (how many times the "
                "longest recent round a worker waits for a silent peer; default 10), got "
                f"{self.peer_deadline_factor!r}"
            )
        if (
            isinstance(self.peer_deadline_min, bool)
            or not isinstance(self.peer_deadline_min, int | float)
            or not 0 < self.peer_deadline_min < math.inf
        ):
            raise ConfigError(
                "job.peer_deadline_min must be a positive, finite number of seconds (the "
                f"shortest wait for a silent peer; default 5), got {self.peer_deadline_min!r}"
            )
        if self.target_loss is not None and (
            isinstance(self.target_loss, bool)
            or not isinstance(self.target_loss, int | float)
            or not math.isfinite(self.target_loss)
        ):
            raise ConfigError(f"job.target_loss must be a finite number, got {self.target_loss!r}")

    # ---------------------------------------------------------------- I/O

    def to_dict(self) -> dict[str, Any]:
        job: dict[str, Any] = {
            "workers": self.workers,
            "rounds": self.rounds,
            "seed": self.seed,
            "partitions": self.partitions,
            "eval_every": self.eval_every,
            "round_timeout": self.round_timeout,
            "replace_timeout": self.replace_timeout,
        }
        if self.target_loss is not None:
            job["target_loss"] = self.target_loss
        if self.spares:  # only when used, so workers of earlier versions still read the job
            job["spares"] = self.spares
        if self.init_from is not None:
            job["init_from"] = self.init_from
        if self.max_norm_ratio:
            job["max_norm_ratio"] = self.max_norm_ratio
        if self.peer_deadline_factor != 10.0:
            job["peer_deadline_factor"] = self.peer_deadline_factor
        if self.peer_deadline_min != 5.0:
            job["peer_deadline_min"] = self.peer_deadline_min
        if self.batch_size:
            job["batch_size"] = self.batch_size
        return {
            "job": job,
            "data": self.data.to_dict(),
            "model": self.model.to_dict(),
            "policy": self.policy.to_dict(),
            "optimizer": dict(self.optimizer),
            "stragglers": self.stragglers.to_dict(),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @staticmethod
    def from_dict(doc: Mapping[str, Any]) -> JobConfig:
        if not isinstance(doc, Mapping):
            raise ConfigError(
                "a job document must be a table/object with sections " + ", ".join(SECTIONS)
            )
        unknown = set(doc) - set(SECTIONS)
        if unknown:
            raise ConfigError(
                f"unknown section(s) {', '.join(sorted(unknown))} in the job document; "
                f"valid sections: {', '.join(SECTIONS)}"
            )
        job = dict(_section(doc, "job"))
        known_job = {
            "workers",
            "rounds",
            "seed",
            "partitions",
            "target_loss",
            "eval_every",
            "round_timeout",
            "replace_timeout",
            "spares",
            "init_from",
            "max_norm_ratio",
            "peer_deadline_factor",
            "peer_deadline_min",
            "batch_size",
        }
        bad = set(job) - known_job
        if bad:
            raise ConfigError(
                f"unknown key(s) {', '.join(sorted(bad))} in [job]; valid keys: "
                + ", ".join(sorted(known_job))
            )
        return JobConfig(
            workers=job.get("workers", 4),
            rounds=job.get("rounds", 100),
            seed=job.get("seed", 0),
            partitions=job.get("partitions", 0),
            target_loss=job.get("target_loss"),
            eval_every=job.get("eval_every", 1),
            round_timeout=job.get("round_timeout", 300.0),
            replace_timeout=job.get("replace_timeout", 0.0),
            spares=job.get("spares", 0),
            init_from=job.get("init_from"),
            max_norm_ratio=job.get("max_norm_ratio", 0.0),
            peer_deadline_factor=job.get("peer_deadline_factor", 10.0),
            peer_deadline_min=job.get("peer_deadline_min", 5.0),
            batch_size=job.get("batch_size", 0),
            data=_component(doc, "data", "synthetic"),
            model=_component(doc, "model", "logistic", {"l2": 1e-4}),
            policy=_component(doc, "policy", "uncoded"),
            optimizer=dict(_section(doc, "optimizer")) or {"lr": "auto"},
            stragglers=_component(doc, "stragglers", "none"),
        )

    @staticmethod
    def from_json(text: str) -> JobConfig:
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"the job document is not valid JSON: {exc}") from None
        return JobConfig.from_dict(doc)

    @staticmethod
    def from_toml(path: str | Path) -> JobConfig:
        p = Path(path)
        try:
            with p.open("rb") as fh:
                doc = tomllib.load(fh)
        except FileNotFoundError:
            raise ConfigError(f"job file {p} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"job file {p} is not valid TOML: {exc}") from None
        return JobConfig.from_dict(doc)

    def replace(self, **changes: Any) -> JobConfig:
        values = {k: v for k, v in asdict(self).items() if k not in changes}
        values.update(changes)
        for key in ("data", "model", "policy", "stragglers"):
            if isinstance(values[key], dict):
                values[key] = Component(values[key]["name"], values[key].get("options", {}))
        return JobConfig(**values)


def _check_int(name: str, value: Any, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _section(doc: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    section = doc.get(name, {})
    if not isinstance(section, Mapping):
        raise ConfigError(f"[{name}] must be a table of keys, got {section!r}")
    return section


def _component(
    doc: Mapping[str, Any],
    name: str,
    default: str,
    default_options: Mapping[str, Any] | None = None,
) -> Component:
    section = dict(_section(doc, name))
    if not section:
        return Component(default, dict(default_options or {}))
    comp_name = section.pop("name", default)
    if not isinstance(comp_name, str):
        raise ConfigError(f"[{name}] name must be a string, got {comp_name!r}")
    return Component(comp_name, section)
