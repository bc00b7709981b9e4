"""Provisioning: compare the declared topology with a cluster, fix what can be fixed safely (create
missing topics, set declared configs) and report what cannot.

A config change that can lose data or weaken durability is destructive: lowering retention
(`retention.ms`, `retention.bytes`; -1 is unlimited), changing `cleanup.policy`, lowering
`min.insync.replicas`. `plan` marks it (`Action.destructive` says why) and `apply` refuses it unless
told `allow_destructive`; the rest of the plan is applied either way.

Partition counts and replication factors are never changed here: adding partitions to a keyed
topic moves keys to other partitions (breaking per-key order), so a mismatch is reported as drift.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)

from lapse.kernel.topology import TopicSpec

CREATE, ALTER, DRIFT, ERROR = "create", "alter_config", "drift", "error"


@dataclass(frozen=True)
class Action:
    """One step of a plan; `status` is "planned" until `apply` sets done / failed / not fixed."""

    kind: str  # create | alter_config | drift | error
    topic: str
    detail: str
    changes: dict[str, list[str | None]] = field(default_factory=dict)  # key -> [current, desired]
    status: str = "planned"
    destructive: tuple[str, ...] = ()  # why a config change can lose data or weaken durability
    spec: TopicSpec | None = field(default=None, compare=False, repr=False)

    @property
    def fixable(self) -> bool:
        return self.kind in (CREATE, ALTER)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("spec")
        return data


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
    """What `apply` would do to make the cluster match `declared`; an empty list means no change."""
    metadata = admin.list_topics(timeout=timeout)
    existing = [spec for spec in declared if spec.name in metadata.topics]
    configs = _describe(admin, [spec.name for spec in existing], timeout)
    actions: list[Action] = []
    for spec in declared:
        topic = metadata.topics.get(spec.name)
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
    _wait_configs(admin, altered, timeout)
    return [results[i] for i in range(len(actions))]
