"""The docs site's generated references cover every setting and every key of the kinds file, whatever
shape the models take; the hand-written pages keep the facts the code defines (`make docs` builds
them all with mkdocs in strict mode)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, Field

from lapse.devtools import docs_reference
from lapse.kernel.settings import Settings, env_var
from lapse.shell.error_boundary import ExitCode

REPO = Path(__file__).resolve().parents[2]


def test_every_setting_is_listed_with_its_variable_and_default():
    page = docs_reference.configuration_page()
    for section, info in Settings.model_fields.items():
        assert f"## `{section}`" in page
        for name, field in info.annotation.model_fields.items():
            start = f"| `{name}`<br>`{env_var(f'{section}.{name}')}` |"
            row = next((line for line in page.splitlines() if line.startswith(start)), None)
            assert row is not None, f"{section}.{name} missing"
            assert row.count(" | ") == 3, row  # type, default and description cells, none split by a `|`
            if field.description:
                assert field.description.split()[0] in row


def test_every_model_and_key_of_the_kinds_schema_is_on_the_page():
    schema = docs_reference.kinds_schema()
    page = docs_reference.kinds_page()
    assert schema["$defs"]
    for name, model in schema["$defs"].items():
        assert f"## {name} {{#{docs_reference.anchor(name)}}}" in page
        for key in model.get("properties", {}):
            assert f"| `{key}` |" in page, f"{name}.{key} missing"
    linked = set(re.findall(r"\]\(#([a-z0-9_-]+)\)", page))
    anchors = set(re.findall(r"\{#([a-z0-9_-]+)\}", page))
    assert linked <= anchors


class _Update(BaseModel):
    """Set columns."""

    type: Literal["update"]
    set_: dict[str, str] = Field(alias="set", min_length=1)


class _Produce(BaseModel):
    """Produce a record."""

    type: Literal["produce"]
    topic: str = Field(min_length=1, description="The declared topic.")


class _Kind(BaseModel):
    effect: Annotated[_Update | _Produce, Field(discriminator="type")]


def test_a_discriminated_union_of_effects_reads_as_its_members():
    """The effect declarations are becoming a discriminated union: the page names each member and
    the key that tells them apart, from the schema alone."""
    schema = _Kind.model_json_schema(ref_template="#/$defs/{model}")
    effect = docs_reference.schema_type(schema["properties"]["effect"])
    assert effect == "[_Update](#_update) or [_Produce](#_produce), told apart by `type`"
    assert docs_reference.model_order(schema) == ["_Update", "_Produce"]
    produce = "\n".join(docs_reference.model_section("_Produce", schema["$defs"]["_Produce"]))
    assert '| `type` | `"produce"` | yes |' in produce
    assert "The declared topic." in produce


def test_an_effect_keyed_by_its_type_reads_as_its_keys():
    """Or a union of one-key mappings (`effect: {http: {...}}`): each member is its key and model."""
    effect = {"oneOf": [
        {"type": "object", "properties": {"update": {"$ref": "#/$defs/_Update"}}, "required": ["update"]},
        {"type": "object", "properties": {"produce": {"$ref": "#/$defs/_Produce"}}, "required": ["produce"]}]}
    assert docs_reference.schema_type(effect) == "{`update`: [_Update](#_update)} or {`produce`: [_Produce](#_produce)}"


def test_the_troubleshooting_page_explains_every_exit_code():
    page = (REPO / "docs" / "troubleshooting.md").read_text()
    for code in ExitCode:
        assert re.search(rf"^\| {code.value} \| ", page, re.M), f"exit code {code.value} not in the table"
        if code is not ExitCode.OK:
            assert f"{{#exit-{code.value}}}" in page


def test_the_readme_is_short_and_keeps_the_two_commands():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    assert "make demo" in readme and "make test" in readme
