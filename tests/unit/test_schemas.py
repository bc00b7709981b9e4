"""Schema evolution checks: every current schema against every earlier version, by real encode/decode.

Backward compatibility: a record written with an old version decodes with today's codec.
Forward compatibility: a record written with the current version decodes with an old reader.
Sample records are generated from the schemas, so a new field is covered without editing this file.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from io import BytesIO
from typing import Any

import fastavro
import pytest

from lapse.kernel.codec import Codec, SchemaStore, StoredSchema
from lapse.kernel.settings import REPO_ROOT

SCHEMAS_DIR = REPO_ROOT / "schemas"
STORE = SchemaStore(SCHEMAS_DIR)
PAIRS = [(old, STORE.current[old.stem]) for old in STORE.history]
PAIR_IDS = [old.path.name for old, _ in PAIRS]

# The processor, producers and reconciler rely on these exact names.
EXPECTED_FIELDS = {
    "expiry_event": [
        "op_key", "kind", "tenant", "subject_id", "due_at", "produced_at", "source",
        "correlation_id", "attempt", "replay_id", "attributes",
    ],
    "cleanup_outcome": [
        "outcome_id", "op_key", "kind", "tenant", "subject_id", "status", "attempt", "failure_class",
        "reason", "due_at", "occurred_at", "correlation_id", "replay_id", "worker",
    ],
    "dead_letter": [
        "op_key", "kind", "tenant", "subject_id", "failure_class", "reason", "attempt", "history",
        "source_topic", "source_partition", "source_offset", "original_key", "original_value",
        "original_headers", "dead_lettered_at", "correlation_id", "replay_id",
    ],
}


def sample(schema: Any, name: str = "x") -> Any:
    """A non-default value for every Avro type used here (nullable unions take the non-null branch)."""
    if isinstance(schema, list):
        return sample(next(branch for branch in schema if branch != "null"), name)
    if isinstance(schema, dict):
        if schema.get("logicalType") == "timestamp-millis":
            return datetime(2025, 3, 1, 12, 30, 15, 123000, tzinfo=UTC)
        kind = schema["type"]
        if kind == "record":
            return {f["name"]: sample(f["type"], f["name"]) for f in schema["fields"]}
        if kind == "map":
            return {"k1": sample(schema["values"], name), "k2": sample(schema["values"], name)}
        if kind == "array":
            return [sample(schema["items"], name), sample(schema["items"], name)]
        return sample(kind, name)
    return {"string": f"{name}-value", "int": 7, "long": 1_234_567_890_123, "bytes": b"\x00\xffraw"}[schema]


def resolved(written: dict[str, Any], reader: StoredSchema) -> dict[str, Any]:
    """What `reader` should see for `written`: its fields, from the record or else the field default."""
    fields = reader.parsed["fields"]
    return {f["name"]: written[f["name"]] if f["name"] in written else f["default"] for f in fields}


def write_body(schema: StoredSchema, record: dict[str, Any]) -> bytes:
    out = BytesIO()
    fastavro.schemaless_writer(out, schema.parsed, record)
    return out.getvalue()


@pytest.fixture(scope="module")
def codec() -> Codec:
    return Codec(STORE)


def test_every_current_schema_has_a_history_entry() -> None:
    assert set(STORE.current) == set(EXPECTED_FIELDS)
    for stem in STORE.current:
        assert any(old.stem == stem for old in STORE.history), f"schemas/history/{stem}.v1.avsc is missing"
    for old in STORE.history:
        assert re.fullmatch(rf"{old.stem}\.v\d+\.avsc", old.path.name), old.path


def test_current_schemas_keep_the_agreed_field_names() -> None:
    for stem, names in EXPECTED_FIELDS.items():
        assert [f["name"] for f in STORE.current[stem].parsed["fields"]] == names


@pytest.mark.parametrize("path", sorted(SCHEMAS_DIR.rglob("*.avsc")), ids=lambda p: p.name)
def test_every_record_and_field_has_a_doc(path) -> None:
    def check(record: dict[str, Any]) -> None:
        assert record.get("doc"), f"{path.name}: record {record['name']} has no doc"
        for field in record["fields"]:
            assert field.get("doc"), f"{path.name}: field {record['name']}.{field['name']} has no doc"
            for nested in _records_in(field["type"]):
                check(nested)

    check(json.loads(path.read_text()))


def _records_in(schema: Any) -> list[dict[str, Any]]:
    if isinstance(schema, list):
        return [r for branch in schema for r in _records_in(branch)]
    if isinstance(schema, dict):
        if schema["type"] == "record":
            return [schema]
        return _records_in(schema.get("items") or schema.get("values") or schema["type"])
    return []


@pytest.mark.parametrize(("old", "current"), PAIRS, ids=PAIR_IDS)
def test_backward_compatible_old_records_decode_with_the_current_codec(old, current, codec) -> None:
    written = sample(old.parsed)
    data = b"\xc3\x01" + old.fingerprint + write_body(old, written)
    name, record = codec.decode(data)
    assert name == current.stem
    assert record == resolved(written, current)


@pytest.mark.parametrize(("old", "current"), PAIRS, ids=PAIR_IDS)
def test_forward_compatible_current_records_decode_with_an_old_reader(old, current, codec) -> None:
    written = sample(current.parsed)
    data = codec.encode(current.stem, written)
    assert data[:10] == b"\xc3\x01" + current.fingerprint
    record = fastavro.schemaless_reader(BytesIO(data[10:]), current.parsed, old.parsed)
    assert record == resolved(written, old)


@pytest.mark.parametrize(("old", "current"), PAIRS, ids=PAIR_IDS)
def test_fields_added_since_an_old_version_have_defaults(old, current) -> None:
    old_names = {f["name"] for f in old.parsed["fields"]}
    for field in current.parsed["fields"]:
        if field["name"] not in old_names:
            assert "default" in field, f"{current.stem}.{field['name']} is new and needs a default"
