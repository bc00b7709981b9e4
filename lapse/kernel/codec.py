"""Avro encoding and decoding of Lapse records, in either wire format.

Without a schema registry records use Avro single-object encoding (`C3 01`, 8-byte little-endian
CRC-64-AVRO fingerprint, body) and writer schemas come from `schemas/` and `schemas/history/`.
With a registry they use the Confluent format (`00`, 4-byte big-endian schema id, body). Decoding
detects the format from the first byte and always reads into the current schema of the record's
name, so records written by older (or newer) code still decode.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path
from typing import Any

import fastavro
from fastavro.schema import fingerprint, to_parsing_canonical_form
from fastavro.types import Schema

from lapse.kernel.connections import registry_client
from lapse.kernel.schema_registry import SchemaRegistryClient, SchemaRegistryError
from lapse.kernel.settings import Settings
from lapse.kernel.text import one_line

__all__ = ["Codec", "DecodeError", "EncodeError", "SchemaRegistryError", "SchemaStore", "StoredSchema"]

SINGLE_OBJECT_MAGIC = b"\xc3\x01"
SINGLE_OBJECT_HEADER_LEN = 10
CONFLUENT_MAGIC = 0x00
CONFLUENT_HEADER_LEN = 5
# A registry schema nested deeper than this (JSON levels) is refused before fastavro sees it: the
# schemas in schemas/ nest 9 levels at most, and fastavro's compiled parser recurses on the C stack.
REGISTRY_SCHEMA_MAX_DEPTH = 64
# At most this many refused registry schema ids are remembered (the oldest goes first).
REFUSED_SCHEMA_IDS_MAX = 10_000
# Longest message of a DecodeError (it may quote a writer schema or a library error at length).
MESSAGE_CHARS = 500


class DecodeError(Exception):
    """Bytes that cannot be decoded; `reason` is a short machine code, str(self) a one-line message.

    Reasons: empty, bad_magic, unknown_fingerprint, unknown_schema_id, unknown_writer_schema (a
    registry schema that is none of the schemas in schemas/ or schemas/history/), malformed_body,
    unexpected_schema, registry_unavailable, invalid_field (a timestamp no datetime can hold, text
    that is not UTF-8; the message names the field). `transient` is True only when the registry could not
    be reached (retrying later may succeed); every other decode error is permanent for those bytes.
    """

    def __init__(self, reason: str, message: str, transient: bool = False):
        super().__init__(message)
        self.reason = reason
        self.transient = transient


class EncodeError(Exception):
    """A record that does not fit its schema (missing required field, wrong type); names the field."""


def schema_fingerprint(schema: dict[str, Any]) -> bytes:
    """The 8-byte CRC-64-AVRO fingerprint of the schema's Parsing Canonical Form, in wire order.

    fastavro returns the hex of the fingerprint's little-endian bytes (like Java's
    `SchemaNormalization`), which is exactly the byte order single-object encoding uses.
    """
    return bytes.fromhex(fingerprint(to_parsing_canonical_form(schema), "CRC-64-AVRO"))


@dataclass(frozen=True)
class StoredSchema:
    """One schema file: its record's stem and full name, the fastavro-parsed form and the raw JSON."""

    stem: str
    full_name: str
    parsed: dict[str, Any]
    schema_json: str
    fingerprint: bytes
    path: Path


@dataclass(frozen=True)
class _ReadPlan:
    """How to read a body: the writer schema, and the reader schema (None when identical)."""

    stem: str
    writer: Schema
    reader: Schema | None


class SchemaStore:
    """Every .avsc under the schemas folder: current schemas by stem and name, writers by fingerprint."""

    def __init__(self, schemas_dir: Path | str):
        root = Path(schemas_dir)
        if not root.is_dir():
            raise ValueError(f"schemas folder {root} does not exist")
        self.current: dict[str, StoredSchema] = {}
        self.by_name: dict[str, StoredSchema] = {}
        for path in sorted(root.glob("*.avsc")):
            stored = _load(path, path.stem)
            self.current[stored.stem] = stored
            self.by_name[stored.full_name] = stored
        self.history: list[StoredSchema] = []
        for path in sorted((root / "history").glob("*.avsc")):
            stem = path.name.split(".", 1)[0]
            stored = _load(path, stem)
            if stem not in self.current or self.current[stem].full_name != stored.full_name:
                raise ValueError(f"{path}: history of {stored.full_name} without a current {stem}.avsc")
            self.history.append(stored)
        # Current schemas win a fingerprint tie (a doc-only change keeps the canonical form).
        self.by_fingerprint: dict[bytes, StoredSchema] = {s.fingerprint: s for s in self.history}
        self.by_fingerprint.update({s.fingerprint: s for s in self.current.values()})


