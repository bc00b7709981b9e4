"""Provisioning: compare the declared topology with a cluster, fix what can be fixed safely (create
missing topics, set declared configs) and report what cannot.

A config change that can lose data or weaken durability is destructive: lowering retention
(`retention.ms`, `retention.bytes`; -1 is unlimited), changing `cleanup.policy`, lowering
`min.insync.replicas`. `plan` marks it (`Action.destructive` says why) and `apply` refuses it unless
told `allow_destructive`; the rest of the plan is applied either way.

Partition counts and replication factors are never changed here: adding partitions to a keyed
topic moves keys to other partitions (breaking per-key order), so a mismatch is reported as drift.

ACLs (`plan_acls`): the bindings the topology's principals need (`lapse.shell.acls`) are created
when missing; an ALLOW on this environment's topics or groups that the topology does not declare is
reported as drift. Removing it is destructive: `removals` turns that drift into removals, which
`apply` carries out only when told `allow_destructive`. A wider ALLOW that also reaches them (the
`*` wildcard, a shorter prefix) is drift too, never removed here; a DENY is an operator's own,
never drift and never removed. A broker without an authorizer has no ACLs to manage.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field, fields, replace
from enum import Enum
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

from lapse.kernel.topology import TopicSpec, Topology
from lapse.shell.acls import GROUP, LITERAL, PREFIXED, TOPIC, Grant, declared_grants, owned_resources

CREATE, ALTER, DRIFT, ERROR = "create", "alter_config", "drift", "error"
CREATE_ACL, REMOVE_ACL = "create_acl", "remove_acl"


@dataclass(frozen=True)
class Action:
    """One step of a plan; `status` is "planned" until `apply` sets done / failed / not fixed."""

    kind: str  # create | alter_config | drift | error | create_acl | remove_acl
    topic: str  # the topic; for an ACL, its resource (`topic lapse.expiry`, `group lapse-cleanup`)
    detail: str
    changes: dict[str, list[str | None]] = field(default_factory=dict)  # key -> [current, desired]
    status: str = "planned"
    destructive: tuple[str, ...] = ()  # why a config change can lose data or weaken durability
    spec: TopicSpec | None = field(default=None, compare=False, repr=False)
    acl: AclBinding | None = field(default=None, compare=False, repr=False)  # the ACL of an ACL action

    @property
    def fixable(self) -> bool:
        return self.kind in (CREATE, ALTER, CREATE_ACL, REMOVE_ACL)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: copy.deepcopy(getattr(self, f.name)) for f in fields(self) if f.name not in ("spec", "acl")}


TopicConfigs = dict[str, str | None]
RETENTION_KEYS = ("retention.ms", "retention.bytes")  # -1 is unlimited


def _number(value: str | None) -> float | None:
    """A numeric config value; below 0 (-1: unlimited retention) as infinity; None when unreadable."""
    try:
        number = int(value) if value is not None else None
    except ValueError:
        return None
    return None if number is None else (float("inf") if number < 0 else float(number))


def destructive_changes(changes: dict[str, list[str | None]]) -> tuple[str, ...]:
    """Why setting `changes` ({key: [current, desired]}) on an existing topic can lose data or
    weaken durability: lowered retention, a changed cleanup policy, fewer in-sync replicas."""
    why = []
    for key, (current, desired) in sorted(changes.items()):
        if key in RETENTION_KEYS:
            before, after = _number(current), _number(desired)
            if before is not None and after is not None and after < before:
                why.append(f"lowers {key} from {current} to {desired}")
        elif key == "cleanup.policy" and current is not None and current != desired:
            why.append(f"changes cleanup.policy from {current} to {desired}")
        elif key == "min.insync.replicas":
            before, after = _number(current), _number(desired)
            if before is not None and after is not None and after < before:
                why.append(f"lowers min.insync.replicas from {current} to {desired}")
    return tuple(why)


def _describe(admin: AdminClient, names: list[str], timeout: float) -> dict[str, TopicConfigs | BaseException]:
    """Current configs per topic ({key: value}), or the exception when the broker refused."""
    if not names:
        return {}
    resources = [ConfigResource(ResourceType.TOPIC, name) for name in names]
    try:
        futures = admin.describe_configs(resources, request_timeout=timeout)
    except KafkaException as exc:
        return {name: exc for name in names}
    out: dict[str, TopicConfigs | BaseException] = {}
    for resource, future in futures.items():
        try:
            out[resource.name] = {k: e.value for k, e in future.result(timeout).items()}
        except Exception as exc:  # KafkaException: unsupported or failed on this broker
            out[resource.name] = exc
    return out


def _error_text(exc: BaseException) -> str:
    err = exc.args[0] if exc.args else None
    return err.str() if isinstance(err, KafkaError) else str(exc)


def plan(admin: AdminClient, declared: list[TopicSpec], timeout: float = 10.0) -> list[Action]:
    """What `apply` would do to make the cluster match `declared`; an empty list means no change. A
    topic the cluster has too few brokers to create is an error of the plan itself, so that a dry
    run refuses what the apply would."""
    metadata = admin.list_topics(timeout=timeout)
    existing = [spec for spec in declared if spec.name in metadata.topics]
    configs = _describe(admin, [spec.name for spec in existing], timeout)
    brokers = len(metadata.brokers)
    actions: list[Action] = []
    for spec in declared:
        topic = metadata.topics.get(spec.name)
        if topic is None and spec.replication_factor > brokers:  # the broker would refuse the create
            actions.append(Action(ERROR, spec.name,
                                  f"cannot be created with replication factor {spec.replication_factor}: the "
                                  f"cluster has {brokers} broker(s); declare fewer replicas or pass "
                                  f"--replication-factor {brokers}", spec=spec))
            continue
        if topic is None:
            actions.append(Action(CREATE, spec.name,
                                  f"create with {spec.partitions} partitions, replication "
                                  f"{spec.replication_factor}", spec=spec))
            continue
        if len(topic.partitions) != spec.partitions:
            actions.append(Action(DRIFT, spec.name,
                                  f"has {len(topic.partitions)} partitions, declared {spec.partitions}; "
                                  "partition counts are never changed automatically (it would move "
                                  "keys between partitions)", spec=spec))
        replicas = {len(p.replicas) for p in topic.partitions.values()}
        if replicas and replicas != {spec.replication_factor}:
            actions.append(Action(DRIFT, spec.name,
                                  f"has replication factor {sorted(replicas)}, declared "
                                  f"{spec.replication_factor}; change it with a partition "
                                  "reassignment", spec=spec))
        current = configs.get(spec.name)
        if not isinstance(current, dict):
            why = _error_text(current) if current is not None else "no answer for this topic"
            actions.append(Action(ERROR, spec.name, f"cannot read topic configs from this broker: {why}",
                                  spec=spec))
            continue
        wanted = dict(spec.config)
        if "min.insync.replicas" in wanted and replicas:
            # Never ask for more in-sync replicas than the topic really has: acks=all would fail.
            wanted["min.insync.replicas"] = str(min(int(wanted["min.insync.replicas"]), min(replicas)))
        changes = {key: [current.get(key), want] for key, want in sorted(wanted.items())
                   if current.get(key) != want}
        if changes:
            actions.append(Action(ALTER, spec.name,
                                  "set " + ", ".join(f"{k}={v[1]}" for k, v in changes.items()),
                                  changes=changes, spec=spec, destructive=destructive_changes(changes)))
    return actions


def _wait_visible(admin: AdminClient, specs: list[TopicSpec], timeout: float) -> None:
    """Return once metadata shows every topic with a leader per partition (or the time is up)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        topics = admin.list_topics(timeout=timeout).topics
        if all(
            spec.name in topics and len(topics[spec.name].partitions) == spec.partitions
            and all(p.leader >= 0 for p in topics[spec.name].partitions.values())
            for spec in specs
        ):
            return
        time.sleep(0.1)


