"""Start-up checks: what a role verifies before it does any work, each failure a one-line refusal.

A role that started against a database one migration behind, a schema file edited incompatibly,
or a setting too long for the column it is written to would fail every batch and dead-letter good
work. So before any work each role checks, and refuses (`StartupRefused`, a configuration error:
exit 3 at the error boundary) with what is wrong and what to do:

- the database is at the migration head (an unreachable database is not refused here: its error
  goes through to the boundary, exit 4);
- every current schema can read every schema in `schemas/history/` (Avro schema resolution,
  checked on the parsed schemas, and a generated sample written with the old schema and read
  with the new one);
- settings written to a ledger column or a topic name fit it (topic prefix + each declared name
  at most 249 legal characters, worker_id within the claim owner column);
- for the roles that use Kafka, that a broker answers (`check_kafka`; unreachable: an outage, exit 4).
"""

from __future__ import annotations

import io
import re
from collections.abc import Mapping
from typing import Any

import fastavro
from fastavro.utils import generate_many

from lapse.kernel.codec import SchemaStore, StoredSchema
from lapse.kernel.database import configured_url, connect_args, current, history
from lapse.kernel.kafka_clients import make_admin
from lapse.kernel.models import cleanup_ledger, ledger_transitions, outbox
from lapse.kernel.settings import Settings, env_var
from lapse.kernel.topology import load_topology

MAX_TOPIC_CHARS = 249  # Kafka's limit on a topic name
_TOPIC_CHARS = re.compile(r"^[A-Za-z0-9._-]*$")
SAMPLES = 20  # generated records written with each old schema and read with the current one
# How long the start-up check waits for a broker to answer before it counts as unreachable.
KAFKA_TIMEOUT_S = 5.0


class StartupRefused(ValueError):
    """A role must not start: the one-line message says what is wrong and what to do."""


def check_kafka(settings: Settings, timeout_s: float = KAFKA_TIMEOUT_S) -> None:
    """A broker answers a metadata request within `timeout_s`; KafkaException (an outage: exit 4 at
    the error boundary, waited out by a service) when none does."""
    make_admin(settings).list_topics(timeout=timeout_s)


def check_startup(settings: Settings, *, database: bool = True) -> None:
    """Every start-up check of a role, cheapest first; `database=False` for roles that never open
    it (the delay-tier forwarder). Raises StartupRefused on the first that fails."""
    check_settings(settings)
    check_schemas(settings)
    if database:
        check_database(settings)


# --- the database ---------------------------------------------------------------------------------

def check_database(settings: Settings) -> None:
    """The database's revision of Lapse's tables is the migrations' head."""
    url = configured_url(settings)
    state = current(url, settings.database.schema_name, connect_timeout_s=settings.database.connect_timeout_s,
                    statement_timeout_s=settings.database.statement_timeout_s, connect_args=connect_args(settings))
    if state["at_head"]:
        return
    revision = state["revision"]
    if revision is not None and revision not in {s["revision"] for s in history(url)}:
        raise StartupRefused(f"database at revision {revision}, unknown to this Lapse (it needs "
                             f"{state['head']}): a newer Lapse migrated it; run that version")
    found = revision or (f"legacy {state['legacy_revision']}" if state["legacy_revision"] else "none")
    raise StartupRefused(f"database at revision {found}, this Lapse needs {state['head']}: "
                         "run `lapse db upgrade`")


# --- schemas --------------------------------------------------------------------------------------

def check_schemas(settings: Settings) -> None:
    """Every current schema reads every older version of itself kept in `schemas/history/`."""
    try:
        store = SchemaStore(settings.schemas.dir)
    except ValueError as exc:
        raise StartupRefused(f"schemas ({env_var('schemas.dir')}): {exc}") from None
    for old in store.history:
        new = store.current[old.stem]
        problem = resolution_problem(new.parsed, old.parsed) or sample_problem(new, old)
        if problem is not None:
            raise StartupRefused(f"schema {new.path.name} cannot read {old.path.name} in history/: {problem}; "
                                 "events written with it would be dead-lettered: make the change compatible")


def sample_problem(new: StoredSchema, old: StoredSchema) -> str | None:
    """Write generated records with `old` and read them with `new` (as a decoder would)."""
    try:
        for record in generate_many(old.parsed, SAMPLES):
            buffer = io.BytesIO()
            fastavro.schemaless_writer(buffer, old.parsed, record)
            buffer.seek(0)
            fastavro.schemaless_reader(buffer, old.parsed, new.parsed)
    except Exception as exc:  # whatever resolution raises (SchemaResolutionError, KeyError, …) is the finding
        return f"a sample record does not resolve: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    return None


_PROMOTIONS = {"int": {"long", "float", "double"}, "long": {"float", "double"}, "float": {"double"},
               "string": {"bytes"}, "bytes": {"string"}}
_NAMED = ("record", "enum", "fixed")
_COMPLEX = (*_NAMED, "array", "map")


def resolution_problem(reader: Any, writer: Any, path: str = "") -> str | None:
    """Why data written with `writer` cannot be read with `reader` (Avro schema resolution, on
    fastavro-parsed schemas), or None. Named types are compared by name; logical types as their
    underlying type."""
    return _Resolver(_named(reader), _named(writer)).problem(reader, writer, path or "(top)", set())


