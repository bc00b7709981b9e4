"""Start-up checks without a database: schema resolution against schemas/history/, and settings
that must fit the topic names and ledger columns they are written to."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path
from typing import Any

import fastavro
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lapse.kernel.settings import REPO_ROOT, load_settings
from lapse.shell.startup_checks import (
    StartupRefused,
    check_schemas,
    check_settings,
    resolution_problem,
)

SCHEMAS = REPO_ROOT / "schemas"
BASE: dict[str, Any] = {"type": "record", "name": "R", "namespace": "t", "fields": [
    {"name": "a", "type": "string"},
    {"name": "n", "type": "int"},
    {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["X", "Y"]}},
    {"name": "u", "type": ["null", "string"], "default": None},
    {"name": "m", "type": {"type": "map", "values": "long"}},
]}


def parsed(schema: dict[str, Any]) -> Any:
    return fastavro.parse_schema(schema, named_schemas={})


def changed(field: str, **new: Any) -> dict[str, Any]:
    """BASE with one field replaced (or removed, with `drop=True`), or one added."""
    schema = json.loads(json.dumps(BASE))
    fields = [f for f in schema["fields"] if f["name"] != field]
    if not new.pop("drop", False):
        fields.append({"name": field, **new})
    schema["fields"] = fields
    return schema


COMPATIBLE = {
    "a field added with a default": changed("z", type="string", default=""),
    "a field removed": changed("a", drop=True),
    "int promoted to long": changed("n", type="long"),
    "string read as bytes": changed("a", type="bytes"),
    "an enum symbol added": changed("e", type={"type": "enum", "name": "E", "symbols": ["X", "Y", "Z"]}),
    "a union widened": changed("u", type=["null", "string", "long"], default=None),
    "a plain field read as a union": changed("a", type=["null", "string"], default=None),
}
INCOMPATIBLE = {
    "a field added without a default": (changed("z", type="string"), "z: a field the old schema lacks"),
    "a type changed": (changed("a", type="int"), "a: written as string, read as int"),
    "long narrowed to int": (changed("m", type={"type": "map", "values": "int"}), "m{}: written as long"),
    "an enum symbol removed": (changed("e", type={"type": "enum", "name": "E", "symbols": ["X"]}),
                               "enum symbol 'Y'"),
    "a union narrowed": (changed("u", type="string", default=""), "u: a value of type null"),
    "a record renamed": ({**BASE, "name": "S"}, "written as t.R, read as t.S"),
}


@pytest.mark.parametrize("reader", COMPATIBLE.values(), ids=COMPATIBLE.keys())
def test_compatible_changes_resolve(reader):
    assert resolution_problem(parsed(reader), parsed(BASE)) is None


@pytest.mark.parametrize(("reader", "expected"), INCOMPATIBLE.values(), ids=INCOMPATIBLE.keys())
def test_incompatible_changes_are_named(reader, expected):
    problem = resolution_problem(parsed(reader), parsed(BASE))
    assert problem is not None and expected in problem


PRIMITIVES = ["null", "boolean", "int", "long", "float", "double", "bytes", "string"]
SAMPLE = {"null": None, "boolean": True, "int": 7, "long": 7, "float": 1.5, "double": 1.5, "bytes": b"x",
          "string": "x"}


def record(field_type: Any) -> Any:
    return parsed({"type": "record", "name": "R", "fields": [{"name": "f", "type": field_type}]})


def reads(branch: str, reader: Any) -> bool:
    """Whether fastavro reads a value written as `branch` with `reader` (a type or a union)."""
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, record(branch), {"f": SAMPLE[branch]})
    buffer.seek(0)
    try:
        fastavro.schemaless_reader(buffer, record(branch), record(reader))
    except Exception:  # any resolution error is a "no"
        return False
    return True


@settings(max_examples=200, deadline=None)
@given(writer=st.lists(st.sampled_from(PRIMITIVES), min_size=1, max_size=3, unique=True),
       reader=st.lists(st.sampled_from(PRIMITIVES), min_size=1, max_size=3, unique=True))
def test_the_check_agrees_with_fastavro_on_unions_of_primitives(writer, reader):
    """The check accepts a writer (a type or a union) exactly when fastavro reads a value of each
    of its branches with the reader."""
    w = writer if len(writer) > 1 else writer[0]
    r = reader if len(reader) > 1 else reader[0]
    problem = resolution_problem(record(r), record(w))
    assert (problem is None) == all(reads(branch, r) for branch in writer), (writer, reader, problem)


def copy_schemas(tmp_path: Path) -> Path:
    target = tmp_path / "schemas"
    shutil.copytree(SCHEMAS, target)
    return target


def test_the_packaged_schemas_pass(tmp_path):
    check_schemas(load_settings(schemas={"dir": copy_schemas(tmp_path)}))


def test_an_incompatible_edit_of_a_current_schema_is_refused_naming_it(tmp_path):
    folder = copy_schemas(tmp_path)
    path = folder / "expiry_event.avsc"
    schema = json.loads(path.read_text())
    schema["fields"] = [{**f, "type": "int"} if f["name"] == "tenant" else f for f in schema["fields"]]
    path.write_text(json.dumps(schema))
    with pytest.raises(StartupRefused) as refused:
        check_schemas(load_settings(schemas={"dir": folder}))
    message = str(refused.value)
    assert message.startswith("schema expiry_event.avsc cannot read expiry_event.v1.avsc in history/: ")
    assert "tenant: written as string, read as int" in message and "\n" not in message


def test_a_schemas_folder_that_does_not_parse_is_refused(tmp_path):
    folder = copy_schemas(tmp_path)
    (folder / "dead_letter.avsc").write_text("{not json")
    with pytest.raises(StartupRefused, match=r"dead_letter\.avsc: not a valid Avro schema"):
        check_schemas(load_settings(schemas={"dir": folder}))


def test_a_prefix_too_long_for_kafka_topic_names_is_refused():
    check_settings(load_settings(topics={"prefix": "staging."}))
    with pytest.raises(StartupRefused) as refused:
        check_settings(load_settings(topics={"prefix": "p" * 240}))
    message = str(refused.value)
    assert message.startswith("topics.prefix (LAPSE_TOPICS__PREFIX) is 240 characters: with ")
    assert "over Kafka's 249" in message


@given(st.text(min_size=1, max_size=20).filter(lambda s: any(not (c.isascii() and (c.isalnum() or c in "._-"))
                                                             for c in s)))
def test_a_prefix_with_characters_kafka_refuses_is_refused(prefix):
    with pytest.raises(StartupRefused, match="a topic prefix uses only letters, digits"):
        check_settings(load_settings(topics={"prefix": prefix}))
