"""deploy/k8s/: every manifest is valid for a pinned Kubernetes version, and the pieces fit.

Schema validation is `kubernetes-validate` (PyPI; the dev extra) in strict mode, which
rejects unknown fields as well as wrong types. It needs no cluster. The rest checks what a
schema cannot: that the kustomization lists every manifest, that Services select the pods
they name, that the workers dial the coordinator's Service, that the Secret the pods read
is the one deploy/k8s/make-secrets.sh and the secretGenerator make, and that the
Prometheus configuration scrapes the jobs the Grafana dashboard queries.
tests/containers/test_k8s.py runs the same manifests with `podman kube play`.
"""

from __future__ import annotations

import base64
import copy
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "deploy" / "k8s"
# The oldest Kubernetes minor version still in standard support on EKS when this was
# written; strict validation against it also holds for the newer ones checked below.
K8S_VERSIONS = ("1.31.0", "1.34.0")
MANIFESTS = sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")


def _documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def _all() -> list[dict[str, Any]]:
    return [d for path in MANIFESTS for d in _documents(path)]


def _find(kind: str, name: str) -> dict[str, Any]:
    found = [d for d in _all() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def _kustomization() -> dict[str, Any]:
    return dict(yaml.safe_load((K8S / "kustomization.yaml").read_text()))


def _user_copy(tmp_path: Path, *options: str) -> Path:
    """deploy/ (k8s and the ec2 certificate script) copied, with make-secrets.sh run in it."""
    copy_root = tmp_path / "deploy"
    for part in ("k8s", "ec2"):
        shutil.copytree(ROOT / "deploy" / part, copy_root / part)
    shutil.rmtree(copy_root / "k8s" / "secrets", ignore_errors=True)
    shutil.rmtree(copy_root / "k8s" / "tls" / "secrets", ignore_errors=True)
    script = copy_root / "k8s" / "make-secrets.sh"
    subprocess.run([str(script), *options], check=True, capture_output=True)
    return copy_root / "k8s"


def _generated_secret(tmp_path: Path) -> dict[str, Any]:
    """The Secret kustomize's secretGenerator makes from make-secrets.sh's files."""
    k8s = _user_copy(tmp_path)
    (generator,) = _kustomization()["secretGenerator"]
    data = {}
    for entry in generator["files"]:
        key, _, path = entry.partition("=")
        assert path.startswith("secrets/"), f"{entry}: not under deploy/k8s/secrets/"
        data[key] = base64.b64encode((k8s / path).read_bytes()).decode()
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": generator["name"], "namespace": _kustomization()["namespace"]},
        "type": "Opaque",
        "data": data,
    }


def _kustomize(k8s: Path) -> list[dict[str, Any]]:
    """`kubectl kustomize` (kustomize built into kubectl), as `kubectl apply -k` renders."""
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl (with its built-in kustomize) is not installed")
    done = subprocess.run(
        ["kubectl", "kustomize", str(k8s)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d is not None]


def test_manifests_exist() -> None:
    names = {p.name for p in MANIFESTS}
    assert {"coordinator.yaml", "worker.yaml", "prometheus.yaml", "namespace.yaml"} <= names


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_every_manifest_is_valid_for_kubernetes(path: Path, version: str) -> None:
    documents = _documents(path)
    assert documents, f"{path.name} holds no manifest"
    for document in documents:
        kubernetes_validate.validate(document, version, strict=True)


def test_the_generated_secret_is_valid(tmp_path: Path) -> None:
    secret = _generated_secret(tmp_path)
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(secret, version, strict=True)
    tokens = {base64.b64decode(v) for v in secret["data"].values()}
    assert len(tokens) == 2, "the workers' and the operators' tokens must differ"
    for token in tokens:  # used as environment variables: no final newline
        assert len(token) == 64 and token.strip() == token


@pytest.mark.parametrize(
    "breakage",
    [
        lambda d: d["spec"].__setitem__("replicas", "four"),  # wrong type
        lambda d: d["spec"]["template"]["spec"].__setitem__("containres", []),  # unknown
        lambda d: d["spec"].pop("selector"),  # required field missing
    ],
    ids=["wrong-type", "unknown-field", "missing-field"],
)
def test_a_broken_manifest_is_refused(breakage: Any) -> None:
    """The validation above is not vacuous: each kind of breakage is caught."""
    broken = copy.deepcopy(_find("Deployment", "codedgd-worker"))
    breakage(broken)
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSIONS[0], strict=True)


