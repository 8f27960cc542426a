"""The README's scaling command, as written: `CODEDGD_WORKERS=8 docker compose up --build
--scale worker=8` (with podman's compose): eight worker containers join, Prometheus finds
every one, and the default job runs on all eight.

Runs after tests/containers/test_compose.py has taken its stack down (same ports, same
project); the sandbox-only settings are that module's (see its docstring).
"""

from __future__ import annotations

import subprocess
import time

import pytest

from tests.containers.support import ROOT, Prometheus, wait_for
from tests.containers.test_compose import (
    DEFAULT_PORTS,
    PROJECT,
    _port_free,
    _teardown,
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

    for what, port in DEFAULT_PORTS.items():
        if not _port_free(port):
            pytest.fail(f"port {port} ({what}) is in use: the README's command publishes it")
    env = podman_env() | {"CODEDGD_WORKERS": str(SCALED)}
    log_dir = tmp_path_factory.mktemp("compose-scale-logs")
    with (log_dir / "podman-compose-up.log").open("wb") as log:
        up = subprocess.Popen(UP_SCALED, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        prom = Prometheus("http://127.0.0.1:9090")
        started = time.time()

        def ready() -> bool | None:
            if up.poll() is not None:
                text = (log_dir / "podman-compose-up.log").read_text(errors="replace")
                pytest.fail(f"`{' '.join(UP_SCALED)}` ended with {up.returncode}:\n{text[-3000:]}")
            return True if prom.ready() else None

        wait_for(ready, timeout=600, what="Prometheus ready")
        prom.wait_for_targets({"codedgd-coordinator": 1, "codedgd-worker": SCALED}, timeout=180)
        prom.wait_for_jobs_done(1, timeout=600)
        assert prom.value("codedgd_workers_connected") == SCALED
        # The default job ran on all eight: each computed rounds of it.
        computed = prom.api("query", query="codedgd_worker_rounds_computed_total")["result"]
        assert len([r for r in computed if float(r["value"][1]) > 0]) == SCALED
        print(f"scaled stack up and its job done in {time.time() - started:.0f} s")
    finally:
        _teardown(PROJECT, env, log_dir)
        up.terminate()
        try:
            up.wait(timeout=60)
        except subprocess.TimeoutExpired:
            up.kill()
