"""Writer schemas from a schema registry: only the local current and history schemas are accepted.

A registry (or whoever can register schemas in it) could otherwise hand the codec any writer schema
with a Lapse record's name; a recursive one plus a 200 KB record overflowed fastavro's C reader.
The codec accepts a registry schema only when its Parsing Canonical Form (the fingerprint the store
uses for schemas/ files) is that of a current schema or one in schemas/history/, and then reads with
the local schema; anything else is poison with reason `unknown_writer_schema`, remembered per id.

The registry is the real-HTTP test double of tests/unit/test_codec.py.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from io import BytesIO
from typing import Any, cast

import fastavro
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from lapse.kernel import codec as codec_module
from lapse.kernel.codec import Codec, DecodeError, SchemaStore, StoredSchema, schema_fingerprint
from lapse.kernel.schema_registry import SchemaRegistryClient
from tests.fixtures.registry import FakeRegistry, serving
from tests.unit.test_codec import RECORDS, SCHEMAS_DIR
from tests.unit.test_schemas import resolved, sample

STORE = SchemaStore(SCHEMAS_DIR)
LOCAL = [*STORE.current.values(), *STORE.history]


@pytest.fixture(scope="module")
def registry() -> Iterator[FakeRegistry]:
    with serving() as server:
        yield server


def fresh_codec(registry: FakeRegistry) -> Codec:
    """A codec as a new process has it: nothing cached, every id fetched from the registry."""
    return Codec(STORE, SchemaRegistryClient(registry.url))


def framed(schema_id: int, body: bytes) -> bytes:
    return b"\x00" + schema_id.to_bytes(4, "big") + body


def body_of(schema: Any, record: dict[str, Any]) -> bytes:
    out = BytesIO()
    fastavro.schemaless_writer(out, schema, record)
    return out.getvalue()


def refusal(codec: Codec, data: bytes) -> DecodeError:
    with pytest.raises(DecodeError) as info:
        codec.decode(data)
    assert "\n" not in str(info.value) and not info.value.transient
    return info.value


def record_of(name: str) -> dict[str, Any]:
    return cast(dict[str, Any], RECORDS[name])


def raw_of(stored: StoredSchema) -> dict[str, Any]:
    return json.loads(stored.schema_json)


@pytest.fixture
def no_registry_schema_reaches_the_reader(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every writer schema fastavro is asked to read with must be a local one (parsed from schemas/).
    A foreign writer fails the test instead of reaching the C reader (which could crash pytest)."""
    local = [s.parsed for s in LOCAL]
    seen: list[Any] = []
    real = fastavro.schemaless_reader

    def reader(fo, writer_schema, reader_schema=None, *args, **kwargs):
        seen.append(writer_schema)
        if not any(writer_schema is schema for schema in local):
            raise AssertionError(f"a registry writer schema reached fastavro's reader: {writer_schema!r:.200}")
        return real(fo, writer_schema, reader_schema, *args, **kwargs)

    monkeypatch.setattr(fastavro, "schemaless_reader", reader)  # what the codec calls
    return seen


