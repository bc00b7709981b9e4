"""Cleanup kinds: what makes a business row eligible, how its op key is built, and its effect.

Kinds are declared in the kinds file (`kinds.file`, YAML): a table, its id, optional tenant and
due columns, eligibility conditions and one effect (update, delete, http, object-store,
kafka-produce: one module each in `effects`), compiled against the reflected table; or, for
what declarations cannot say, a Python `CleanupKind` named by dotted path.
`load_kinds(settings, engine)` gives every process the same kinds.

kind          the CleanupKind interface the rooms use (and ExternalEffect, EligibleRow)
effects       the effect types, one module each, registered in effects.registry
declarations  the kinds file as validated data (pydantic), read from YAML
columns       the reflected table: column lookup, values checked against column types, subject ids
compiler      a declaration compiled into a CleanupKind; statements: its conditional SQL
generations   a kind's generation column: what tells one lapse of a row from the next, as text
indexes       the (due, id) index every kind needs, or the CREATE INDEX to add
loading       load_kinds: the file, compiled and checked; checks: `lapse kinds list/check`
plan          `lapse kinds plan`: what a kind would change now and hour by hour, read-only, bounded
errors        the one-line KindsFileError (file, kind, field, what is wrong)
"""

from lapse.kernel.kinds.checks import KindCheck, check_kinds, describe
from lapse.kernel.kinds.declarations import KindsFile, declared_generations, declared_names, read_kinds_file
from lapse.kernel.kinds.errors import KindsFileError
from lapse.kernel.kinds.generations import Generation, generation_text
from lapse.kernel.kinds.kind import CleanupKind, EligibleRow, ExternalEffect, SubjectRow
from lapse.kernel.kinds.loading import compile_kinds, load_kind, load_kinds

__all__ = [
    "CleanupKind",
    "EligibleRow",
    "ExternalEffect",
    "Generation",
    "KindCheck",
    "KindsFile",
    "KindsFileError",
    "SubjectRow",
    "check_kinds",
    "compile_kinds",
    "declared_generations",
    "declared_names",
    "describe",
    "generation_text",
    "load_kind",
    "load_kinds",
    "read_kinds_file",
]