def test_kustomization_lists_every_manifest() -> None:
    kustomization = _kustomization()
    assert sorted(kustomization["resources"]) == sorted(p.name for p in MANIFESTS)
    namespace = kustomization["namespace"]
    for document in _all():  # `kubectl apply -f` lands in the same namespace as `-k`
        if document["kind"] != "Namespace":
            assert document["metadata"].get("namespace") == namespace, document["metadata"]
    assert _find("Namespace", namespace)
    # What make-secrets.sh writes is never committed.
    assert {"/secrets/", "/tls/secrets/"} <= set((K8S / ".gitignore").read_text().split())


def test_services_select_their_pods() -> None:
    for document in _all():
        if document["kind"] != "Service":
            continue
        name = document["metadata"]["name"]
        deployment = _find("Deployment", name)
        pod = deployment["spec"]["template"]
        labels = pod["metadata"]["labels"]
        selector = document["spec"]["selector"]
        assert selector.items() <= labels.items(), f"Service {name} selects no pod"
        assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
        ports = {p["name"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
        for port in document["spec"]["ports"]:
            assert port["targetPort"] in ports, f"Service {name}: {port}"


def test_workers_dial_the_coordinator_service_and_advertise_their_peer_port() -> None:
    coordinator = _find("Deployment", "codedgd-coordinator")
    workers = _find("Deployment", "codedgd-worker")
    service = _find("Service", "codedgd-coordinator")
    (c,) = coordinator["spec"]["template"]["spec"]["containers"]
    (w,) = workers["spec"]["template"]["spec"]["containers"]
    c_env, w_env = _env(c), _env(w)
    grpc = next(p["port"] for p in service["spec"]["ports"] if p["name"] == "grpc")
    assert w_env["CODEDGD_COORDINATOR"] == f"codedgd-coordinator:{grpc}"
    assert c_env["CODEDGD_LISTEN"].endswith(f":{grpc}")
    # The default job waits for CODEDGD_WORKERS workers: as many as the Deployment runs.
    assert int(c_env["CODEDGD_WORKERS"]) == workers["spec"]["replicas"]
    # Peers dial the pod's IP (downward API) at the port the Peer service listens on.
    peer = next(p["containerPort"] for p in w["ports"] if p["name"] == "peer")
    assert w_env["CODEDGD_PEER_LISTEN"] == f"0.0.0.0:{peer}"
    assert w_env["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert w_env["CODEDGD_PEER_ADDRESS"] == f"$(POD_IP):{peer}"
    # Metrics: bound on every address, on the port the container declares as `metrics`.
    for container, env in ((c, c_env), (w, w_env)):
        metrics = next(p["containerPort"] for p in container["ports"] if p["name"] == "metrics")
        assert env["CODEDGD_METRICS_PORT"] == str(metrics)
        assert env["CODEDGD_METRICS_ADDRESS"] == "0.0.0.0"


def test_pods_read_the_generated_tokens_by_role(tmp_path: Path) -> None:
    secret = _generated_secret(tmp_path)
    refs: dict[str, dict[str, str]] = {}
    for name in ("codedgd-coordinator", "codedgd-worker"):
        (container,) = _find("Deployment", name)["spec"]["template"]["spec"]["containers"]
        for var, value in _env(container).items():
            if isinstance(value, dict) and "secretKeyRef" in value:
                ref = value["secretKeyRef"]
                assert ref["name"] == secret["metadata"]["name"]
                assert ref["key"] in secret["data"], ref
                refs.setdefault(name, {})[var] = ref["key"]
    assert refs["codedgd-coordinator"] == {
        "CODEDGD_WORKER_TOKEN": "worker-token",
        "CODEDGD_OPERATOR_TOKEN": "operator-token",
    }
    # A worker holds the workers' token only (docs/security.md).
    assert refs["codedgd-worker"] == {"CODEDGD_WORKER_TOKEN": "worker-token"}


def test_every_container_has_probes_resources_and_no_root() -> None:
    probes = {
        "codedgd-coordinator": ["codedgd", "health", "--coordinator", "127.0.0.1:50051"],
        "codedgd-worker": ["codedgd", "health", "--worker"],
    }
    for document in _all():
        if document["kind"] != "Deployment":
            continue
        name = document["metadata"]["name"]
        pod = document["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        for container in pod["containers"]:
            for kind in ("requests", "limits"):
                assert {"cpu", "memory"} <= container["resources"][kind].keys(), name
            for probe in ("readinessProbe", "livenessProbe"):
                assert probe in container, f"{name}: no {probe}"
                if name in probes:
                    assert container[probe]["exec"]["command"] == probes[name]
            assert container["securityContext"]["allowPrivilegeEscalation"] is False


def test_prometheus_discovers_the_pods_the_dashboard_queries() -> None:
    config_map = _find("ConfigMap", "codedgd-prometheus")
    config = yaml.safe_load(config_map["data"]["prometheus.yml"])
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    dashboard = (ROOT / "docker/grafana/dashboards/codedgd.json").read_text()
    queried = set(re.findall(r'job=\\"(codedgd-[a-z]+)', dashboard))
    assert queried and queried <= jobs.keys()
    for job in ("codedgd-coordinator", "codedgd-worker"):
        (sd,) = jobs[job]["kubernetes_sd_configs"]
        assert sd["role"] == "pod" and sd["namespaces"] == {"own_namespace": True}
        component = job.removeprefix("codedgd-")
        (selector,) = sd["selectors"]
        assert f"app.kubernetes.io/component={component}" in selector["label"]
        keep = jobs[job]["relabel_configs"][0]
        assert keep["source_labels"] == ["__meta_kubernetes_pod_container_port_name"]
        assert keep["regex"] == "metrics" and keep["action"] == "keep"
    # The Deployment mounts that ConfigMap where its --config.file points, with the RBAC
    # that pod discovery needs.
    deployment = _find("Deployment", "codedgd-prometheus")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    config_volume = next(n for n, v in volumes.items() if "configMap" in v)
    assert volumes[config_volume]["configMap"]["name"] == "codedgd-prometheus"
    assert f"--config.file={mounts[config_volume]}/prometheus.yml" in container["args"]
    role = _find("Role", "codedgd-prometheus")
    assert {"list", "watch"} <= set(role["rules"][0]["verbs"])
    binding = _find("RoleBinding", "codedgd-prometheus")
    assert binding["subjects"][0]["name"] == pod["serviceAccountName"]


def _by_kind(documents: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for d in documents}


def test_kustomize_renders_valid_manifests(tmp_path: Path) -> None:
    rendered = _kustomize(_user_copy(tmp_path))
    for document in rendered:
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(document, version, strict=True)
    kinds = _by_kind(rendered)
    expected = {(d["kind"], d["metadata"]["name"]) for d in _all()}
    assert kinds.keys() == expected | {("Secret", "codedgd-tokens")}
    for document in rendered:
        if document["kind"] != "Namespace":
            assert document["metadata"]["namespace"] == "codedgd"


def test_kustomize_tls_component_renders_valid_manifests(tmp_path: Path) -> None:
    k8s = _user_copy(tmp_path, "--tls")
    kustomization = (k8s / "kustomization.yaml").read_text()
    commented = "# components:\n#   - tls\n"
    assert commented in kustomization, "the TLS component's switch is not where docs say"
    (k8s / "kustomization.yaml").write_text(
        kustomization.replace(commented, "components:\n  - tls\n")
    )
    rendered = _kustomize(k8s)
    for document in rendered:
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(document, version, strict=True)
    kinds = _by_kind(rendered)
    secret = kinds["Secret", "codedgd-tls"]
    assert secret["metadata"]["namespace"] == "codedgd"
    mounts = {"codedgd-coordinator": set(), "codedgd-worker": set()}
    for name, needed in mounts.items():
        pod = kinds["Deployment", name]["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        (volume,) = [v for v in pod["volumes"] if v["name"] == "tls"]
        assert volume["secret"]["secretName"] == "codedgd-tls"
        keys = {item["key"] for item in volume["secret"]["items"]}
        assert keys <= secret["data"].keys()
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == "tls"]
        env = _env(container)
        # Every TLS file a variable names is one the volume mounts; the base env stays.
        for var, value in env.items():
            if var.startswith("CODEDGD_TLS_") and var != "CODEDGD_TLS_SERVER_NAME":
                assert value.startswith(mount["mountPath"] + "/")
                needed.add(value.removeprefix(mount["mountPath"] + "/"))
        assert needed and needed <= {item["path"] for item in volume["secret"]["items"]}
        assert "CODEDGD_WORKER_TOKEN" in env
        assert pod["securityContext"]["fsGroup"] == 10001  # reads the 0440 files
    coordinator = kinds["Deployment", "codedgd-coordinator"]["spec"]["template"]["spec"]
    probe = coordinator["containers"][0]["readinessProbe"]["exec"]["command"]
    assert probe[:4] == ["codedgd", "health", "--coordinator", "127.0.0.1:50051"]
    assert "--tls-ca" in probe
    worker = _env(
        kinds["Deployment", "codedgd-worker"]["spec"]["template"]["spec"]["containers"][0]
    )
    server_name = worker["CODEDGD_TLS_SERVER_NAME"]
    assert probe[probe.index("--tls-server-name") + 1] == server_name
    # The certificate make-secrets.sh wrote carries the name the workers verify.
    pem = (k8s / "tls" / "secrets" / "coordinator.pem").read_text()
    text = subprocess.run(
        ["openssl", "x509", "-noout", "-ext", "subjectAltName"],
        input=pem,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert f"DNS:{server_name}" in text
