"""Every metric the Grafana dashboard queries is one codedgd exports.

The container suite asks a real Prometheus every dashboard query; this catches a
misspelt metric name on any machine, in the default run.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import CollectorRegistry

from codedgd.services.coordinator.metrics import CoordinatorMetrics
from codedgd.services.worker.agent import WorkerAgent, WorkerOptions
from codedgd.services.worker.metrics import _AgentCollector

DASHBOARD = Path(__file__).resolve().parent.parent / "docker/grafana/dashboards/codedgd.json"
SUFFIXES = ("_bucket", "_count", "_sum", "_created")


def _exported() -> set[str]:
    names: set[str] = set()
    coordinator = CoordinatorMetrics()
    worker = CollectorRegistry()
    worker.register(_AgentCollector(WorkerAgent(WorkerOptions())))
    for registry in (coordinator.registry, worker):
        for family in registry.collect():
            names.add(family.name)
            names.update(sample.name for sample in family.samples)
    # Labelled families have no samples until a child exists: name their series too.
    for name in list(names):
        names.update(name + s for s in (*SUFFIXES, "_total"))
    return names


def test_every_metric_of_the_dashboard_is_exported() -> None:
    exprs = [
        str(target["expr"])
        for panel in json.loads(DASHBOARD.read_text())["panels"]
        for target in panel.get("targets", [])
    ]
    used = {name for expr in exprs for name in re.findall(r"\bcodedgd_[a-z0-9_]+", expr)}
    assert len(used) > 10
    missing = sorted(used - _exported())
    assert not missing, f"the dashboard queries metrics no one exports: {missing}"
