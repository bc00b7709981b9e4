"""Every statement `lapse show` reads one operation's history with: its ledger row, its
transitions, its outbox records, and the op keys a correlation id was seen with. Read-only, and
each statement walks an index (the module's notes say which, and what a walk costs):

- the ledger row: the primary key;
- transitions: failed attempts through ix_lapse_transitions_failures (op_key, id), exact; the
  others through ix_lapse_transitions_at over the row's lifetime (created_at .. updated_at, padded
  by CLOCK_SKEW), filtered by op key: that walk reads every transition any op key made in the
  window (no index holds all transitions by op key since migration 0005);
- outbox records (`key` is the op key, not indexed): unsent ones through ix_lapse_outbox_unsent
  (the relay's backlog), sent ones through ix_lapse_outbox_sent from the row's creation on (every
  record sent since then, up to the purge horizon);
- op keys of a subject's lapses (a kind with a generation): ix_lapse_ledger_kind_subject;
- op keys of a correlation id: the operations created with it through ix_lapse_ledger_correlation;
  only when there is none, the transitions of a time window through ix_lapse_transitions_at (an id
  that arrived later, with a redelivery or a replay: that walk reads every transition of the window);
- a tenant's operations, a page at a time in (kind, op key) order: ix_lapse_ledger_tenant
  (tenant, kind, op_key), one range walk of at most a page;
- whether a kind or a tenant is known: one probe of ix_lapse_ledger_kind_subject or
  ix_lapse_ledger_tenant.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Select, exists, func, select, tuple_, union_all

from lapse.kernel.models import cleanup_ledger as L
from lapse.kernel.models import ledger_transitions as T
from lapse.kernel.models import outbox as O

# How far apart two writers' clocks may be: a transition is stamped with its writer's clock, so
# the lifetime window of an op key is widened by this much on each side.
CLOCK_SKEW = timedelta(minutes=1)


@dataclass(frozen=True, slots=True)
class LedgerRecord:
    """One ledger row, every column."""

    op_key: str
    kind: str
    tenant: str
    subject_id: str
    state: str
    attempt: int
    due_at: datetime
    claim_owner: str | None
    claim_until: datetime | None
    last_failure_class: str | None
    last_failure: str | None
    replay_id: str | None
    correlation_id: str
    source: str
    duplicates: int
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None


@dataclass(frozen=True, slots=True)
class TransitionRecord:
    """One recorded transition of an op key."""

    id: int
    from_state: str | None
    to_state: str
    attempt: int
    failure_class: str | None
    reason: str | None
    actor: str
    replay_id: str | None
    correlation_id: str | None
    at: datetime
    event_topic: str | None  # where the consumed event that made it was read (None: not consumed)
    event_partition: int | None
    event_offset: int | None


@dataclass(frozen=True, slots=True)
class OutboxRecord:
    """One outbox row of an op key: what was (or is to be) published, and when it was sent."""

    id: int
    topic: str
    schema: str
    payload: dict[str, Any]
    headers: dict[str, str]
    created_at: datetime
    sent_at: datetime | None


# The columns each statement selects, in the order of its record's fields.
LEDGER_COLUMNS = tuple(L.c[f.name] for f in fields(LedgerRecord))
TRANSITION_COLUMNS = tuple(T.c[f.name] for f in fields(TransitionRecord))
OUTBOX_COLUMNS = tuple(O.c[f.name] for f in fields(OutboxRecord))


def ledger_statement(op_key: str) -> Select[Any]:
    """The ledger row of `op_key`: the primary key."""
    return select(*LEDGER_COLUMNS).where(L.c.op_key == op_key)


def ledger_record(conn: Connection, op_key: str) -> LedgerRecord | None:
    """The ledger row of `op_key`, or None."""
    row = conn.execute(ledger_statement(op_key)).one_or_none()
    return None if row is None else LedgerRecord(*row)


def transitions_statement(row: LedgerRecord) -> Select[Any]:
    """Every transition of `row`'s op key, in the order recorded, in two index walks: the failed
    attempts by op key (ix_lapse_transitions_failures), and the other transitions among all those
    recorded in the row's lifetime (ix_lapse_transitions_at; every transition writes the row's
    updated_at with its own time, so none lies outside the window but for clock skew)."""
    start, end = row.created_at - CLOCK_SKEW, row.updated_at + CLOCK_SKEW
    failed = select(*TRANSITION_COLUMNS).where(T.c.op_key == row.op_key, T.c.failure_class.is_not(None))
    others = select(*TRANSITION_COLUMNS).where(T.c.at >= start, T.c.at <= end, T.c.op_key == row.op_key,
                                               T.c.failure_class.is_(None))
    both = union_all(failed, others).subquery()
    return select(*both.c).order_by(both.c.id)


def transitions_of(conn: Connection, row: LedgerRecord) -> list[TransitionRecord]:
    return [TransitionRecord(*r) for r in conn.execute(transitions_statement(row))]


def outbox_statement(row: LedgerRecord) -> Select[Any]:
    """Every outbox row keyed by `row`'s op key still kept, in the order written: those not sent
    yet (ix_lapse_outbox_unsent) and those sent since the row was created (ix_lapse_outbox_sent)."""
    unsent = select(*OUTBOX_COLUMNS).where(O.c.sent_at.is_(None), O.c.key == row.op_key)
    sent = select(*OUTBOX_COLUMNS).where(O.c.sent_at.is_not(None), O.c.sent_at >= row.created_at - CLOCK_SKEW,
                                         O.c.key == row.op_key)
    both = union_all(unsent, sent).subquery()
    return select(*both.c).order_by(both.c.id)


def outbox_of(conn: Connection, row: LedgerRecord) -> list[OutboxRecord]:
    return [OutboxRecord(*r) for r in conn.execute(outbox_statement(row))]


def lapses_statement(kind: str, subject_id: str, limit: int) -> Select[Any]:
    """Op keys of every operation of one subject of `kind`, oldest first, at most `limit`: one per
    lapse for a kind with a generation (ix_lapse_ledger_kind_subject)."""
    return (select(L.c.op_key).where(L.c.kind == kind, L.c.subject_id == subject_id)
            .order_by(L.c.created_at, L.c.op_key).limit(limit))


def correlation_statement(correlation_id: str, since: datetime, until: datetime, limit: int) -> Select[Any]:
    """Op keys with a transition carrying `correlation_id` recorded in [since, until), first seen
    first, at most `limit` (ix_lapse_transitions_at: reads every transition of the window)."""
    return (select(T.c.op_key).where(T.c.at >= since, T.c.at < until, T.c.correlation_id == correlation_id)
            .group_by(T.c.op_key).order_by(func.min(T.c.id)).limit(limit))


def created_with_statement(correlation_id: str, since: datetime, until: datetime, limit: int) -> Select[Any]:
    """Op keys of the operations created with `correlation_id` in [since, until), oldest first, at
    most `limit` (ix_lapse_ledger_correlation)."""
    return (select(L.c.op_key).where(L.c.correlation_id == correlation_id, L.c.created_at >= since,
                                     L.c.created_at < until)
            .order_by(L.c.created_at, L.c.op_key).limit(limit))


def op_keys_of_correlation(conn: Connection, correlation_id: str, since: datetime, until: datetime,
                           limit: int) -> list[str]:
    """The operations created with `correlation_id` in [since, until); if there are none, those
    with a transition carrying it in that window."""
    created = list(conn.execute(created_with_statement(correlation_id, since, until, limit)).scalars())
    return created or list(conn.execute(correlation_statement(correlation_id, since, until, limit)).scalars())


@dataclass(frozen=True, slots=True)
class OperationLine:
    """One operation of a tenant's list: where it stands."""

    op_key: str
    kind: str
    subject_id: str
    state: str
    attempt: int
    due_at: datetime
    updated_at: datetime
    last_failure_class: str | None


