"""The committed generated code matches protos/ exactly (regenerated with grpcio-tools)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(
    importlib.util.find_spec("grpc_tools") is None,
    reason="grpcio-tools is a dev dependency: pip install -e .[dev]",
)
def test_generated_code_is_up_to_date(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_protos.py"), "--out", str(tmp_path)],
        check=True,
        capture_output=True,
    )
    committed = ROOT / "services" / "proto"
    generated = sorted(p.name for p in tmp_path.iterdir())
    assert generated == sorted(p.name for p in committed.iterdir() if p.suffix in (".py", ".pyi"))
    for name in generated:
        assert (tmp_path / name).read_text() == (committed / name).read_text(), (
            f"services/proto/{name} is stale: run python scripts/gen_protos.py"
        )
