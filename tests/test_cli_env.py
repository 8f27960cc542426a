"""Environment-variable defaults of the CLI (how containers configure the services)."""

from __future__ import annotations

import pytest

from codedgd.client.cli import build_parser
from codedgd.client.cli.options import apply_env_defaults, check_env, env_name, job_from_args
from codedgd.client.local import worker_environment
from codedgd.services.errors import ConfigError
from codedgd.services.security import TOKEN_ENV


def parse(env: dict[str, str], *argv: str):  # type: ignore[no-untyped-def]
    parser = build_parser()
    errors = apply_env_defaults(parser, env)
    args = parser.parse_args(list(argv))
    check_env(errors, args.command)
    return args


def test_env_name() -> None:
    assert env_name("--metrics-port") == "CODEDGD_METRICS_PORT"


def test_env_sets_worker_and_coordinator_flags() -> None:
    args = parse({"CODEDGD_COORDINATOR": "coord:6000", "CODEDGD_METRICS_PORT": "9101"}, "worker")
    assert args.coordinator == "coord:6000"
    assert args.metrics_port == 9101
    args = parse({"CODEDGD_RUN_DEFAULT_JOB": "true", "CODEDGD_LISTEN": "0.0.0.0:7"}, "coordinator")
    assert args.run_default_job is True
    assert args.listen == "0.0.0.0:7"


def test_command_line_wins_over_env() -> None:
    args = parse({"CODEDGD_COORDINATOR": "coord:6000"}, "worker", "--coordinator", "h:1")
    assert args.coordinator == "h:1"


def test_env_job_flags_reach_the_job() -> None:
    args = parse(
        {"CODEDGD_WORKERS": "7", "CODEDGD_POLICY": "ignore-stragglers", "CODEDGD_ROUNDS": "3"},
        "submit",
    )
    job = job_from_args(args)
    assert (job.workers, job.rounds, job.policy.name) == (7, 3, "ignore-stragglers")


def test_bad_env_value_names_the_variable() -> None:
    with pytest.raises(ConfigError, match="CODEDGD_METRICS_PORT='abc'"):
        parse({"CODEDGD_METRICS_PORT": "abc"}, "worker")
    with pytest.raises(ConfigError, match="CODEDGD_NO_RECONNECT"):
        parse({"CODEDGD_NO_RECONNECT": "maybe"}, "worker")


def test_repeatable_flags_ignore_the_environment() -> None:
    # --param/--data-opt/--straggler-opt are command-line only: a variable of the same
    # name neither breaks parsing nor leaks into the job.
    env = {"CODEDGD_PARAM": "s=2", "CODEDGD_DATA_OPT": "rows=9", "CODEDGD_STRAGGLER_OPT": "x=1"}
    args = parse(env, "submit", "--policy", "ignore-stragglers", "--param", "s=1")
    job = job_from_args(args)
    assert job.policy.options == {"s": 1}
    assert job_from_args(parse(env, "submit")).policy.options == {}


def test_codedgd_run_workers_get_no_coordinator_variables_but_the_malloc_switch() -> None:
    environ = {"CODEDGD_METRICS_PORT": "9100", "CODEDGD_MALLOC_TUNING": "0", "HOME": "/root"}
    env = worker_environment(environ, token="t0k")
    assert "CODEDGD_METRICS_PORT" not in env  # would make every worker bind the same port
    assert env["CODEDGD_MALLOC_TUNING"] == "0"  # a per-process setting: every process obeys
    assert env["HOME"] == "/root" and env["OPENBLAS_NUM_THREADS"] == "1"
    assert env[TOKEN_ENV] == "t0k"
