"""The declared topology (topics.yaml), loaded once: every topic with its config, which topic plays
which role (expiry, outcomes, dead letters, delay tiers, the topics `kafka-produce` effects write),
and the consumer groups by role.

Code finds topics and groups by role through `Topology`, never by name, so one optional prefix
renames a whole environment (side-by-side deployments, a test's own topics). Provisioning the
cluster from it is `lapse.shell.provisioning`; the optional `principals:` section names the Kafka
principal of each role, from which `lapse.shell.acls` derives that role's ACLs.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from lapse.kernel.yaml_files import YamlFileError, load_file

_NAME = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
MAX_INT32, MAX_INT16 = 2**31 - 1, 2**15 - 1
_DURATION = re.compile(r"^(\d+)\s*(ms|s|m|h|d)$")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_TOPIC_KEYS = {"role", "partitions", "replication_factor", "retention", "config", "groups",
               "manual_readers", "delay_seconds"}
EFFECT_ROLE = "effect"  # a topic a `kafka-produce` effect writes to (any number of them)
TOPIC_ROLES = ("expiry", "outcomes", "dlq", EFFECT_ROLE)
GROUP_ROLES = ("cleanup", "delay", "analytics")
# Group roles a topics file may leave out: a file from before the archive has no archive group, and
# runs everything but the archive (which then refuses to start, naming what to add).
OPTIONAL_GROUP_ROLES = ("archive",)
# Group roles an older topics.yaml may still name although nothing consumes as them any more
# (`reports`: the daily report reads the ledger, not a topic). Such a file is accepted: the role
# and its group name in topic group lists are dropped, with one warning, so `lapse status` shows
# no lag of a group that never reads.
RETIRED_GROUP_ROLES = ("reports",)
# Roles that may have a Kafka principal of their own (`principals:`); `lapse report` reads only the
# database, so it has none. What each may do is derived in lapse.shell.acls.
PRINCIPAL_ROLES = ("sweep", "process", "relay", "delay", "reconcile", "audit", "status", "analytics", "console",
                   "archive")
_PRINCIPAL = re.compile(r"^[A-Za-z]+:[^\s;,]+$")  # Kafka's `Type:name`, e.g. User:lapse-sweep

# logging directly, as `lapse.kernel.logs.get_logger` names it: that module imports the settings,
# which import this one
log = logging.getLogger("lapse.topology")


class TopicsFileError(ValueError):
    """topics.yaml is missing or malformed; the message is one line naming the file and the key."""


@dataclass(frozen=True)
class TopicSpec:
    """One declared topic, with the effective name (prefix applied) and config."""

    name: str
    declared_name: str
    partitions: int
    replication_factor: int
    config: dict[str, str]
    role: str | None = None
    groups: tuple[str, ...] = ()
    manual_readers: tuple[str, ...] = ()
    delay_seconds: int | None = None


@dataclass(frozen=True)
class DelayTier:
    """A delay tier: records wait on `topic` until due; `delay_s` is the longest wait it covers."""

    topic: str
    delay_s: int


@dataclass(frozen=True)
class Groups:
    """Consumer group names by role (prefix applied); `archive` None when the file declares none."""

    cleanup: str
    delay: str
    analytics: str
    archive: str | None = None

    def by_role(self) -> dict[str, str]:
        """The declared groups by role (an optional role left out when the file names none)."""
        return {role: group for role, group in vars(self).items() if group is not None}


@dataclass(frozen=True)
class Topology:
    """Topics and groups of one environment. `tiers` are sorted shortest first."""

    expiry: str
    outcomes: str
    dlq: str
    tiers: tuple[DelayTier, ...]
    groups: Groups
    specs: tuple[TopicSpec, ...]
    principals: tuple[tuple[str, str], ...] = ()  # (role, principal), roles in PRINCIPAL_ROLES order

    @property
    def delay_topics(self) -> list[str]:
        return [tier.topic for tier in self.tiers]

    @property
    def effect_topics(self) -> list[str]:
        """The topics `kafka-produce` effects may write to (role `effect`)."""
        return [spec.name for spec in self.specs if spec.role == EFFECT_ROLE]

    def reads(self) -> list[tuple[str, str]]:
        """(group, topic) for every group the file says reads a topic."""
        return [(group, spec.name) for spec in self.specs for group in spec.groups]

    def declared_groups(self) -> list[str]:
        return sorted({group for spec in self.specs for group in spec.groups})

    def principal(self, role: str) -> str | None:
        """The Kafka principal `role` runs as (topics.yaml `principals:`), None when not declared."""
        return dict(self.principals).get(role)


def _fail(path: Path, where: str, problem: str) -> TopicsFileError:
    return TopicsFileError(f"{path}: {where}: {problem}")


def _positive_int(path: Path, where: str, value: Any, maximum: int = MAX_INT32) -> int:
    """A positive integer of at most `maximum` (Kafka's own field sizes: int32, int16 for a
    replication factor), so no count can overflow the client that sends it."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= maximum:
        raise _fail(path, where, f"must be a positive integer of at most {maximum}, got {value!r}")
    return value


