"""A mistyped command, flag or coordinator address gets one line saying what was meant."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from codedgd.client.cli import main


@pytest.mark.parametrize(
    ("argv", "hint"),
    [
        (["sumbit"], "did you mean submit?"),
        (
            ["submit", "--wokers", "3"],
            "unrecognized arguments: --wokers 3; did you mean --workers?",
        ),
        (["run", "--polcy", "frc"], "did you mean --policy?"),
        (["simulate", "--straglers=exponential"], "did you mean --stragglers?"),
        (["coordinator", "--metrics-prot", "9100"], "did you mean --metrics-port?"),
    ],
)
def test_a_typo_gets_a_suggestion(
    argv: list[str], hint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert hint in err and "Traceback" not in err


def test_an_unknown_flag_far_from_any_gets_no_wrong_guess(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["run", "--zzzzzz"])
    err = capsys.readouterr().err
    assert "unrecognized arguments: --zzzzzz" in err and "did you mean" not in err


@pytest.mark.parametrize("target", ["localhost", "10.0.0.5", "[::1]"])
def test_a_coordinator_address_without_a_port_names_the_default_port(
    target: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["status", "--coordinator", target]) == 2
    err = capsys.readouterr().err
    assert f"--coordinator {target!r} has no port" in err and f"{target}:50051" in err


async def test_health_takes_the_token_and_tls_flags_of_every_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A healthcheck given the same settings as the other commands (a token file, from
    CODEDGD_TOKEN_FILE in a container) probes the coordinator, whose health service is
    open whatever token comes with it."""
    from codedgd.client.cli.health import main as health_main
    from codedgd.services.coordinator.server import CoordinatorServer
    from codedgd.services.security import Security

    token = tmp_path / "token"
    token.write_text("operator-secret\n")
    server = await CoordinatorServer.start(
        "127.0.0.1:0", security=Security(worker_token="w-secret", operator_token="operator-secret")
    )
    try:
        code = await asyncio.to_thread(
            health_main, ["--coordinator", f"127.0.0.1:{server.port}", "--token-file", str(token)]
        )
    finally:
        await server.stop(0)
    assert code == 0
    assert "healthy" in capsys.readouterr().out


def test_model_options_come_from_the_command_line() -> None:
    """--model-opt sets a model's options (a plugin's too) beside --l2."""
    from codedgd.client.cli import build_parser
    from codedgd.client.cli.options import job_from_args

    args = build_parser().parse_args(
        ["run", "--model", "least-squares", "--model-opt", "l2=0.5", "--model-opt", "x=y"]
    )
    config = job_from_args(args)
    assert config.model.name == "least-squares"
    assert dict(config.model.options) == {"l2": 0.5, "x": "y"}
    args = build_parser().parse_args(["run", "--model-opt", "l2=0.5", "--l2", "0.25"])
    assert dict(job_from_args(args).model.options) == {"l2": 0.25}  # the flag wins
