"""What a user's mistakes cost: one clear line, before anything starts, and nothing lost.

Each case came from a review that ran the CLI as a user would: a result path that could
only fail after training, a NaN that made the finished run's file unwritable, a bad
environment variable that broke every command, settings checked only once the job ran.
"""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import pytest

from codedgd.client.api import Client, JobState
from codedgd.client.cli import main
from codedgd.client.cli.jobs import watch_job as _watch
from codedgd.client.results import check_output, result_paths, summarize
from codedgd.services.coordinator.server import CoordinatorServer
from codedgd.services.coordinator.service import _validate
from codedgd.services.errors import ConfigError, JobFailed
from codedgd.services.job import Component, JobConfig
from codedgd.services.records import RoundRecord, read_result_file, write_results
from tests.factories import round_record


def _record(t: int, metric: float = math.nan) -> RoundRecord:
    return round_record(
        t,
        wall_seconds=0.1 * (t + 1),
        round_seconds=0.1,
        wait_seconds=0.05,
        compute_seconds_max=0.01,
        loss=0.5,
        metric=metric,
        metric_name="auc",
        workers_used=(0, 1),
        decode_residual=math.inf,
        bytes_up=10,
        bytes_down=10,
        uploads=2,
        computations=2,
    )


# ---------------------------------------------------------------- result files


def test_non_finite_numbers_do_not_cost_the_result_file(tmp_path: Path) -> None:
    # A one-class test set has no AUC (NaN); a residual can be inf. JSON has neither: the
    # file is written with nulls instead of the whole finished run being lost.
    records = [_record(0), _record(1, metric=math.nan)]
    summary = summarize(records, 1.0, JobConfig())
    assert summary["final_metric"] is not None and math.isnan(summary["final_metric"])
    path = write_results(tmp_path / "r.json", {"job": {"x": math.inf}}, records, summary)
    doc = json.loads(path.read_text())
    assert doc["summary"]["final_metric"] is None
    assert doc["job"]["job"]["x"] is None
    assert [r["decode_residual"] for r in doc["rounds"]] == [None, None]
    _, _, back = read_result_file(path)
    assert len(back) == 2 and math.isnan(back[1].metric)


@pytest.mark.parametrize(
    ("given", "pair"),
    [("x.json", ("x.json", "x.csv")), ("x.csv", ("x.json", "x.csv")), ("x", ("x", "x.csv"))],
)
def test_output_names_a_json_and_a_csv(given: str, pair: tuple[str, str]) -> None:
    assert tuple(p.name for p in result_paths(Path(given))) == pair


def test_unwritable_output_is_refused_before_anything_runs(tmp_path: Path) -> None:
    blocker = tmp_path / "afile"
    blocker.write_text("not a directory")
    with pytest.raises(ConfigError, match=r"cannot write the results to .*afile.*--output"):
        check_output(blocker / "out.json")
    (tmp_path / "d.json").mkdir()
    with pytest.raises(ConfigError, match="is a directory"):
        check_output(tmp_path / "d.json")
    fine = tmp_path / "new" / "r.json"
    check_output(fine)
    assert fine.parent.is_dir() and not fine.exists()  # probed, not left behind