def _load(path: Path, stem: str) -> StoredSchema:
    try:
        raw = json.loads(path.read_text())
        parsed = fastavro.parse_schema(raw, named_schemas={})
    except (OSError, ValueError, fastavro.schema.SchemaParseException) as exc:
        raise ValueError(f"{path}: not a valid Avro schema: {exc}") from None
    if not isinstance(parsed, dict):
        raise ValueError(f"{path}: not an Avro record schema")
    return StoredSchema(stem, parsed["name"], parsed, json.dumps(raw), schema_fingerprint(raw), path)


class Codec:
    """Encodes records of the current schemas and decodes either wire format (see module doc)."""

    def __init__(self, store: SchemaStore, registry: SchemaRegistryClient | None = None):
        self.store = store
        self.registry = registry
        self._by_fingerprint = {
            fp: _ReadPlan(s.stem, s.parsed, self._reader_for(s)) for fp, s in store.by_fingerprint.items()
        }
        # The same by a single-object record's whole header (marker and fingerprint): one lookup
        # decides a well-formed record's plan; the checks that name what is wrong run on a miss.
        self._by_header = {SINGLE_OBJECT_MAGIC + fp: plan for fp, plan in self._by_fingerprint.items()}
        # Registry schemas are accepted only as one of these: Parsing Canonical Form -> read plan of
        # that local (current or history) schema. Comparing the canonical form, not only its CRC-64
        # fingerprint, means a schema crafted to collide with a local fingerprint is still refused.
        self._by_canonical_form = {
            _canonical_form(json.loads(s.schema_json)): self._by_fingerprint[s.fingerprint]
            for s in (*store.history, *store.current.values())
        }
        self._by_schema_id: dict[int, _ReadPlan] = {}
        self._refused_schema_ids: dict[int, tuple[str, str]] = {}  # id -> (reason, message), permanent
        self._projections: dict[tuple[int, tuple[str, ...]], _ReadPlan] = {}
        self._headers: dict[str, bytes] = {}
        if registry is None:
            self._headers = {stem: SINGLE_OBJECT_MAGIC + s.fingerprint for stem, s in store.current.items()}

    @classmethod
    def from_settings(cls, settings: Settings) -> Codec:
        """A codec for `settings.schemas.dir`, in Confluent format if `settings.schemas.registry_url`
        is set (the registry client comes from lapse.kernel.connections)."""
        return cls(SchemaStore(settings.schemas.dir), registry_client(settings.schemas))

    # Encoding.

    def encode(self, name: str, record: dict[str, Any]) -> bytes:
        """Framed Avro bytes of `record` under the current schema `name` (a file stem, e.g. "expiry_event").

        Raises EncodeError for a record that does not fit, SchemaRegistryError if the registry
        cannot register the schema.
        """
        schema = self.store.current.get(name)
        if schema is None:
            raise EncodeError(f"unknown schema {name!r}; known: {', '.join(sorted(self.store.current))}")
        header = self._headers.get(name) or self._register(schema)
        out = BytesIO()
        out.write(header)
        try:
            fastavro.schemaless_writer(out, schema.parsed, record)
        except Exception as exc:  # fastavro raises TypeError/ValueError/AttributeError…
            raise EncodeError(_encode_message(schema, record, exc)) from None
        return out.getvalue()

    def _register(self, schema: StoredSchema) -> bytes:
        assert self.registry is not None
        schema_id = self.registry.register(schema.full_name, schema.schema_json)
        self._by_schema_id[schema_id] = _ReadPlan(schema.stem, schema.parsed, None)
        header = bytes([CONFLUENT_MAGIC]) + schema_id.to_bytes(4, "big")
        self._headers[schema.stem] = header
        return header

    # Decoding.

    def decode(self, data: bytes) -> tuple[str, dict[str, Any]]:
        """The record's schema stem and the record, read into the current schema of that name."""
        plan, offset = self._plan(data)
        return plan.stem, _read(plan, data, offset)

    def decode_expected(self, name: str, data: bytes) -> dict[str, Any]:
        """Like decode, but raises DecodeError("unexpected_schema") unless the record is a `name`."""
        plan, offset = self._plan(data)
        if plan.stem != name:
            raise DecodeError("unexpected_schema", f"expected a {name} record, got a {plan.stem}")
        return _read(plan, data, offset)

    def decode_fields(self, name: str, data: bytes, fields: tuple[str, ...]) -> dict[str, Any]:
        """Like decode_expected, but reads only `fields` (the rest of the body is skipped, not
        built): for readers of long histories, such as the audit, that need a few fields."""
        plan, offset = self._plan(data)
        if plan.stem != name:
            raise DecodeError("unexpected_schema", f"expected a {name} record, got a {plan.stem}")
        key = (id(plan.writer), fields)
        projected = self._projections.get(key)
        if projected is None:
            current = json.loads(self.store.current[name].schema_json)
            current["fields"] = [f for f in current["fields"] if f["name"] in fields]
            projected = _ReadPlan(name, plan.writer, fastavro.parse_schema(current, named_schemas={}))
            self._projections[key] = projected
        return _read(projected, data, offset)

    def _plan(self, data: bytes) -> tuple[_ReadPlan, int]:
        plan = self._by_header.get(data[:SINGLE_OBJECT_HEADER_LEN]) if type(data) is bytes else None
        if plan is not None:
            return plan, SINGLE_OBJECT_HEADER_LEN
        if not data:
            raise DecodeError("empty", "empty record value")
        first = data[0]
        if first == 0xC3:
            if len(data) < 2 or data[1] != 0x01:
                raise DecodeError("bad_magic", "not an Avro record: bad single-object marker")
            if len(data) < SINGLE_OBJECT_HEADER_LEN:
                raise DecodeError("malformed_body", "truncated single-object header")
            plan = self._by_fingerprint.get(bytes(data[2:SINGLE_OBJECT_HEADER_LEN]))
            if plan is None:
                fp = bytes(data[2:SINGLE_OBJECT_HEADER_LEN]).hex()
                raise DecodeError("unknown_fingerprint", f"no schema with fingerprint {fp} in schemas/")
            return plan, SINGLE_OBJECT_HEADER_LEN
        if first == CONFLUENT_MAGIC:
            if self.registry is None:
                raise DecodeError(
                    "registry_unavailable", "Confluent-format record but no schema registry is configured"
                )
            if len(data) < CONFLUENT_HEADER_LEN:
                raise DecodeError("malformed_body", "truncated Confluent header")
            schema_id = int.from_bytes(data[1:CONFLUENT_HEADER_LEN], "big")
            plan = self._by_schema_id.get(schema_id) or self._fetch(schema_id)
            return plan, CONFLUENT_HEADER_LEN
        raise DecodeError("bad_magic", f"not an Avro record: first byte 0x{first:02x}")

    def _fetch(self, schema_id: int) -> _ReadPlan:
        """Resolve an unseen registry id to a read plan (network call, then cached).

        The registry's schema is accepted only if its Parsing Canonical Form (whose CRC-64 is the
        fingerprint the store uses for local files) is that of a current schema or of one in
        schemas/history/; the plan then reads with that local schema, resolved into the current one,
        so no registry-supplied schema ever reaches fastavro's reader. Anything else is permanently
        refused (and remembered per id, so it is neither fetched nor examined again).
        """
        assert self.registry is not None
        refused = self._refused_schema_ids.get(schema_id)
        if refused is not None:
            raise DecodeError(*refused)
        try:
            schema_text = self.registry.schema_by_id(schema_id)
        except SchemaRegistryError as exc:
            if exc.not_found:  # the client remembers a 404 for a while; the id may be registered later
                message = f"schema id {schema_id} is not in the registry"
                raise DecodeError("unknown_schema_id", message) from None
            raise DecodeError("registry_unavailable", str(exc), transient=exc.transient) from None
        try:
            plan = self._accept(schema_id, schema_text)
        except DecodeError as exc:
            if len(self._refused_schema_ids) >= REFUSED_SCHEMA_IDS_MAX:
                self._refused_schema_ids.pop(next(iter(self._refused_schema_ids)), None)
            self._refused_schema_ids[schema_id] = (exc.reason, str(exc))
            raise
        self._by_schema_id[schema_id] = plan
        return plan

    def _accept(self, schema_id: int, schema_text: str) -> _ReadPlan:
        """The read plan of the local schema that `schema_text` is, or DecodeError (permanent)."""
        try:
            raw = json.loads(schema_text)
        except (ValueError, RecursionError) as exc:
            message = f"schema id {schema_id} is not a valid Avro schema: {exc}"
            raise DecodeError("unknown_schema_id", one_line(message, MESSAGE_CHARS)) from None
        if _nesting_depth(raw, REGISTRY_SCHEMA_MAX_DEPTH) > REGISTRY_SCHEMA_MAX_DEPTH:
            message = (f"schema id {schema_id} nests deeper than {REGISTRY_SCHEMA_MAX_DEPTH} levels, so it is "
                       "neither the current schema nor one in schemas/history (not parsed)")
            raise DecodeError("unknown_writer_schema", message)
        try:
            canonical = _canonical_form(raw)
        except Exception as exc:  # fastavro raises SchemaParseException, UnknownType, KeyError, TypeError…
            message = f"schema id {schema_id} is not a valid Avro schema: {type(exc).__name__}: {exc}"
            raise DecodeError("unknown_schema_id", one_line(message, MESSAGE_CHARS)) from None
        plan = self._by_canonical_form.get(canonical)
        if plan is not None:
            return plan
        name = _canonical_name(canonical)
        if name not in self.store.by_name:
            message = f"schema id {schema_id} is {name!r}, not a Lapse record"
            raise DecodeError("unexpected_schema", one_line(message, MESSAGE_CHARS))
        fp = fingerprint(canonical, "CRC-64-AVRO")
        message = (f"schema id {schema_id} is {name} with fingerprint {fp}, which is neither the current "
                   "schema nor one in schemas/history")
        raise DecodeError("unknown_writer_schema", message)

    def _reader_for(self, writer: StoredSchema) -> Schema | None:
        """None when the writer is the current schema (no resolution needed), else the current one."""
        current = self.store.current[writer.stem]
        return None if writer.fingerprint == current.fingerprint else current.parsed