def _wait_configs(admin: AdminClient, wanted: dict[str, TopicConfigs], timeout: float) -> None:
    """Return once describe_configs shows the altered values (the broker applies them a moment after
    the controller accepted them), or the time is up."""
    deadline = time.monotonic() + timeout
    while wanted and time.monotonic() < deadline:
        current = _describe(admin, list(wanted), timeout)
        if all(_has_configs(current.get(name), values) for name, values in wanted.items()):
            return
        time.sleep(0.1)


def _has_configs(current: TopicConfigs | BaseException | None, values: TopicConfigs) -> bool:
    return isinstance(current, dict) and all(current.get(k) == v for k, v in values.items())


def _spec(action: Action) -> TopicSpec:
    if action.spec is None:
        raise ValueError(f"{action.kind} action for {action.topic} has no topic spec")
    return action.spec


def apply(admin: AdminClient, actions: list[Action], timeout: float = 30.0, *,
          allow_destructive: bool = False) -> list[Action]:
    """Carry out the fixable actions; every action comes back with status done, failed, not fixed,
    or refused (a destructive config change without `allow_destructive`)."""
    results: dict[int, Action] = {}
    creates = [(i, a, _spec(a)) for i, a in enumerate(actions) if a.kind == CREATE]
    if creates:
        new = [NewTopic(a.topic, num_partitions=spec.partitions,
                        replication_factor=spec.replication_factor, config=dict(spec.config))
               for _, a, spec in creates]
        futures = admin.create_topics(new, request_timeout=timeout, operation_timeout=timeout)
        for i, action, _ in creates:
            try:
                futures[action.topic].result(timeout)
                results[i] = replace(action, status="done")
            except Exception as exc:
                results[i] = replace(action, status="failed", detail=f"{action.detail}: {_error_text(exc)}")
        created = [spec for i, _, spec in creates if results[i].status == "done"]
        _wait_visible(admin, created, timeout)
    altered: dict[str, TopicConfigs] = {}
    for i, action in enumerate(actions):
        if action.kind == ALTER and action.destructive and not allow_destructive:
            results[i] = replace(action, status="refused")
        elif action.kind == ALTER:
            entries = [ConfigEntry(k, v[1], incremental_operation=AlterConfigOpType.SET)
                       for k, v in action.changes.items()]
            resource = ConfigResource(ResourceType.TOPIC, action.topic, incremental_configs=entries)
            try:
                admin.incremental_alter_configs([resource], request_timeout=timeout)[resource].result(timeout)
                results[i] = replace(action, status="done")
                altered[action.topic] = {k: v[1] for k, v in action.changes.items()}
            except Exception as exc:
                results[i] = replace(action, status="failed", detail=f"{action.detail}: {_error_text(exc)}")
        elif action.kind in (DRIFT, ERROR):
            results[i] = replace(action, status="not fixed")
    results.update(_create_acls(admin, [(i, a) for i, a in enumerate(actions) if a.kind == CREATE_ACL], timeout))
    removals = [(i, a) for i, a in enumerate(actions) if a.kind == REMOVE_ACL]
    results.update({i: replace(a, status="refused") for i, a in removals if not allow_destructive})
    results.update(_remove_acls(admin, removals if allow_destructive else [], timeout))
    _wait_configs(admin, altered, timeout)
    return [results[i] for i in range(len(actions))]


