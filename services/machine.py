"""The machine a process runs on: which of a job's processes share one machine's cores.

A pool on one machine (``codedgd run``, a bench of network namespaces, a compose file's
containers on one host) shares that machine's cores, and every message costs CPU that a
cluster of a machine per worker pays in parallel. Each codedgd process says which
machine it runs on: a worker in its Hello, the coordinator in the round reports that
list its workers' (``RoundRecord.machines``, ``RoundRecord.coordinator_machine``). So
``codedgd tune`` can tell the two apart from a run's result file (:func:`one_machine`).

A machine is named by its running kernel: the first 16 hex digits of the SHA-256 of
``/proc/sys/kernel/random/boot_id``, which every process and container on one Linux host
shares and which changes at every boot (elsewhere, of the host's name). Only the digest
leaves the machine.
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
import platform
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
CGROUP = Path("/sys/fs/cgroup")
# What a machine's id may hold, as the .proto says (Machine.id).
_ID = re.compile(r"[A-Za-z0-9._:-]{0,64}")
# More cores than any machine has: a count beyond it is not believed.
MAX_CPUS = 1 << 20


@dataclass(frozen=True)
class Machine:
    """The machine a process runs on: ``id`` names it (the same for every process on it;
    "" unknown), ``cpus`` the cores the process may run on (0 unknown): its CPU affinity,
    or fewer where a cgroup's quota allows fewer (a container's ``--cpus``)."""

    id: str = ""
    cpus: int = 0

    @property
    def known(self) -> bool:
        return bool(self.id)

    def cores(self) -> str:
        """Its cores in words: "2 cores", "1 core", "? cores" when not said."""
        return f"{self.cpus} core{'s' if self.cpus != 1 else ''}" if self.cpus else "? cores"


@functools.cache
def this_machine() -> Machine:
    """The machine this process runs on."""
    try:
        name = BOOT_ID.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        name = ""
    if not name:
        name = "host:" + platform.node()
    digest = hashlib.sha256(name.encode()).hexdigest()[:16]
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # (not on Linux)
        cpus = os.cpu_count() or 0
    quota = _cgroup_cpus()
    if quota is not None and cpus:
        cpus = min(cpus, quota)
    return Machine(digest, min(cpus, MAX_CPUS))


def _cgroup_cpus() -> int | None:
    """The cores a cgroup's CPU quota allows this process (a container's ``--cpus``),
    rounded up; None without a quota."""
    for quota_file, period_file in (
        (CGROUP / "cpu.max", None),  # v2: "QUOTA PERIOD" or "max PERIOD"
        (CGROUP / "cpu" / "cpu.cfs_quota_us", CGROUP / "cpu" / "cpu.cfs_period_us"),  # v1
    ):
        try:
            words = quota_file.read_text(encoding="ascii").split()
            if period_file is not None:
                words += period_file.read_text(encoding="ascii").split()
            quota, period = float(words[0]), float(words[1])
        except (OSError, UnicodeDecodeError, ValueError, IndexError):
            continue  # (no such file, "max": no quota)
        if quota > 0 and period > 0:
            return max(1, math.ceil(quota / period))
    return None


def check_machine(machine: Machine) -> str | None:
    """Why a machine a worker said it runs on is refused, or None."""
    if not _ID.fullmatch(machine.id):
        return (
            f"machine id {machine.id[:80]!r} is not at most 64 letters, digits or . _ : - "
            "(a codedgd worker sends a digest of the host's boot id: upgrade the worker)"
        )
    if not 0 <= machine.cpus <= MAX_CPUS:
        return f"machine cpus {machine.cpus} is not a count of cores (0 to {MAX_CPUS})"
    return None


def one_machine(coordinator: Machine | None, workers: Iterable[Machine | None]) -> Machine | None:
    """The machine the coordinator and every worker share, if they all said the same one
    (its cores: the most any of them may run on); None if any differs or is unknown."""
    pool = [coordinator, *workers]
    if any(m is None or not m.known for m in pool):
        return None
    ids = {m.id for m in pool if m is not None}
    if len(ids) != 1:
        return None
    return Machine(ids.pop(), max(m.cpus for m in pool if m is not None))
