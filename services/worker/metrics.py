"""Prometheus metrics of a worker process (served on --metrics-port).

The coordinator measures each worker's compute and response times per round (labelled by
the worker's plan index); these are the worker's own totals, read at scrape time. Every
replica of a scaled worker service exports the same names, told apart by Prometheus's
``instance`` label; ``codedgd_worker_index`` maps an instance to the coordinator's
``worker`` label.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from codedgd.services.metrics_endpoint import MetricsSecurity, serve_metrics
from codedgd.services.worker.agent import WorkerAgent


class _AgentCollector(Collector):
    """Reads the agent's counters at scrape time (no bookkeeping on the hot path)."""

    def __init__(self, agent: WorkerAgent) -> None:
        self.agent = agent

    def collect(self):  # type: ignore[no-untyped-def]
        a = self.agent
        stats = a.stats
        yield CounterMetricFamily(
            "codedgd_worker_rounds_computed_total",
            "Rounds whose result this worker sent.",
            value=stats.rounds_computed,
        )
        yield CounterMetricFamily(
            "codedgd_worker_rounds_cancelled_total",
            "Rounds cancelled while this worker computed or waited.",
            value=stats.rounds_cancelled,
        )
        yield CounterMetricFamily(
            "codedgd_worker_compute_seconds_total",
            "Seconds spent computing gradients.",
            value=stats.compute_seconds_total,
        )
        yield CounterMetricFamily(
            "codedgd_worker_delay_seconds_total",
            "Seconds of injected straggler delay.",
            value=stats.delay_seconds_total,
        )
        yield CounterMetricFamily(
            "codedgd_worker_bytes_sent_total",
            "Result payload bytes sent.",
            value=stats.bytes_sent_total,
        )
        yield CounterMetricFamily(
            "codedgd_worker_uploads_skipped_total",
            "Rounds whose result this worker computed but did not upload (lag-wk trigger).",
            value=stats.uploads_skipped,
        )
        yield CounterMetricFamily(
            "codedgd_worker_crashes_total",
            "Times this worker dropped its connection because the job's straggler model "
            "(crash) said so.",
            value=stats.crashes,
        )
        yield GaugeMetricFamily(
            "codedgd_worker_connected",
            "1 while the stream to the coordinator is open.",
            value=1.0 if a.connected else 0.0,
        )
        families = {
            "bytes_sent": CounterMetricFamily(
                "codedgd_worker_peer_bytes_sent",
                "Bytes this worker pushed to its peers (ring and tree jobs), by its role.",
                labels=["role"],
            ),
            "bytes_received": CounterMetricFamily(
                "codedgd_worker_peer_bytes_received",
                "Tensor bytes this worker received from its peers, by its role.",
                labels=["role"],
            ),
            "wait_seconds": CounterMetricFamily(
                "codedgd_worker_peer_wait_seconds",
                "Seconds blocked on peers' data with its own part ready, by its role "
                "(a tree's role names its level).",
                labels=["role"],
            ),
            "children_cancelled": CounterMetricFamily(
                "codedgd_worker_children_cancelled",
                "Children a tree node told to stop: slower than the set it decoded.",
                labels=["role"],
            ),
        }
        for role, totals in sorted(stats.peers.items()):
            for key, family in families.items():
                family.add_metric([role], float(getattr(totals, key)))
        yield from families.values()
        refused = CounterMetricFamily(
            "codedgd_worker_peer_pushes_refused",
            "Peers' pushes this worker refused, by reason: credential (a call without its "
            "job's peer credential, refused before any message is read), malformed (a "
            "bad frame, sender, stage, step or shape, or a round too far ahead: the call "
            "is ended), stale (chunks of an older round or attempt, dropped).",
            labels=["reason"],
        )
        server = a.peer_server
        refused.add_metric(["credential"], float(server.refused if server else 0))
        refused.add_metric(["malformed"], float(server.rejected if server else 0))
        refused.add_metric(["stale"], float(stats.peer_chunks_stale))
        yield refused
        index = a.rounds.worker_index
        yield GaugeMetricFamily(
            "codedgd_worker_index",
            "This worker's index in the running job's plan (the coordinator's worker label); "
            "-1 without a job.",
            value=float(index) if index is not None else -1.0,
        )


def serve_worker_metrics(
    agent: WorkerAgent,
    port: int,
    address: str = "127.0.0.1",
    security: MetricsSecurity | None = None,
) -> int:
    """Serve the agent's metrics on ``address:port``; the bound port.

    ``security`` adds HTTPS and basic auth (codedgd.services.metrics_endpoint). A port
    out of range or in use is a ConfigError naming it.
    """
    registry = CollectorRegistry()
    registry.register(_AgentCollector(agent))
    server = serve_metrics(registry, port, address, security=security)
    return int(server.server_address[1])
