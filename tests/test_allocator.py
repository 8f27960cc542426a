"""The malloc tuning applies on glibc Linux, can be switched off, and is a no-op elsewhere."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from codedgd.services import allocator

PROBE = "from codedgd.services.allocator import keep_freed_memory; print(keep_freed_memory())"


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


# A thread allocates three θ-sized blocks (the third needs a heap of its own), the
# main thread frees them: as a worker's compute thread and event loop do each round.
REUSE_PROBE = """
import resource
from concurrent.futures import ThreadPoolExecutor
import numpy as np
from codedgd.services.allocator import keep_freed_memory
assert keep_freed_memory()
pool = ThreadPoolExecutor(1)
faults = []
for _ in range(5):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    blocks = pool.submit(lambda: [np.ones(4_000_000) for _ in range(3)]).result()
    del blocks
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(*faults)
"""


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
    reason="the tuning is glibc's",
)
def test_blocks_freed_by_another_thread_are_reused_without_fresh_pages() -> None:
    # numpy's huge-page advice would make each fault 2 MiB: count 4 KiB pages instead.
    env = {"PATH": "/usr/bin:/bin", "NUMPY_MADVISE_HUGEPAGE": "0"}
    out = subprocess.run(
        [sys.executable, "-c", REUSE_PROBE], env=env, capture_output=True, text=True, check=True
    )
    first, *later = map(int, out.stdout.split())
    pages_per_block = 4_000_000 * 8 // 4096
    assert first > 2 * pages_per_block  # the first round faults its blocks in
    assert max(later) < pages_per_block // 10, later  # later rounds reuse them
