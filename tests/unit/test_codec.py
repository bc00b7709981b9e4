"""The codec: round trips in both wire formats, typed errors for undecodable bytes and bad records."""

from __future__ import annotations

import base64
import random
import socket
from collections.abc import Iterator
from datetime import UTC, datetime
from io import BytesIO

import fastavro
import pytest

from lapse.kernel.codec import Codec, DecodeError, EncodeError, SchemaRegistryError, SchemaStore
from lapse.kernel.settings import REPO_ROOT, Settings, load_settings
from tests.fixtures.registry import FakeRegistry, serving
from tests.fixtures.topology import repo_topology

SCHEMAS_DIR = REPO_ROOT / "schemas"
DUE = datetime(2025, 3, 1, 12, 0, 0, 250000, tzinfo=UTC)
NOW = datetime(2025, 3, 1, 12, 0, 5, 0, tzinfo=UTC)

RECORDS = {
    "expiry_event": {
        "op_key": "release-reservation:42", "kind": "reservation_hold", "tenant": "acme",
        "subject_id": "42", "due_at": DUE, "produced_at": NOW, "source": "sweep",
        "correlation_id": "corr-1", "attempt": 2, "replay_id": None, "attributes": {"region": "eu"},
    },
    "cleanup_outcome": {
        "outcome_id": 9001, "op_key": "release-reservation:42", "kind": "reservation_hold",
        "tenant": "acme", "subject_id": "42", "status": "retry_scheduled", "attempt": 1,
        "failure_class": "transient", "reason": "HTTP 503", "due_at": DUE, "occurred_at": NOW,
        "correlation_id": "corr-1", "replay_id": None, "worker": "host-1",
    },
    "dead_letter": {
        "op_key": None, "kind": None, "tenant": None, "subject_id": None, "failure_class": "invalid",
        "reason": "bad_magic: not an Avro record", "attempt": 0,
        "history": [{"attempt": 1, "failure_class": "transient", "reason": "timeout", "at": NOW}],
        "source_topic": repo_topology().expiry, "source_partition": 3, "source_offset": 12345678901,
        "original_key": b"k", "original_value": b"\x17garbage", "original_headers": {"h": b"v"},
        "dead_lettered_at": NOW, "correlation_id": None, "replay_id": "replay-7",
    },
}


def settings(**schemas) -> Settings:
    """Settings reading the repository's schemas, with no registry unless `schemas` names one."""
    return load_settings(schemas={"dir": SCHEMAS_DIR, "registry_url": None, **schemas})


@pytest.fixture(scope="module")
def codec() -> Codec:
    return Codec.from_settings(settings())


def decode_error(codec: Codec, data: bytes) -> DecodeError:
    with pytest.raises(DecodeError) as info:
        codec.decode(data)
    assert "\n" not in str(info.value)
    return info.value


# Single-object encoding (no registry).


@pytest.mark.parametrize("name", sorted(RECORDS))
def test_single_object_round_trip(codec: Codec, name: str) -> None:
    data = codec.encode(name, RECORDS[name])
    assert data[:2] == b"\xc3\x01"
    assert data[2:10] == codec.store.current[name].fingerprint
    assert codec.decode(data) == (name, RECORDS[name])
    assert codec.decode_expected(name, data) == RECORDS[name]


def test_timestamps_decode_as_aware_utc_datetimes(codec: Codec) -> None:
    record = codec.decode_expected("expiry_event", codec.encode("expiry_event", RECORDS["expiry_event"]))
    assert record["due_at"] == DUE and record["due_at"].tzinfo is not None


def test_missing_fields_with_defaults_take_the_default(codec: Codec) -> None:
    defaulted = ("attempt", "replay_id", "attributes")
    minimal = {k: v for k, v in RECORDS["expiry_event"].items() if k not in defaulted}
    record = codec.decode_expected("expiry_event", codec.encode("expiry_event", minimal))
    assert (record["attempt"], record["replay_id"], record["attributes"]) == (0, None, {})