# --- ACLs ------------------------------------------------------------------------------------------

_RESOURCE = {TOPIC: ResourceType.TOPIC, GROUP: ResourceType.GROUP}
_PATTERN = {LITERAL: ResourcePatternType.LITERAL, PREFIXED: ResourcePatternType.PREFIXED}
# None matches any principal and host (the client's type hints say str only)
_EVERY_ACL = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None,  # type: ignore[arg-type]
                              AclOperation.ANY, AclPermissionType.ANY)
# describe_acls' answer from a broker that has no ACLs to manage (no authorizer, or no ACL API)
_NO_AUTHORIZER = {KafkaError.SECURITY_DISABLED, KafkaError._UNSUPPORTED_FEATURE, KafkaError.UNSUPPORTED_VERSION}


class NoAuthorizer(Exception):
    """The broker has no authorizer (or no ACL API): there are no ACLs to plan."""


def binding(grant: Grant) -> AclBinding:
    """The ALLOW binding, from any host, of `grant`."""
    return AclBinding(_RESOURCE[grant.resource], grant.name, _PATTERN[grant.pattern], grant.principal, "*",
                      AclOperation[grant.operation], AclPermissionType.ALLOW)


def _name(value: Enum | str | int) -> str:
    """An ACL field's name as Kafka spells it (the client types them as enum, string or number)."""
    return value.name if isinstance(value, Enum) else str(value)


