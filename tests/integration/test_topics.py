"""`lapse topics apply` against real brokers: creates what is missing, is idempotent, reports drift
it must not fix, and applies a destructive config change only when told to, recording it.
(Reading topics.yaml without a broker: tests/unit/test_topics_file.py.)"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType
from sqlalchemy import select, text

from lapse.kernel.database import make_engine
from lapse.kernel.models import operator_actions
from lapse.kernel.topology import Topology, load_topology
from lapse.shell.app import main
from lapse.shell.provisioning import apply, destructive_changes, plan
from tests.fixtures.kafka import admin, create_topics
from tests.fixtures.polling import eventually
from tests.fixtures.topology import TOPICS_FILE

DAY_MS = 86_400_000


def _configs(client, names):
    futures = client.describe_configs([ConfigResource(ResourceType.TOPIC, n) for n in names])
    return {res.name: {k: e.value for k, e in f.result(30).items()} for res, f in futures.items()}


def _partitions(client, name):
    return len(client.list_topics(name, timeout=10).topics[name].partitions)


def _topology(unique) -> Topology:
    """The repository's topics.yaml under a fresh prefix, replication factor 1 (one test broker)."""
    return load_topology(TOPICS_FILE, unique("t") + ".", replication_factor=1)


def test_apply_twice_creates_everything_then_reports_no_change(kafka_bootstrap, unique):
    topology = _topology(unique)
    declared = list(topology.specs)
    client = admin(kafka_bootstrap)

    first = apply(client, plan(client, declared))
    assert [(a.kind, a.status) for a in first] == [("create", "done")] * len(declared)
    assert {a.topic for a in first} == {spec.name for spec in declared}

    assert plan(client, declared) == []

    configs = _configs(client, [spec.name for spec in declared])
    for spec in declared:
        assert _partitions(client, spec.name) == spec.partitions
        assert {k: configs[spec.name][k] for k in spec.config} == spec.config
    assert configs[topology.expiry]["retention.ms"] == str(14 * DAY_MS)
    assert configs[topology.outcomes]["retention.ms"] == str(30 * DAY_MS)
    assert configs[topology.dlq]["retention.ms"] == str(90 * DAY_MS)
    assert configs[topology.dlq]["cleanup.policy"] == "delete"
    assert configs[topology.dlq]["min.insync.replicas"] == "1"  # lowered to the RF of 1


def test_drift_is_reported_and_left_alone_while_configs_are_fixed(kafka_bootstrap, unique):
    topology = _topology(unique)
    dlq, tier, outcomes = topology.dlq, topology.tiers[0].topic, topology.outcomes
    client = admin(kafka_bootstrap)
    create_topics(kafka_bootstrap, {dlq: 1, tier: 8})
    create_topics(kafka_bootstrap, {outcomes: 6}, config={"retention.ms": "1000"})
    declared = list(topology.specs)

    results = apply(client, plan(client, declared))
    drift = {(a.topic, a.status) for a in results if a.kind == "drift"}
    assert drift == {(dlq, "not fixed"), (tier, "not fixed")}
    altered = [a for a in results if a.kind == "alter_config" and a.topic == outcomes]
    assert altered[0].status == "done"
    assert altered[0].changes["retention.ms"] == ["1000", str(30 * DAY_MS)]

    assert _partitions(client, dlq) == 1
    assert _partitions(client, tier) == 8
    assert _configs(client, [outcomes])[outcomes]["retention.ms"] == str(30 * DAY_MS)
    # The tier was made with the broker's default retention (7 days): lowering it to the declared
    # 3 days is destructive, so it is refused unless allowed.
    refused = [a for a in results if a.kind == "alter_config" and a.topic == tier]
    assert refused[0].status == "refused" and "lowers retention.ms" in refused[0].destructive[0]
    again = plan(client, declared)
    assert {(a.kind, a.topic) for a in again} == {("drift", dlq), ("drift", tier), ("alter_config", tier)}
    apply(client, again, allow_destructive=True)
    assert {(a.kind, a.topic) for a in plan(client, declared)} == {("drift", dlq), ("drift", tier)}


def test_cli_apply_is_idempotent(kafka_bootstrap, unique):
    args = ["topics", "apply", "--bootstrap-servers", kafka_bootstrap, "--replication-factor", "1",
            "--topic-prefix", unique("t") + "."]
    first = CliRunner().invoke(main, [*args, "--json"])
    assert first.exit_code == 0, first.output
    second = CliRunner().invoke(main, args)
    assert second.exit_code == 0, second.output
    assert second.output.strip() == "no change"


def test_the_dry_run_refuses_what_the_apply_would_refuse(kafka_bootstrap, unique):
    """topics.yaml declares replication 3 and the test cluster has one broker: the dry run used to
    promise every create, which the apply then failed. Both now name it, create nothing, exit 1."""
    prefix = unique("t") + "."
    args = ["topics", "apply", "--bootstrap-servers", kafka_bootstrap, "--topic-prefix", prefix]
    dry = CliRunner().invoke(main, [*args, "--dry-run"])
    real = CliRunner().invoke(main, args)
    for result in (dry, real):
        assert result.exit_code == 1, result.output
        lines = result.output.splitlines()
        assert lines and all(line.startswith("ERROR ") for line in lines), lines
        assert "cannot be created with replication factor 3: the cluster has 1 broker(s)" in lines[0]
        assert lines[0].endswith("--replication-factor 1")
    assert dry.output == real.output
    assert not [t for t in admin(kafka_bootstrap).list_topics(timeout=10).topics if t.startswith(prefix)]


