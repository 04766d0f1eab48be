"""docs/metrics.md is what docs/gen_metrics.py writes from node/metrics.py today, and the Grafana
dashboard (deploy/grafana/xr.json) queries only metrics the node exposes."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPOSITORY = Path(__file__).resolve().parent.parent.parent
DASHBOARD = REPOSITORY / "deploy" / "grafana" / "xr.json"
# A metric name in a PromQL expression: every xr metric starts with `xr_`.
_METRIC_NAME = re.compile(r"\bxr_[a-z0-9_]+\b")


@pytest.fixture(scope="module")
def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gen_metrics", REPOSITORY / "docs" / "gen_metrics.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # Registered before it runs: its dataclasses look their module up by name.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _queries(node: Any) -> Iterator[str]:
    """Every PromQL expression of a dashboard: panel targets and templating queries."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("expr", "definition", "query") and isinstance(value, str):
                yield value
            else:
                yield from _queries(value)
    elif isinstance(node, list):
        for item in node:
            yield from _queries(item)


def _metric_names(dashboard: Any) -> set[str]:
    return {name for query in _queries(dashboard) for name in _METRIC_NAME.findall(query)}


def test_catalogue__is_up_to_date(generator: ModuleType) -> None:
    expected = generator.render()
    actual = (REPOSITORY / "docs" / "metrics.md").read_text()
    assert actual == expected, "docs/metrics.md is out of date: run python docs/gen_metrics.py"


def test_catalogue__lists_the_metrics_the_node_documents(generator: ModuleType) -> None:
    names = {family.name for family in generator.families()}
    assert {"xr_raft_term", "xr_http_requests", "xr_jobs"} <= names
    assert "xr_http_requests_total" in generator.series_names()


def test_catalogue__lists_the_labels_a_collector_declares(generator: ModuleType) -> None:
    """The generator took labels from samples only, and the store it collects from is empty:
    the per-region gauges were listed without their labels."""
    labels = {family.name: family.labels for family in generator.families()}
    assert labels["xr_region_gpu_memory_bytes"] == ("region", "in_region", "kind")
    for name in ("xr_region_cpu_slots", "xr_region_gpus", "xr_region_tasks_running"):
        assert labels[name] == ("region", "in_region"), name
    assert labels["xr_raft_leader_changes"] == ("region",)


def test_metric_names__finds_names_in_targets_and_templating() -> None:
    dashboard = {
        "panels": [{"targets": [{"expr": "sum(rate(xr_a_total[5m])) / xr_b"}]}],
        "templating": {"list": [{"query": {"query": "label_values(xr_c, region)"}}]},
    }
    assert _metric_names(dashboard) == {"xr_a_total", "xr_b", "xr_c"}


def test_dashboard__queries_only_metrics_the_node_exposes(generator: ModuleType) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    used = _metric_names(dashboard)
    assert used, "the dashboard queries no xr metric: the checker sees nothing"
    unknown = used - generator.series_names()
    assert not unknown, f"deploy/grafana/xr.json uses metrics the node does not expose: {unknown}"
