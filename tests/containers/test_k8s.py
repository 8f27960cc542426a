"""deploy/k8s/ for real: `podman kube play` runs what `kubectl apply -k deploy/k8s` applies.

As a user would: deploy/ is copied, deploy/k8s/make-secrets.sh makes the tokens (and with
`--tls` the certificates), and `kubectl kustomize` (kubectl's built-in kustomize) renders
the kustomization, once as shipped and once with its TLS component switched on. podman
plays the result: the coordinator (its claim becomes a podman volume), the worker
Deployment's four replicas as four pods, and Prometheus. The default job runs to the end,
Prometheus scrapes the coordinator and every worker, the operator's CLI on the host checks
status (the workers' token is refused for it) and runs a ring-allreduce job whose workers
push to each other's Peer port across pods (over mutual TLS in the TLS run).

What podman 4.3 (Debian bookworm) cannot do, and this test therefore adapts, nothing else:

1. Kinds it does not run: Namespace, Service, ServiceAccount, Role, RoleBinding are left
   out (kube play makes pods, volumes, config maps and secrets only). Without Services,
   the workers dial the coordinator's *pod* by its name, which podman's DNS resolves on
   the network the test creates: CODEDGD_COORDINATOR=codedgd-coordinator-pod-0:50051.
2. The downward API's `status.podIP` ("fieldPath status.podIP is either not valid or not
   supported"): POD_IP and CODEDGD_PEER_ADDRESS are dropped, and each worker advertises
   its address on the route to the coordinator, which is the same pod IP.
3. Secrets: a `kind: Secret` it plays is stored in a form its own secretKeyRef cannot read
   back ("secret ... is not valid JSON"), and a secret *volume* crashes it (nil pointer in
   VolumeFromSecret). The rendered Secrets are left out; the test creates each as a podman
   secret in the form secretKeyRef reads (a JSON object of base64 values), and writes the
   items of a secret volume to a directory mounted as a hostPath volume instead.
4. Pod discovery (kubernetes_sd_configs) needs a Kubernetes API server (and Debian's
   Prometheus is built without it): in the ConfigMap's prometheus.yml it becomes
   static_configs naming the pods, with the labels discovery would give them; the job
   names and relabel rules stay as shipped.
5. Images: `codedgd:latest` and Prometheus's upstream image become the suite's local
   builds (docker/Dockerfile, docker/prometheus/Dockerfile), as kustomize `images:` would.
6. Ports: podman 4.3 publishes every `containerPort` on the host at the same number, so
   the second worker pod fails ("bind: address already in use" on 9101). The `ports` lists
   are dropped (probes given the number for a port's name); pods still reach each other's
   ports on the network, as in a cluster.

Probes are run with `podman exec` (podman turns a livenessProbe into a healthcheck, which
needs systemd timers to repeat; there is no systemd here).

    python -m pytest -m containers tests/containers/test_k8s.py
"""

from __future__ import annotations

import base64
import copy
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.containers.support import (
    APP_IMAGE,
    PROMETHEUS_IMAGE,
    ROOT,
    Prometheus,
    build_suite_images,
    clean_env,
    default_job_rounds,
    podman,
    require_tools,
    wait_for,
)

pytestmark = pytest.mark.containers

NOT_PLAYED = {"Namespace", "Service", "ServiceAccount", "Role", "RoleBinding"}
IMAGES = {"codedgd:latest": APP_IMAGE, "quay.io/prometheus/prometheus": PROMETHEUS_IMAGE}


@dataclass
class Cluster:
    coordinator: str  # pod IP:50051, reachable from the host on podman's bridge
    prometheus: Prometheus
    workers: int
    operator_token: str
    worker_token: str
    pods: list[str]
    tls: list[str]  # the CLI's TLS flags ([] without TLS)


