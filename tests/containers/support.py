"""Helpers of the container suite: podman, base images, Prometheus's HTTP API, the dashboard.

The suite runs the project the way users do: the real Dockerfile built by podman, the real
docker-compose.yml run by podman-compose, Debian's Prometheus, and every query of the
Grafana dashboard JSON asked of that Prometheus.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "docker" / "grafana" / "dashboards" / "codedgd.json"
COMPOSE_FILE = ROOT / "docker-compose.yml"
DEFAULT_JOB = ROOT / "docker" / "jobs" / "default.toml"
# Grafana's $__rate_interval is at least four scrape intervals; the suite's Prometheus
# scrapes every 5 s (compose) or 2 s (network namespaces).
RATE_INTERVAL = "20s"
CONTAINERS_CONF = """\
[containers]
default_ulimits = []
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
"""

T = TypeVar("T")


def missing(reason: str) -> None:
    """Skip, or fail when the CI asked for the suite (CODEDGD_CONTAINERS_REQUIRED=1)."""
    if os.environ.get("CODEDGD_CONTAINERS_REQUIRED") == "1":
        pytest.fail(f"container suite required but {reason}")
    pytest.skip(reason)


def require_tools(*tools: str) -> None:
    absent = [t for t in tools if shutil.which(t) is None]
    if absent:
        missing(f"missing tools: {', '.join(absent)} (scripts/ci_containers.sh installs them)")
    if os.geteuid() != 0:
        missing("needs root (podman networks, network namespaces)")


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without any CODEDGD_* variable, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CODEDGD_")}
    env.update(extra)
    return env


def wait_for(
    probe: Callable[[], T | None], *, timeout: float, what: str, interval: float = 1.0
) -> T:
    """Poll ``probe`` until it returns something other than None (or fail saying ``what``)."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            value = probe()
            if value is not None:
                return value
        except Exception as exc:  # a service still starting: keep polling
            last_error = exc
        if time.monotonic() > deadline:
            detail = f" (last error: {last_error})" if last_error else ""
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}{detail}")
        time.sleep(interval)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def default_job_rounds() -> int:
    import tomllib

    return int(tomllib.loads(DEFAULT_JOB.read_text())["job"]["rounds"])


