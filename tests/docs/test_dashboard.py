"""deploy/grafana/hotstate.json reads only metrics a server exposes: a renamed metric breaks this, not the
operator's dashboard."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from hotstate.controller.image import MetadataImage
from hotstate.server.http.control_metrics import ControlPlaneMetrics, ControlPlaneView, RaftView
from hotstate.server.http.metrics import Metrics

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "hotstate.json"
FUNCTIONS = {"sum", "max", "min", "rate", "by", "histogram_quantile", "le", "avg", "count"}


def _exposed() -> set[str]:
    metrics = Metrics()
    view = ControlPlaneView(1, MetadataImage.empty(), True, RaftView(1, 1, 0, 0, "leader"))
    ControlPlaneMetrics(lambda: view, metrics.registry)
    for label in ("ok",):
        metrics.queries.labels(label).inc()
        metrics.forwards.labels(label).inc()
    metrics.table_queries.labels("t").inc()
    metrics.latency.observe(0.001)
    metrics.replica_lag.labels("t", "0", "active").set(0)
    metrics.peer_alive.labels("2").set(1)
    names: set[str] = set()
    for family in text_string_to_metric_families(metrics.render().decode()):
        names.update(sample.name for sample in family.samples)
    return names


def test_every_metric_the_dashboard_reads_is_exposed() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exposed = _exposed()
    used: set[str] = set()
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            expr = re.sub(r"\{[^}]*\}|\[[^\]]*\]", "", target["expr"])  # label matchers and ranges
            for name in re.findall(r"[a-z_][a-z0-9_]*", expr):
                if name not in FUNCTIONS and not name.startswith(("outcome", "table", "partition", "state")):
                    used.add(name)
    assert used, "the dashboard reads no metric"
    assert used <= exposed, sorted(used - exposed)
    assert "kafka_controller_kafkacontroller_activecontrollercount" in used