def _render(work: Path, tls: bool) -> Path:
    """The user's steps in a copy of deploy/: make-secrets.sh, then `kubectl kustomize`."""
    for part in ("k8s", "ec2"):
        shutil.copytree(ROOT / "deploy" / part, work / "deploy" / part)
    k8s = work / "deploy" / "k8s"
    shutil.rmtree(k8s / "secrets", ignore_errors=True)
    shutil.rmtree(k8s / "tls" / "secrets", ignore_errors=True)
    options = ["--tls"] if tls else []
    subprocess.run([str(k8s / "make-secrets.sh"), *options], check=True, capture_output=True)
    if tls:  # the switch docs/kubernetes.md tells users to flip
        kustomization = k8s / "kustomization.yaml"
        text = kustomization.read_text()
        assert "# components:\n#   - tls\n" in text
        kustomization.write_text(
            text.replace("# components:\n#   - tls\n", "components:\n  - tls\n")
        )
    rendered = work / "rendered.yaml"
    done = subprocess.run(["kubectl", "kustomize", str(k8s)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    rendered.write_text(done.stdout)
    return k8s


def _image(image: str) -> str:
    for prefix, local in IMAGES.items():
        if image == prefix or image.startswith(prefix + ":"):
            return local
    raise AssertionError(f"no local image for {image}")


def _static_prometheus_config(original: str, workers: int) -> str:
    """Adaptation 4: the same jobs and relabel rules, the pods named instead of discovered.

    Each target carries the __meta_kubernetes_* labels pod discovery would give it, so the
    shipped relabel rules (keep the `metrics` port of running pods; pod, namespace, node
    labels) run as they would in a cluster.
    """
    config = yaml.safe_load(original)
    targets = {
        "codedgd-coordinator": ["codedgd-coordinator-pod-0:9100"],
        "codedgd-worker": [f"codedgd-worker-pod-{i}:9101" for i in range(workers)],
    }
    for job in config["scrape_configs"]:
        if job["job_name"] in targets:
            del job["kubernetes_sd_configs"]
            job["static_configs"] = [
                {
                    "targets": [target],
                    "labels": {
                        "__meta_kubernetes_namespace": "codedgd",
                        "__meta_kubernetes_pod_name": target.split(":")[0],
                        "__meta_kubernetes_pod_node_name": "podman",
                        "__meta_kubernetes_pod_phase": "Running",
                        "__meta_kubernetes_pod_container_port_name": "metrics",
                    },
                }
                for target in targets[job["job_name"]]
            ]
    return str(yaml.safe_dump(config, sort_keys=False))


def for_podman(
    documents: list[dict[str, Any]], secret_dir: Path
) -> tuple[list[dict[str, Any]], int]:
    """The manifests with the adaptations of the module docstring; and the worker count.

    A secret volume becomes a hostPath volume of the secret's files, under secret_dir.
    """
    workers = next(
        d["spec"]["replicas"]
        for d in documents
        if d["kind"] == "Deployment" and d["metadata"]["name"] == "codedgd-worker"
    )
    secrets = {d["metadata"]["name"]: d for d in documents if d["kind"] == "Secret"}
    out = []
    for original in documents:
        if original["kind"] in NOT_PLAYED | {"Secret"}:  # 1, 3
            continue
        doc = copy.deepcopy(original)
        if doc["kind"] == "ConfigMap" and doc["metadata"]["name"] == "codedgd-prometheus":
            doc["data"]["prometheus.yml"] = _static_prometheus_config(  # 4
                doc["data"]["prometheus.yml"], workers
            )
        if doc["kind"] == "Deployment":
            name = doc["metadata"]["name"]
            for volume in doc["spec"]["template"]["spec"].get("volumes", []):
                if "secret" in volume:  # 3
                    volume["hostPath"] = {
                        "path": str(_secret_files(secrets, volume, secret_dir / name)),
                        "type": "Directory",
                    }
                    del volume["secret"]
            for container in doc["spec"]["template"]["spec"]["containers"]:
                container["image"] = _image(container["image"])  # 5
                container["imagePullPolicy"] = "Never"
                ports = {p["name"]: p["containerPort"] for p in container.pop("ports", [])}  # 6
                for probe in ("readinessProbe", "livenessProbe"):
                    http = container.get(probe, {}).get("httpGet")
                    if http and http["port"] in ports:
                        http["port"] = ports[http["port"]]
                env = []
                for var in container.get("env", []):
                    if var["name"] in ("POD_IP", "CODEDGD_PEER_ADDRESS"):  # 2
                        continue
                    if var["name"] == "CODEDGD_COORDINATOR":  # 1
                        host, port = var["value"].rsplit(":", 1)
                        var = {"name": var["name"], "value": f"{host}-pod-0:{port}"}
                    env.append(var)
                container["env"] = env
        out.append(doc)
    return out, workers


def _secret_files(
    secrets: dict[str, dict[str, Any]], volume: dict[str, Any], secret_dir: Path
) -> Path:
    """Adaptation 3: a secret volume's items as files (readable: hostPath has no fsGroup)."""
    source = volume["secret"]
    data = secrets[source["secretName"]]["data"]
    items = source.get("items") or [{"key": k, "path": k} for k in data]
    directory = secret_dir / volume["name"]
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o755)
    for item in items:
        path = directory / item["path"]
        path.write_bytes(base64.b64decode(data[item["key"]]))
        path.chmod(0o444)
    return directory


def _pod_ip(pod: str, network: str) -> str:
    infra = podman("pod", "inspect", pod, "--format", "{{.InfraContainerID}}").stdout.strip()
    networks = json.loads(
        podman("inspect", infra, "--format", "{{json .NetworkSettings.Networks}}").stdout
    )
    return str(networks[network]["IPAddress"])


def _volumes(documents: list[dict[str, Any]]) -> list[str]:
    """The podman volumes kube play makes for the manifests' claims and pod volumes."""
    names = [d["metadata"]["name"] for d in documents if d["kind"] == "PersistentVolumeClaim"]
    for doc in documents:
        if doc["kind"] == "Deployment":
            for volume in doc["spec"]["template"]["spec"].get("volumes", []):
                if "emptyDir" in volume:
                    names.append(volume["name"])
                elif "configMap" in volume:
                    names.append(volume["configMap"]["name"])
    return names


def _create_secrets(documents: list[dict[str, Any]], secret_dir: Path) -> None:
    """Adaptation 3: each rendered Secret as a podman secret, in the form secretKeyRef reads."""
    for secret in documents:
        if secret["kind"] == "Secret":
            name = secret["metadata"]["name"]
            path = secret_dir / f"{name}.json"
            path.write_text(json.dumps(secret["data"]))
            podman("secret", "rm", name, check=False)
            podman("secret", "create", name, str(path))


def _down(
    kube_file: Path, rendered: list[dict[str, Any]], played: list[dict[str, Any]], network: str
) -> None:
    log_dir = kube_file.parent / "logs"
    log_dir.mkdir(exist_ok=True)
    deployments = [d for d in played if d["kind"] == "Deployment"]
    for doc in deployments:
        for i in range(doc["spec"]["replicas"]):
            for container in doc["spec"]["template"]["spec"]["containers"]:
                name = f"{doc['metadata']['name']}-pod-{i}-{container['name']}"
                logs = podman("logs", name, check=False)
                (log_dir / f"{name}.log").write_text(logs.stdout + logs.stderr)
    podman("kube", "down", str(kube_file), check=False, timeout=180)
    for doc in deployments:  # what `kube down` missed (a run that failed half-way)
        for i in range(doc["spec"]["replicas"]):
            podman("pod", "rm", "-f", f"{doc['metadata']['name']}-pod-{i}", check=False)
    for volume in _volumes(played):
        podman("volume", "rm", "-f", volume, check=False)
    for secret in rendered:
        if secret["kind"] == "Secret":
            podman("secret", "rm", secret["metadata"]["name"], check=False)
    podman("network", "rm", "-f", network, check=False)
    print(f"container logs of the kube play run: {log_dir}")


@pytest.fixture(scope="module", params=["plain", "tls"])
def cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    require_tools("podman", "catatonit", "kubectl")
    build_suite_images()
    tls = request.param == "tls"
    work = tmp_path_factory.mktemp(f"k8s-{request.param}")
    k8s = _render(work, tls)
    rendered = [d for d in yaml.safe_load_all((work / "rendered.yaml").read_text()) if d]
    played, workers = for_podman(rendered, work / "secret-volumes")
    kube_file = work / "codedgd-podman.yaml"
    kube_file.write_text(yaml.safe_dump_all(played, sort_keys=False))
    network = f"codedgdk8s{os.getpid()}"
    _down(kube_file, rendered, played, network)  # leftovers of an interrupted run
    try:
        podman("network", "create", network)
        _create_secrets(rendered, work)
        podman("kube", "play", "--network", network, str(kube_file), timeout=300)
        pods = [
            f"{d['metadata']['name']}-pod-{i}"
            for d in played
            if d["kind"] == "Deployment"
            for i in range(d["spec"]["replicas"])
        ]
        prom = Prometheus(f"http://{_pod_ip('codedgd-prometheus-pod-0', network)}:9090")
        wait_for(prom.ready, timeout=120, what="Prometheus ready")
        certs = k8s / "tls" / "secrets"
        yield Cluster(
            coordinator=f"{_pod_ip('codedgd-coordinator-pod-0', network)}:50051",
            prometheus=prom,
            workers=workers,
            operator_token=(k8s / "secrets" / "operator.token").read_text(),
            worker_token=(k8s / "secrets" / "worker.token").read_text(),
            pods=pods,
            tls=[
                "--tls-ca",
                str(certs / "ca.pem"),
                "--tls-server-name",
                "coordinator.codedgd.internal",
            ]
            if tls
            else [],
        )
    finally:
        _down(kube_file, rendered, played, network)


def _cli(
    cluster: Cluster, *args: str, token: str | None, tls: bool = True
) -> subprocess.CompletedProcess[str]:
    env = clean_env(**({"CODEDGD_TOKEN": token} if token else {}))
    where = ["--coordinator", cluster.coordinator, *(cluster.tls if tls else [])]
    return subprocess.run(
        [sys.executable, "-m", "codedgd.client.cli", *args, *where],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
    )


def test_one_pod_per_replica_and_every_pod_runs(cluster: Cluster) -> None:
    assert len(cluster.pods) == 1 + cluster.workers + 1  # coordinator, workers, Prometheus
    for pod in cluster.pods:
        state = podman("pod", "inspect", pod, "--format", "{{.State}}").stdout.strip()
        assert state == "Running", f"{pod}: {state}"


def _in_pod(tls: list[str]) -> list[str]:
    """The CLI's TLS flags with the CA where the TLS component mounts it in the pods."""
    return ["/etc/codedgd/tls/ca.pem" if flag.endswith("ca.pem") else flag for flag in tls]


def test_probes_pass(cluster: Cluster) -> None:
    # The probes' own commands (`codedgd health`, `codedgd health --worker`), run in the pods.
    def healthy(container: str, *command: str) -> bool | None:
        done = podman("exec", container, *command, check=False)
        return True if done.returncode == 0 else None

    probe = ["codedgd", "health", "--coordinator", "127.0.0.1:50051", *_in_pod(cluster.tls)]
    wait_for(
        partial(healthy, "codedgd-coordinator-pod-0-coordinator", *probe),
        timeout=60,
        what="the coordinator's probe",
    )
    for i in range(cluster.workers):
        wait_for(
            partial(healthy, f"codedgd-worker-pod-{i}-worker", "codedgd", "health", "--worker"),
            timeout=90,
            what=f"worker {i}'s probe",
        )
    # The same service from the host (open without a token; with TLS, over TLS).
    health = _cli(cluster, "health", token=None)
    assert health.returncode == 0, health.stdout + health.stderr


def test_prometheus_scrapes_the_coordinator_and_every_worker(cluster: Cluster) -> None:
    cluster.prometheus.wait_for_targets(
        {"codedgd-coordinator": 1, "codedgd-worker": cluster.workers}, timeout=120
    )
    # The shipped relabel rules gave every target its pod, namespace and node.
    pods = {
        t["labels"]["pod"]
        for t in cluster.prometheus.targets()
        if t["labels"]["job"].startswith("codedgd-") and t["labels"]["namespace"] == "codedgd"
    }
    assert pods == {p for p in cluster.pods if not p.startswith("codedgd-prometheus")}


def test_default_job_completes(cluster: Cluster) -> None:
    prom = cluster.prometheus
    prom.wait_for_jobs_done(1, timeout=420)
    assert prom.value("sum(codedgd_rounds_total)") == default_job_rounds()
    assert prom.value("codedgd_workers_connected") == cluster.workers
    computed = prom.value('sum(codedgd_worker_rounds_computed_total{job="codedgd-worker"})')
    assert computed, "no worker's metrics were scraped"


def test_operator_cli_runs_a_ring_job_across_pods(cluster: Cluster) -> None:
    cluster.prometheus.wait_for_jobs_done(1, timeout=420)
    refused = _cli(cluster, "status", token=None)
    assert refused.returncode == 2 and "token" in refused.stderr
    if cluster.tls:  # the coordinator speaks TLS only
        plain = _cli(cluster, "status", token=cluster.operator_token, tls=False)
        assert plain.returncode != 0, plain.stdout
    # The workers' token (the only one a worker pod holds) cannot act as an operator.
    refused = _cli(cluster, "status", token=cluster.worker_token)
    assert refused.returncode == 2, refused.stdout
    args = ("submit", "-n", str(cluster.workers), "-r", "20", "--policy", "ring-allreduce")
    done = _cli(cluster, *args, "--watch", "--no-progress", token=cluster.operator_token)
    assert done.returncode == 0, done.stderr
    status = _cli(cluster, "status", token=cluster.operator_token)
    assert status.returncode == 0, status.stderr
    assert status.stdout.count(": done, ") == 2, status.stdout
    assert ": done, 20/20 rounds done" in status.stdout
    # Every worker pushed to its ring neighbour's Peer port, pod to pod.
    cluster.prometheus.wait_for_jobs_done(2, timeout=60)

    def pushed() -> float | None:
        value = cluster.prometheus.value(
            "count(sum by (instance) (codedgd_worker_peer_bytes_sent_total) > 0)"
        )
        return value if value == cluster.workers else None

    wait_for(pushed, timeout=60, what="peer bytes from every worker in Prometheus", interval=2)
