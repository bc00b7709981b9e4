"""`lapse topics apply` against real brokers: creates what is missing, is idempotent, reports drift
it must not fix. (Reading topics.yaml without a broker: tests/unit/test_topics_file.py.)"""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from confluent_kafka.admin import ConfigResource, ResourceType

from lapse.kernel.provisioning import apply, plan
from lapse.kernel.topology import Topology, load_topology
from lapse.shell.app import main
from tests.fixtures.kafka import admin, create_topics
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
    again = plan(client, declared)
    assert {(a.kind, a.topic) for a in again} == {("drift", dlq), ("drift", tier)}


def test_cli_apply_is_idempotent(kafka_bootstrap, unique):
    args = ["topics", "apply", "--bootstrap-servers", kafka_bootstrap, "--replication-factor", "1",
            "--topic-prefix", unique("t") + "."]
    first = CliRunner().invoke(main, [*args, "--json"])
    assert first.exit_code == 0, first.output
    second = CliRunner().invoke(main, args)
    assert second.exit_code == 0, second.output
    assert second.output.strip() == "no change"


@pytest.mark.embedded
def test_apply_twice_on_the_embedded_broker(embedded_bootstrap, unique):
    declared = list(_topology(unique).specs)
    client = admin(embedded_bootstrap)
    assert {a.status for a in apply(client, plan(client, declared))} == {"done"}
    assert plan(client, declared) == []
