"""The boundary of effect declarations, without a broker: `effect:` is a one-key mapping that the
discriminated union turns into exactly one registered type, or a one-line refusal naming the field;
the kernel's and the processors' registries agree; a `kafka-produce` topic must be declared with
role effect; produce errors fall into the failure classes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import KafkaError
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import Column, DateTime, Index, Integer, MetaData, String, Table, create_engine

from lapse.kernel.kinds import KindsFileError, compile_kinds, read_kinds_file
from lapse.kernel.kinds import effects as effects_package
from lapse.kernel.kinds.declarations import DeclaredKind, parse_kind
from lapse.kernel.kinds.effects.base import ExternalEffectType
from lapse.kernel.kinds.effects.kafka_produce import KafkaProduceEffect
from lapse.kernel.kinds.effects.registry import BY_TAG, EFFECT_TYPES, EXTERNAL_TAGS, TAGS, exactly_one
from lapse.kernel.kinds.errors import KindError
from lapse.kernel.topology import load_topology
from lapse.processors.effects import BUILDERS
from lapse.processors.effects.kafka_produce import partition_of, produce_failure
from lapse.processors.failures import AMBIGUOUS, CLASSES, INVALID, TEMPORARY

BASE = {"table": "profiles", "id": "id", "due": "erase_after"}
INNER: dict[str, dict[str, Any]] = {  # a valid value under each tag
    "update": {"set": {"status": "erased"}},
    "delete": {},
    "http": {"url": "https://x.example/{id}"},
    "object-store": {"url": "file:objects", "key_column": "status"},
    "kafka-produce": {"topic": "t.effects"},
}
TOPICS = ("groups: {cleanup: g-cleanup, delay: g-delay, analytics: g-analytics}\n"
          "topics:\n"
          "  t.expiry: {role: expiry, partitions: 1, groups: [g-cleanup]}\n"
          "  t.outcomes: {role: outcomes, partitions: 1, groups: [g-analytics]}\n"
          "  t.dlq: {role: dlq, partitions: 1}\n"
          "  t.delay.30s: {partitions: 1, delay_seconds: 30, groups: [g-delay]}\n"
          "  t.effects: {role: effect, partitions: 4}\n")

metadata = MetaData()
Table(  # the business table the declarations name, created in each test's own SQLite file
    "profiles", metadata,
    Column("id", Integer, primary_key=True),
    Column("status", String(16), nullable=False),
    Column("erase_after", DateTime, nullable=False),
    Index("ix_profiles_due", "erase_after", "id"),
)


def refusal(effect: Any) -> str:
    with pytest.raises(KindError) as caught:
        parse_kind("erase", {**BASE, "effect": effect})
    return str(caught.value)


def test_the_registries_of_both_layers_name_the_same_types():
    assert len(set(TAGS)) == len(EFFECT_TYPES) and set(INNER) == set(TAGS)
    assert set(BUILDERS) == set(EXTERNAL_TAGS)  # every external type has a caller, nothing else has one
    assert all(issubclass(t, ExternalEffectType) == (t.tag in EXTERNAL_TAGS) for t in EFFECT_TYPES)


@pytest.mark.parametrize("tag", TAGS)
def test_a_one_key_mapping_is_that_type(tag):
    decl = parse_kind("erase", {**BASE, "effect": {tag: INNER[tag]}})
    assert isinstance(decl, DeclaredKind) and type(decl.effect) is BY_TAG[tag] and decl.effect.tag == tag
    assert decl.summary()["effect"] == tag
    assert DeclaredKind.model_validate({**BASE, "effect": decl.effect}) == decl  # an instance passes as is


def test_bare_delete_is_delete_and_other_bare_types_name_their_field():
    assert parse_kind("erase", {**BASE, "effect": {"delete": None}}).effect.tag == "delete"  # type: ignore[union-attr]
    assert refusal({"update": None}).startswith("effect.update: ")
    assert refusal({"kafka-produce": None}).startswith("effect.kafka-produce: ")


@pytest.mark.parametrize(("effect", "expected"), [
    ({}, f"effect: {exactly_one()}"),
    ({"update": INNER["update"], "delete": {}}, f"effect: {exactly_one()}"),
    ({"truncate": {}}, "effect.truncate: Extra inputs are not permitted"),
    ({"kafka-produce": {}}, "effect.kafka-produce.topic: Field required"),
    ({"kafka-produce": {"topic": "t", "acks": 1}}, "effect.kafka-produce.acks: Extra inputs are not permitted"),
    ({"kafka-produce": {"topic": "t", "timeout_s": 0}}, "effect.kafka-produce.timeout_s: Input should be greater"),
    ({"kafka-produce": {"topic": ""}}, "effect.kafka-produce.topic: String should have at least 1 character"),
    ("delete", "effect: "),
])
def test_a_wrong_effect_is_refused_naming_the_field(effect, expected):
    assert refusal(effect).startswith(expected)


@given(keys=st.lists(st.sampled_from([*TAGS, "truncate", "python", "set", "x-y"]), unique=True, max_size=4))
def test_any_mapping_not_of_exactly_one_type_is_refused_in_one_line(keys):
    effect = {k: INNER.get(k, {}) for k in keys}
    known = [k for k in keys if k in TAGS]
    if len(keys) == 1 and known:
        assert parse_kind("erase", {**BASE, "effect": effect}).effect.tag == known[0]  # type: ignore[union-attr]
        return
    message = refusal(effect)
    assert "\n" not in message
    unknown = [k for k in keys if k not in TAGS]
    assert message == (f"effect: {exactly_one()}" if not unknown
                       else f"effect.{unknown[0]}: Extra inputs are not permitted")


@given(tag=st.sampled_from(EXTERNAL_TAGS), rate=st.floats(0.01, 100_000))
def test_limits_go_with_external_effects_only(tag, rate):
    limits = {"rate_per_s": rate, "per": "endpoint"}
    decl = parse_kind("erase", {**BASE, "effect": {tag: INNER[tag]}, "limits": limits})
    assert decl.limits.rate_per_s == rate  # type: ignore[union-attr]
    for internal in set(TAGS) - set(EXTERNAL_TAGS):
        with pytest.raises(KindError, match="limits apply to"):
            parse_kind("erase", {**BASE, "effect": {internal: INNER[internal]}, "limits": limits})


@pytest.fixture
def compile_with(tmp_path):
    engine = create_engine(f"sqlite:///{tmp_path / 'business.db'}")
    metadata.create_all(engine)
    topics = tmp_path / "topics.yaml"
    topics.write_text(TOPICS)

    def compile_effect(inner: dict[str, Any], *, with_topology: bool = True, prefix: str = "p."):
        path = tmp_path / "kinds.yaml"
        path.write_text(yaml.safe_dump({"kinds": {"erase": {**BASE, "effect": {"kafka-produce": inner}}}}))
        topology = load_topology(topics, prefix) if with_topology else None
        return compile_kinds(read_kinds_file(path), engine, topology=topology)["erase"]

    yield compile_effect
    engine.dispose()


def test_a_kafka_produce_topic_compiles_to_its_prefixed_name(compile_with):
    kind = compile_with({"topic": "t.effects", "then_set": {"status": "produced"}})
    assert kind.external_effect is not None and kind.idempotent_effect
    declared = kind.external_effect.declared
    assert isinstance(declared, KafkaProduceEffect) and declared.topic == "p.t.effects"
    assert declared.privileges() == ["SELECT", "UPDATE"]
    assert compile_with({"topic": "p.t.effects"}).external_effect.declared.privileges() == ["SELECT"]  # type: ignore[union-attr]


@pytest.mark.parametrize(("inner", "expected"), [
    ({"topic": "t.nowhere"}, "effect.kafka-produce.topic: 't.nowhere' is not declared in the topics file "
                             "(declare it with role: effect)"),
    ({"topic": "t.dlq"}, "effect.kafka-produce.topic: 't.dlq' has role dlq in the topics file, not role: effect"),
    ({"topic": "t.delay.30s"}, "effect.kafka-produce.topic: 't.delay.30s' has no role in the topics file"),
    ({"topic": "t.effects", "then_set": {"statuz": "x"}}, "effect.kafka-produce.then_set.statuz: no column"),
])
def test_a_kafka_produce_topic_not_of_role_effect_is_refused_in_one_line(compile_with, inner, expected):
    with pytest.raises(KindsFileError) as caught:
        compile_with(inner)
    message = str(caught.value)
    assert "\n" not in message and f"kind 'erase': {expected}" in message, message


def test_a_kafka_produce_kind_without_a_topics_file_says_so(compile_with):
    with pytest.raises(KindsFileError, match=r"effect\.kafka-produce\.topic: no topics file"):
        compile_with({"topic": "t.effects"}, with_topology=False)


@pytest.mark.parametrize(("code", "expected"), [
    (KafkaError.MSG_SIZE_TOO_LARGE, INVALID),
    (KafkaError.TOPIC_AUTHORIZATION_FAILED, INVALID),
    (KafkaError.UNKNOWN_TOPIC_OR_PART, INVALID),
    (KafkaError._UNKNOWN_TOPIC, INVALID),
    (KafkaError.INVALID_RECORD, INVALID),
    (KafkaError._MSG_TIMED_OUT, AMBIGUOUS),
    (KafkaError.REQUEST_TIMED_OUT, AMBIGUOUS),
    (KafkaError.NOT_LEADER_FOR_PARTITION, TEMPORARY),
    (KafkaError.NOT_ENOUGH_REPLICAS, TEMPORARY),
    (KafkaError._TRANSPORT, TEMPORARY),
    (KafkaError._ALL_BROKERS_DOWN, TEMPORARY),
])
def test_produce_errors_fall_into_the_failure_classes(code, expected):
    failure = produce_failure(KafkaError(code), "p.t.effects")
    assert failure.failure_class == expected and failure.reason.startswith("produce to p.t.effects: ")


KAFKA_ERROR_CODES = sorted({v for k, v in vars(KafkaError).items()
                            if isinstance(v, int) and not isinstance(v, bool) and k.lstrip("_").isupper()})


@given(code=st.sampled_from(KAFKA_ERROR_CODES))
def test_every_produce_error_has_a_class_and_a_one_line_reason(code):
    failure = produce_failure(KafkaError(code, "line one\nline two"), "t")
    assert failure.failure_class in CLASSES and "\n" not in failure.reason


@given(key=st.binary(max_size=300), partitions=st.integers(1, 1000))
def test_an_op_key_always_goes_to_the_same_partition(key, partitions):
    assert 0 <= partition_of(key, partitions) < partitions
    assert partition_of(key, partitions) == partition_of(bytes(key), partitions)


def test_the_effect_type_modules_live_one_per_type():
    folder = Path(effects_package.__file__).parent
    modules = {p.stem for p in folder.glob("*.py")} - {"__init__", "base", "registry"}
    assert {t.tag.replace("-", "_") for t in EFFECT_TYPES} | {"python"} == modules


def test_the_json_schema_shows_effect_as_the_file_writes_it():
    """One object of one key per registered type (what the generated kinds-file reference shows)."""
    schema = DeclaredKind.model_json_schema()
    members = schema["properties"]["effect"]["oneOf"]
    assert [m["required"] for m in members] == [[tag] for tag in TAGS]
    assert all(m["additionalProperties"] is False and set(m["properties"]) == set(m["required"]) for m in members)
    assert "EffectShape" not in schema["$defs"]
