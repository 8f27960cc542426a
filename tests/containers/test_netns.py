"""The EC2 layout on one machine: every host in its own network namespace.

A switch namespace holds a bridge; the coordinator (10.77.0.1), six workers
(10.77.0.11-16) and Prometheus (10.77.0.9) each get a namespace, a veth into the bridge
and their own address; each worker's link is shaped by a tbf qdisc. The coordinator and
workers are configured exactly as deploy/ec2 configures the containers: from
deploy/ec2/coordinator.env and worker.env, with TLS and a token made by
deploy/ec2/make-certs.sh, the workers verifying the certificate's name
(coordinator.codedgd.internal) while dialing an IP. Prometheus (Debian's) scrapes them all.
No traffic leaves the namespaces this test creates; they are deleted at the end.

What this does not test: AWS itself (security groups, ec2_sd_configs, cloud-init, ECR).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.containers.support import (
    ROOT,
    Prometheus,
    clean_env,
    netns_http_get,
    queries_without_data,
    require_tools,
)

pytestmark = pytest.mark.containers

EC2 = ROOT / "deploy" / "ec2"
SUBNET = "10.77.0"
COORDINATOR_IP = f"{SUBNET}.1"
PROMETHEUS_IP = f"{SUBNET}.9"
WORKER_IPS = [f"{SUBNET}.{11 + i}" for i in range(6)]
ROUNDS = 120
WORKER_LINK = "200mbit"  # tbf rate of each worker's link, both directions


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def in_ns(ns: str, *args: str) -> str:
    done = subprocess.run(
        ["ip", "netns", "exec", ns, *args], check=True, capture_output=True, text=True
    )
    return done.stdout


def read_env_file(path: Path) -> dict[str, str]:
    env: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, value = line.split("=", 1)
            env[key] = value
    return env


@dataclass
class Cluster:
    prefix: str
    switch: str
    prometheus: Prometheus
    coordinator_ns: str
    worker_ns: list[str]
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    namespaces: list[str] = field(default_factory=list)
    logs: str = ""


def _add_host(switch: str, ns: str, port: str, address: str, rate: str | None) -> None:
    ip("netns", "add", ns)
    ip("-n", switch, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
    ip("-n", switch, "link", "set", port, "master", "br0", "up")
    ip("-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
    ip("-n", ns, "link", "set", "eth0", "up")
    ip("-n", ns, "link", "set", "lo", "up")
    if rate:
        for where, dev in ((ns, "eth0"), (switch, port)):  # uploads, then downloads
            in_ns(
                where,
                "tc",
                "qdisc",
                "add",
                "dev",
                dev,
                "root",
                "tbf",
                "rate",
                rate,
                "burst",
                "256kb",
                "latency",
                "100ms",
            )


def _start(
    cluster: Cluster, name: str, ns: str, argv: list[str], env: dict[str, str], logs: Path
) -> None:
    log = (logs / f"{name}.log").open("wb")
    cluster.processes[name] = subprocess.Popen(
        ["ip", "netns", "exec", ns, *argv],
        env=env,
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def _ec2_env(path: Path, secrets_dir: Path, **overrides: str) -> dict[str, str]:
    """An env file of deploy/ec2 with the container paths mapped onto this machine."""
    env = {}
    for key, value in read_env_file(path).items():
        value = value.replace("/etc/codedgd/secrets/", f"{secrets_dir}/")
        value = value.replace("/etc/codedgd/jobs/", f"{ROOT}/docker/jobs/")
        value = value.replace("/var/lib/codedgd/state", f"{secrets_dir.parent}/state")
        env[key] = value
    env.update(overrides)
    return env


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    require_tools("ip", "tc", "openssl", "prometheus")
    tmp = tmp_path_factory.mktemp("netns")
    prefix = f"cdg{os.getpid() % 100000}"
    switch = f"{prefix}-sw"
    c = Cluster(
        prefix=prefix,
        switch=switch,
        prometheus=Prometheus(f"http://{PROMETHEUS_IP}:9090", netns_http_get(f"{prefix}-prom")),
        coordinator_ns=f"{prefix}-coord",
        worker_ns=[f"{prefix}-w{i}" for i in range(len(WORKER_IPS))],
        logs=str(tmp),
    )
    try:
        ip("netns", "add", switch)
        c.namespaces.append(switch)
        ip("-n", switch, "link", "add", "br0", "type", "bridge")
        ip("-n", switch, "link", "set", "br0", "up")
        hosts: list[tuple[str, str, str, str | None]] = [
            (c.coordinator_ns, "pc", COORDINATOR_IP, None)
        ]
        hosts += [
            (ns, f"pw{i}", a, WORKER_LINK)
            for i, (ns, a) in enumerate(zip(c.worker_ns, WORKER_IPS, strict=True))
        ]
        hosts.append((f"{prefix}-prom", "pp", PROMETHEUS_IP, None))
        for ns, port, address, rate in hosts:
            c.namespaces.append(ns)
            _add_host(switch, ns, port, address, rate)

        secrets_dir = tmp / "secrets"
        subprocess.run(
            [str(EC2 / "make-certs.sh"), str(secrets_dir), "coordinator.codedgd.internal"],
            check=True,
            capture_output=True,
        )
        cli = [sys.executable, "-m", "codedgd.client.cli"]
        coord_env = _ec2_env(
            EC2 / "coordinator.env",
            secrets_dir,
            CODEDGD_ROUNDS=str(ROUNDS),
            CODEDGD_WORKERS=str(len(WORKER_IPS)),
        )
        _start(
            c, "coordinator", c.coordinator_ns, [*cli, "coordinator"], clean_env(**coord_env), tmp
        )
        for i, ns in enumerate(c.worker_ns):
            worker_env = _ec2_env(
                EC2 / "worker.env",
                secrets_dir,
                CODEDGD_COORDINATOR=f"{COORDINATOR_IP}:50051",
                CODEDGD_NAME=f"host-w{i}",
                CODEDGD_PEER_ADDRESS=f"{WORKER_IPS[i]}:50052",
            )
            _start(c, f"worker{i}", ns, [*cli, "worker"], clean_env(**worker_env), tmp)

        config = tmp / "prometheus.yml"
        workers = ", ".join(f'"{a}:9101"' for a in WORKER_IPS)
        config.write_text(
            "global: {scrape_interval: 2s, scrape_timeout: 2s}\n"
            "scrape_configs:\n"
            f"  - {{job_name: codedgd-coordinator, static_configs: "
            f'[{{targets: ["{COORDINATOR_IP}:9100"]}}]}}\n'
            f"  - {{job_name: codedgd-worker, static_configs: [{{targets: [{workers}]}}]}}\n"
        )
        prometheus = shutil.which("prometheus")
        assert prometheus is not None
        _start(
            c,
            "prometheus",
            f"{prefix}-prom",
            [
                prometheus,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp / 'tsdb'}",
                f"--web.listen-address={PROMETHEUS_IP}:9090",
            ],
            clean_env(),
            tmp,
        )
        yield c
    finally:
        _stop_all(c)
        for ns in reversed(c.namespaces):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        print(f"logs of the network-namespace cluster: {tmp}")


def _stop_all(c: Cluster) -> None:
    for proc in c.processes.values():
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in c.processes.values():
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_job_completes_across_namespaces(cluster: Cluster) -> None:
    prom = cluster.prometheus
    prom.wait_for_targets({"codedgd-coordinator": 1, "codedgd-worker": 6}, timeout=120)
    prom.wait_for_jobs_done(1, timeout=300)
    assert prom.value("sum(codedgd_rounds_total)") == ROUNDS
    assert prom.value("codedgd_workers_connected") == len(WORKER_IPS)
    # Each worker's own endpoint, scraped over its shaped link, counted its results.
    for address in WORKER_IPS:
        computed = prom.value(f'codedgd_worker_rounds_computed_total{{instance="{address}:9101"}}')
        assert computed is not None and computed > 0


def test_ring_and_codedreduce_jobs_run_over_the_workers_peer_links(
    cluster: Cluster,
) -> None:
    """Submitted as an operator would, with deploy/ec2's TLS and token: the workers push
    to each other on their peer port (50052, deploy/ec2/worker.env) across the bridge."""
    prom = cluster.prometheus
    prom.wait_for_jobs_done(1, timeout=300)
    secrets = Path(cluster.logs) / "secrets"  # made by deploy/ec2/make-certs.sh
    cli = [sys.executable, "-m", "codedgd.client.cli", "submit", "--watch", "--no-progress"]
    auth = [
        "--coordinator",
        f"{COORDINATOR_IP}:50051",
        "--tls-ca",
        str(secrets / "ca.pem"),
        "--tls-server-name",
        "coordinator.codedgd.internal",
        "--token-file",
        str(secrets / "operator.token"),
    ]
    jobs = [
        ["-n", "6", "-r", "10", "--policy", "ring-allreduce"],
        ["-n", "6", "-r", "10", "--policy", "codedreduce", "--param", "fanout=2"],
    ]
    for done, job in enumerate(jobs, start=2):
        out = subprocess.run(
            ["ip", "netns", "exec", cluster.coordinator_ns, *cli, *job, *auth],
            capture_output=True,
            text=True,
            timeout=300,
            env=clean_env(),
            cwd=ROOT,
        )
        assert out.returncode == 0, out.stderr
        prom.wait_for_jobs_done(done, timeout=120)
    for policy in ("ring-allreduce", "codedreduce"):
        assert prom.value(f'sum(codedgd_rounds_total{{policy="{policy}"}})') == 10
    pushed = prom.value("sum(codedgd_worker_peer_bytes_sent_total)")
    assert pushed is not None and pushed > 0


def test_a_worker_whose_link_is_cut_mid_job_is_dropped_and_the_job_goes_on(
    cluster: Cluster,
) -> None:
    """The cable of worker 0 is pulled (its veth port on the switch goes down) while a job
    runs: no FIN, no RST, the worker just falls silent. The coordinator drops it (gRPC's
    keepalive or, at the latest, --worker-timeout's watchdog), the tolerant job finishes
    every round without it, and once the link is back the worker reconnects on its own."""
    prom = cluster.prometheus
    prom.wait_for_jobs_done(3, timeout=300)  # the jobs of the tests before
    secrets = Path(cluster.logs) / "secrets"
    rounds = 400
    submit = [
        sys.executable, "-m", "codedgd.client.cli", "submit", "--watch", "--no-progress",
        "-n", "6", "-r", str(rounds), "--policy", "ignore-stragglers", "--param", "s=1",
        "--stragglers", "exponential", "--straggler-opt", "mean=0.05",
        "--coordinator", f"{COORDINATOR_IP}:50051", "--tls-ca", str(secrets / "ca.pem"),
        "--tls-server-name", "coordinator.codedgd.internal",
        "--token-file", str(secrets / "operator.token"),
    ]  # fmt: skip
    # Dropped as silent by the watchdog, or as lost when gRPC's keepalive gives up first.
    dropped_query = 'sum(codedgd_stragglers_total{reason=~"silent|lost"})'
    before = prom.value(dropped_query) or 0.0
    # The default job (deploy/ec2) ran ignore-stragglers too: count this job's rounds.
    rounds_query = 'sum(codedgd_rounds_total{policy="ignore-stragglers"})'
    rounds_before = prom.value(rounds_query) or 0.0
    job = subprocess.Popen(
        ["ip", "netns", "exec", cluster.coordinator_ns, *submit],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(),
        cwd=ROOT,
    )
    try:
        deadline = time.monotonic() + 60
        while (prom.value(rounds_query) or 0.0) < rounds_before + 5:
            assert job.poll() is None, job.communicate()
            assert time.monotonic() < deadline, "the job did not start"
            time.sleep(0.5)
        ip("-n", cluster.switch, "link", "set", "pw0", "down")
        _out, err = job.communicate(timeout=180)
        assert job.returncode == 0, err
    finally:
        ip("-n", cluster.switch, "link", "set", "pw0", "up")
        if job.poll() is None:
            job.kill()
    prom.wait_for_jobs_done(4, timeout=60)
    assert prom.value(rounds_query) == rounds_before + rounds
    deadline = time.monotonic() + 60
    while (prom.value(dropped_query) or 0.0) <= before:
        assert time.monotonic() < deadline, "the cut worker was never dropped"
        time.sleep(1)
    # Reconnected: all six connected again (it backs off up to 10 s between tries).
    deadline = time.monotonic() + 90
    while prom.value("codedgd_workers_connected") != len(WORKER_IPS):
        assert time.monotonic() < deadline, "the cut worker did not come back"
        time.sleep(1)


def test_prometheus_scrapes_every_host_and_dashboard_queries_answer(cluster: Cluster) -> None:
    prom = cluster.prometheus
    prom.wait_for_jobs_done(1, timeout=300)
    prom.wait_for_targets({"codedgd-coordinator": 1, "codedgd-worker": 6}, timeout=60)
    end = time.time()
    assert queries_without_data(prom, end - 600, end) == []


def test_traffic_went_through_the_shaped_links(cluster: Cluster) -> None:
    cluster.prometheus.wait_for_jobs_done(1, timeout=300)
    for ns in cluster.worker_ns:
        stats = in_ns(ns, "tc", "-s", "qdisc", "show", "dev", "eth0")
        assert "tbf" in stats
        match = re.search(r"Sent (\d+) bytes", stats)
        assert match and int(match.group(1)) > 0, stats


def test_sigterm_stops_the_coordinator_and_its_workers(cluster: Cluster) -> None:
    cluster.prometheus.wait_for_jobs_done(1, timeout=300)
    coordinator = cluster.processes["coordinator"]
    coordinator.send_signal(signal.SIGTERM)
    assert coordinator.wait(timeout=60) == 0
    # The workers outlive their coordinator, reconnecting with backoff until one is back
    # (a restarted coordinator resumes its jobs); SIGTERM ends each with status 0.
    workers = [cluster.processes[f"worker{i}"] for i in range(len(WORKER_IPS))]
    time.sleep(3)
    assert all(w.poll() is None for w in workers)
    for w in workers:
        w.send_signal(signal.SIGTERM)
    for w in workers:
        assert w.wait(timeout=60) == 0