def _key(acl: AclBinding) -> tuple[str, str, str, str, str, str, str]:
    return (_name(acl.restype), acl.name, _name(acl.resource_pattern_type), acl.principal, acl.host,
            _name(acl.operation), _name(acl.permission_type))


def _where(acl: AclBinding) -> str:
    prefixed = acl.resource_pattern_type == ResourcePatternType.PREFIXED
    return f"{_name(acl.restype).lower()} {acl.name}{'*' if prefixed else ''}"


def _authorizer(admin: AdminClient, timeout: float) -> str | None:
    """A broker's `authorizer.class.name` ("" when it has none), None when its configs cannot be
    read (then describe_acls' answer decides)."""
    try:
        broker = min(admin.list_topics(timeout=timeout).brokers)
        resource = ConfigResource(ResourceType.BROKER, str(broker))
        entries = admin.describe_configs([resource], request_timeout=timeout)[resource].result(timeout)
    except Exception:  # KafkaException or ValueError: no broker listed, configs not readable here
        return None
    entry = entries.get("authorizer.class.name")
    return (entry.value or "") if entry is not None else None


def existing_acls(admin: AdminClient, timeout: float = 10.0) -> list[AclBinding]:
    """Every ACL binding on the cluster; NoAuthorizer when the broker manages none (a broker
    without an authorizer answers describe_acls with an empty list, so its config is asked first)."""
    if _authorizer(admin, timeout) == "":
        raise NoAuthorizer("authorizer.class.name is not set")
    return _all_acls(admin, timeout)


def _all_acls(admin: AdminClient, timeout: float) -> list[AclBinding]:
    """describe_acls for every binding; NoAuthorizer when the broker has no ACL API to answer it."""
    try:
        found: list[AclBinding] = admin.describe_acls(_EVERY_ACL, request_timeout=timeout).result(timeout)
    except KafkaException as exc:
        err = exc.args[0] if exc.args else None
        if isinstance(err, KafkaError) and err.code() in _NO_AUTHORIZER:
            raise NoAuthorizer(err.str()) from None
        raise
    return found


def plan_acls(admin: AdminClient, topology: Topology, timeout: float = 10.0) -> list[Action]:
    """What `apply` would do to the cluster's ACLs: create each declared binding that is missing;
    report each undeclared ALLOW that reaches this environment's own resources as drift: one on
    them alone (removable with `removals`), or a wider one, a wildcard or a prefix that also covers
    them (reported only: it reaches beyond this environment). A DENY is an operator's restriction
    Lapse never creates: neither drift nor ever removed. NoAuthorizer when the broker has no ACLs."""
    current = existing_acls(admin, timeout)
    have = {_key(acl) for acl in current}
    wanted = [binding(grant) for grant in declared_grants(topology)]
    actions = [Action(CREATE_ACL, _where(acl), f"allow {acl.principal} {_name(acl.operation)} from any host",
                      acl=acl) for acl in wanted if _key(acl) not in have]
    declared = {_key(acl) for acl in wanted}
    owned = [(_name(_RESOURCE[r]), name, _name(_PATTERN[p])) for r, name, p in sorted(owned_resources(topology))]
    for acl in sorted(current, key=_key):
        if _key(acl) in declared or _name(acl.permission_type) != "ALLOW":
            continue
        resource = _key(acl)[:3]
        reached = [mine for mine in owned if _covers(resource, mine)]
        if any(_covers(mine, resource) for mine in owned):  # on this environment's resources alone
            actions.append(Action(DRIFT, _where(acl), (
                f"{_text(acl)} is not declared in the topics file; ACLs are never removed automatically"),
                acl=acl))
        elif reached:
            restype, name, pattern = reached[0]
            actions.append(Action(DRIFT, _where(acl), (
                f"{_text(acl)} reaches {restype.lower()} {name}{'*' if pattern == 'PREFIXED' else ''} and is not "
                "declared in the topics file; it reaches beyond this environment, so it is never removed here")))
    return actions


