"""docker-compose.yml for real, started by the README's own command.

`podman-compose up --build` (the README's `docker compose up --build`, with podman's
compose), run as written from the checkout, with nothing set: it builds the images, starts
the coordinator, the 3 workers of `deploy.replicas`, Prometheus and Grafana on their
default ports, and runs the default job. Then jobs are submitted with the CLI from the
host, the coordinator container is restarted mid-job, and the services are stopped with
SIGTERM.

What only this sandbox needs, and the user's machine does not (docs/deployment.md): runc
and no default ulimits (CONTAINERS_CONF), a Debian base image under the Dockerfiles' FROM
names, the images first built once with the host network so `--build` finds every layer
in podman's cache (pip cannot reach the package index from a build here otherwise), and a
stand-in for Grafana under Grafana's image name (tests/containers/grafana_standin: the
real image cannot be pulled here; the dashboard's queries are checked against the real
Prometheus instead).

    python -m pytest -m containers tests/containers/test_compose.py

CODEDGD_CONTAINERS_CHART=docs/img/compose-run.png also plots the run from Prometheus.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest

from codedgd.client.cli.health import coordinator_status
from tests.containers.support import (
    COMPOSE_FILE,
    ROOT,
    Prometheus,
    build,
    clean_env,
    compose_image,
    default_job_rounds,
    ensure_base_images,
    ensure_grafana_standin,
    from_image,
    podman,
    podman_env,
    queries_without_data,
    require_tools,
    save_chart,
    wait_for,
)

pytestmark = pytest.mark.containers

WORKERS = 3  # deploy.replicas of docker-compose.yml
# The README's command, with podman's compose for Docker's.
UP = ("podman-compose", "up", "--build")
PROJECT = "codedgd"  # docker-compose.yml's `name`
APP_IMAGE = compose_image("coordinator")  # codedgd:latest
PROMETHEUS_IMAGE = compose_image("prometheus")  # codedgd-prometheus:latest
DEFAULT_PORTS = {"coordinator": 50051, "coordinator metrics": 9100, "Prometheus": 9090}
DEFAULT_PORTS["Grafana"] = 3000


@dataclass
class Stack:
    project: str
    env: dict[str, str]
    coordinator: str  # host:port published on the host
    prometheus: Prometheus
    grafana: str  # its URL on the host
    started: float

    def containers(self, service: str) -> list[str]:
        out = podman(
            "ps",
            "-a",
            "--filter",
            f"label=io.podman.compose.project={self.project}",
            "--filter",
            f"label=io.podman.compose.service={service}",
            "--format",
            "{{.Names}}",
        ).stdout
        return sorted(out.split())


@pytest.fixture(scope="module")
def images() -> None:
    """Sandbox-only: the base images, a first build with the host network (so the
    README's `--build` finds every layer cached) and Grafana's stand-in."""
    require_tools("podman", "podman-compose")
    app_dockerfile = ROOT / "docker" / "Dockerfile"
    prom_dockerfile = ROOT / "docker" / "prometheus" / "Dockerfile"
    ensure_base_images([from_image(app_dockerfile), from_image(prom_dockerfile)])
    build(APP_IMAGE, app_dockerfile, ROOT)
    build(PROMETHEUS_IMAGE, prom_dockerfile, prom_dockerfile.parent)
    ensure_grafana_standin()


@pytest.fixture(scope="module")
def stack(images: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The README's command, as written, in the foreground of a child process."""
    env = podman_env()  # CONTAINERS_CONF (runc, no ulimits): sandbox-only
    started = time.time()
    with compose_up(UP, env, tmp_path_factory.mktemp("compose-logs")) as prom:
        yield Stack(PROJECT, env, "127.0.0.1:50051", prom, "http://127.0.0.1:3000", started)


@contextmanager
def compose_up(command: Sequence[str], env: dict[str, str], log_dir: Path) -> Iterator[Prometheus]:
    """``command`` (a compose up, in the foreground of a child process) until Prometheus
    is ready; the stack is taken down, its containers' logs kept in ``log_dir``, on exit."""
    # A stack an interrupted run left behind (its containers, and the coordinator's state
    # volume with that run's jobs in it) would join this one: remove it first.
    stale = log_dir / "left-by-an-earlier-run"
    stale.mkdir()
    _teardown(PROJECT, env, stale)
    for what, port in DEFAULT_PORTS.items():
        if not _port_free(port):
            pytest.fail(f"port {port} ({what}) is in use: the README's command publishes it")
    log_path = log_dir / "podman-compose-up.log"
    with log_path.open("wb") as log:
        up = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        prom = Prometheus("http://127.0.0.1:9090")

        def ready() -> bool | None:
            if up.poll() is not None:
                text = log_path.read_text(errors="replace")
                pytest.fail(f"`{' '.join(command)}` ended with {up.returncode}:\n{text[-3000:]}")
            return True if prom.ready() else None

        wait_for(ready, timeout=600, what="Prometheus ready")
        yield prom
    finally:
        _teardown(PROJECT, env, log_dir)
        up.terminate()
        try:
            up.wait(timeout=60)
        except subprocess.TimeoutExpired:
            up.kill()


def _port_free(port: int) -> bool:
    import socket

    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _teardown(project: str, env: dict[str, str], log_dir: Path) -> None:
    label = f"label=io.podman.compose.project={project}"
    names = podman("ps", "-a", "--filter", label, "--format", "{{.Names}}", check=False)
    for name in names.stdout.split():
        logs = podman("logs", name, check=False)
        (log_dir / f"{name}.log").write_text(logs.stdout + logs.stderr)
    subprocess.run(
        ["podman-compose", "-p", project, "-f", str(COMPOSE_FILE), "down", "-v", "-t", "10"],
        env=env,
        capture_output=True,
        timeout=300,
        cwd=ROOT,
    )
    # podman-compose may leave scaled replicas behind: remove them by name.
    left = podman("ps", "-a", "--filter", label, "--format", "{{.Names}}", check=False)
    for name in left.stdout.split():
        podman("rm", "-f", "-t", "5", name, check=False)
    podman("network", "rm", "-f", f"{project}_default", check=False)
    podman("volume", "rm", "-f", f"{project}_coordinator-state", check=False)
    print(f"container logs of {project}: {log_dir}")


def test_prometheus_configs_are_valid(images: None) -> None:
    for config in (
        ROOT / "docker" / "prometheus" / "prometheus.yml",
        ROOT / "deploy" / "ec2" / "prometheus.yml",
    ):
        done = podman(
            "run",
            "--rm",
            "-v",
            f"{config}:/check/prometheus.yml:ro",
            "--entrypoint",
            "promtool",
            PROMETHEUS_IMAGE,
            "check",
            "config",
            "/check/prometheus.yml",
            check=False,
        )
        assert done.returncode == 0, f"{config}: {done.stdout}{done.stderr}"


def test_image_runs_as_non_root_with_codedgd_entrypoint(images: None) -> None:
    uid = podman("run", "--rm", "--entrypoint", "id", APP_IMAGE, "-u").stdout.strip()
    assert uid != "0"
    listing = podman("run", "--rm", APP_IMAGE, "policies").stdout
    assert "uncoded" in listing


def test_prometheus_finds_the_coordinator_and_every_worker(stack: Stack) -> None:
    stack.prometheus.wait_for_targets(
        {"codedgd-coordinator": 1, "codedgd-worker": WORKERS}, timeout=120
    )
    workers = {
        t["labels"]["instance"]
        for t in stack.prometheus.targets()
        if t["labels"]["job"] == "codedgd-worker"
    }
    assert len(workers) == WORKERS  # one target per replica, found by DNS


def test_compose_healthchecks_pass(stack: Stack) -> None:
    coordinators = stack.containers("coordinator")
    workers = stack.containers("worker")
    assert len(coordinators) == 1
    assert len(workers) == WORKERS

    for name in coordinators + workers:  # the healthcheck commands of docker-compose.yml
        wait_for(partial(_healthy, name), timeout=60, what=f"{name} healthy")
    # The same probe from the host, through the published port (no token needed).
    assert asyncio.run(coordinator_status(stack.coordinator, timeout=10)) == "SERVING"


def _healthy(name: str) -> bool | None:
    return True if podman("healthcheck", "run", name, check=False).returncode == 0 else None


def test_default_job_runs_to_the_end(stack: Stack) -> None:
    prom = stack.prometheus
    prom.wait_for_jobs_done(1, timeout=300)
    assert prom.value("sum(codedgd_rounds_total)") == default_job_rounds()
    assert prom.value("codedgd_workers_connected") == WORKERS
    assert prom.value('sum(codedgd_worker_rounds_computed_total{job="codedgd-worker"})')
    # Straggler-tolerant policy with injected delays: some results were cancelled.
    assert prom.value('codedgd_stragglers_total{reason="cancelled"}')


def _cli(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    env = clean_env()
    return subprocess.run(
        [sys.executable, "-m", "codedgd.client.cli", *args, "--coordinator", stack.coordinator],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
    )


def test_host_cli_submits_a_job(stack: Stack) -> None:
    stack.prometheus.wait_for_jobs_done(1, timeout=300)
    # Jobs whose workers push to each other over the compose network (port 50052): a ring
    # of the 3 workers, and CodedReduce with fanout 3 (one level, s = 1).
    codedreduce = ["--policy", "codedreduce", "--param", "fanout=3", "--param", "levels=1"]
    for done_jobs, policy in enumerate((["--policy", "ring-allreduce"], codedreduce), start=2):
        args = ("submit", "-n", str(WORKERS), "-r", "20", *policy, "--watch", "--no-progress")
        done = _cli(stack, *args)
        assert done.returncode == 0, done.stderr
        stack.prometheus.wait_for_jobs_done(done_jobs, timeout=120)
    status = _cli(stack, "status")
    assert status.stdout.count(": done, ") == 3  # the default job and these two
    assert status.stdout.count(": done, 20/20 rounds done") == 2
    pushed = stack.prometheus.value("sum(codedgd_worker_peer_bytes_sent_total)")
    assert pushed is not None and pushed > 0


def test_every_dashboard_query_returns_data(stack: Stack) -> None:
    prom = stack.prometheus
    prom.wait_for_jobs_done(1, timeout=300)
    # The last rounds reach Prometheus at its next scrape: poll a little before judging.
    missing = queries_without_data(prom, stack.started - 5, time.time())
    for _ in range(12):
        if not missing:
            break
        time.sleep(2)
        missing = queries_without_data(prom, stack.started - 5, time.time())
    assert missing == []
    end = time.time()
    chart = os.environ.get("CODEDGD_CONTAINERS_CHART")
    if chart:
        save_chart(prom, stack.started, end, ROOT / chart)


def test_a_restarted_coordinator_container_resumes_its_job(stack: Stack) -> None:
    """`podman restart` of the coordinator mid-job (SIGTERM, then a new process on the
    compose volume): the job resumes from the round it stopped at, the same worker
    containers reconnect, and it ends done with every round."""
    # Exponential delays (mean 50 ms) make the 400 rounds last ~30 s: it is mid-job.
    args = ("-n", "3", "-r", "400", "--stragglers", "exponential", "--straggler-opt", "mean=0.05")
    submitted = _cli(stack, "submit", *args)
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.split()[0]

    def rounds_done() -> int:
        status = _cli(stack, "status", job_id)
        if status.returncode != 0 or "rounds done" not in status.stdout:
            return -1
        return int(status.stdout.split(" rounds done")[0].rsplit(" ", 1)[1].split("/")[0])

    wait_for(
        lambda: True if rounds_done() >= 20 else None, timeout=180, what="20 rounds of the job"
    )
    coordinator = stack.containers("coordinator")[0]
    podman("restart", "-t", "30", coordinator)
    wait_for(lambda: True if rounds_done() >= 0 else None, timeout=120, what="it back")
    watched = _cli(stack, "watch", job_id, "--no-progress")
    assert watched.returncode == 0, watched.stderr
    status = _cli(stack, "status", job_id)
    assert f"job {job_id}: done, 400/400 rounds done" in status.stdout, status.stdout
    logs = podman("logs", coordinator, check=False)
    text = logs.stdout + logs.stderr  # both lives of the container
    assert f"job {job_id} interrupted" in text and "resumes it at round" in text
    assert f"job {job_id} (interrupted) will resume at round" in text


def test_grafana_gets_the_provisioning_and_the_dashboard_compose_mounts(stack: Stack) -> None:
    """What compose gives Grafana: the provisioning files and the codedgd dashboard at the
    paths Grafana reads (served here by the sandbox's stand-in; the dashboard's queries
    are checked against Prometheus above)."""
    import urllib.request

    def get(path: str) -> dict[str, object] | None:
        try:
            with urllib.request.urlopen(stack.grafana + path, timeout=5) as response:
                doc: dict[str, object] = json.load(response)
                return doc
        except OSError:
            return None

    health = wait_for(lambda: get("/api/health"), timeout=60, what="Grafana answering")
    assert health["provisioning"] == ["dashboards/codedgd.yml", "datasources/prometheus.yml"]
    shipped = json.loads((ROOT / "docker/grafana/dashboards/codedgd.json").read_text())
    served = get(f"/api/dashboards/uid/{shipped['uid']}")
    assert served is not None and served["dashboard"] == shipped


def test_sigterm_stops_worker_and_coordinator_cleanly(stack: Stack) -> None:
    # Exit status 0 after `podman stop` (SIGTERM): a process that ignored the signal would
    # be killed after the timeout and exit 137.
    for name in (stack.containers("worker")[0], stack.containers("coordinator")[0]):
        podman("stop", "-t", "30", name)
        code = podman("inspect", name, "--format", "{{.State.ExitCode}}").stdout.strip()
        assert code == "0", f"{name} exited with {code}"