def test_decode_expected_rejects_another_record_type(codec: Codec) -> None:
    data = codec.encode("cleanup_outcome", RECORDS["cleanup_outcome"])
    with pytest.raises(DecodeError) as info:
        codec.decode_expected("expiry_event", data)
    assert info.value.reason == "unexpected_schema"


def test_single_object_fingerprint_matches_the_avro_spec() -> None:
    """CRC-64-AVRO of the canonical form `"null"` is 0x63dd24e7cc258f8a, written little-endian."""
    from lapse.kernel.codec import schema_fingerprint

    assert schema_fingerprint("null") == (0x63DD24E7CC258F8A).to_bytes(8, "little")


# Undecodable bytes: a DecodeError with a reason, never another exception.


def test_empty_bytes(codec: Codec) -> None:
    assert decode_error(codec, b"").reason == "empty"


def test_random_bytes(codec: Codec) -> None:
    data = random.Random(1234).randbytes(64)
    assert data[0] not in (0x00, 0xC3)
    assert decode_error(codec, data).reason == "bad_magic"


@pytest.mark.parametrize(
    "data", [b'{"op_key": "x"}', b"\xc3\x02" + bytes(20), b"\xc3"], ids=["json", "c3-02", "c3-alone"]
)
def test_bad_magic(codec: Codec, data: bytes) -> None:
    assert decode_error(codec, data).reason == "bad_magic"


def test_unknown_fingerprint(codec: Codec) -> None:
    body = codec.encode("expiry_event", RECORDS["expiry_event"])[10:]
    error = decode_error(codec, b"\xc3\x01" + b"\x01\x02\x03\x04\x05\x06\x07\x08" + body)
    assert error.reason == "unknown_fingerprint"
    assert "0102030405060708" in str(error)


@pytest.mark.parametrize("cut", [1, 5, 20])
def test_truncated_body(codec: Codec, cut: int) -> None:
    data = codec.encode("dead_letter", RECORDS["dead_letter"])
    assert decode_error(codec, data[:-cut]).reason == "malformed_body"


def test_truncated_header_and_trailing_bytes_are_malformed(codec: Codec) -> None:
    data = codec.encode("expiry_event", RECORDS["expiry_event"])
    assert decode_error(codec, data[:6]).reason == "malformed_body"
    assert decode_error(codec, data + b"\x00\x00").reason == "malformed_body"


def test_random_body_behind_a_valid_header(codec: Codec) -> None:
    header = b"\xc3\x01" + codec.store.current["expiry_event"].fingerprint
    assert decode_error(codec, header + b"\xff" * 40).reason == "malformed_body"


def test_confluent_record_without_registry(codec: Codec) -> None:
    error = decode_error(codec, b"\x00\x00\x00\x00\x07" + b"\x02ab")
    assert error.reason == "registry_unavailable"
    assert not error.transient


# Encoding errors name the field.


def test_encode_missing_required_field_names_it(codec: Codec) -> None:
    record = {k: v for k, v in RECORDS["expiry_event"].items() if k != "tenant"}
    with pytest.raises(EncodeError, match=r"expiry_event: missing required field tenant$"):
        codec.encode("expiry_event", record)


def test_encode_wrong_type_names_the_field(codec: Codec) -> None:
    with pytest.raises(EncodeError, match="attempt"):
        codec.encode("expiry_event", {**RECORDS["expiry_event"], "attempt": "two"})
    with pytest.raises(EncodeError, match="due_at"):
        codec.encode("expiry_event", {**RECORDS["expiry_event"], "due_at": "tomorrow"})


def test_encode_unknown_schema_name(codec: Codec) -> None:
    with pytest.raises(EncodeError, match="unknown schema 'nope'"):
        codec.encode("nope", {})


# Confluent wire format, against a real HTTP server standing in for the registry.


@pytest.fixture
def registry() -> Iterator[FakeRegistry]:
    with serving() as server:
        yield server


