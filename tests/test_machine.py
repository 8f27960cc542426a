"""Which machine a process runs on, and which of a run's processes shared one."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from codedgd.services import machine as machine_module
from codedgd.services.machine import Machine, check_machine, one_machine, this_machine
from codedgd.services.records import RoundRecord
from codedgd.services.tuning.pool import pool_of
from tests.factories import round_record


def test_this_machine_is_named_by_a_digest_of_its_running_kernel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    here = this_machine()
    assert re.fullmatch(r"[0-9a-f]{16}", here.id) and here.cpus >= 1
    assert check_machine(here) is None
    # Another boot (or host) is another machine; the boot id itself never leaves it.
    boot = tmp_path / "boot_id"
    boot.write_text("0f1e2d3c-aaaa-bbbb-cccc-000000000001\n")
    monkeypatch.setattr(machine_module, "BOOT_ID", boot)
    this_machine.cache_clear()
    try:
        other = this_machine()
        assert other.id != here.id and "0f1e2d3c" not in other.id
        boot.write_text("0f1e2d3c-aaaa-bbbb-cccc-000000000001\n")
        this_machine.cache_clear()
        assert this_machine() == other  # the same boot: the same machine
    finally:
        this_machine.cache_clear()


@pytest.mark.parametrize(
    ("machine", "why"),
    [
        (Machine("a b"), "is not at most 64 letters"),
        (Machine("x" * 65), "is not at most 64 letters"),
        (Machine("ok", -1), "is not a count of cores"),
        (Machine("ok", 2**21), "is not a count of cores"),
    ],
)
def test_a_machine_no_codedgd_process_would_send_is_refused(machine: Machine, why: str) -> None:
    assert why in (check_machine(machine) or "")


def test_one_machine_only_when_every_process_said_the_same() -> None:
    a, b = Machine("aa", 2), Machine("bb", 2)
    assert one_machine(a, [a, Machine("aa", 4)]) == Machine("aa", 4)  # its most cores
    assert one_machine(a, [a, b]) is None
    assert one_machine(None, [a, a]) is None  # the coordinator's not known
    assert one_machine(a, [a, Machine()]) is None  # a worker that said nothing


def _record(t: int, holders: dict[int, str], machines: dict[int, Machine]) -> RoundRecord:
    coordinator = Machine("aa", 2) if machines else None
    return round_record(t, holders=holders, machines=machines, coordinator_machine=coordinator)


def test_a_runs_pool_is_its_places_latest_holders_machines() -> None:
    a, b = Machine("aa", 2), Machine("bb", 8)
    first = _record(0, {0: "w0", 1: "w1"}, {0: a, 1: a})
    pool = pool_of([first, _record(1, {}, {})], 2)
    assert pool.one == a and pool.machines == 1
    assert "ran on one machine (2 cores)" in pool.describe()
    # A newcomer on another machine took place 1: two machines now.
    pool = pool_of([first, _record(5, {1: "new"}, {1: b})], 2)
    assert pool.one is None and pool.known and pool.machines == 2
    # A newcomer that named no machine: not known where place 1 ran.
    pool = pool_of([first, _record(5, {1: "old-worker"}, {})], 2)
    assert pool.one is None and not pool.known
    # The simulator's records (and older files) name none.
    assert not pool_of([_record(0, {}, {})], 2).known


@pytest.mark.parametrize(
    ("files", "cpus"),
    [
        ({"cpu.max": "150000 100000\n"}, 2),  # a container's --cpus 1.5: two cores' time
        ({"cpu.max": "max 100000\n"}, None),  # no quota
        ({"cpu/cpu.cfs_quota_us": "100000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 1),
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
        ({}, None),
    ],
)
def test_a_containers_cpu_quota_bounds_its_cores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, files: dict[str, str], cpus: int | None
) -> None:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    monkeypatch.setattr(machine_module, "CGROUP", tmp_path)
    assert machine_module._cgroup_cpus() == cpus
    this_machine.cache_clear()
    try:
        here = this_machine()
        assert here.cpus == min(len(os.sched_getaffinity(0)), cpus or 10**9)
    finally:
        this_machine.cache_clear()
