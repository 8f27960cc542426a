"""A mistyped command, flag or coordinator address gets one line saying what was meant."""

from __future__ import annotations

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
