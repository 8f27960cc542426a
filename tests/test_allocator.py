"""The malloc tuning applies on glibc Linux, can be switched off, and is a no-op elsewhere."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from services import allocator

PROBE = "from services.allocator import keep_freed_memory; print(keep_freed_memory())"


def _probe(env_value: str | None) -> str:
    env = {"PATH": "/usr/bin:/bin"}
    if env_value is not None:
        env[allocator.ENV] = env_value
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def test_applied_on_glibc_linux_by_default() -> None:
    expected = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"
    assert _probe(None) == str(expected)


@pytest.mark.parametrize("value", ["0", "off", "false", " No "])
def test_switched_off_by_the_environment(value: str) -> None:
    assert _probe(value) == "False"
