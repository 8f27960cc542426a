"""Job documents: TOML/JSON round trips and clear errors for bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from codedgd.services.errors import ConfigError
from codedgd.services.job import Component, JobConfig


def test_json_roundtrip_keeps_everything() -> None:
    job = JobConfig(
        workers=6,
        rounds=10,
        seed=3,
        target_loss=0.2,
        policy=Component("ignore-stragglers", {"s": 2}),
        stragglers=Component("exponential", {"mean": 0.5}),
        optimizer={"lr": 0.5, "nesterov": True},
    )
    assert JobConfig.from_json(job.to_json()) == job


def test_toml_file(tmp_path: Path) -> None:
    p = tmp_path / "job.toml"
    p.write_text(
        '[job]\nworkers = 8\n[policy]\nname = "ignore-stragglers"\ns = 2\n'
        '[stragglers]\nname = "pareto"\nscale = 0.1\nshape = 2.5\n'
    )
    job = JobConfig.from_toml(p)
    assert job.workers == 8
    assert job.policy == Component("ignore-stragglers", {"s": 2})
    assert job.stragglers.options == {"scale": 0.1, "shape": 2.5}
    assert job.model.name == "logistic"  # defaults fill what the file leaves out


@pytest.mark.parametrize(
    "doc,message",
    [
        ({"jobs": {}}, "unknown section"),
        ({"job": {"worker": 3}}, "unknown key"),
        ({"job": {"workers": 0}}, "job.workers must be an integer >= 1"),
        ({"job": {"workers": "4"}}, "job.workers must be an integer"),
        ({"job": {"rounds": 2.5}}, "job.rounds"),
        ({"job": {"round_timeout": -1}}, "round_timeout"),
        ({"job": {"replace_timeout": -1}}, "job.replace_timeout must be a number of seconds >= 0"),
        ({"job": {"replace_timeout": "1m"}}, "replace_timeout"),
        ({"job": {"spares": -1}}, "job.spares must be an integer >= 0"),
        ({"job": {"spares": 1}}, "job.spares = 1 needs job.replace_timeout > 0"),
        ({"job": {"spares": 1.5}}, "job.spares"),
        ({"policy": "uncoded"}, "must be a table"),
        ({"policy": {"name": 3}}, "name must be a string"),
    ],
)
def test_bad_documents(doc: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        JobConfig.from_dict(doc)


def test_bad_json() -> None:
    with pytest.raises(ConfigError, match="not valid JSON"):
        JobConfig.from_json("{")


def test_replace_timeout_travels_with_the_job() -> None:
    job = JobConfig.from_dict({"job": {"replace_timeout": 30}})
    assert job.replace_timeout == 30
    assert JobConfig.from_json(job.to_json()).replace_timeout == 30
    assert JobConfig().replace_timeout == 0.0  # by default a lost worker fails the round


def test_spares_travel_with_the_job_and_stay_out_of_it_when_unused() -> None:
    job = JobConfig.from_dict({"job": {"spares": 2, "replace_timeout": 30}})
    assert job.spares == 2
    assert JobConfig.from_json(job.to_json()).spares == 2
    # Without spares the job document is what workers of earlier versions read.
    assert "spares" not in JobConfig().to_dict()["job"]
