"""The one list of declarable effect types, and the kinds file's `effect:` as a discriminated union
over it.

The file writes an effect as a mapping of one key, the type's tag (`{http: {url: …}}`, `delete:`
bare); the union's discriminator reads that key and the chosen member validates the value under it,
so an error names the field as the file does (`effect.http.url`). Anything else (no key, an
unknown one, two) is validated by a shape model that says what is wrong.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Union

from pydantic import (
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    GetJsonSchemaHandler,
    Tag,
    create_model,
    model_validator,
)
from pydantic.json_schema import JsonSchemaValue, SkipJsonSchema
from pydantic_core import CoreSchema

from lapse.kernel.kinds.effects.base import EffectType
from lapse.kernel.kinds.effects.delete import DeleteEffect
from lapse.kernel.kinds.effects.http import HttpEffect
from lapse.kernel.kinds.effects.kafka_produce import KafkaProduceEffect
from lapse.kernel.kinds.effects.object_store import ObjectStoreEffect
from lapse.kernel.kinds.effects.update import UpdateEffect

# Register an effect type here (its caller in processors/effects/__init__.py), in the order the
# kinds file's messages list them.
EFFECT_TYPES: tuple[type[EffectType], ...] = (
    UpdateEffect, DeleteEffect, HttpEffect, ObjectStoreEffect, KafkaProduceEffect)
BARE_TAGS = frozenset({DeleteEffect.tag})  # `delete:` with nothing after it means `delete: {}`

BY_TAG: dict[str, type[EffectType]] = {t.tag: t for t in EFFECT_TYPES}
TAGS = tuple(BY_TAG)
EXTERNAL_TAGS = tuple(t.tag for t in EFFECT_TYPES if t.external)
SHAPE = "(shape)"  # the union member of a mapping that names no single type; left out of error paths


def exactly_one() -> str:
    return f"exactly one of {', '.join(TAGS)}"


def _tag_of(value: Any) -> str:
    if isinstance(value, EffectType):
        return value.tag
    if isinstance(value, dict) and len(value) == 1 and next(iter(value)) in BY_TAG:
        return str(next(iter(value)))
    return SHAPE


def _under(tag: str) -> BeforeValidator:
    """The value under the type's key, validated by the member (a model instance passes as is)."""
    def unwrap(value: Any) -> Any:
        if isinstance(value, EffectType):
            return value
        inner = value[tag]
        return {} if inner is None and tag in BARE_TAGS else inner
    return BeforeValidator(unwrap)


class _Keyed:
    """The JSON schema of a member as the file writes it: an object of the one key `tag`."""

    def __init__(self, tag: str) -> None:
        self.tag = tag

    def __get_pydantic_json_schema__(self, schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        inner = handler(schema)
        value = {"anyOf": [inner, {"type": "null"}]} if self.tag in BARE_TAGS else inner
        return {"type": "object", "properties": {self.tag: value}, "required": [self.tag],
                "additionalProperties": False}


def _refuse_shape(model: Any) -> Any:
    raise ValueError(exactly_one())


# The mapping that names no single type: each tag a known key (extra keys refused by name), and
# when every key is known, the count is wrong.
_Shape: Any = create_model(  # type: ignore[call-overload]
    "EffectShape", __config__=ConfigDict(extra="forbid", frozen=True),
    __validators__={"_exactly_one": model_validator(mode="after")(_refuse_shape)},
    **{tag.replace("-", "_"): (Any, Field(None, alias=tag)) for tag in TAGS})

if TYPE_CHECKING:
    Effect = EffectType
else:
    Effect = Annotated[
        Union[(*(Annotated[t, _under(t.tag), _Keyed(t.tag), Tag(t.tag)] for t in EFFECT_TYPES),
               Annotated[SkipJsonSchema[_Shape], Tag(SHAPE)])],
        Discriminator(_tag_of)]
