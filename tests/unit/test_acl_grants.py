"""The ACLs derived from topics.yaml without a broker: each role's rights follow what it does, a
topics file without `principals:` still loads (and declares none), and a wrong principal or role
is a one-line error naming the key."""

from __future__ import annotations

from dataclasses import replace

import pytest

from lapse.kernel.topology import TopicsFileError, load_topology
from lapse.shell.acls import MANUAL_GROUP_PREFIX, declared_grants, owned_resources, role_grants
from tests.fixtures.topology import TOPICS_FILE

BASE = ("groups: {cleanup: g-cleanup, delay: g-delay, analytics: g-analytics}\n"
        "topics:\n"
        "  t.expiry: {role: expiry, partitions: 1, groups: [g-cleanup], manual_readers: [audit]}\n"
        "  t.outcomes: {role: outcomes, partitions: 1, groups: [g-analytics]}\n"
        "  t.dlq: {role: dlq, partitions: 1}\n"
        "  t.delay.30s: {partitions: 1, delay_seconds: 30, groups: [g-delay]}\n")


def rights(topology, role: str) -> set[tuple[str, str, str]]:
    return {(g.operation, g.resource, g.name + ("*" if g.pattern == "prefixed" else ""))
            for g in role_grants(topology, role)}


def test_each_role_gets_what_its_work_needs_and_nothing_else():
    t = load_topology(TOPICS_FILE, "p.")
    tiers = set(t.delay_topics)
    writes = {role: {name for op, kind, name in rights(t, role) if op == "WRITE"}
              for role, _ in t.principals}
    assert writes["sweep"] == writes["reconcile"] == {t.expiry}
    assert writes["relay"] == {t.expiry, t.outcomes, t.dlq, *tiers}
    assert writes["process"] == {t.dlq, *tiers}
    assert writes["delay"] == {t.expiry, t.dlq, *tiers}
    assert writes["audit"] == writes["status"] == writes["archive"] == set()
    assert writes["analytics"] == {f"{t.groups.analytics}-*"}  # its own changelog topics only
    assert {r for r in rights(t, "process") if r[0] == "READ"} == {
        ("READ", "topic", t.expiry), ("READ", "group", t.groups.cleanup)}
    assert {r for r in rights(t, "audit")} == {
        ("READ", "topic", t.expiry), ("READ", "topic", t.outcomes), ("READ", "topic", t.dlq),
        ("READ", "group", MANUAL_GROUP_PREFIX + "*")}
    assert rights(t, "archive") == {("READ", "topic", t.expiry), ("READ", "topic", t.outcomes),
                                    ("READ", "topic", t.dlq), ("READ", "group", t.groups.archive)}
    assert {name for op, kind, name in rights(t, "status") if op == "DESCRIBE"} == set(t.declared_groups())
    assert ("CREATE", "topic", f"{t.groups.analytics}-*") in rights(t, "analytics")
    # Every name but the manual readers' shared group prefix carries the environment's prefix.
    assert all(g.name.startswith("p.") for g in declared_grants(t) if g.name != MANUAL_GROUP_PREFIX)
    assert ("group", MANUAL_GROUP_PREFIX, "prefixed") not in owned_resources(t)


def test_the_console_reads_what_status_reads_and_the_dlq():
    t = load_topology(TOPICS_FILE, "p.")
    assert t.principal("console") == "User:lapse-console"
    status = {(op, kind, name) for op, kind, name in rights(t, "status")}
    assert rights(t, "console") == status | {("READ", "topic", t.dlq)}
    # Status reads the dlq only for the lag of a group that reads it (the archive's).
    no_archive = replace(t, specs=tuple(replace(spec, groups=tuple(g for g in spec.groups if g != t.groups.archive))
                                        for spec in t.specs))
    assert ("READ", "topic", t.dlq) not in rights(no_archive, "status")
    assert ("READ", "topic", t.dlq) in rights(no_archive, "console")
    assert {op for op, _, _ in rights(t, "console")} == {"READ", "DESCRIBE"}
    without = replace(t, principals=tuple(p for p in t.principals if p[0] != "console"))
    assert role_grants(without, "console") == []  # not declared: no ACLs


def test_a_file_without_principals_loads_and_declares_no_acls(tmp_path):
    path = tmp_path / "topics.yaml"
    path.write_text(BASE)
    topology = load_topology(path)
    assert topology.principals == () and declared_grants(topology) == []


def test_a_role_left_out_gets_no_acls(tmp_path):
    path = tmp_path / "topics.yaml"
    path.write_text(BASE + "principals: {sweep: 'User:s', archive: 'User:a'}\n")
    topology = load_topology(path)
    assert {g.principal for g in declared_grants(topology)} == {"User:s"}  # no archive group: no archive
    assert role_grants(topology, "process") == []


@pytest.mark.parametrize("principals, expected", [
    ("{sweeper: 'User:s'}", "principals.sweeper: unknown role"),
    ("{sweep: lapse-sweep}", "principals.sweep: must be a Kafka principal like User:lapse-sweep"),
    ("[User:s]", "principals: must map roles to Kafka principals"),
])
def test_a_wrong_principals_section_is_a_one_line_error(tmp_path, principals, expected):
    path = tmp_path / "topics.yaml"
    path.write_text(BASE + f"principals: {principals}\n")
    with pytest.raises(TopicsFileError) as err:
        load_topology(path)
    assert expected in str(err.value) and str(path) in str(err.value) and "\n" not in str(err.value)


def test_effect_topics_are_written_and_checked_by_the_process_principal_alone(tmp_path):
    """A topic of role `effect` is what `kafka-produce` effects write: the process principal may
    WRITE it and READ it (a retry or takeover looks for the op key's record first, through a
    manual reader's group); no other role gains anything on it."""
    path = tmp_path / "topics.yaml"
    path.write_text(BASE + "  t.effects: {role: effect, partitions: 2}\n"
                    "principals: {process: 'User:p', sweep: 'User:s', relay: 'User:r', status: 'User:st'}\n")
    topology = load_topology(path)
    assert topology.effect_topics == ["t.effects"]
    process = rights(topology, "process")
    assert {r for r in process if r[2] == "t.effects"} == {("WRITE", "topic", "t.effects"),
                                                          ("READ", "topic", "t.effects")}
    assert ("READ", "group", MANUAL_GROUP_PREFIX + "*") in process
    others = {g for g in declared_grants(topology) if g.name == "t.effects" and g.principal != "User:p"}
    assert others == set()
    without = tmp_path / "plain.yaml"
    without.write_text(BASE + "principals: {process: 'User:p'}\n")
    plain = rights(load_topology(without), "process")
    assert plain == process - {("WRITE", "topic", "t.effects"), ("READ", "topic", "t.effects"),
                               ("READ", "group", MANUAL_GROUP_PREFIX + "*")}
