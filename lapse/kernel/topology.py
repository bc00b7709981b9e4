"""Declared topics (topics.yaml): load and validate the file, compare it with a cluster, fix what
can be fixed safely (create missing topics, set declared configs) and report what cannot.

Partition counts and replication factors are never changed here: adding partitions to a keyed
topic moves keys to other partitions (breaking per-key order), so a mismatch is reported as drift.
"""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)

from lapse.kernel.settings import REPO_ROOT, Settings

DEFAULT_TOPICS_FILE = REPO_ROOT / "topics.yaml"
DEFAULT_DELAY_PREFIX = "lapse.delay."
_NAME = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
_DURATION = re.compile(r"^(\d+)\s*(ms|s|m|h|d)$")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_TOPIC_KEYS = {"partitions", "replication_factor", "retention", "config", "groups",
               "manual_readers", "delay_seconds"}

CREATE, ALTER, DRIFT, ERROR = "create", "alter_config", "drift", "error"


class TopicsFileError(ValueError):
    """topics.yaml is missing or malformed; the message is one line naming the file and the key."""


@dataclass(frozen=True)
class TopicSpec:
    """One declared topic, with the effective name (prefix/suffix applied) and config."""

    name: str
    declared_name: str
    partitions: int
    replication_factor: int
    config: dict[str, str]
    groups: tuple[str, ...] = ()
    manual_readers: tuple[str, ...] = ()
    delay_seconds: int | None = None


@dataclass(frozen=True)
class Action:
    """One step of a plan; `status` is "planned" until `apply` sets done / failed / not fixed."""

    kind: str  # create | alter_config | drift | error
    topic: str
    detail: str
    changes: dict[str, list[str | None]] = field(default_factory=dict)  # key -> [current, desired]
    status: str = "planned"
    spec: TopicSpec | None = field(default=None, compare=False, repr=False)

    @property
    def fixable(self) -> bool:
        return self.kind in (CREATE, ALTER)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("spec")
        return data


# ---------------------------------------------------------------- loading


def _fail(path: Path, where: str, problem: str) -> TopicsFileError:
    return TopicsFileError(f"{path}: {where}: {problem}")


def _positive_int(path: Path, where: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _fail(path, where, f"must be a positive integer, got {value!r}")
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
        text = path.read_text()
    except OSError as exc:
        raise TopicsFileError(f"{path}: cannot read topics file ({exc.strerror})") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f"line {mark.line + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or "parse error"
        raise TopicsFileError(f"{path}: not valid YAML ({line}{problem})") from None
    if not isinstance(doc, dict):
        raise TopicsFileError(f"{path}: must be a mapping with a 'topics' key")
    unknown = set(doc) - {"defaults", "topics"}
    if unknown:
        raise _fail(path, sorted(map(str, unknown))[0], "unknown key (expected defaults, topics)")
    if not isinstance(doc.get("topics"), dict) or not doc["topics"]:
        raise _fail(path, "topics", "must map each topic name to its settings")
    return doc


def load_topics(
    path: str | Path | None = None,
    name_prefix: str = "",
    name_suffix: str = "",
    replication_factor: int | None = None,
) -> list[TopicSpec]:
    """Read and validate the topics file; `replication_factor` overrides every topic's (tests use 1).

    `min.insync.replicas` is lowered to the effective replication factor when it is larger, so the
    same file serves a 3-broker cluster and a single test broker.
    """
    path = Path(path) if path is not None else DEFAULT_TOPICS_FILE
    doc = _read(path)
    defaults = doc.get("defaults") or {}
    if not isinstance(defaults, dict) or set(defaults) - {"replication_factor", "config"}:
        raise _fail(path, "defaults", "may only hold replication_factor and config")
    default_rf = _positive_int(path, "defaults.replication_factor",
                               defaults.get("replication_factor", 1))
    default_config = _config(path, "defaults.config", defaults.get("config"))
    if replication_factor is not None:
        _positive_int(path, "replication factor override", replication_factor)

    specs = []
    for declared, body in doc["topics"].items():
        where = f"topics.{declared}"
        name = f"{name_prefix}{declared}{name_suffix}"
        if not isinstance(declared, str) or not _NAME.match(name):
            raise _fail(path, where, "topic names use only letters, digits, '.', '_' and '-'")
        if not isinstance(body, dict):
            raise _fail(path, where, "must be a mapping with at least 'partitions'")
        unknown = set(body) - _TOPIC_KEYS
        if unknown:
            raise _fail(path, f"{where}.{sorted(map(str, unknown))[0]}", "unknown key")
        if "partitions" not in body:
            raise _fail(path, f"{where}.partitions", "is required")
        partitions = _positive_int(path, f"{where}.partitions", body["partitions"])
        rf = replication_factor or _positive_int(
            path, f"{where}.replication_factor", body.get("replication_factor", default_rf))
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
        specs.append(TopicSpec(
            name=name,
            declared_name=declared,
            partitions=partitions,
            replication_factor=rf,
            config=config,
            groups=_names(path, f"{where}.groups", body.get("groups")),
            manual_readers=_names(path, f"{where}.manual_readers", body.get("manual_readers")),
            delay_seconds=None if delay is None else _positive_int(path, f"{where}.delay_seconds", delay),
        ))
    return specs


def _path_and_prefix(settings_or_path: Settings | str | Path | None) -> tuple[Path, str]:
    # Tier names come from the file's own names; settings.delay_topic_prefix only renames the
    # topics a deployment (or a test) produces to.
    if isinstance(settings_or_path, Settings):
        return settings_or_path.topics_file, DEFAULT_DELAY_PREFIX
    return Path(settings_or_path or DEFAULT_TOPICS_FILE), DEFAULT_DELAY_PREFIX


def delay_tiers(settings_or_path: Settings | str | Path | None = None) -> list[tuple[str, int]]:
    """The delay tiers as (tier, delay_seconds), shortest first; tier is the name after the prefix."""
    path, prefix = _path_and_prefix(settings_or_path)
    tiers = []
    for spec in load_topics(path):
        if spec.delay_seconds is None:
            continue
        if not spec.name.startswith(prefix):
            raise _fail(path, f"topics.{spec.name}", f"a delay tier's name must start with {prefix!r}")
        tiers.append((spec.name[len(prefix):], spec.delay_seconds))
    return sorted(tiers, key=lambda tier: (tier[1], tier[0]))


def declared_groups(settings_or_path: Settings | str | Path | None = None) -> list[str]:
    """Every consumer group the topics file says reads some topic, sorted."""
    path, _ = _path_and_prefix(settings_or_path)
    return sorted({group for spec in load_topics(path) for group in spec.groups})


# ---------------------------------------------------------------- plan and apply


TopicConfigs = dict[str, str | None]


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


def plan(admin: AdminClient, declared: list[TopicSpec], timeout: float = 15.0) -> list[Action]:
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
                                  changes=changes, spec=spec))
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


def apply(admin: AdminClient, actions: list[Action], timeout: float = 30.0) -> list[Action]:
    """Carry out the fixable actions; every action comes back with status done, failed or not fixed."""
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
        if action.kind == ALTER:
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
