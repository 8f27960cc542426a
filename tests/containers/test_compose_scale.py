"""The README's scaling command, as written: `CODEDGD_WORKERS=8 docker compose up --build
--scale worker=8` (with podman's compose): eight worker containers join, Prometheus finds
every one, and the default job runs on all eight.

Runs after tests/containers/test_compose.py has taken its stack down (same ports, same
project); the sandbox-only settings are that module's (see its docstring).
"""

from __future__ import annotations

import time

import pytest

from tests.containers.test_compose import (
    compose_up,
    images,  # noqa: F401 (the fixture: base images, cached layers, Grafana's stand-in)
)

pytestmark = pytest.mark.containers

SCALED = 8
UP_SCALED = ("podman-compose", "up", "--build", "--scale", f"worker={SCALED}")


def test_the_readmes_scale_command_runs_the_default_job_on_eight_workers(
    images: None,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    from tests.containers.support import podman_env

    env = podman_env() | {"CODEDGD_WORKERS": str(SCALED)}
    started = time.time()
    with compose_up(UP_SCALED, env, tmp_path_factory.mktemp("compose-scale-logs")) as prom:
        prom.wait_for_targets({"codedgd-coordinator": 1, "codedgd-worker": SCALED}, timeout=180)
        prom.wait_for_jobs_done(1, timeout=600)
        assert prom.value("codedgd_workers_connected") == SCALED
        # The default job ran on all eight: each computed rounds of it.
        computed = prom.api("query", query="codedgd_worker_rounds_computed_total")["result"]
        assert len([r for r in computed if float(r["value"][1]) > 0]) == SCALED
        print(f"scaled stack up and its job done in {time.time() - started:.0f} s")