OPERATION_LINE_COLUMNS = tuple(L.c[f.name] for f in fields(OperationLine))


def tenant_page_statement(tenant: str, kind: str | None, after: tuple[str, str] | None, limit: int) -> Select[Any]:
    """A page of `tenant`'s operations (of `kind` only, when given) after the (kind, op key)
    `after`, in (kind, op key) order: one range of ix_lapse_ledger_tenant."""
    stmt = select(*OPERATION_LINE_COLUMNS).where(L.c.tenant == tenant)
    if kind is not None:
        stmt = stmt.where(L.c.kind == kind)
    if after is not None:
        stmt = stmt.where(tuple_(L.c.kind, L.c.op_key) > tuple_(*after))
    return stmt.order_by(L.c.kind, L.c.op_key).limit(limit)


def tenant_page(conn: Connection, tenant: str, kind: str | None, after: tuple[str, str] | None,
                limit: int) -> list[OperationLine]:
    return [OperationLine(*row) for row in conn.execute(tenant_page_statement(tenant, kind, after, limit))]


def known_kind(conn: Connection, kind: str) -> bool:
    """Whether any operation of `kind` is in the ledger."""
    return bool(conn.execute(select(exists().where(L.c.kind == kind))).scalar())


def known_tenant(conn: Connection, tenant: str) -> bool:
    """Whether any operation of `tenant` is in the ledger."""
    return bool(conn.execute(select(exists().where(L.c.tenant == tenant))).scalar())