def _named(schema: Any, into: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every named type defined in a parsed schema, by full name."""
    into = {} if into is None else into
    if isinstance(schema, list):
        for branch in schema:
            _named(branch, into)
    elif isinstance(schema, dict):
        kind = schema.get("type")
        if kind in _NAMED and "name" in schema:
            into.setdefault(schema["name"], schema)
        for field in schema.get("fields", ()) if kind == "record" else ():
            _named(field["type"], into)
        if kind == "array":
            _named(schema["items"], into)
        if kind == "map":
            _named(schema["values"], into)
        if isinstance(kind, (dict, list)):
            _named(kind, into)
    return into


class _Resolver:
    def __init__(self, readers: Mapping[str, Any], writers: Mapping[str, Any]) -> None:
        self.readers = readers
        self.writers = writers

    def _type(self, schema: Any, named: Mapping[str, Any]) -> Any:
        """A schema with named references replaced and a wrapped type ({"type": "string"}) unwrapped."""
        while True:
            if isinstance(schema, str) and schema in named:
                schema = named[schema]
            elif isinstance(schema, dict) and schema.get("type") not in _COMPLEX:
                schema = schema["type"]  # {"type": "long", "logicalType": …}, or a type wrapped once more
            else:
                return schema

    def problem(self, reader: Any, writer: Any, path: str, seen: set[tuple[str, str]]) -> str | None:
        reader, writer = self._type(reader, self.readers), self._type(writer, self.writers)
        if isinstance(writer, list):
            for branch in writer:
                if self._first_match(reader, branch, path, seen) is not None:
                    return f"{path}: a value of type {_show(branch)} has no matching type in the reader"
            return None
        if isinstance(reader, list):
            if self._first_match(reader, writer, path, seen) is not None:
                return f"{path}: the reader's union has no type for {_show(writer)}"
            return None
        return self._single(reader, writer, path, seen)

    def _first_match(self, reader: Any, writer: Any, path: str, seen: set[tuple[str, str]]) -> str | None:
        """None when some branch of `reader` (a union or not) reads `writer`, else a problem."""
        branches = reader if isinstance(reader, list) else [reader]
        for branch in branches:
            if self.problem(branch, writer, path, seen) is None:
                return None
        return "no match"

    def _single(self, reader: Any, writer: Any, path: str, seen: set[tuple[str, str]]) -> str | None:
        r_kind = reader if isinstance(reader, str) else reader.get("type")
        w_kind = writer if isinstance(writer, str) else writer.get("type")
        if r_kind != w_kind:
            if r_kind in _PROMOTIONS.get(w_kind, ()):
                return None
            return f"{path}: written as {w_kind}, read as {r_kind}"
        if r_kind in _NAMED and reader.get("name") != writer.get("name"):
            return f"{path}: written as {writer.get('name')}, read as {reader.get('name')}"
        if r_kind == "record":
            key = (reader["name"], writer["name"])
            if key in seen:  # a recursive type already being compared
                return None
            seen = seen | {key}
            written = {f["name"]: f for f in writer["fields"]}
            for field in reader["fields"]:
                names = [field["name"], *field.get("aliases", ())]
                source = next((written[n] for n in names if n in written), None)
                where = f"{path}.{field['name']}" if path != "(top)" else field["name"]
                if source is None:
                    if "default" not in field:
                        return f"{where}: a field the old schema lacks, with no default"
                    continue
                found = self.problem(field["type"], source["type"], where, seen)
                if found is not None:
                    return found
            return None
        if r_kind == "enum":
            missing = [s for s in writer["symbols"] if s not in reader["symbols"]]
            if missing and "default" not in reader:
                return f"{path}: enum symbol {missing[0]!r} unknown to the reader, which has no default"
            return None
        if r_kind == "fixed":
            same = reader["size"] == writer["size"]
            return None if same else f"{path}: fixed size {writer['size']} read as {reader['size']}"
        if r_kind == "array":
            return self.problem(reader["items"], writer["items"], f"{path}[]", seen)
        if r_kind == "map":
            return self.problem(reader["values"], writer["values"], f"{path}{{}}", seen)
        return None


def _show(schema: Any) -> str:
    if isinstance(schema, str):
        return schema
    if isinstance(schema, dict):
        return str(schema.get("name") or schema.get("type"))
    return "union"


# --- settings -------------------------------------------------------------------------------------

def check_settings(settings: Settings) -> None:
    """Settings written to a ledger column or into a topic or group name fit it."""
    prefix = settings.topics.prefix
    if not _TOPIC_CHARS.fullmatch(prefix):
        raise StartupRefused(f"topics.prefix ({env_var('topics.prefix')}) {prefix[:40]!r}: a topic prefix "
                             "uses only letters, digits, '.', '_' and '-'")
    bare = load_topology(settings.topics.file)
    names = [spec.name for spec in bare.specs] + list(bare.groups.by_role().values())
    longest = max(names, key=len)
    limit = min(MAX_TOPIC_CHARS, _length(outbox.c.topic))
    if len(prefix) + len(longest) > limit:
        raise StartupRefused(f"topics.prefix ({env_var('topics.prefix')}) is {len(prefix)} characters: with "
                             f"{longest!r} the name would be {len(prefix) + len(longest)}, over Kafka's "
                             f"{limit}; use at most {limit - len(longest)}")
    load_topology(settings.topics.file, prefix)  # any other naming rule, as the roles will load it
    worker_id = settings.runtime.worker_id
    limit = min(_length(cleanup_ledger.c.claim_owner), _length(ledger_transitions.c.actor))
    if len(worker_id) > limit:
        raise StartupRefused(f"runtime.worker_id ({env_var('runtime.worker_id')}) is {len(worker_id)} "
                             f"characters, over the ledger's {limit}")


def _length(column: Any) -> int:
    length = getattr(column.type, "length", None)
    return int(length) if length is not None else MAX_TOPIC_CHARS
