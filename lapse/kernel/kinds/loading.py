"""From the kinds file to the kinds every process uses: read, validate, compile, refuse.

`load_kinds` is the one way a process gets its kinds. The whole file is refused at the first
mistake, with a one-line error naming the file, the kind and the field, before anything runs:
an unknown column, a value that cannot fit, an effect missing a field, a table without the
(due, id) index its sweep needs (with the CREATE INDEX to add).
"""

from __future__ import annotations

import importlib
from dataclasses import replace
from pathlib import Path

from sqlalchemy import MetaData

from lapse.kernel.kinds.brakes import effective_budget
from lapse.kernel.kinds.columns import Bind
from lapse.kernel.kinds.compiler import compile_declared
from lapse.kernel.kinds.declarations import Declaration, KindsFile, read_kinds_file
from lapse.kernel.kinds.effects.python import PythonKind
from lapse.kernel.kinds.errors import KindError, show
from lapse.kernel.kinds.indexes import require_due_index
from lapse.kernel.kinds.kind import CleanupKind
from lapse.kernel.kinds.limits import unknown_weights
from lapse.kernel.settings import Settings
from lapse.kernel.topology import Topology


def load_kind(dotted: str) -> CleanupKind:
    """Import a kind named as `package.module:ATTRIBUTE`; ValueError when it is not one, or when
    importing the module fails in any way (it is the user's code: a syntax error, an exception
    at import time is a wrong kinds file, not an error of Lapse)."""
    module_name, _, attr = dotted.partition(":")
    try:
        kind = getattr(importlib.import_module(module_name), attr)
    except Exception as exc:  # whatever the named module raises while it is imported
        raise ValueError(f"cannot load {dotted!r}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
                         ) from None
    if not isinstance(kind, CleanupKind):
        raise ValueError(f"{dotted!r} is a {type(kind).__name__}, not a CleanupKind")
    return kind


def python_kind(name: str, decl: PythonKind) -> CleanupKind:
    """The Python kind a declaration names; its name must be the declared one (op keys and
    `schedule_cleanup` use it)."""
    try:
        kind = load_kind(decl.python)
    except ValueError as exc:
        raise KindError("python", str(exc)) from None
    if kind.name != name:
        raise KindError("python", f"{decl.python} is the kind {show(kind.name)}, not {show(name)}")
    if decl.limits is not None and kind.external_effect is None:
        raise KindError("limits", f"{decl.python} applies its effect in the database: it calls no endpoint")
    if decl.limits is not None and decl.limits.per == "endpoint":
        raise KindError("limits.per", "a Python kind's endpoints are its own: limit it per kind or per tenant")
    problem = unknown_weights(decl.tenant_weights, kind.has_tenant)
    if problem is not None:
        raise KindError("tenant_weights", problem)
    # The file's word wins: a Python kind's effect is unknown, so it has no default budget.
    return replace(kind, mode=decl.mode, budget=effective_budget(decl.budget, False) if decl.budget is not None
                   else kind.budget, limits=decl.limits.limits() if decl.limits is not None else kind.limits,
                   priority=decl.priority, tenant_weights=dict(decl.tenant_weights) or kind.tenant_weights)


def compile_kind(name: str, decl: Declaration, bind: Bind, metadata: MetaData, base_dir: Path,
                 lapse_schema: str | None = None, topology: Topology | None = None) -> CleanupKind:
    """One kind, declared or Python; KindError naming the field when it cannot be used."""
    if isinstance(decl, PythonKind):
        return python_kind(name, decl)
    return compile_declared(name, decl, bind, metadata, base_dir, lapse_schema, topology)


def compile_kinds(kinds_file: KindsFile, bind: Bind, lapse_schema: str | None = None,
                  topology: Topology | None = None) -> dict[str, CleanupKind]:
    """Every kind of the file, compiled against the database at `bind` (and `topology`, for the
    topics effects name), each with its due index; KindsFileError at the first that is wrong."""
    metadata = MetaData()
    base_dir = kinds_file.path.resolve().parent
    kinds: dict[str, CleanupKind] = {}
    for name, decl in kinds_file.kinds.items():
        try:
            kind = compile_kind(name, decl, bind, metadata, base_dir, lapse_schema, topology)
            require_due_index(bind, kind)
        except KindError as exc:
            raise exc.in_file(kinds_file.path, name) from None
        kinds[name] = kind
    return kinds


def load_kinds(settings: Settings, bind: Bind) -> dict[str, CleanupKind]:
    """The kinds of the kinds file (`kinds.file`), by name, compiled against the database."""
    return compile_kinds(read_kinds_file(settings.kinds.file), bind, settings.database.schema_name,
                         settings.topology)
