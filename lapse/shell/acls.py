"""The Kafka ACLs each role needs, derived from the topology: the role's principal (topics.yaml
`principals:`) may read and write exactly the topics and groups what the role does touches, so a
leaked sweep credential cannot redirect delay tiers and a reader cannot forge expiry events.

What each role does (and so may do):
- sweep, reconcile: produce expiry events (WRITE on the expiry topic);
- relay: publish outbox rows, which are outcomes, ledger-backed dead letters, and wake-ups or
  events the publish API queued (WRITE on outcomes, dlq, the expiry topic and every delay tier);
- process: consume the expiry topic in the cleanup group, produce wake-ups and poison records
  (READ expiry + group; WRITE delay tiers, dlq); run `kafka-produce` effects (WRITE on each topic
  of role `effect`, and READ on it with a manual reader's group: a retry or a takeover first
  looks in the key's partition for the record, so it is produced once per op key);
- delay: consume the delay tiers in the delay group, forward to the expiry topic or the next tier,
  poison to the dlq (READ tiers + group; WRITE expiry, tiers, dlq);
- audit: read the topics that list it under `manual_readers`, by manual assignment;
- status: read the committed offsets of every declared group (DESCRIBE) and the records at them
  (READ on the topics those groups read), by manual assignment;
- analytics: the Faust app reads outcomes in the analytics group and keeps its changelog and
  assignor topics under the group's name (READ, WRITE, CREATE, DESCRIBE on that topic prefix);
- console: what status may (the lag it shows) and READ on the dlq, whose poison records it lists
  by manual assignment. A replay writes the ledger and the outbox only: the relay publishes it;
- archive: consume the expiry, outcomes and dlq topics in the archive group (READ the three + group).
Manual readers use throwaway group ids under MANUAL_GROUP_PREFIX: READ on that group prefix.
Producers are idempotent; WRITE on a topic covers that (Kafka 2.8+), no cluster right is needed.

Provisioning the bindings is `lapse.shell.provisioning.plan_acls`.
"""

from __future__ import annotations

from dataclasses import dataclass

from lapse.kernel.topology import Topology

# The group-id prefix of the readers that assign partitions themselves and commit nothing
# (lapse.readers.offsets.manual_consumer names its groups so).
MANUAL_GROUP_PREFIX = "lapse-manual-"
TOPIC, GROUP = "topic", "group"
LITERAL, PREFIXED = "literal", "prefixed"


@dataclass(frozen=True, order=True)
class Grant:
    """One ALLOW ACL from any host: `principal` may do `operation` on the resource `name` (a whole
    name, or every name starting with it when `pattern` is prefixed)."""

    resource: str  # topic | group
    name: str
    pattern: str  # literal | prefixed
    principal: str
    operation: str  # READ | WRITE | DESCRIBE | CREATE, as Kafka names ACL operations

    @property
    def where(self) -> str:
        """The resource as a person reads it: `topic lapse.expiry`, `group lapse-manual-*`."""
        return f"{self.resource} {self.name}{'*' if self.pattern == PREFIXED else ''}"

    def __str__(self) -> str:
        return f"allow {self.principal} {self.operation} on {self.where}"


def _topics(principal: str, operation: str, names: list[str]) -> list[Grant]:
    return [Grant(TOPIC, name, LITERAL, principal, operation) for name in names]


def role_grants(topology: Topology, role: str) -> list[Grant]:
    """The ACLs of one role (see the module docstring); none when it has no declared principal."""
    who = topology.principal(role)
    if who is None:
        return []
    t = topology
    tiers = t.delay_topics
    manual_group = Grant(GROUP, MANUAL_GROUP_PREFIX, PREFIXED, who, "READ")
    grants: list[Grant]
    if role in ("sweep", "reconcile"):
        grants = _topics(who, "WRITE", [t.expiry])
    elif role == "relay":
        grants = _topics(who, "WRITE", [t.expiry, t.outcomes, t.dlq, *tiers])
    elif role == "process":
        effects = t.effect_topics
        grants = [*_topics(who, "READ", [t.expiry, *effects]), Grant(GROUP, t.groups.cleanup, LITERAL, who, "READ"),
                  *_topics(who, "WRITE", [*tiers, t.dlq, *effects]), *([manual_group] if effects else [])]
    elif role == "delay":
        grants = [*_topics(who, "READ", tiers), Grant(GROUP, t.groups.delay, LITERAL, who, "READ"),
                  *_topics(who, "WRITE", [t.expiry, *tiers, t.dlq])]
    elif role == "audit":
        grants = [*_topics(who, "READ", [s.name for s in t.specs if "audit" in s.manual_readers]), manual_group]
    elif role in ("status", "console"):
        read = {topic for _, topic in t.reads()}
        if role == "console":
            read.add(t.dlq)  # its poison records
        grants = [*_topics(who, "READ", sorted(read)),
                  *(Grant(GROUP, group, LITERAL, who, "DESCRIBE") for group in t.declared_groups()),
                  manual_group]
    elif role == "analytics":
        internal = f"{t.groups.analytics}-"  # Faust's changelog and assignor topics: <app id>-…
        grants = [*_topics(who, "READ", [t.outcomes]), Grant(GROUP, t.groups.analytics, LITERAL, who, "READ"),
                  *(Grant(TOPIC, internal, PREFIXED, who, op) for op in ("CREATE", "DESCRIBE", "READ", "WRITE")),
                  manual_group]
    elif role == "archive":
        if t.groups.archive is None:
            return []  # no archive group declared: the archive does not run
        grants = [*_topics(who, "READ", [t.expiry, t.outcomes, t.dlq]),
                  Grant(GROUP, t.groups.archive, LITERAL, who, "READ")]
    else:
        raise ValueError(f"no ACLs are defined for role {role!r}")
    return grants


def declared_grants(topology: Topology) -> list[Grant]:
    """Every ACL the topology declares: each role with a principal, its rights; sorted, no repeats."""
    return sorted({grant for role, _ in topology.principals for grant in role_grants(topology, role)})


def owned_resources(topology: Topology) -> set[tuple[str, str, str]]:
    """(resource, name, pattern) of what belongs to this environment alone: its topics, its groups,
    the analytics topic prefix. An ACL on one of these that the topology does not declare is drift.
    The manual readers' group prefix is left out: every environment on the cluster shares it."""
    owned = {(TOPIC, spec.name, LITERAL) for spec in topology.specs}
    owned |= {(GROUP, group, LITERAL) for group in topology.groups.by_role().values()}
    owned |= {(g.resource, g.name, g.pattern) for g in declared_grants(topology) if g.name != MANUAL_GROUP_PREFIX}
    return owned
