"""`lapse topics apply` and ACLs on the secured Apache Kafka: the dry run shows each role's planned
ACLs and changes nothing, the apply creates them, a second apply has nothing left to do, and an ACL
the topics file does not declare is reported as drift and left in place, removed only with
--allow-destructive and a reason (then recorded). A broker without an authorizer has no ACLs to
manage, and says so.
(Each role working with only these ACLs: test_secured_broker.py.)"""

from __future__ import annotations

import json

from click.testing import CliRunner, Result
from confluent_kafka.admin import AclBinding, AclOperation, AclPermissionType, ResourcePatternType, ResourceType
from sqlalchemy import select

from lapse.kernel.database import make_engine
from lapse.kernel.models import operator_actions
from lapse.kernel.settings import env_var
from lapse.kernel.topology import load_topology
from lapse.shell.acls import declared_grants
from lapse.shell.app import main
from lapse.shell.provisioning import existing_acls
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
