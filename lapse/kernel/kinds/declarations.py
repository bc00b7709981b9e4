"""The kinds file as validated data: what each declared kind says, before any database is seen.

A kind is either declared (table, id, optional tenant, due column, eligibility conditions, one
effect of the types in `effects.registry`, retry policy, call limits, priority, tenant weights) or
names a Python kind by dotted path. Every model forbids unknown fields and takes values as they
are typed in the file (no string-to-number coercion), so a mistake is refused here with the field
that holds it; whether the names exist in the table is the compiler's business.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainValidator, ValidationError, model_validator

from lapse.kernel.kinds.brakes import BRAKE_TAGS, BUDGET_HELP, MODE_HELP, BudgetField, Mode
from lapse.kernel.kinds.effects.python import PythonKind
from lapse.kernel.kinds.effects.registry import EXTERNAL_TAGS, SHAPE, Effect
from lapse.kernel.kinds.errors import KindError, KindsFileError, show
from lapse.kernel.kinds.limits import (
    LIMITS_HELP,
    PRIORITY_HELP,
    WEIGHTS_HELP,
    LimitsDecl,
    Priority,
    checked_weights,
    unknown_weights,
)
from lapse.kernel.ledger import InvalidOpKey, op_key
from lapse.kernel.yaml_files import YamlFileError, load_text, read_text

GENERATION_HELP = (
    "The column that tells one lapse of a row from the next, for a subject that lapses again (a hold "
    "released and held again): a NOT NULL timestamp with time zone set when it starts over "
    "(`hold_started_at`) or an integer version. Each generation is its own operation, "
    "`<kind>:<id>@<generation>`, applied once; without it a subject lapses once per ledger row.")
MAX_LIST = 1000
SCALARS = (str, int, float, bool)

# A condition or set value: what YAML gives for a scalar (dates and timestamps included), or null.
Scalar = Any


@dataclass(frozen=True)
class Condition:
    """One eligibility condition on a column: `eq` (a value or null), `ne` (`{not: …}`), `in`,
    `not_in` (`{in: [...]}`, `{not_in: [...]}`)."""

    op: Literal["eq", "ne", "in", "not_in"]
    value: Scalar

    def text(self, column: str) -> str:
        """How `lapse kinds list` shows the condition: `status = 'held'`, `plan in ('a', 'b')`."""
        if self.op in ("in", "not_in"):
            values = ", ".join(show(v) for v in self.value)
            return f"{column} {'in' if self.op == 'in' else 'not in'} ({values})"
        if self.value is None:
            return f"{column} is {'null' if self.op == 'eq' else 'not null'}"
        return f"{column} {'=' if self.op == 'eq' else '!='} {show(self.value)}"


def _scalar(value: Any) -> Scalar:
    if value is not None and not isinstance(value, SCALARS) and not hasattr(value, "isoformat"):
        raise ValueError(f"expected a value or null, not {type(value).__name__}")
    return value


def _condition(raw: Any) -> Condition:
    """`value`, `null`, `{in: [...]}`, `{not_in: [...]}` or `{not: value}`."""
    if not isinstance(raw, dict):
        return Condition("eq", _scalar(raw))
    if len(raw) != 1 or next(iter(raw)) not in ("in", "not_in", "not"):
        raise ValueError("expected a value, null, {in: [...]}, {not_in: [...]} or {not: value}")
    (op, value), = raw.items()
    if op == "not":
        return Condition("ne", _scalar(value))
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_LIST:
        raise ValueError(f"{op} takes a list of 1 to {MAX_LIST} values")
    if any(v is None for v in value):
        raise ValueError(f"{op} takes values, not null (say `null` or {{not: null}} instead)")
    return Condition("in" if op == "in" else "not_in", tuple(_scalar(v) for v in value))


ConditionField = Annotated[Condition, PlainValidator(_condition)]
WeightsField = Annotated[dict[str, float], BeforeValidator(checked_weights)]


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, populate_by_name=False)


class RetryDecl(_Strict):
    """The retry policy of an effect that can fail: attempts, then a capped, jittered backoff;
    rate-limited tries burn no attempt, so they end after `rate_limited_for_s` from the first
    failed attempt instead (then a dead letter of class `rate_limited`)."""

    max_attempts: int = Field(6, ge=1, le=100)
    base_s: float = Field(5.0, gt=0, le=86_400)
    cap_s: float = Field(3600.0, gt=0, le=7 * 86_400)
    rate_limited_for_s: float = Field(86_400.0, gt=0, le=30 * 86_400)

    @model_validator(mode="after")
    def _cap_over_base(self) -> RetryDecl:
        if self.cap_s < self.base_s:
            raise ValueError("cap_s must be at least base_s")
        return self


class DeclaredKind(_Strict):
    """A kind declared over a business table."""

    table: str = Field(min_length=1)
    id: str = Field(min_length=1)
    tenant: str | None = Field(None, min_length=1, description=(
        "The tenant column: text, uuid or integer, carried as text (a uuid lowercase with dashes); "
        "null reads as 'default', and so does a table without one."))
    due: str = Field(min_length=1)
    eligible: dict[str, ConditionField] = Field(default_factory=dict, max_length=100)
    effect: Effect
    retry: RetryDecl = Field(default_factory=RetryDecl)
    limits: LimitsDecl | None = Field(None, description=LIMITS_HELP)
    priority: Priority = Field("normal", description=PRIORITY_HELP)
    tenant_weights: WeightsField = Field(default_factory=dict, description=WEIGHTS_HELP)
    mode: Mode = Field("live", description=MODE_HELP)
    budget: BudgetField = Field(None, description=BUDGET_HELP)
    generation: str | None = Field(None, min_length=1, description=GENERATION_HELP)

    @model_validator(mode="before")
    @classmethod
    def _rate_moved(cls, data: Any) -> Any:
        if isinstance(data, dict) and "rate_per_s" in data:
            raise ValueError("rate_per_s is now limits.rate_per_s, counted for all workers together (it was each "
                             "worker's): move it there, as the total rate the far side takes")
        return data

    @model_validator(mode="after")
    def _limits_only_outside(self) -> DeclaredKind:
        if self.limits is not None and not self.effect.external:
            *most, last = EXTERNAL_TAGS
            raise ValueError(f"limits apply to {', '.join(most)} and {last} effects only: a {self.effect.tag} "
                             "effect calls no endpoint")
        problem = unknown_weights(self.tenant_weights, self.tenant is not None)
        if problem is not None:
            raise ValueError(f"tenant_weights: {problem}")
        return self

    def privileges(self) -> list[str]:
        """What the database role must be allowed on the table, for the effect."""
        return self.effect.privileges()

    def summary(self) -> dict[str, Any]:
        summary = {"table": self.table, "effect": self.effect.tag, "id": self.id, "tenant": self.tenant,
                   "due": self.due, "conditions": [c.text(col) for col, c in self.eligible.items()]}
        return summary if self.generation is None else {**summary, "generation": self.generation}


Declaration = DeclaredKind | PythonKind


@dataclass(frozen=True)
class KindsFile:
    """The kinds file, validated: where it is (relative `file:` URLs resolve against its folder)
    and each kind's declaration by name, in file order."""

    path: Path
    kinds: dict[str, Declaration]


