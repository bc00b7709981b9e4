"""The alert rules shipped in compose/prometheus/ pass their own unit tests under promtool, every
alert is exercised there, and the Prometheus of compose loads them. promtool is a prerequisite
(`make promtool`): where it is missing these tests fail, they are never skipped."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from lapse.kernel.settings import REPO_ROOT

COMPOSE = REPO_ROOT / "compose"
RULES = COMPOSE / "prometheus" / "alerts.yml"
RULE_TESTS = COMPOSE / "prometheus" / "alerts_test.yml"


def promtool(*args: str, cwd=None) -> subprocess.CompletedProcess:
    tool = shutil.which("promtool")
    if tool is None:
        pytest.fail("promtool is missing: run `make promtool` (Debian's prometheus package provides it)")
    return subprocess.run([tool, *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def test_the_alert_rules_pass_their_promtool_tests():
    done = promtool("test", "rules", RULE_TESTS.name, cwd=RULE_TESTS.parent)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_is_exercised_by_a_rule_test():
    alerts = {rule["alert"] for group in yaml.safe_load(RULES.read_text())["groups"]
              for rule in group["rules"] if "alert" in rule}
    tested = {case["alertname"] for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]
              for case in test.get("alert_rule_test", [])}
    fired = {case["alertname"] for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]
             for case in test.get("alert_rule_test", []) if case.get("exp_alerts")}
    assert alerts == tested, f"untested alerts: {sorted(alerts - tested)}; unknown: {sorted(tested - alerts)}"
    assert alerts == fired, f"alerts never seen firing in a test: {sorted(alerts - fired)}"


def test_compose_prometheus_loads_the_rules(tmp_path):
    """prometheus.yml names the rules where docker-compose.yml mounts them, and the config with
    those rules is valid for promtool."""
    config = yaml.safe_load((COMPOSE / "prometheus.yml").read_text())
    (rule_file,) = config["rule_files"]
    service = yaml.safe_load((COMPOSE / "docker-compose.yml").read_text())["services"]["prometheus"]
    assert f"./prometheus/alerts.yml:{rule_file}:ro" in service["volumes"]
    shutil.copy(RULES, tmp_path / "alerts.yml")
    config["rule_files"] = ["alerts.yml"]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    done = promtool("check", "config", "prometheus.yml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
