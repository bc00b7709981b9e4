"""The application's publish path: schedule a cleanup inside the application's own transaction.

`schedule_cleanup` writes a `pending` ledger row and an outbox row in the caller's transaction, so
the expiry event exists if and only if the business change commits; the outbox relay publishes it.
Work that is not due yet goes to the delay tier that covers the wait, with its `lapse-due-at` header.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection
from sqlalchemy.orm import Session

from lapse.kernel.clock import database_now
from lapse.kernel.delays import delay_record
from lapse.kernel.kinds import CleanupKind, declared_generations, generation_text
from lapse.kernel.ledger import LedgerWrites, expiry_event, insert_pending
from lapse.kernel.models import SCHEMA
from lapse.kernel.settings import Settings, load_settings
from lapse.kernel.trace_context import traceparent_of
from lapse.kernel.tracing import PUBLISH, publish_span

SOURCE = "publish"


def _connection(conn_or_session: Connection | Session, settings: Settings) -> Connection:
    """The caller's connection, finding Lapse's tables where `database.schema_name` says even when
    the application made its engine with plain `create_engine` (no schema translate map)."""
    conn = conn_or_session.connection() if isinstance(conn_or_session, Session) else conn_or_session
    translate = conn.get_execution_options().get("schema_translate_map") or {}
    if SCHEMA not in translate:
        schema = settings.database.schema_name if conn.dialect.name == "postgresql" else None
        conn.execution_options(schema_translate_map={**translate, SCHEMA: schema})
    return conn


def _generation(kind: str | CleanupKind, column: str | None, subject_id: str | int,
                generation: datetime | int | None) -> str | None:
    """The generation's text for the op key, checked against the kind (its column's type too when
    the kind itself is given, which is also how a Python kind's generation is known)."""
    if isinstance(kind, CleanupKind):
        kind.parse_subject(str(subject_id))
        column = kind.generation.name if kind.generation is not None else None
    name = kind.name if isinstance(kind, CleanupKind) else kind
    if column is None:
        if generation is not None:
            raise ValueError(f"kind {name!r} declares no generation column: schedule it without generation=")
        return None
    if generation is None:
        raise ValueError(f"kind {name!r} tells its lapses apart by {column}: pass the row's {column} as generation=")
    if isinstance(kind, CleanupKind) and kind.generation is not None:
        return kind.generation.text(generation)
    return generation_text(generation)


def schedule_cleanup(
    conn_or_session: Connection | Session,
    kind: str | CleanupKind,
    subject_id: str | int,
    tenant: str,
    due_at: datetime,
    *,
    generation: datetime | int | None = None,
    correlation_id: str | None = None,
    traceparent: str | None = None,
    settings: Settings | None = None,
    now: datetime | None = None,
) -> bool:
    """Record cleanup work for `subject_id` in the caller's transaction; commit is the caller's.

    `kind` is a kind's name in the kinds file (or the kind itself); without `settings` they are
    read from the environment (`load_settings()`), the kinds file from `kinds.file`. A kind that
    declares a generation column takes the row's value of it as `generation` (an aware datetime or
    an int): each lapse of the row is its own operation (`<kind>:<id>@<generation>`).
    The event carries a W3C trace context (docs/design/traces.md): the span this call records
    (under the application's active span, or `traceparent`), else `traceparent` or the active
    span's; a malformed `traceparent` is dropped.
    Idempotent per op key: returns False (and writes nothing) when the op key already has a
    ledger row. Raises ValueError for an unknown kind, a malformed subject, a generation missing,
    unexpected or of the wrong type, or a naive `due_at`.
    """
    settings = settings or load_settings()
    name = kind.name if isinstance(kind, CleanupKind) else kind
    generations = declared_generations(settings.kinds.file)
    if name not in generations:
        raise ValueError(f"unknown cleanup kind {name!r}: not declared in {settings.kinds.file}")
    if due_at.tzinfo is None:
        raise ValueError("due_at must be timezone-aware")
    event = expiry_event(name, subject_id, tenant, due_at, source=SOURCE, correlation_id=correlation_id,
                         generation=_generation(kind, generations[name], subject_id, generation))
    conn = _connection(conn_or_session, settings)
    with publish_span(PUBLISH, traceparent_of(traceparent), {"lapse.op_key": event.op_key,
                                                             "lapse.kind": name}) as carried:
        event = event._replace(traceparent=carried)
        now = now or database_now(conn)  # due now or through a delay tier: the database's clock decides
        if not insert_pending(conn, [event], now):
            return False
        topic, headers = settings.topology.expiry, {}
        if due_at > now:
            topic, record_headers = delay_record(settings.topology, due_at, now)
            headers = {key: value.decode() for key, value in record_headers}
        writes = LedgerWrites(SOURCE, now)
        writes.expiry(topic, event, headers)
        writes.flush(conn)
        return True