def registry_codec(registry: FakeRegistry) -> Codec:
    return Codec.from_settings(
        settings(registry_url=registry.url, registry_auth="lapse:s3cret")
    )


@pytest.mark.parametrize("name", sorted(RECORDS))
def test_confluent_round_trip(registry: FakeRegistry, name: str) -> None:
    writer = registry_codec(registry)
    data = writer.encode(name, RECORDS[name])
    schema_id = int.from_bytes(data[1:5], "big")
    assert data[0] == 0 and schema_id >= 1
    assert registry.subjects == {writer.store.current[name].full_name: [schema_id]}  # RecordNameStrategy
    assert writer.decode(data) == (name, RECORDS[name])
    reader = registry_codec(registry)  # a fresh process: must fetch the id from the registry
    assert reader.decode_expected(name, data) == RECORDS[name]
    assert reader.decode(data) == (name, RECORDS[name])
    assert registry.gets == 1  # then cached
    expected_auth = "Basic " + base64.b64encode(b"lapse:s3cret").decode()
    assert set(registry.authorizations) == {expected_auth}


def test_confluent_old_writer_schema_resolves_into_the_current_reader(registry: FakeRegistry) -> None:
    store = SchemaStore(SCHEMAS_DIR)
    old = next(s for s in store.history if s.stem == "cleanup_outcome")
    schema_id = registry.add(old.full_name, old.schema_json)
    old_record = {k: v for k, v in RECORDS["cleanup_outcome"].items() if k != "worker"}
    body = BytesIO()
    fastavro.schemaless_writer(body, old.parsed, old_record)
    data = b"\x00" + schema_id.to_bytes(4, "big") + body.getvalue()
    assert registry_codec(registry).decode(data) == ("cleanup_outcome", {**old_record, "worker": None})


def test_registry_codec_still_decodes_single_object_records(registry: FakeRegistry, codec: Codec) -> None:
    data = codec.encode("expiry_event", RECORDS["expiry_event"])
    assert registry_codec(registry).decode(data) == ("expiry_event", RECORDS["expiry_event"])


def test_unknown_schema_id(registry: FakeRegistry) -> None:
    error = decode_error(registry_codec(registry), b"\x00\x00\x00\x03\xe7" + b"\x02ab")
    assert error.reason == "unknown_schema_id"


def test_registry_unreachable() -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    codec = Codec.from_settings(settings(registry_url=f"http://127.0.0.1:{port}"))
    error = decode_error(codec, b"\x00\x00\x00\x00\x01" + b"\x02ab")
    assert error.reason == "registry_unavailable" and error.transient
    with pytest.raises(SchemaRegistryError, match="unreachable") as info:
        codec.encode("expiry_event", RECORDS["expiry_event"])
    assert "\n" not in str(info.value) and info.value.transient


def test_decode_fields_reads_only_the_named_fields_of_old_and_new_records(tmp_path):
    """The audit's projection: exactly the named fields, and the type check of a full decode."""
    from datetime import UTC, datetime

    from lapse.kernel.codec import Codec, SchemaStore
    from lapse.kernel.settings import REPO_ROOT

    codec = Codec(SchemaStore(REPO_ROOT / "schemas"))
    now = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
    record = {"op_key": "release-reservation:7", "kind": "release-reservation", "tenant": "t",
              "subject_id": "7", "due_at": now, "produced_at": now, "source": "replay",
              "correlation_id": "c", "attempt": 2, "replay_id": "r-1", "attributes": {"a": "b"}}
    data = codec.encode("expiry_event", record)
    assert codec.decode_fields("expiry_event", data, ("op_key", "replay_id")) == {
        "op_key": "release-reservation:7", "replay_id": "r-1"}
    import pytest

    from lapse.kernel.codec import DecodeError

    with pytest.raises(DecodeError) as err:
        codec.decode_fields("cleanup_outcome", data, ("op_key",))
    assert err.value.reason == "unexpected_schema"