def _field_path(loc: tuple[int | str, ...]) -> str:
    return ".".join(show(part, bare=True) for part in loc) or "(kind)"


def _pydantic_message(exc: ValidationError) -> tuple[str, str]:
    error = exc.errors()[0]
    message = error["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
    loc = tuple(p for p in error["loc"]
                if not (isinstance(p, str) and (p.startswith("function-") or p == SHAPE or p in BRAKE_TAGS)))
    return _field_path(loc), message.splitlines()[0]


def _valid_name(name: Any) -> bool:
    """A kind name is the first half of every op key (`kind:subject`), so the op key's rule."""
    if not isinstance(name, str):
        return False
    try:
        op_key(name, "1")
    except InvalidOpKey:
        return False
    return True


def parse_kind(name: Any, raw: Any) -> Declaration:
    """One kind's declaration; KindError naming the field when it is wrong."""
    if not _valid_name(name):
        raise KindError("name", "a kind name is a lowercase letter, then lowercase letters, digits "
                                "and dashes, at most 63 characters")
    if not isinstance(raw, dict):
        raise KindError("(kind)", "expected a mapping of table, id, due, eligible, effect… or python")
    model: type[DeclaredKind] | type[PythonKind] = PythonKind if "python" in raw else DeclaredKind
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise KindError(*_pydantic_message(exc)) from None


def parse_kinds_text(text: str, path: Path) -> KindsFile:
    """Validate the text of a kinds file; KindsFileError (one line) on the first mistake."""
    try:
        data = load_text(text, path)
    except YamlFileError as exc:
        raise KindsFileError(str(exc)) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise KindsFileError(f"{path}: expected one top-level key `kinds`")
    if set(data) - {"kinds"}:
        unknown = ", ".join(sorted(show(k) for k in data if k != "kinds"))
        raise KindsFileError(f"{path}: expected one top-level key `kinds`, not {unknown}")
    raw_kinds = data.get("kinds") or {}
    if not isinstance(raw_kinds, dict):
        raise KindsFileError(f"{path}: kinds: expected a mapping of kind name to declaration")
    kinds: dict[str, Declaration] = {}
    for name, raw in raw_kinds.items():
        try:
            kinds[name] = parse_kind(name, raw)
        except KindError as exc:
            raise exc.in_file(path, name) from None
    return KindsFile(path, kinds)


def read_kinds_file(path: Path | None) -> KindsFile:
    """Read and validate the kinds file at `path` (settings `kinds.file`)."""
    if path is None:
        raise KindsFileError("no kinds file: set kinds.file (LAPSE_KINDS__FILE) or run `lapse init`")
    try:
        text = read_text(path, "kinds file")
    except YamlFileError as exc:
        raise KindsFileError(str(exc)) from None
    return parse_kinds_text(text, path)


@lru_cache(maxsize=16)
def _generations_cached(path: str, mtime_ns: int, size: int) -> dict[str, str | None]:
    return {name: decl.generation if isinstance(decl, DeclaredKind) else None
            for name, decl in read_kinds_file(Path(path)).kinds.items()}


def declared_generations(path: Path | None) -> dict[str, str | None]:
    """Each kind the file declares, with its generation column (None: none, or a Python kind), read
    again only when the file changed (for the publish API, which runs inside the application's
    transactions and must stay cheap)."""
    if path is None:
        raise KindsFileError("no kinds file: set kinds.file (LAPSE_KINDS__FILE) or run `lapse init`")
    try:
        stat = os.stat(path)
    except OSError as exc:
        raise KindsFileError(f"{path}: cannot read the kinds file ({exc.strerror})") from None
    return _generations_cached(str(path), stat.st_mtime_ns, stat.st_size)


def declared_names(path: Path | None) -> frozenset[str]:
    """The kind names the file declares (`declared_generations`' names)."""
    return frozenset(declared_generations(path))
