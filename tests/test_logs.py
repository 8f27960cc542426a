"""--log-format json: one JSON object per record, one line each, whatever the message."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from codedgd.client.cli import main
from codedgd.client.cli.logs import JsonFormatter


def test_a_record_is_one_json_line_even_with_a_newline_in_it() -> None:
    record = logging.LogRecord(
        "codedgd.coordinator",
        logging.WARNING,
        __file__,
        1,
        "worker %s reports: %s",
        ("w1", "oops\nforged line"),
        None,
    )
    line = JsonFormatter().format(record)
    assert "\n" not in line
    doc = json.loads(line)
    assert doc["level"] == "WARNING" and doc["logger"] == "codedgd.coordinator"
    assert doc["message"] == "worker w1 reports: oops\nforged line"
    assert doc["time"].endswith("+00:00")


def test_an_exception_travels_inside_the_object() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord(
            "codedgd", logging.ERROR, __file__, 1, "failed", (), sys.exc_info()
        )
    doc = json.loads(JsonFormatter().format(record))
    assert "ValueError: boom" in doc["exception"]


def test_the_worker_logs_json_lines_when_asked() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "codedgd.client.cli",
            "worker",
            "--log-format",
            "json",
            "--coordinator",
            "127.0.0.1:1",
            "--no-reconnect",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    logged = [line for line in proc.stderr.splitlines() if line.startswith("{")]
    assert logged, proc.stderr
    for line in logged:
        assert json.loads(line)["logger"] == "codedgd.worker"


def test_codedgd_run_gives_its_workers_the_log_format(tmp_path: Path) -> None:
    """`codedgd --log-format json run --worker-log F`: the workers' lines in F are JSON too
    (a log shipper reading F parses every line)."""
    log = tmp_path / "workers.log"
    proc = subprocess.run(
        [
            sys.executable, "-m", "codedgd.client.cli", "--log-format", "json", "run",
            "-n", "2", "-r", "2", "--no-progress", "--worker-log", str(log),
        ],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    lines = [line for line in log.read_text().splitlines() if line.strip()]
    assert lines, (proc.stdout, proc.stderr)
    for line in lines:
        assert json.loads(line)["logger"].startswith("codedgd"), line


@pytest.mark.parametrize(
    "argv", [["--log-format", "xml", "policies"], ["policies", "--log-format", "xml"]]
)
def test_an_unknown_log_format_is_refused_naming_the_choices(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--log-format 'xml'" in err and "choose text or json" in err
