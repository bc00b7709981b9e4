"""topics.yaml read without a broker: a malformed file is a one-line error naming the file and the
key (also through `lapse topics apply --dry-run`), and the roles, delay tiers and groups come from
the file, all renamed by one prefix."""

from __future__ import annotations

import logging

import pytest
from click.testing import CliRunner

from lapse.kernel.topology import DelayTier, TopicsFileError, load_topology
from lapse.shell.app import main
from tests.fixtures.topology import TOPICS_FILE

GROUPS = "groups: {cleanup: g-cleanup, delay: g-delay, analytics: g-analytics}\n"
TIER = "  t.delay.30s: {partitions: 1, delay_seconds: 30, groups: [g-delay]}\n"
ROLES = ("  t.expiry: {role: expiry, partitions: 1, groups: [g-cleanup]}\n"
         "  t.outcomes: {role: outcomes, partitions: 1}\n")


@pytest.mark.parametrize("text, expected", [
    ("topics: [lapse.expiry", "not valid YAML"),
    (GROUPS + "topics:\n  lapse.expiry:\n    partitions: 0\n", "topics.lapse.expiry.partitions"),
    (GROUPS + "topics:\n  lapse.expiry:\n    partitions: 3\n    retention: two weeks\n", "retention"),
    (GROUPS + "topics:\n  lapse.expiry:\n    partitions: 3\n    partitons: 4\n", "partitons: unknown key"),
    (GROUPS + "topics:\n  'bad name!':\n    partitions: 3\n", "topic names use only"),
    ("tpoics: {}\n", "unknown key"),
    # Roles and groups: every role's topic and group declared, every group a topic names declared.
    (GROUPS + "topics:\n" + ROLES + TIER, "topics: exactly one topic must have role: dlq (found 0)"),
    (GROUPS + "topics:\n" + ROLES + TIER + "  t.dlq: {role: dlq, partitions: 1, groups: [g-audit]}\n",
     "topics.t.dlq.groups: 'g-audit' is not declared under groups"),
    (GROUPS + "topics:\n" + ROLES + TIER + "  t.dlq: {role: dead-letters, partitions: 1}\n",
     "topics.t.dlq.role: must be one of expiry, outcomes, dlq, effect, got 'dead-letters'"),
    ("groups: {cleanup: g-cleanup}\ntopics:\n" + ROLES + TIER + "  t.dlq: {role: dlq, partitions: 1}\n",
     "groups: must name the group of each role"),
])
def test_malformed_topics_file_is_a_one_line_error(tmp_path, text, expected):
    bad = tmp_path / "topics.yaml"
    bad.write_text(text)
    with pytest.raises(TopicsFileError) as err:
        load_topology(bad)
    assert expected in str(err.value) and str(bad) in str(err.value)
    assert "\n" not in str(err.value)

    result = CliRunner().invoke(main, ["topics", "apply", "--file", str(bad), "--dry-run"])
    assert result.exit_code == 3
    assert result.output.strip().splitlines() == [f"lapse: {err.value}"]


def test_roles_delay_tiers_and_groups_come_from_the_file():
    topology = load_topology(TOPICS_FILE)
    assert [(tier.topic, tier.delay_s) for tier in topology.tiers] == [
        ("lapse.delay.30s", 30), ("lapse.delay.2m", 120), ("lapse.delay.10m", 600), ("lapse.delay.1h", 3600)]
    assert (topology.expiry, topology.outcomes, topology.dlq) == ("lapse.expiry", "lapse.outcomes", "lapse.dlq")
    assert topology.declared_groups() == ["lapse-analytics", "lapse-archive", "lapse-cleanup", "lapse-delay"]
    assert set(topology.groups.by_role().values()) == set(topology.declared_groups())
    assert {group for group, topic in topology.reads() if group == topology.groups.archive} == {"lapse-archive"}
    assert sorted(topic for group, topic in topology.reads() if group == topology.groups.archive) == sorted(
        [topology.expiry, topology.outcomes, topology.dlq])
    by_name = {spec.name: spec for spec in topology.specs}
    assert by_name[topology.expiry].manual_readers == ("audit",)
    assert by_name[topology.expiry].replication_factor == 3
    assert by_name[topology.expiry].config["min.insync.replicas"] == "2"


def test_one_prefix_renames_every_topic_and_group():
    plain, prefixed = load_topology(TOPICS_FILE), load_topology(TOPICS_FILE, "env-a.")
    assert [spec.name for spec in prefixed.specs] == ["env-a." + spec.name for spec in plain.specs]
    assert [spec.declared_name for spec in prefixed.specs] == [spec.name for spec in plain.specs]
    assert prefixed.tiers == tuple(DelayTier("env-a." + t.topic, t.delay_s) for t in plain.tiers)
    assert (prefixed.expiry, prefixed.outcomes, prefixed.dlq) == tuple(
        "env-a." + name for name in (plain.expiry, plain.outcomes, plain.dlq))
    assert prefixed.groups.by_role() == {role: "env-a." + name for role, name in plain.groups.by_role().items()}
    assert prefixed.reads() == [("env-a." + group, "env-a." + topic) for group, topic in plain.reads()]


def test_an_older_file_naming_the_retired_reports_group_loads_without_it(tmp_path, caplog):
    """`groups.reports` (nothing consumes as it) in a user's older file is accepted with one
    warning; its name leaves every topic's group list, so no status shows its lag."""
    old = tmp_path / "topics.yaml"
    old.write_text("groups: {cleanup: g-cleanup, delay: g-delay, analytics: g-analytics, reports: g-reports}\n"
                   "topics:\n" + ROLES.replace("partitions: 1}", "partitions: 1, groups: [g-analytics, g-reports]}")
                   + TIER + "  t.dlq: {role: dlq, partitions: 1, groups: [g-reports]}\n")
    logger = logging.getLogger("lapse.topology")  # its own handler: "lapse" may not propagate
    logger.addHandler(caplog.handler)
    level = logger.level  # a command run earlier in this process may have set "lapse" above WARNING
    logger.setLevel(logging.WARNING)
    try:
        topology = load_topology(old, "p.")
    finally:
        logger.removeHandler(caplog.handler)
        logger.setLevel(level)
    assert topology.groups.by_role() == {"cleanup": "p.g-cleanup", "delay": "p.g-delay", "analytics": "p.g-analytics"}
    assert topology.declared_groups() == ["p.g-analytics", "p.g-cleanup", "p.g-delay"]
    assert sorted(topology.reads()) == [("p.g-analytics", "p.t.outcomes"), ("p.g-cleanup", "p.t.expiry"),
                                        ("p.g-delay", "p.t.delay.30s")]
    assert {r.getMessage() for r in caplog.records if "groups.reports" in r.getMessage()} == {
        f"{old}: groups.reports (g-reports) is no longer used and is ignored; remove it and its name "
        "from the topics' groups lists"}


def test_the_repository_topics_file_declares_no_reports_group():
    topology = load_topology(TOPICS_FILE)
    assert "reports" not in topology.groups.by_role()
    assert not any("reports" in group for spec in topology.specs for group in spec.groups)