def _covers(wide: tuple[str, str, str], narrow: tuple[str, str, str]) -> bool:
    """Whether the ACL resource pattern `wide` (type, name, LITERAL or PREFIXED) matches every name
    `narrow` matches (the literal `*` matches every name of its type)."""
    (wide_type, wide_name, wide_pattern), (narrow_type, narrow_name, narrow_pattern) = wide, narrow
    if wide_type != narrow_type:
        return False
    if wide_pattern == "LITERAL":
        return wide_name == "*" or (narrow_pattern == "LITERAL" and narrow_name == wide_name)
    return narrow_name.startswith(wide_name) and not (narrow_pattern == "LITERAL" and narrow_name == "*")


def _text(acl: AclBinding) -> str:
    host = "any host" if acl.host == "*" else acl.host
    return f"{_name(acl.permission_type).lower()} {acl.principal} {_name(acl.operation)} from {host}"


def removals(actions: list[Action]) -> list[Action]:
    """`actions` with each undeclared ACL (an ACL drift) turned into its removal, which is
    destructive: `apply` refuses it unless told `allow_destructive`."""
    return [replace(a, kind=REMOVE_ACL, detail=f"remove {_text(a.acl)}",
                    destructive=(f"removes the undeclared ACL {_text(a.acl)}",))
            if a.kind == DRIFT and a.acl is not None else a for a in actions]


def _remove_acls(admin: AdminClient, removes: list[tuple[int, Action]], timeout: float) -> dict[int, Action]:
    """Delete exactly the bindings of `removes`; returns each action with its status, once
    describe_acls no longer shows the removed ones."""
    results: dict[int, Action] = {}
    for i, action in removes:
        acl = action.acl
        try:
            if acl is None:
                raise ValueError(f"remove_acl action on {action.topic} has no binding")
            exact = AclBindingFilter(acl.restype, acl.name, acl.resource_pattern_type, acl.principal, acl.host,
                                     acl.operation, acl.permission_type)
            admin.delete_acls([exact], request_timeout=timeout)[exact].result(timeout)
            results[i] = replace(action, status="done")
        except Exception as exc:
            results[i] = replace(action, status="failed", detail=f"{action.detail}: {_error_text(exc)}")
    _wait_acls(admin, results, present=False, timeout=timeout)
    return results


def _create_acls(admin: AdminClient, creates: list[tuple[int, Action]], timeout: float) -> dict[int, Action]:
    """Create the bindings of `creates`; returns each action with its status, once describe_acls
    shows the created ones (the authorizer learns them a moment after the controller accepted them)."""
    if not creates:
        return {}
    bindings = [action.acl for _, action in creates if action.acl is not None]
    futures = admin.create_acls(bindings, request_timeout=timeout)
    results: dict[int, Action] = {}
    for i, action in creates:
        try:
            if action.acl is None:
                raise ValueError(f"create_acl action on {action.topic} has no binding")
            futures[action.acl].result(timeout)
            results[i] = replace(action, status="done")
        except Exception as exc:
            results[i] = replace(action, status="failed", detail=f"{action.detail}: {_error_text(exc)}")
    _wait_acls(admin, results, present=True, timeout=timeout)
    return results


def _wait_acls(admin: AdminClient, results: dict[int, Action], *, present: bool, timeout: float) -> None:
    """Wait (at most `timeout`) until describe_acls shows every binding `results` created
    (`present`) or none it deleted: the authorizer learns a change a moment after the controller
    accepted it."""
    changed = {_key(a.acl) for a in results.values() if a.status == "done" and a.acl is not None}
    deadline = time.monotonic() + timeout
    while changed and time.monotonic() < deadline:
        listed = {_key(acl) for acl in _all_acls(admin, timeout)}
        if (changed <= listed) if present else not (changed & listed):
            return
        time.sleep(0.1)
