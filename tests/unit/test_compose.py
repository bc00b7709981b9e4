"""compose/ is consistent with the code: every LAPSE_<SECTION>__<FIELD> variable names a field of
that Settings section, topics.yaml
fits the three brokers, each image is pinned, and Prometheus scrapes what serves metrics.
(Docker cannot run here; see compose/README.md.)"""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from lapse.kernel.settings import ENV_NESTED_DELIMITER, ENV_PREFIX, REPO_ROOT, env_var, field_info
from lapse.kernel.topology import load_topology

COMPOSE = REPO_ROOT / "compose"


def _compose() -> dict:
    return yaml.safe_load((COMPOSE / "docker-compose.yml").read_text())


def _lapse_vars(env: dict) -> set[str]:
    return {k for k in env if k.startswith("LAPSE_")}


def _names_a_field(var: str) -> bool:
    """`LAPSE_<SECTION>__<FIELD>` where FIELD is a field of the Settings section SECTION."""
    section, delimiter, name = var.removeprefix(ENV_PREFIX).lower().partition(ENV_NESTED_DELIMITER)
    path = f"{section}.{name}"
    try:
        field_info(path)
    except KeyError:
        return False
    return bool(delimiter) and env_var(path) == var


def test_every_lapse_variable_is_a_settings_field():
    services = _compose()["services"]
    seen = set()
    for name, service in services.items():
        variables = _lapse_vars(service.get("environment") or {})
        unknown = {var for var in variables if not _names_a_field(var)}
        assert not unknown, f"service {name} sets {sorted(unknown)}, which name no Settings field"
        seen |= variables
    dockerfile = (COMPOSE / "Dockerfile").read_text()
    dockerfile_vars = set(re.findall(r"\b(LAPSE_[A-Z_]+)=", dockerfile))
    assert dockerfile_vars and all(_names_a_field(var) for var in dockerfile_vars), sorted(dockerfile_vars)
    assert {env_var("kafka.bootstrap_servers"), env_var("database.url"), env_var("runtime.metrics_port")} <= seen


def test_old_flat_names_are_not_fields():
    assert not _names_a_field("LAPSE_BATCH_SIZE")
    assert not _names_a_field("LAPSE_PROCESSOR__NO_SUCH_FIELD")
    assert not _names_a_field("LAPSE_NO_SUCH_SECTION__BATCH_SIZE")
    assert _names_a_field("LAPSE_PROCESSOR__BATCH_SIZE")


def test_topics_fit_three_brokers_and_services_are_there():
    services = _compose()["services"]
    brokers = [n for n, s in services.items() if str(s.get("image", "")).startswith("apache/kafka:")]
    assert len(brokers) == 3
    for spec in load_topology(REPO_ROOT / "topics.yaml").specs:
        assert spec.replication_factor <= len(brokers), spec.name
        assert int(spec.config.get("min.insync.replicas", "1")) < spec.replication_factor, spec.name
    for role in ("sweep", "process", "relay", "delay", "reconcile", "analytics", "monitor", "migrate",
                 "postgres", "schema-registry", "prometheus", "grafana"):
        assert role in services, role
    assert services["process"]["deploy"]["replicas"] == 3


def test_images_are_pinned_and_prometheus_scrapes_the_metrics_port():
    for name, service in _compose()["services"].items():
        image = service.get("image")
        assert image and ":" in image and not image.endswith(":latest"), f"{name}: unpinned image {image}"
    scrape = yaml.safe_load((COMPOSE / "prometheus.yml").read_text())["scrape_configs"]
    targets = {t for job in scrape for c in job.get("static_configs", []) for t in c["targets"]}
    targets |= {f"{n}:{c['port']}" for job in scrape for c in job.get("dns_sd_configs", []) for n in c["names"]}
    port = _compose()["x-lapse-env"][env_var("runtime.metrics_port")]
    assert {f"{s}:{port}" for s in ("sweep", "process", "relay", "monitor")} <= targets
    dashboard = json.loads(Path(COMPOSE / "grafana/dashboards/lapse.json").read_text())
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p["targets"])
    for metric in ("lapse_oldest_eligible_age_seconds", "lapse_consumer_lag_records",
                   "lapse_dead_letters_total", "lapse_batch_seconds_bucket", "lapse_retries_total"):
        assert metric in exprs
