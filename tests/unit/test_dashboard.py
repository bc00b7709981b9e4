"""The Grafana dashboard of compose/: every panel aggregates across processes (one line per kind,
state or group, not one tile per process), has a unit and thresholds, and queries only metrics
Lapse serves."""

from __future__ import annotations

import json
import re

from prometheus_client import REGISTRY, CollectorRegistry, generate_latest

import lapse.processors.metrics  # noqa: F401  (registers the processor's counters)
from lapse.kernel.settings import REPO_ROOT, load_settings
from lapse.shell.status_collector import StatusCollector
from lapse.shell.supervisor import RolesCollector, Supervisor

DASHBOARD = REPO_ROOT / "compose" / "grafana" / "dashboards" / "lapse.json"
# An aggregation over series: sum(…), max by (kind) (…), histogram_quantile(q, sum by (le) (…)), …
AGGREGATES = re.compile(r"^(histogram_quantile\([^,]+,\s*)?(sum|max|min|avg|count)\s*(by\s*\([^)]*\)\s*)?\(")
METRIC = re.compile(r"\b(lapse_[a-z_]+|up)\b")


def _panels() -> list[dict]:
    return json.loads(DASHBOARD.read_text())["panels"]


def _served_names() -> set[str]:
    """The metric families Lapse serves: the processes' own, the status samples, the roles'."""
    registry = CollectorRegistry()
    registry.register(RolesCollector(Supervisor(load_settings(), [])))
    text = generate_latest(REGISTRY).decode() + generate_latest(registry).decode()
    status = {family.name for family in StatusCollector(dict).describe()}  # no reading
    return {_family(name) for name in re.findall(r"^# TYPE (\S+) ", text, re.MULTILINE)} | status


def _family(name: str) -> str:
    return re.sub(r"_(total|bucket|count|sum|created)$", "", name)


def test_every_panel_aggregates_and_has_a_unit_and_thresholds():
    panels = _panels()
    assert len({p["id"] for p in panels}) == len(panels) >= 10
    for panel in panels:
        defaults = panel["fieldConfig"]["defaults"]
        assert defaults.get("unit"), f"{panel['title']}: no unit"
        assert defaults["thresholds"]["steps"], f"{panel['title']}: no thresholds"
        assert panel["targets"], f"{panel['title']}: no query"
        for target in panel["targets"]:
            assert AGGREGATES.match(target["expr"]), f"{panel['title']}: {target['expr']} is not aggregated"


def test_the_alarm_panels_show_the_alert_thresholds():
    by_expr = {t["expr"]: p for p in _panels() for t in p["targets"]}
    steps = by_expr["max(lapse_oldest_eligible_age_seconds)"]["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert [s["value"] for s in steps] == [None, 900, 3600]
    assert by_expr["max(lapse_oldest_eligible_age_seconds)"]["fieldConfig"]["defaults"]["unit"] == "s"


def test_every_panel_queries_a_metric_lapse_serves():
    served = _served_names() | {"up"}
    for panel in _panels():
        for target in panel["targets"]:
            for name in METRIC.findall(target["expr"]):
                assert _family(name) in served, f"{panel['title']}: {name} is not served by Lapse"
