"""`lapse topics apply` and ACLs on the secured Apache Kafka: the dry run shows each role's planned
ACLs and changes nothing, the apply creates them, a second apply has nothing left to do, and an ACL
the topics file does not declare is reported as drift and left in place, removed only with
--allow-destructive and a reason (then recorded). A broker without an authorizer has no ACLs to
manage, and says so.
(Each role working with only these ACLs: test_secured_broker.py.)"""

from __future__ import annotations

import json

import pytest
import yaml
from click.testing import CliRunner, Result
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
)
from sqlalchemy import select

from lapse.kernel.database import make_engine
from lapse.kernel.kinds.effects import EffectCall
from lapse.kernel.kinds.effects.kafka_produce import KafkaProduceEffect
from lapse.kernel.models import operator_actions
from lapse.kernel.settings import env_var, load_settings
from lapse.kernel.topology import load_topology
from lapse.processors.effects.kafka_produce import KafkaProduceCaller
from lapse.processors.failures import INVALID, EffectFailure
from lapse.shell.acls import declared_grants
from lapse.shell.app import main
from lapse.shell.provisioning import existing_acls
from tests.fixtures.kafka import read_topic
from tests.fixtures.topology import TOPICS_FILE


def apply(secure_kafka, prefix: str, *args: str) -> Result:
    env = {**secure_kafka.env(), env_var("topics.prefix"): prefix}
    return CliRunner().invoke(main, ["topics", "apply", "--replication-factor", "1", *args], env=env)


def acls_of(secure_kafka, prefix: str) -> set[tuple[str, str, str, str]]:
    """(resource, name, principal, operation) of every ACL on the cluster naming this prefix."""
    return {(acl.restype.name, acl.name, acl.principal, acl.operation.name)
            for acl in existing_acls(secure_kafka.server.admin()) if acl.name.startswith(prefix)}