def _canonical_form(schema: Any) -> str:
    """The Parsing Canonical Form of a schema (JSON as loaded), as `schema_fingerprint` computes it."""
    return str(to_parsing_canonical_form(schema))


def _canonical_name(canonical: str) -> str | None:
    """The full name of a named schema in Parsing Canonical Form; for other schemas, the type (a
    primitive) or None."""
    try:
        schema = json.loads(canonical)
    except ValueError:
        return None
    if isinstance(schema, dict):
        name = schema.get("name")
        return name if isinstance(name, str) else None
    return schema if isinstance(schema, str) else None


def _nesting_depth(value: Any, limit: int) -> int:
    """How deeply JSON `value` nests (a scalar is 0), without recursion; stops counting past `limit`."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            if depth > limit:
                return depth
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return deepest


def _read(plan: _ReadPlan, data: bytes, offset: int) -> dict[str, Any]:
    body = BytesIO(data)
    body.seek(offset)
    try:
        record = fastavro.schemaless_reader(body, plan.writer, plan.reader)
    except Exception as exc:  # EOFError, UnicodeDecodeError, schema resolution errors…
        at_fault = _fields_at_fault(plan.writer, data, offset)
        if at_fault:
            raise DecodeError("invalid_field", "; ".join(at_fault)) from None
        message = f"cannot read {plan.stem} body: {type(exc).__name__}: {exc}"
        raise DecodeError("malformed_body", one_line(message, MESSAGE_CHARS)) from None
    if not isinstance(record, dict):  # every Lapse schema is a record
        raise DecodeError("malformed_body", f"{plan.stem} body is not a record")
    if body.tell() != len(data):
        message = f"{len(data) - body.tell()} unread bytes after the {plan.stem} body"
        raise DecodeError("malformed_body", message)
    return record


# What a timestamp field may hold and still be a datetime (0001-01-01 to 9999-12-31), per unit.
TIMESTAMP_RANGE = {
    "timestamp-millis": (-62_135_596_800_000, 253_402_300_799_999),
    "timestamp-micros": (-62_135_596_800_000_000, 253_402_300_799_999_999),
}


def _fields_at_fault(writer: Schema, data: bytes, offset: int) -> list[str]:
    """For a body that failed to read: its top-level fields whose value no reader can hold — a
    timestamp no datetime can hold, text that is not UTF-8 — each as `<field>: <problem>`. Found
    by reading the body again as plain values (timestamps as longs, strings as bytes: Avro encodes
    both alike). Empty when that is not why the body failed."""
    if not isinstance(writer, dict) or not isinstance(writer.get("fields"), list):
        return []
    body = BytesIO(data)
    body.seek(offset)
    try:
        raw = fastavro.schemaless_reader(body, fastavro.parse_schema(_plain(writer), named_schemas={}), None)
    except Exception:  # not a value's fault: the caller reports the original error
        return []
    if not isinstance(raw, dict):
        return []
    found = []
    for spec in writer["fields"]:
        name, value = spec["name"], raw.get(spec["name"])
        unit = _timestamp_unit(spec.get("type"))
        if unit and isinstance(value, int) and not TIMESTAMP_RANGE[unit][0] <= value <= TIMESTAMP_RANGE[unit][1]:
            found.append(f"{name}: {value} is outside the {unit} range (years 1 to 9999)")
        elif _has_text(spec.get("type")) and not _utf8(value):
            found.append(f"{name}: text that is not UTF-8")
    return found


def _timestamp_unit(schema: Any) -> str | None:
    """The timestamp logical type of a field's schema (or of a branch of its union), if any."""
    branches = schema if isinstance(schema, list) else [schema]
    for branch in branches:
        if isinstance(branch, dict) and branch.get("logicalType") in TIMESTAMP_RANGE:
            return str(branch["logicalType"])
    return None


