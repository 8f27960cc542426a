"""Process memory tuning: keep freed tensor-sized blocks instead of returning them.

Every round allocates and frees buffers the size of θ and of the gradients: gRPC's
received messages, the frames we send, numpy temporaries. glibc's malloc serves
blocks above a (dynamic) threshold of at most 32 MiB with fresh ``mmap`` pages and
trims the top of its heap back to the kernel when more than twice that threshold is
free, so the next round faults every 4 KiB page in again; measured, those faults
cost more than the copies themselves (docs/benchmarks.md). Raising both thresholds
makes freed blocks reusable. The price is that the process keeps its peak heap.

Threads get the same treatment by sharing the main arena (one arena in all): a
worker computes its gradient in a thread, and a tensor-sized block allocated
there lands in a per-thread heap of at most 64 MiB. glibc deletes such a heap as
soon as it is empty (whatever the trim threshold), which happens every round
when the event loop frees the thread's gradient: a fresh ``mmap`` and 7,800 page
faults (or, under numpy's huge-page advice, as many MiB zeroed by the kernel)
per 32 MB block per round. Measured at n = 8, ℓ = 4·10⁶: workers' CPU per round
down by a fifth (docs/benchmarks.md).

Applied by the ``codedgd`` command at start-up (coordinator, worker, run) on Linux
with glibc; elsewhere, or with ``CODEDGD_MALLOC_TUNING=0``, nothing changes.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys

log = logging.getLogger("codedgd")

ENV = "CODEDGD_MALLOC_TUNING"
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
MMAP_THRESHOLD = 32 * 1024 * 1024  # glibc's maximum on 64-bit hosts
TRIM_THRESHOLD = 1024 * 1024 * 1024


def keep_freed_memory() -> bool:
    """Tune glibc malloc for round-sized buffers; return whether it was applied."""
    if os.environ.get(ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018 -- glibc only (musl has no mallopt knobs)
    except (OSError, AttributeError):
        return False
    ok = (
        bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))
        and bool(libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
        and bool(libc.mallopt(_M_ARENA_MAX, 1))
    )
    if not ok:
        log.debug("mallopt refused the thresholds; keeping glibc's defaults")
    return ok