def test_dry_run_shows_the_acls_apply_creates_them_and_a_second_apply_changes_nothing(secure_kafka, unique):
    prefix = unique("t") + "."
    topology = load_topology(TOPICS_FILE, prefix, replication_factor=1)
    wanted = [g for g in declared_grants(topology) if g.name.startswith(prefix)]
    expiry_writers = {g.principal for g in wanted if (g.name, g.operation) == (topology.expiry, "WRITE")}
    assert expiry_writers == {"User:lapse-sweep", "User:lapse-reconcile", "User:lapse-relay", "User:lapse-delay"}

    dry = apply(secure_kafka, prefix, "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert f"would create ACL on topic {topology.expiry}: allow User:lapse-sweep WRITE from any host" in dry.output
    assert f"would create ACL on group {topology.groups.cleanup}: allow User:lapse-process READ" in dry.output
    assert acls_of(secure_kafka, prefix) == set()  # the dry run changed nothing

    first = apply(secure_kafka, prefix, "--json")
    assert first.exit_code == 0, first.output
    done = [a for a in json.loads(first.stdout)["actions"] if a["kind"] == "create_acl"]
    assert done and {a["status"] for a in done} == {"done"}
    assert acls_of(secure_kafka, prefix) == {(g.resource.upper(), g.name, g.principal, g.operation)
                                             for g in wanted}

    second = apply(secure_kafka, prefix)
    assert second.exit_code == 0, second.output
    assert second.output.strip() == "no change"


def test_an_undeclared_acl_is_drift_removed_only_when_allowed_and_then_recorded(secure_kafka, unique, pg_url):
    prefix = unique("t") + "."
    topology = load_topology(TOPICS_FILE, prefix, replication_factor=1)
    assert apply(secure_kafka, prefix).exit_code == 0
    intruder = AclBinding(ResourceType.TOPIC, topology.expiry, ResourcePatternType.LITERAL, "User:intruder", "*",
                          AclOperation.WRITE, AclPermissionType.ALLOW)
    admin = secure_kafka.server.admin()
    for future in admin.create_acls([intruder]).values():
        future.result(30)

    for _ in range(2):  # reported each time, removed never
        drift = apply(secure_kafka, prefix)
        assert drift.exit_code == 1, drift.output
        assert drift.output.strip().splitlines() == [
            f"DRIFT topic {topology.expiry}: allow User:intruder WRITE from any host is not declared in the "
            "topics file; ACLs are never removed automatically"]
    assert ("TOPIC", topology.expiry, "User:intruder", "WRITE") in acls_of(secure_kafka, prefix)

    allowed = ["--allow-destructive", "--reason", "revoke the intruder", "--actor", "alice", "--database-url", pg_url]
    shown = apply(secure_kafka, prefix, *allowed, "--dry-run")
    assert shown.exit_code == 0, shown.output
    assert shown.output.strip() == (
        f"would remove ACL on topic {topology.expiry}: remove allow User:intruder WRITE from any host "
        "(DESTRUCTIVE: removes the undeclared ACL allow User:intruder WRITE from any host)")
    removed = apply(secure_kafka, prefix, *allowed)
    assert removed.exit_code == 0, removed.output
    assert not any(principal == "User:intruder" for _, _, principal, _ in acls_of(secure_kafka, prefix))
    assert apply(secure_kafka, prefix).output.strip() == "no change"
    engine = make_engine(pg_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(select(operator_actions)).mappings().all()
    finally:
        engine.dispose()
    assert [(r["action"], r["actor"], r["reason"], r["target"]) for r in rows] == [
        ("topics_apply_destructive", "alice", "revoke the intruder", f"topic {topology.expiry}")]


def test_a_broker_without_an_authorizer_has_no_acls_to_manage(kafka_bootstrap, unique):
    env = {env_var("kafka.bootstrap_servers"): kafka_bootstrap, env_var("topics.prefix"): unique("t") + "."}
    result = CliRunner().invoke(main, ["topics", "apply", "--replication-factor", "1", "--json"], env=env)
    assert result.exit_code == 0, result.output
    applied = json.loads(result.stdout)
    assert applied["acls"].startswith("not managed: the broker has no authorizer")
    assert {a["kind"] for a in applied["actions"]} == {"create"}


def test_an_effect_topic_is_created_and_granted_to_the_process_principal_only(secure_kafka, unique, tmp_path):
    """A topic of role effect (what `kafka-produce` writes): apply creates it and lets the process
    principal WRITE it and READ it (the retry's check for the op key's record); no other role
    gets any right on it, and the process principal nothing more than without it."""
    doc = yaml.safe_load(TOPICS_FILE.read_text())
    doc["topics"]["lapse.effects.erasures"] = {"role": "effect", "partitions": 2, "retention": "1d"}
    path = tmp_path / "topics.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    prefix = unique("t") + "."
    topic = prefix + "lapse.effects.erasures"
    env = {**secure_kafka.env(), env_var("topics.prefix"): prefix, env_var("topics.file"): str(path)}
    result = CliRunner().invoke(main, ["topics", "apply", "--replication-factor", "1"], env=env)
    assert result.exit_code == 0, result.output
    assert topic in secure_kafka.server.admin().list_topics(timeout=30).topics
    on_topic = {(principal, op) for _, name, principal, op in acls_of(secure_kafka, prefix) if name == topic}
    assert on_topic == {("User:lapse-process", "WRITE"), ("User:lapse-process", "READ")}
    plain = load_topology(TOPICS_FILE, prefix, replication_factor=1)
    process = {(g.name, g.operation) for g in declared_grants(load_topology(path, prefix, replication_factor=1))
               if g.principal == "User:lapse-process"}
    assert process - {(g.name, g.operation) for g in declared_grants(plain) if g.principal == "User:lapse-process"} == {
        (topic, "WRITE"), (topic, "READ"), ("lapse-manual-", "READ")}
    # Those rights are enough for the effect, a retry's check included; without them it is invalid.
    process = load_settings(kafka=secure_kafka.kafka_section(secure_kafka.user_of("process")),
                            topics={"prefix": prefix, "file": str(path)})
    sweep = load_settings(kafka=secure_kafka.kafka_section(secure_kafka.user_of("sweep")),
                          topics={"prefix": prefix, "file": str(path)})
    effect = KafkaProduceEffect(topic=topic, timeout_s=10)
    for attempt in (1, 2):  # the second looks first (READ), finds the record and produces nothing
        produced = KafkaProduceCaller(effect, process)
        try:
            produced(EffectCall("erase", "erase:1", attempt, "1", "t1", {}))
        finally:
            produced.close()
    refused = KafkaProduceCaller(effect, sweep)
    try:
        with pytest.raises(EffectFailure) as caught:
            refused(EffectCall("erase", "erase:2", 1, "2", "t1", {}))
    finally:
        refused.close()
    assert caught.value.failure_class == INVALID and "AUTHORIZATION" in caught.value.reason, caught.value.reason
    records = [(m.key(), dict(m.headers())["lapse-attempt"]) for m in read_topic(
        secure_kafka.bootstrap, topic, extra={**secure_kafka.client_config(), "isolation.level": "read_committed"})]
    assert records == [(b"erase:1", b"1")]


def test_an_operators_deny_is_kept_and_a_wider_allow_is_drift_that_is_never_removed(secure_kafka, unique, pg_url):
    prefix = unique("t") + "."
    topology = load_topology(TOPICS_FILE, prefix, replication_factor=1)
    assert apply(secure_kafka, prefix).exit_code == 0
    deny = AclBinding(ResourceType.TOPIC, topology.expiry, ResourcePatternType.LITERAL, "User:lapse-sweep", "*",
                      AclOperation.WRITE, AclPermissionType.DENY)  # an operator stops the sweep for a while
    everything = AclBinding(ResourceType.TOPIC, "*", ResourcePatternType.LITERAL, "User:intruder", "*",
                            AclOperation.READ, AclPermissionType.ALLOW)
    wider = AclBinding(ResourceType.GROUP, prefix[:-1], ResourcePatternType.PREFIXED, "User:intruder", "*",
                       AclOperation.READ, AclPermissionType.ALLOW)
    admin = secure_kafka.server.admin()
    for future in admin.create_acls([deny, everything, wider]).values():
        future.result(30)
    try:
        drift = apply(secure_kafka, prefix, "--json")
        assert drift.exit_code == 1, drift.output
        reported = sorted((a["kind"], a["topic"], a["detail"]) for a in json.loads(drift.stdout)["actions"])
        beyond = "is not declared in the topics file; it reaches beyond this environment, so it is never removed here"
        assert [(kind, where) for kind, where, _ in reported] == [
            ("drift", f"group {prefix[:-1]}*"), ("drift", "topic *")]
        for (_, where, detail) in reported:  # naming one of this environment's resources it reaches
            assert detail.startswith(f"allow User:intruder READ from any host reaches {where.split()[0]} {prefix}")
            assert detail.endswith(beyond)

        allowed = ["--allow-destructive", "--reason", "tidy up", "--actor", "alice", "--database-url", pg_url, "--json"]
        tidied = apply(secure_kafka, prefix, *allowed)
        assert tidied.exit_code == 1, tidied.output
        assert {a["status"] for a in json.loads(tidied.stdout)["actions"]} == {"not fixed"}
        left = {(acl.restype.name, acl.name, acl.principal, acl.permission_type.name)
                for acl in existing_acls(admin)}
        assert {("TOPIC", topology.expiry, "User:lapse-sweep", "DENY"), ("TOPIC", "*", "User:intruder", "ALLOW"),
                ("GROUP", prefix[:-1], "User:intruder", "ALLOW")} <= left
    finally:
        for acl in (deny, everything, wider):
            exact = AclBindingFilter(acl.restype, acl.name, acl.resource_pattern_type, acl.principal, acl.host,
                                     acl.operation, acl.permission_type)
            admin.delete_acls([exact])[exact].result(30)