# ------------------------------------------------------------------ dashboard


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target of the Grafana dashboard, variables filled in."""
    doc = json.loads(DASHBOARD.read_text())
    out: list[tuple[str, str]] = []
    for panel in doc["panels"]:
        for target in panel.get("targets", []):
            expr = str(target["expr"]).replace("$__rate_interval", RATE_INTERVAL)
            assert "$" not in expr, f"unhandled Grafana variable in {panel['title']!r}: {expr}"
            out.append((str(panel["title"]), expr))
    return out


# ------------------------------------------------------------------ Prometheus


Fetch = Callable[[str], str]


def http_get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


def netns_http_get(netns: str) -> Fetch:
    """A fetch that runs inside network namespace ``netns`` (the test stays outside it)."""
    code = (
        "import sys, urllib.request; "
        "sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())"
    )

    def fetch(url: str) -> str:
        done = subprocess.run(
            ["ip", "netns", "exec", netns, sys.executable, "-c", code, url],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if done.returncode != 0:
            raise OSError(f"GET {url} in {netns}: {done.stderr.strip()[-300:]}")
        return done.stdout

    return fetch


class Prometheus:
    """The few calls of Prometheus's HTTP API the suite needs."""

    def __init__(self, base_url: str, fetch: Fetch = http_get) -> None:
        self.base = base_url.rstrip("/")
        self.fetch = fetch

    def api(self, path: str, **params: Any) -> Any:
        url = f"{self.base}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        doc = json.loads(self.fetch(url))
        if doc.get("status") != "success":
            raise AssertionError(f"Prometheus {path} {params}: {doc}")
        return doc["data"]

    def ready(self) -> bool | None:
        self.fetch(f"{self.base}/-/ready")
        return True

    def targets(self) -> list[dict[str, Any]]:
        return list(self.api("targets", state="active")["activeTargets"])

    def up_targets(self, job: str) -> int:
        return sum(1 for t in self.targets() if t["labels"]["job"] == job and t["health"] == "up")

    def value(self, query: str) -> float | None:
        """The single value of an instant query, or None when it returns no series."""
        result = self.api("query", query=query)["result"]
        if not result:
            return None
        assert len(result) == 1, f"{query} returned {len(result)} series"
        return float(result[0]["value"][1])

    def range(self, query: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        data = self.api("query_range", query=query, start=start, end=end, step=step)
        return list(data["result"])

    def has_data(self, query: str, start: float, end: float, step: float = 5.0) -> bool:
        """Whether ``query`` has at least one finite sample in [start, end]."""
        return any(
            math.isfinite(float(v))
            for series in self.range(query, start, end, step)
            for _t, v in series["values"]
        )

    def wait_for_targets(self, jobs: dict[str, int], timeout: float) -> None:
        def all_up() -> bool | None:
            return True if all(self.up_targets(j) == n for j, n in jobs.items()) else None

        wait_for(all_up, timeout=timeout, what=f"Prometheus targets up: {jobs}")

    def wait_for_jobs_done(self, count: int, timeout: float) -> None:
        """Wait until the coordinator reports ``count`` finished jobs; fail on a failed one."""

        def done() -> bool | None:
            failed = self.value('sum(codedgd_jobs_total{state=~"failed|cancelled"})')
            assert not failed, "a job failed or was cancelled: see the coordinator's log"
            finished = self.value('sum(codedgd_jobs_total{state="done"})')
            return True if finished is not None and finished >= count else None

        wait_for(done, timeout=timeout, what=f"{count} finished job(s) in Prometheus", interval=2)


def queries_without_data(prom: Prometheus, start: float, end: float) -> list[str]:
    return [
        f"{title}: {expr}"
        for title, expr in dashboard_queries()
        if not prom.has_data(expr, start, end)
    ]


def save_chart(prom: Prometheus, start: float, end: float, path: Path) -> None:
    """Plot a real run's series from Prometheus (docs/img/compose-run.png is made this way)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    q = RATE_INTERVAL
    panels = [
        (
            "round time by policy (s)",
            [
                (
                    f"p{int(p * 100)}",
                    f"histogram_quantile({p}, sum by (policy, le) "
                    f"(rate(codedgd_round_duration_seconds_bucket[{q}])))",
                )
                for p in (0.5, 0.9, 0.99)
            ],
        ),
        (
            "worker response time p90 (s)",
            [
                (
                    "worker {worker}",
                    "histogram_quantile(0.9, sum by (worker, le) "
                    f"(rate(codedgd_worker_response_seconds_bucket[{q}])))",
                )
            ],
        ),
        (
            "stragglers per second",
            [("{reason}", f"sum by (reason) (rate(codedgd_stragglers_total[{q}]))")],
        ),
        ("training loss", [("loss", "codedgd_loss")]),
    ]
    fig, axes = plt.subplots(len(panels), 1, figsize=(8, 2.3 * len(panels)), sharex=True)
    for ax, (title, queries) in zip(axes, panels, strict=True):
        for label, query in queries:
            for series in prom.range(query, start, end, 2.0):
                xs = [float(t) - start for t, _v in series["values"]]
                ys = [float(v) for _t, v in series["values"]]
                ax.plot(xs, ys, label=label.format(**series["metric"]))
        ax.set_title(title, fontsize=9, loc="left")
        ax.legend(fontsize=7, loc="upper right")
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("seconds since `podman-compose up` (scraped every 5 s)")
    fig.suptitle("codedgd under docker-compose.yml: 3 workers, data from Prometheus", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------ podman


def podman_env() -> dict[str, str]:
    """Environment for podman: CONTAINERS_CONF with runc and no default ulimits."""
    env = clean_env()
    if "CONTAINERS_CONF" not in env:
        conf = Path(tempfile.gettempdir()) / "codedgd-containers.conf"
        if not conf.exists() or conf.read_text() != CONTAINERS_CONF:
            conf.write_text(CONTAINERS_CONF)
        env["CONTAINERS_CONF"] = str(conf)
    return env


def podman(
    *args: str, check: bool = True, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        ["podman", *args], env=podman_env(), capture_output=True, text=True, timeout=timeout
    )
    if check and done.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return done


def from_image(dockerfile: Path) -> str:
    """The default of the Dockerfile's FROM argument (``ARG X=image``)."""
    match = re.search(r"^ARG \w+_IMAGE=(\S+)", dockerfile.read_text(), re.MULTILINE)
    assert match, f"{dockerfile} has no ARG *_IMAGE=..."
    return match.group(1)


def ensure_base_images(images: list[str]) -> None:
    """Make the FROM images exist locally, built from Debian packages if they do not.

    No registry can be pulled from on these machines: a Debian bookworm root file system
    (python3 is 3.11 there) is imported under the names the Dockerfiles use, so the
    Dockerfiles stay the ones users build.
    """
    absent = [i for i in images if podman("image", "exists", i, check=False).returncode != 0]
    if not absent:
        return
    if shutil.which("debootstrap") is None:
        missing(f"base images {absent} absent and debootstrap not installed")
    with tempfile.TemporaryDirectory(prefix="codedgd-rootfs-", dir="/var/tmp") as tmp:
        rootfs = Path(tmp) / "rootfs"
        subprocess.run(
            [
                "debootstrap",
                "--variant=minbase",
                "--include=python3,python3-venv,ca-certificates",
                "bookworm",
                str(rootfs),
            ],
            check=True,
            capture_output=True,
            timeout=900,
        )
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        subprocess.run(
            ["podman", "import", "-", absent[0]],
            stdin=tar.stdout,
            env=podman_env(),
            check=True,
            capture_output=True,
            timeout=600,
        )
        tar.wait()
    for image in absent[1:]:
        podman("tag", absent[0], image)


def build(tag: str, dockerfile: Path, context: Path, *options: str) -> None:
    """``podman build`` with the host network and CA certificates (for pip and apt), and
    ``options`` (``--build-arg``, ``-v``) as given."""
    podman(
        "build",
        "--network",
        "host",
        "-v",
        "/etc/ssl/certs:/etc/ssl/certs:ro",
        *options,
        "-f",
        str(dockerfile),
        "-t",
        tag,
        str(context),
        timeout=1200,
    )


def compose_image(service: str) -> str:
    """The image docker-compose.yml gives ``service`` by default (its ``${VAR:-default}``)."""
    import re

    text = COMPOSE_FILE.read_text()
    block = text.split(f"\n  {service}:\n", 1)[1]
    match = re.search(r"image: \$\{\w+:-([^}]+)\}", block)
    assert match, f"no default image for {service} in {COMPOSE_FILE}"
    return match.group(1)


def ensure_grafana_standin() -> str:
    """Sandbox-only: Grafana's image cannot be pulled here, so a stand-in
    (tests/containers/grafana_standin) is built under the very name docker-compose.yml
    uses, and `compose up` runs as written. Returns that name."""
    name = compose_image("grafana")
    if podman("image", "exists", name, check=False).returncode != 0:
        standin = Path(__file__).resolve().parent / "grafana_standin"
        ensure_base_images([from_image(standin / "Dockerfile")])
        build(name, standin / "Dockerfile", standin)
    return name


# The images the suite runs, under the tags test_compose.py also builds.
APP_IMAGE = "localhost/codedgd:containers-test"
PROMETHEUS_IMAGE = "localhost/codedgd-prometheus:containers-test"
_BUILT: set[str] = set()


def build_suite_images() -> None:
    """APP_IMAGE and PROMETHEUS_IMAGE from the project's Dockerfiles, once per test session.

    For module fixtures (tests/containers/test_k8s.py): a second module needing the same
    images builds nothing more. A build after another (test_compose.py's own) reuses
    podman's layer cache and takes seconds.
    """
    app = ROOT / "docker" / "Dockerfile"
    prom = ROOT / "docker" / "prometheus" / "Dockerfile"
    todo = [(t, f) for t, f in ((APP_IMAGE, app), (PROMETHEUS_IMAGE, prom)) if t not in _BUILT]
    if not todo:
        return
    ensure_base_images([from_image(f) for _t, f in todo])
    for tag, dockerfile in todo:
        build(tag, dockerfile, ROOT if dockerfile == app else dockerfile.parent)
        _BUILT.add(tag)
