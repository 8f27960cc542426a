"""auto's prior follows the machines, not the order they connect in: a real pool's run
records who held which place, `codedgd tune --write-auto` names the machines of its
prior, and the coordinator hands each place its holder's entry."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from codedgd.services.coordinator.server import CoordinatorServer
from codedgd.services.job import Component, JobConfig
from codedgd.services.records import write_results
from tests.conftest import ROOT, WorkerProcesses
from tests.e2e.fakes import wait_for
from tests.e2e.test_replacement import _finished
from tests.e2e.test_training import SYNTH


async def _connect(
    coordinator: CoordinatorServer,
    workers: WorkerProcesses,
    order: list[int],
    slow: dict[int, float] | None = None,
    flags: tuple[str, ...] = (),
) -> None:
    """Workers m<k>-0 for k in ``order``, each connected before the next starts: places
    are given in the order workers connected. m<k> of ``slow`` waits that many seconds
    more every round (``--extra-delay``); ``flags`` go to every worker."""
    sessions = coordinator.service.sessions
    for k in order:
        before = len(sessions)
        extra = ("--extra-delay", str(slow[k])) if slow and k in slow else ()
        workers.start(coordinator.port, 1, name=f"m{k}-", extra=(*extra, *flags))
        await wait_for(lambda: len(sessions) > before, timeout=60)  # noqa: B023 - awaited here


async def test_tune_names_the_prior_s_machines_and_auto_gives_each_place_its_holder_s(
    coordinator: CoordinatorServer,
    worker_processes: WorkerProcesses,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="codedgd.services.policies.auto")
    await _connect(coordinator, worker_processes, [0, 1, 2, 3])
    # No straggler model: the delays are the machines' own, so the prior is by machine.
    source = JobConfig(
        workers=4, rounds=12, seed=7, data=SYNTH, model=Component("logistic", {"l2": 1e-3})
    )
    job = coordinator.service.submit(source)
    await _finished(job)
    assert job.state == "done", job.error
    names = [s.name for s in job.places.holders]
    assert names == ["m0-0", "m1-0", "m2-0", "m3-0"]
    assert job.records[0].holders == dict(enumerate(names))
    assert all(not r.holders for r in job.records[1:])
    write_results(tmp_path / "run.json", source.to_dict(), list(job.records), {})

    tune = [
        sys.executable, "-m", "codedgd.client.cli", "tune", str(tmp_path / "run.json"),
        "--policy", "uncoded", "--policy", "frc", "--repeats", "1",
        "--write-auto", str(tmp_path / "auto.toml"),
    ]  # fmt: skip
    done = await asyncio.to_thread(
        subprocess.run, tune, capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert "its prior follows the machines by name, wherever they connect" in done.stdout
    written = JobConfig.from_toml(tmp_path / "auto.toml")
    assert written.policy.options["prior_names"] == ",".join(names)
    assert len(written.policy.options["prior"].split(",")) == 4

    # The pool connects again in another order. Distinct entries, so the log shows
    # which went where: m<k> measured k + 1.
    worker_processes.stop()
    await wait_for(lambda: len(coordinator.service.sessions) == 0, timeout=60)
    await _connect(coordinator, worker_processes, [3, 1, 0, 2])
    options = {**written.policy.options, "prior": "1,2,3,4"}
    job = coordinator.service.submit(
        written.replace(rounds=3, policy=Component("auto", options), target_loss=None)
    )
    await _finished(job)
    assert job.state == "done", job.error
    assert [s.name for s in job.places.holders] == ["m3-0", "m1-0", "m0-0", "m2-0"]
    followed = [r.getMessage() for r in caplog.records if "follows the machines" in r.getMessage()]
    assert followed == [
        "auto: the prior follows the machines by name: 0=m3-0 4, 1=m1-0 2, 2=m0-0 1, 3=m2-0 3"
    ]


@pytest.mark.parametrize("policy", ["uncoded", "ring-allreduce"])
async def test_a_machine_s_extra_delay_follows_it_to_whichever_place_it_holds(
    coordinator: CoordinatorServer, worker_processes: WorkerProcesses, policy: str
) -> None:
    """The instrument the prior by machine is measured with (bench_prior_by_machine): a
    worker's --extra-delay is its own, where a straggler model's delays are a place's;
    in a star's rounds and a ring's."""
    job_config = JobConfig(workers=4, rounds=6, seed=7, data=SYNTH, policy=Component(policy))
    peers = ("--peer-listen", "127.0.0.1:0") if policy != "uncoded" else ()
    for order, slow_place in (([0, 1, 2, 3], 2), ([2, 0, 1, 3], 0)):
        await _connect(coordinator, worker_processes, order, slow={2: 0.5}, flags=peers)
        job = coordinator.service.submit(job_config)
        await _finished(job)
        assert job.state == "done", job.error
        assert job.places.holders[slow_place].name == "m2-0"
        # Every worker is waited for: each round records every one's time (a star's
        # arrivals; a ring's workers' own times, from their WorkerTiming).
        for record in job.records:
            times = record.response_seconds if policy == "uncoded" else record.ready_seconds
            assert times[slow_place] >= 0.5, (order, record.round, times)
            assert max(times, key=lambda w: times[w]) == slow_place, (order, times)
        worker_processes.stop()
        await wait_for(lambda: len(coordinator.service.sessions) == 0, timeout=60)