def test_a_schema_with_the_right_name_but_other_fields_is_poison(
    registry: FakeRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    current = STORE.current["expiry_event"]
    other = raw_of(current)
    other["fields"].append({"name": "extra", "type": "string"})  # a field set of no version
    assert schema_fingerprint(other) not in STORE.by_fingerprint
    schema_id = registry.add(current.full_name, json.dumps(other))
    record = {**record_of("expiry_event"), "extra": "x"}
    data = framed(schema_id, body_of(fastavro.parse_schema(copy.deepcopy(other)), record))

    codec = fresh_codec(registry)
    examined: list[Any] = []
    canonical_form = codec_module._canonical_form

    def counted(schema: Any) -> str:
        examined.append(schema)
        return canonical_form(schema)

    monkeypatch.setattr(codec_module, "_canonical_form", counted)
    error = refusal(codec, data)
    fingerprint = schema_fingerprint(other).hex()
    assert error.reason == "unknown_writer_schema"
    assert str(error) == (f"schema id {schema_id} is lapse.ExpiryEvent with fingerprint {fingerprint}, "
                          "which is neither the current schema nor one in schemas/history")
    for decode in (codec.decode, lambda d: codec.decode_expected("expiry_event", d),
                   lambda d: codec.decode_fields("expiry_event", d, ("op_key",))):
        with pytest.raises(DecodeError) as again:
            decode(data)
        assert (again.value.reason, str(again.value)) == (error.reason, str(error))
    # The refusal is remembered per id: neither fetched nor examined again.
    assert codec.registry is not None and codec.registry.requests == 1 and len(examined) == 1


def test_a_recursive_schema_with_the_right_name_never_reaches_the_reader(
    registry: FakeRegistry, no_registry_schema_reaches_the_reader: list[Any]
) -> None:
    recursive = {
        "type": "record", "name": "ExpiryEvent", "namespace": "lapse",
        "fields": [{"name": "op_key", "type": "string"},
                   {"name": "next", "type": ["null", "lapse.ExpiryEvent"], "default": None}],
    }
    schema_id = registry.add("lapse.ExpiryEvent", json.dumps(recursive))
    # 200 KB of "next" branch markers: a chain deeper than any C stack, were this schema read.
    data = framed(schema_id, b"\x02a" + b"\x02\x02a" * 70_000)

    codec = fresh_codec(registry)
    for _ in range(3):
        error = refusal(codec, data)
        assert error.reason == "unknown_writer_schema"
        assert f"schema id {schema_id} is lapse.ExpiryEvent with fingerprint" in str(error)
    assert no_registry_schema_reaches_the_reader == []
    assert codec.registry is not None and codec.registry.requests == 1


def test_a_deeply_nested_schema_is_refused_before_fastavro_parses_it(registry: FakeRegistry) -> None:
    nested = '"long"'
    for _ in range(200):  # JSON still loads; fastavro's compiled parser would recurse on the C stack
        nested = f'{{"type": "array", "items": ["null", {nested}]}}'
    text = ('{"type": "record", "name": "ExpiryEvent", "namespace": "lapse", '
            f'"fields": [{{"name": "deep", "type": {nested}}}]}}')
    schema_id = registry.add("lapse.ExpiryEvent", text)
    error = refusal(fresh_codec(registry), framed(schema_id, b"\x00"))
    assert error.reason == "unknown_writer_schema"
    assert "nests deeper than 64 levels" in str(error)


@pytest.mark.parametrize("name", sorted(STORE.current))
def test_the_current_schema_served_by_the_registry_decodes(
    registry: FakeRegistry, no_registry_schema_reaches_the_reader: list[Any], name: str
) -> None:
    current = STORE.current[name]
    # As a registry may serve it: no docs, other whitespace; the canonical form is the same.
    stripped = _without_docs(raw_of(current))
    schema_id = registry.add(current.full_name, json.dumps(stripped, indent=1))
    codec = fresh_codec(registry)
    assert codec.decode(framed(schema_id, body_of(current.parsed, record_of(name)))) == (name, RECORDS[name])
    assert no_registry_schema_reaches_the_reader == [current.parsed]


@pytest.mark.parametrize("old", STORE.history, ids=lambda s: s.path.name)
def test_a_history_schema_served_by_the_registry_resolves_into_the_current_one(
    registry: FakeRegistry, no_registry_schema_reaches_the_reader: list[Any], old: StoredSchema
) -> None:
    current = STORE.current[old.stem]
    schema_id = registry.add(old.full_name, old.schema_json)
    written = sample(old.parsed)
    codec = fresh_codec(registry)
    assert codec.decode(framed(schema_id, body_of(old.parsed, written))) == (old.stem, resolved(written, current))
    assert no_registry_schema_reaches_the_reader == [old.parsed]


def test_a_schema_that_is_not_a_lapse_record_is_still_unexpected(registry: FakeRegistry) -> None:
    schema_id = registry.add("other", json.dumps({"type": "record", "name": "acme.Order", "fields": []}))
    error = refusal(fresh_codec(registry), framed(schema_id, b""))
    assert error.reason == "unexpected_schema"
    assert "'acme.Order', not a Lapse record" in str(error)


def _without_docs(schema: Any) -> Any:
    if isinstance(schema, list):
        return [_without_docs(item) for item in schema]
    if isinstance(schema, dict):
        return {k: _without_docs(v) for k, v in schema.items() if k != "doc"}
    return schema


# Property: over registry schemas of a Lapse record's name, accepted iff the fingerprint is local.

AVRO_NAME = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True)
FIELD_TYPES = st.sampled_from(["string", "long", "int", "bytes", ["null", "string"],
                               {"type": "map", "values": "string"}, {"type": "array", "items": "long"}])


@st.composite
def registry_schemas(draw: st.DrawFn) -> dict[str, Any]:
    """A local schema (current or history) as JSON, maybe without docs, maybe with extra fields,
    maybe with fields dropped or reordered: some stay local, most do not."""
    base = draw(st.sampled_from(LOCAL))
    schema = raw_of(base)
    if draw(st.booleans()):
        schema = _without_docs(schema)
    fields = schema["fields"]
    taken = {f["name"] for f in fields}
    extra = draw(st.lists(AVRO_NAME.filter(lambda n: n not in taken), max_size=3, unique=True))
    for name in extra:
        field: dict[str, Any] = {"name": name, "type": draw(FIELD_TYPES)}
        if draw(st.booleans()):
            field["doc"] = "extra"
        fields.insert(draw(st.integers(0, len(fields))), field)
    if len(fields) > 1 and draw(st.integers(0, 4)) == 0:
        del fields[draw(st.integers(0, len(fields) - 1))]
    if draw(st.integers(0, 4)) == 0:
        fields[:] = draw(st.permutations(fields))
    return schema


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(schema=registry_schemas())
def test_a_registry_schema_is_accepted_iff_its_fingerprint_is_local(registry: FakeRegistry, schema) -> None:
    fingerprint = schema_fingerprint(schema)
    local = STORE.by_fingerprint.get(fingerprint)
    schema_id = registry.add(f"lapse.{schema['name']}", json.dumps(schema))
    codec = fresh_codec(registry)
    event("foreign" if local is None else f"local: {local.path.name}")
    if local is not None:
        written = sample(local.parsed)
        stem, record = codec.decode(framed(schema_id, body_of(local.parsed, written)))
        assert (stem, record) == (local.stem, resolved(written, STORE.current[local.stem]))
    else:
        body = body_of(fastavro.parse_schema(copy.deepcopy(schema), named_schemas={}), sample(schema))
        error = refusal(codec, framed(schema_id, body))
        assert error.reason == "unknown_writer_schema"
        assert fingerprint.hex() in str(error) and f"schema id {schema_id} " in str(error)