@pytest.mark.embedded
def test_apply_twice_on_the_embedded_broker(embedded_bootstrap, unique):
    declared = list(_topology(unique).specs)
    client = admin(embedded_bootstrap)
    assert {a.status for a in apply(client, plan(client, declared))} == {"done"}
    assert plan(client, declared) == []


def _set_configs(client, topic, values):
    entries = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in values.items()]
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=entries)
    client.incremental_alter_configs([resource])[resource].result(30)
    eventually(lambda: all(_configs(client, [topic])[topic][k] == v for k, v in values.items()),
               timeout_s=30, interval_s=0.1, what=f"{topic} configs {values} visible")


def _recorded(url):
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(select(operator_actions)).mappings().all()
            user = conn.execute(text("SELECT current_user")).scalar_one()
    finally:
        engine.dispose()
    return [dict(r) for r in rows], user


def test_which_config_changes_are_destructive():
    assert destructive_changes({"retention.ms": ["1209600000", "3600000"]}) == (
        "lowers retention.ms from 1209600000 to 3600000",)
    assert destructive_changes({"retention.ms": ["-1", "3600000"]})  # unlimited → bounded
    assert destructive_changes({"retention.ms": ["3600000", "-1"]}) == ()
    assert destructive_changes({"retention.bytes": ["1000", "2000"], "retention.ms": ["1", "2"]}) == ()
    assert destructive_changes({"cleanup.policy": ["compact", "delete"]}) == (
        "changes cleanup.policy from compact to delete",)
    assert destructive_changes({"min.insync.replicas": ["2", "1"]}) == ("lowers min.insync.replicas from 2 to 1",)
    assert destructive_changes({"min.insync.replicas": ["1", "2"]}) == ()


def test_destructive_apply_is_refused_shown_by_the_dry_run_and_recorded_when_allowed(kafka_bootstrap, unique,
                                                                                     pg_url):
    prefix = unique("t") + "."
    topology = load_topology(TOPICS_FILE, prefix, replication_factor=1)
    client = admin(kafka_bootstrap)
    apply(client, plan(client, list(topology.specs)))
    _set_configs(client, topology.expiry, {"retention.ms": str(30 * DAY_MS)})
    _set_configs(client, topology.dlq, {"cleanup.policy": "compact", "min.insync.replicas": "2"})
    args = ["topics", "apply", "--bootstrap-servers", kafka_bootstrap, "--replication-factor", "1",
            "--topic-prefix", prefix, "--database-url", pg_url, "--log-level", "WARNING"]
    runner = CliRunner()

    refused = runner.invoke(main, args)
    assert refused.exit_code == 2, refused.output
    assert refused.output.startswith("lapse: refused: 2 destructive config change(s), nothing changed")
    assert refused.output.count("\n") == 1
    assert "lowers retention.ms from 2592000000 to 1209600000" in refused.output
    assert _configs(client, [topology.expiry])[topology.expiry]["retention.ms"] == str(30 * DAY_MS)

    dry = runner.invoke(main, [*args, "--dry-run", "--json"])
    assert dry.exit_code == 0, dry.output
    shown = {a["topic"]: a["destructive"] for a in json.loads(dry.stdout)["actions"]}
    assert shown == {topology.expiry: ["lowers retention.ms from 2592000000 to 1209600000"],
                     topology.dlq: ["changes cleanup.policy from compact to delete",
                                    "lowers min.insync.replicas from 2 to 1"]}
    text_dry = runner.invoke(main, [*args, "--dry-run"])
    assert "DESTRUCTIVE: lowers retention.ms" in text_dry.stdout
    assert _configs(client, [topology.dlq])[topology.dlq]["cleanup.policy"] == "compact"

    no_reason = runner.invoke(main, [*args, "--allow-destructive"])
    assert no_reason.exit_code == 2 and "--reason" in no_reason.output
    assert _recorded(pg_url)[0] == []

    done = runner.invoke(main, [*args, "--allow-destructive", "--reason", "ticket 42: back to declared",
                                "--actor", "alice"])
    assert done.exit_code == 0, done.output
    configs = _configs(client, [topology.expiry, topology.dlq])
    assert configs[topology.expiry]["retention.ms"] == str(14 * DAY_MS)
    assert (configs[topology.dlq]["cleanup.policy"], configs[topology.dlq]["min.insync.replicas"]) == ("delete", "1")
    rows, user = _recorded(pg_url)
    assert [(r["action"], r["actor"], r["reason"], r["db_user"]) for r in rows] == [
        ("topics_apply_destructive", "alice", "ticket 42: back to declared", user)]
    assert rows[0]["target"] == ", ".join(sorted([topology.expiry, topology.dlq]))
    assert rows[0]["details"]["changes"][topology.expiry]["changes"]["retention.ms"] == [
        str(30 * DAY_MS), str(14 * DAY_MS)]
    assert plan(client, list(topology.specs)) == []