def _has_text(schema: Any) -> bool:
    """Whether a field's schema holds Avro strings anywhere (a branch, map values, array items)."""
    if schema == "string":
        return True
    if isinstance(schema, list):
        return any(_has_text(branch) for branch in schema)
    if isinstance(schema, dict) and schema.get("type") in ("map", "array"):
        return _has_text(schema.get("values", schema.get("items")))
    return False


def _utf8(value: Any) -> bool:
    """Whether every bytes value within `value` (read as plain values) is UTF-8."""
    if isinstance(value, bytes):
        try:
            value.decode("utf-8")
        except UnicodeDecodeError:
            return False
        return True
    if isinstance(value, dict):
        return all(_utf8(v) for v in value.values())
    if isinstance(value, list):
        return all(_utf8(v) for v in value)
    return True


def _plain(schema: Any) -> Any:
    """A copy of a (parsed) schema that reads plain values: no timestamp logical types, strings as
    bytes, without fastavro's own keys."""
    if schema == "string":
        return "bytes"
    if isinstance(schema, list):
        return [_plain(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    return {key: _plain(value) for key, value in schema.items()
            if not key.startswith("__") and not (key == "logicalType" and value in TIMESTAMP_RANGE)}


def _encode_message(schema: StoredSchema, record: Any, exc: Exception) -> str:
    """One line naming the offending field: missing required fields first, else fastavro's message."""
    if not isinstance(record, dict):
        return f"{schema.stem}: record must be a dict, got {type(record).__name__}"
    fields = schema.parsed["fields"]
    missing = [f["name"] for f in fields if "default" not in f and f["name"] not in record]
    if missing:
        return f"{schema.stem}: missing required field{'s' if len(missing) > 1 else ''} {', '.join(missing)}"
    return one_line(f"{schema.stem}: {exc}", MESSAGE_CHARS)