def test_run_with_an_unwritable_output_fails_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "afile"
    blocker.write_text("")
    code = main(["run", "-r", "1", "-o", str(blocker / "r.json"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "codedgd run: error: cannot write the results to" in err


def test_a_file_that_is_not_a_result_file_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "token"
    bad.write_text("secret\n")
    with pytest.raises(ConfigError, match=r"is not a codedgd result file.*not JSON"):
        read_result_file(bad)
    assert main(["report", str(bad), "-o", str(tmp_path / "rep")]) == 2
    assert "is not a codedgd result file" in capsys.readouterr().err
    code = main(["simulate", "-r", "2", "--trace-from-results", str(bad), "--no-progress"])
    assert code == 2 and "is not a codedgd result file" in capsys.readouterr().err


# ---------------------------------------------------------------- flags and environment


def test_a_bad_variable_stops_only_commands_with_its_flag(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CODEDGD_WORKERS", "abc")
    assert main(["policies"]) == 0
    capsys.readouterr()
    assert main(["run", "--no-progress"]) == 2
    assert "CODEDGD_WORKERS='abc'" in capsys.readouterr().err


def _job_of(argv: list[str]) -> JobConfig:
    from codedgd.client.cli import build_parser
    from codedgd.client.cli.options import apply_env_defaults, check_env, job_from_args

    parser = build_parser()
    errors = apply_env_defaults(parser)
    args = parser.parse_args(argv)
    check_env(errors, args.command)
    return job_from_args(args)


def test_nesterov_can_be_turned_off_over_the_job_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = tmp_path / "job.toml"
    job.write_text("[optimizer]\nlr = 0.1\nnesterov = true\n")
    assert _job_of(["submit", "-c", str(job)]).optimizer["nesterov"] is True
    assert _job_of(["submit", "-c", str(job), "--no-nesterov"]).optimizer["nesterov"] is False
    monkeypatch.setenv("CODEDGD_NESTEROV", "0")
    assert _job_of(["submit", "-c", str(job)]).optimizer["nesterov"] is False
    assert _job_of(["submit", "-c", str(job), "--nesterov"]).optimizer["nesterov"] is True


def test_zero_partitions_on_the_command_line_is_refused() -> None:
    with pytest.raises(ConfigError, match="--partitions 0: k must be at least 1"):
        _job_of(["submit", "-k", "0"])


def test_verbose_goes_after_the_command_too() -> None:
    from codedgd.client.cli import build_parser

    assert build_parser().parse_args(["run", "-v"]).verbose == 1
    assert build_parser().parse_args(["-v", "status"]).verbose == 1


# ---------------------------------------------------------------- job settings, on submit


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"optimizer": {"lr": -1}}, "lr must be a finite number > 0"),
        ({"optimizer": {"lr": "abc"}}, "lr must be a finite number"),
        ({"optimizer": {"schedule": "x"}}, "unknown schedule 'x'"),
        ({"optimizer": {"lrr": 0.1}}, "optimizer has no option"),
        ({"data": Component("synthetic", {"test_fraction": 1.5})}, "test_fraction must be"),
        ({"data": Component("synthetic", {"task": "ranking"})}, "task must be classification"),
        ({"data": Component("synthetic", {"rows": 1})}, "rows must be an integer >= 2"),
        ({"data": Component("synthetic", {"density": "abc"})}, r"density must be in \(0, 1\]"),
        ({"data": Component("lag-synthetic", {"growth": 0})}, "growth must be positive"),
        (
            {"data": Component("synthetic", {"task": "regression"})},
            "needs 0/1 labels: use --model least-squares",
        ),
        (
            {"data": Component("lag-synthetic"), "model": Component("least-squares", {})},
            "comes split among 9 data owners: use k = 9 partitions",
        ),
    ],
)
def test_settings_are_checked_when_the_job_is_submitted(
    change: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        _validate(JobConfig().replace(**change), None)


def test_a_regression_dataset_with_logistic_regression_names_the_model_to_use(
    tmp_path: Path,
) -> None:
    config = JobConfig(data=Component("kc-house"))
    with pytest.raises(ConfigError, match=r"'kc-house' is a regression task.*least-squares"):
        _validate(config, str(tmp_path))
    least_squares = config.replace(model=Component("least-squares", {}))
    _validate(least_squares, str(tmp_path))  # the same data with the right model: fine


@pytest.mark.parametrize(
    ("job", "message"),
    [
        ({"target_loss": math.nan}, "target_loss must be a finite number"),
        ({"round_timeout": math.inf}, "round_timeout must be a positive, finite"),
        ({"round_timeout": True}, "round_timeout must be a positive, finite"),
    ],
)
def test_job_numbers_must_be_finite(job: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        JobConfig.from_dict({"job": job})


# ---------------------------------------------------------------- status and watching


@pytest.mark.parametrize(
    ("state", "round_", "done"),
    [
        ("queued", 0, 0),
        ("assigning", 0, 0),
        ("running", 5, 5),
        ("failed", 3, 3),
        ("cancelled", 7, 7),
        ("done", 19, 20),
    ],
)
def test_rounds_done(state: str, round_: int, done: int) -> None:
    job = JobState("j", state, round_, 20, "", math.nan, math.nan, "")
    assert job.rounds_done == done


async def test_a_stopped_coordinator_says_why_and_a_watch_file_keeps_it(
    tmp_path: Path,
) -> None:
    server = await CoordinatorServer.start("127.0.0.1:0", assign_timeout=60)
    try:
        job = server.service.submit(JobConfig(workers=2, rounds=3))  # no worker will come
        while job.state != "assigning":
            await job.wait_change()
        out = tmp_path / "w.json"
        async with Client(f"127.0.0.1:{server.port}") as client:
            watching = asyncio.create_task(_watch(client, job.id, 3, out, None, progress=False))
            await asyncio.sleep(0.2)
            await server.service.stop()
            with pytest.raises(JobFailed, match="cancelled: coordinator shutting down"):
                await watching
    finally:
        await server.stop()
    assert job.error == "cancelled: coordinator shutting down"
    doc = json.loads(out.read_text())
    assert doc["summary"]["error"] == "cancelled: coordinator shutting down"
    assert doc["job"]["job_id"] == job.id and doc["rounds"] == []


def test_a_worker_that_never_reached_its_coordinator_says_so(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
    code = main(["worker", "--coordinator", address, "--no-reconnect"])
    err = capsys.readouterr().err
    assert code == 2 and f"could not reach the coordinator at {address}" in err
    assert "lost the coordinator" not in err and "Traceback" not in err


def test_a_malformed_listen_address_is_refused_before_any_warning_about_it(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    assert main(["coordinator", "--listen", "garbage"]) == 2
    assert "'garbage' is malformed: expected HOST:PORT" in capsys.readouterr().err
    assert not [r for r in caplog.records if "without a token" in r.getMessage()]
