"""The alert rules and the dashboard: every expression parses (promql-parser, a real PromQL
parser) and every metric it uses is one a duetime role exports."""

from __future__ import annotations

import importlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml
from prometheus_client import REGISTRY

ROOT = Path(__file__).resolve().parents[2]
PROM = ROOT / "infra" / "prometheus"
METRIC_MODULES = [
    "duetime.schedulers.metrics",
    "duetime.consumers.worker.metrics",
    "duetime.consumers.resolver.metrics",
    "duetime.consumers.projector.metrics",
    "duetime.producers.api.metrics",
]


def exported_names() -> set[str]:
    for module in METRIC_MODULES:
        importlib.import_module(module)
    names: set[str] = set()
    for collector in list(REGISTRY._collector_to_names):  # every registered collector
        for family in collector.collect():
            names.add(family.name)
            for sample in family.samples:
                names.add(sample.name)
        names.update(REGISTRY._collector_to_names[collector])
    return names


def selectors(node: Any) -> Iterator[str]:
    """Every metric name a parsed PromQL expression selects."""
    name = getattr(node, "name", None)
    if type(node).__name__ == "VectorSelector" and name:
        yield name
    for attr in ("lhs", "rhs", "expr", "param", "vector_selector"):
        child = getattr(node, attr, None)
        if child is not None and not isinstance(child, str | int | float):
            yield from selectors(child)
    for arg in getattr(node, "args", None) or []:
        yield from selectors(arg)


def rule_exprs() -> list[tuple[str, str]]:
    rules = yaml.safe_load((PROM / "alerts.yml").read_text())
    return [(r["alert"], r["expr"]) for g in rules["groups"] for r in g["rules"]]


def dashboard_exprs() -> list[tuple[str, str]]:
    dash = json.loads((PROM / "grafana-dashboard.json").read_text())
    return [(p["title"], t["expr"]) for p in dash["panels"] for t in p["targets"]]


@pytest.mark.parametrize(("name", "expr"), rule_exprs() + dashboard_exprs())
def test_expression_parses_and_uses_exported_metrics(name: str, expr: str) -> None:
    parsed = promql_parser.parse(expr)
    used = set(selectors(parsed))
    assert used, f"{name}: no metric found in {expr!r}"
    missing = used - exported_names()
    assert not missing, f"{name}: metrics not exported by any role: {sorted(missing)}"


def test_rules_have_the_required_alerts() -> None:
    names = {n for n, _ in rule_exprs()}
    assert {
        "DuetimeDeadLetterDepthHigh",
        "DuetimeStartLatenessP99Over5s",
        "DuetimeWorkerLagGrowing",
        "DuetimePartitionWithoutScheduler",
    } <= names


def test_prometheus_config_loads_the_rules() -> None:
    config = yaml.safe_load((PROM / "prometheus.yml").read_text())
    assert config["rule_files"] == ["alerts.yml"]
    for target in config["scrape_configs"][0]["static_configs"][0]["targets"]:
        assert target.startswith("127.0.0.1:")