def _names(path: Path, where: str, value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise _fail(path, where, "must be a list of names")
    return tuple(value)


def _config(path: Path, where: str, value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _fail(path, where, "must be a mapping of Kafka topic configs")
    out = {}
    for key, val in value.items():
        if not isinstance(key, str) or isinstance(val, (dict, list)) or val is None:
            raise _fail(path, f"{where}.{key}", "must be a single value")
        out[key] = str(val).lower() if isinstance(val, bool) else str(val)
    return out


def _retention_ms(path: Path, where: str, value: Any) -> str:
    match = _DURATION.match(str(value).strip())
    if not match:
        raise _fail(path, where, f"must be a duration like 30s, 10m, 1h or 14d, got {value!r}")
    return str(int(match.group(1)) * _UNIT_MS[match.group(2)])


def _read(path: Path) -> dict[str, Any]:
    try:
        doc = load_file(path, "topics file")
    except YamlFileError as exc:
        raise TopicsFileError(str(exc)) from None
    if not isinstance(doc, dict):
        raise TopicsFileError(f"{path}: must be a mapping with a 'topics' key")
    unknown = set(doc) - {"defaults", "groups", "topics", "principals"}
    if unknown:
        raise _fail(path, sorted(map(str, unknown))[0],
                    "unknown key (expected defaults, groups, topics, principals)")
    if not isinstance(doc.get("topics"), dict) or not doc["topics"]:
        raise _fail(path, "topics", "must map each topic name to its settings")
    return doc


def _topic(path: Path, declared: Any, body: Any, prefix: str, default_rf: int,
           default_config: dict[str, str], replication_factor: int | None) -> TopicSpec:
    where = f"topics.{declared}"
    name = f"{prefix}{declared}"
    if not isinstance(declared, str) or not _NAME.fullmatch(name):
        raise _fail(path, where, "topic names use only letters, digits, '.', '_' and '-'")
    if not isinstance(body, dict):
        raise _fail(path, where, "must be a mapping with at least 'partitions'")
    unknown = set(body) - _TOPIC_KEYS
    if unknown:
        raise _fail(path, f"{where}.{sorted(map(str, unknown))[0]}", "unknown key")
    if "partitions" not in body:
        raise _fail(path, f"{where}.partitions", "is required")
    role = body.get("role")
    if role is not None and role not in TOPIC_ROLES:
        raise _fail(path, f"{where}.role", f"must be one of {', '.join(TOPIC_ROLES)}, got {role!r}")
    partitions = _positive_int(path, f"{where}.partitions", body["partitions"])
    rf = replication_factor or _positive_int(
        path, f"{where}.replication_factor", body.get("replication_factor", default_rf), MAX_INT16)
    config = {**default_config, **_config(path, f"{where}.config", body.get("config"))}
    if "retention" in body:
        if "retention.ms" in config and "retention.ms" not in default_config:
            raise _fail(path, where, "set retention or config retention.ms, not both")
        config["retention.ms"] = _retention_ms(path, f"{where}.retention", body["retention"])
    if "min.insync.replicas" in config:
        misr = int(config["min.insync.replicas"]) if config["min.insync.replicas"].isdigit() else 0
        if misr < 1:
            raise _fail(path, f"{where}.config.min.insync.replicas", "must be a positive integer")
        config["min.insync.replicas"] = str(min(misr, rf))
    delay = body.get("delay_seconds")
    if delay is not None and role is not None:
        raise _fail(path, f"{where}.role", "a delay tier (delay_seconds) has no other role")
    groups = _names(path, f"{where}.groups", body.get("groups"))
    return TopicSpec(
        name=name,
        declared_name=declared,
        partitions=partitions,
        replication_factor=rf,
        config=config,
        role=role,
        groups=tuple(prefix + group for group in groups),
        manual_readers=_names(path, f"{where}.manual_readers", body.get("manual_readers")),
        delay_seconds=None if delay is None else _positive_int(path, f"{where}.delay_seconds", delay),
    )


def _groups(path: Path, doc: dict[str, Any], prefix: str) -> tuple[Groups, set[str]]:
    """The group of each role, and the names of retired roles' groups the file still declares."""
    declared = doc.get("groups")
    if not isinstance(declared, dict) or not set(GROUP_ROLES) <= set(declared) <= {
            *GROUP_ROLES, *OPTIONAL_GROUP_ROLES, *RETIRED_GROUP_ROLES}:
        raise _fail(path, "groups", f"must name the group of each role: {', '.join(GROUP_ROLES)} "
                                    f"(and may name {', '.join(OPTIONAL_GROUP_ROLES)})")
    for role, name in declared.items():
        if not isinstance(name, str) or not _NAME.fullmatch(prefix + name):
            raise _fail(path, f"groups.{role}", "group names use only letters, digits, '.', '_' and '-'")
    live = {role: prefix + declared[role] for role in (*GROUP_ROLES, *OPTIONAL_GROUP_ROLES) if role in declared}
    retired = {prefix + declared[role] for role in RETIRED_GROUP_ROLES if role in declared}
    for role in RETIRED_GROUP_ROLES:
        if role in declared:
            log.warning("%s: groups.%s (%s) is no longer used and is ignored; remove it and its name from "
                        "the topics' groups lists", path, role, declared[role])
    return Groups(**live), retired - set(live.values())


def _principals(path: Path, value: Any) -> tuple[tuple[str, str], ...]:
    """(role, principal) pairs of the optional `principals:` mapping; a file without it has none."""
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise _fail(path, "principals", "must map roles to Kafka principals (User:name)")
    for role, principal in value.items():
        if role not in PRINCIPAL_ROLES:
            raise _fail(path, f"principals.{role}", f"unknown role (expected one of {', '.join(PRINCIPAL_ROLES)})")
        if not isinstance(principal, str) or not _PRINCIPAL.fullmatch(principal):
            raise _fail(path, f"principals.{role}", f"must be a Kafka principal like User:lapse-{role}, "
                                                    f"got {principal!r}")
    return tuple((role, value[role]) for role in PRINCIPAL_ROLES if role in value)


def _by_role(path: Path, specs: list[TopicSpec], role: str) -> str:
    named = [spec.name for spec in specs if spec.role == role]
    if len(named) != 1:
        raise _fail(path, "topics", f"exactly one topic must have role: {role} (found {len(named)})")
    return named[0]


@lru_cache(maxsize=16)
def load_topology(path: Path, prefix: str = "", replication_factor: int | None = None) -> Topology:
    """Read and validate the topics file once (per path, prefix and override).

    `prefix` goes in front of every topic and group name. `replication_factor` overrides every
    topic's (tests and the demo use 1); `min.insync.replicas` is lowered to the effective
    replication factor when it is larger, so one file serves a 3-broker cluster and a single broker.
    """
    path = Path(path)
    doc = _read(path)
    defaults = doc.get("defaults") or {}
    if not isinstance(defaults, dict) or set(defaults) - {"replication_factor", "config"}:
        raise _fail(path, "defaults", "may only hold replication_factor and config")
    default_rf = _positive_int(path, "defaults.replication_factor", defaults.get("replication_factor", 1), MAX_INT16)
    default_config = _config(path, "defaults.config", defaults.get("config"))
    if replication_factor is not None:
        _positive_int(path, "replication factor override", replication_factor, MAX_INT16)
    groups, retired = _groups(path, doc, prefix)
    specs = [_topic(path, declared, body, prefix, default_rf, default_config, replication_factor)
             for declared, body in doc["topics"].items()]
    known = set(groups.by_role().values())
    for spec in specs:
        unknown = sorted(set(spec.groups) - known - retired)
        if unknown:
            raise _fail(path, f"topics.{spec.declared_name}.groups",
                        f"{unknown[0][len(prefix):]!r} is not declared under groups")
    specs = [replace(spec, groups=tuple(g for g in spec.groups if g not in retired)) for spec in specs]
    tiers = sorted((DelayTier(spec.name, spec.delay_seconds) for spec in specs if spec.delay_seconds),
                   key=lambda tier: (tier.delay_s, tier.topic))
    if not tiers:
        raise _fail(path, "topics", "declare at least one delay tier (a topic with delay_seconds)")
    return Topology(
        expiry=_by_role(path, specs, "expiry"),
        outcomes=_by_role(path, specs, "outcomes"),
        dlq=_by_role(path, specs, "dlq"),
        tiers=tuple(tiers),
        groups=groups,
        specs=tuple(specs),
        principals=_principals(path, doc.get("principals")),
    )
