"""The fast path's ledger writes (docs/design/processing.md, "The fast path"): `settle` writes the
ledger rows of work about to be applied already settled, before the effect, and `record_settled`
appends the transitions and outcomes of the work whose effect changed its business row and undoes
the rest. No probe comes first: each statement re-checks the row as it finds it.

On PostgreSQL each is one statement, written once here, prepared by the server once and sent the
batch as typed arrays (`run_prepared`), the outcome payloads built in SQL; `settle_and_apply` is
both with a kind's declared effect between them, in one statement. Elsewhere the same writes as the
portable statements of `queries`, the transitions and outcomes recorded in the writes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import Connection

from lapse.kernel.batch_sql import run_prepared
from lapse.kernel.database import qualified_name
from lapse.kernel.ledger import states
from lapse.kernel.ledger.queries import insert_settled, restore_waiting, settle_waiting, settled_row, withdraw_settled
from lapse.kernel.ledger.records import ExpiryEvent, millis
from lapse.kernel.ledger.writes import LedgerWrites
from lapse.kernel.models import cleanup_ledger, ledger_transitions, outbox
from lapse.kernel.schema_names import CLEANUP_OUTCOME

# The batch's events, one row each: `b`, with the columns `_SETTLED_ROWS` and `_RECORD_DONE` read
# (and, for `settle_and_apply`, the position each came from and its parsed subject).
_BATCH = """b AS MATERIALIZED (
    SELECT * FROM unnest(%(op_key)b::text[], %(kind)b::text[], %(tenant)b::text[], %(subject_id)b::text[],
                         %(due_at)b::timestamptz[], %(correlation_id)b::text[], %(source)b::text[], %(attempt)b::int[],
                         %(replay_id)b::text[], %(duplicates)b::int[]{more_arrays})
        AS b(op_key, kind, tenant, subject_id, due_at, correlation_id, source, attempt, replay_id,
             duplicates{more_names})
)"""

# The ledger rows of `b` written settled (`settle`): `written` (op key, attempt settled at, inserted or moved).
_SETTLED_ROWS = """inserted AS (
    INSERT INTO {ledger} (op_key, kind, tenant, subject_id, state, attempt, due_at, correlation_id, source,
                          replay_id, duplicates, created_at, updated_at, finished_at)
    SELECT b.op_key, b.kind, b.tenant, b.subject_id, 'applied', b.attempt + 1, b.due_at, b.correlation_id,
           b.source, b.replay_id, b.duplicates, %(now)s, %(now)s, %(now)s
    FROM b WHERE b.due_at <= %(now)s
    ON CONFLICT DO NOTHING
    RETURNING op_key, attempt
), moved AS (
    UPDATE {ledger} SET state = 'applied', attempt = attempt + 1, finished_at = %(now)s, updated_at = %(now)s
    WHERE op_key = ANY(ARRAY(SELECT op_key FROM b EXCEPT SELECT op_key FROM inserted))
      AND state = 'pending' AND due_at <= %(now)s
      AND claim_owner IS NULL AND claim_until IS NULL AND finished_at IS NULL
    RETURNING op_key, attempt
), written AS MATERIALIZED (
    SELECT op_key, attempt, true AS fresh FROM inserted UNION ALL SELECT op_key, attempt, false FROM moved
)"""

_SETTLE = "WITH " + _BATCH.format(more_arrays="", more_names="") + ", " + _SETTLED_ROWS + """
SELECT op_key, attempt, fresh FROM written
"""

# The undo of rows whose effect changed nothing (rare: a business row changed after the batch read
# it), put in front of `_RECORD` only when there is some.
_UNDO = """
WITH withdrawn AS (
    DELETE FROM {ledger} WHERE op_key = ANY(%(withdrawn)b::text[]) AND created_at = %(now)s
      AND finished_at = %(now)s AND state = 'applied'
), restored AS (
    UPDATE {ledger} SET state = 'pending', attempt = attempt - 1, finished_at = NULL
    WHERE op_key = ANY(%(restored)b::text[]) AND state = 'applied' AND finished_at = %(now)s
      AND updated_at = %(now)s
),"""

# The transition `pending → applied` and the outcome of each row of `done` (op_key, kind, tenant,
# subject_id, attempt settled at, due_ms, correlation_id, replay_id, event_topic, event_partition,
# event_offset).
_RECORD_DONE = """transitions AS (
    INSERT INTO {transitions} (op_key, from_state, to_state, attempt, actor, replay_id, correlation_id, at,
                               event_topic, event_partition, event_offset)
    SELECT op_key, 'pending', 'applied', attempt, %(actor)s::text, replay_id, correlation_id, %(now)s,
           event_topic, event_partition, event_offset
    FROM done
), outcomes AS (
    INSERT INTO {outbox} (topic, key, schema, payload, headers, created_at)
    SELECT %(topic)s::text, op_key, %(schema)s::text,
           json_build_object('op_key', op_key, 'kind', kind, 'tenant', tenant, 'subject_id', subject_id,
                             'status', 'applied', 'attempt', attempt, 'failure_class', NULL, 'reason', NULL,
                             'due_at', due_ms, 'occurred_at', %(now_ms)s::bigint, 'correlation_id', correlation_id,
                             'replay_id', replay_id, 'worker', %(actor)s::text),
           '{{}}'::json, %(now)s
    FROM done
)"""

_RECORD = """
WITH done AS (
    SELECT * FROM unnest(%(op_key)b::text[], %(kind)b::text[], %(tenant)b::text[], %(subject_id)b::text[],
                         %(attempt)b::int[], %(due_ms)b::bigint[], %(correlation_id)b::text[],
                         %(replay_id)b::text[], %(event_topic)b::text[], %(event_partition)b::int[],
                         %(event_offset)b::bigint[])
        AS d(op_key, kind, tenant, subject_id, attempt, due_ms, correlation_id, replay_id, event_topic,
             event_partition, event_offset)
), """ + _RECORD_DONE + """
SELECT count(*) FROM done
"""

# `settle`, the kind's effect on the rows written and `_RECORD_DONE` for those it changed, in one
# statement: the effect (`{effect}`, its ids drawn from `lapse_settled`) runs after the ledger rows
# are written, as with `settle` first, and its subjects join the batch's by value (`subject`).
_SETTLE_AND_APPLY = "WITH " + _BATCH.format(
    more_arrays=", %(due_ms)b::bigint[], %(event_topic)b::text[], %(event_partition)b::int[], "
                "%(event_offset)b::bigint[], CAST(%(lapse_subjects)s::text AS {subject_type})",
    more_names=", due_ms, event_topic, event_partition, event_offset, subject",
) + ", " + _SETTLED_ROWS + """, lapse_settled AS MATERIALIZED (
    SELECT b.subject FROM b JOIN written USING (op_key)
), changed(subject) AS (
{effect}
), done AS MATERIALIZED (
    SELECT b.op_key, b.kind, b.tenant, b.subject_id, w.attempt, b.due_ms, b.correlation_id, b.replay_id,
           b.event_topic, b.event_partition, b.event_offset
    FROM b JOIN written w USING (op_key) JOIN changed c ON c.subject = b.subject
), """ + _RECORD_DONE + """
SELECT w.op_key, w.attempt, w.fresh, d.op_key IS NOT NULL FROM written w LEFT JOIN done d USING (op_key)
"""

_TEXTS: dict[tuple[Any, ...], str] = {}


class Written(NamedTuple):
    """A ledger row `settle` wrote: the attempt it settled at, and whether it was inserted (a first
    delivery) or moved (a waiting row)."""

    attempt: int
    fresh: bool


def _text(conn: Connection, template: str, **more: str) -> str:
    """`template` with the table names as the connection sees them (schema-qualified, quoted), and
    `more` (the names of `settle_and_apply`'s effect and subject type)."""
    key = (template, qualified_name(conn, cleanup_ledger), *sorted(more.items()))
    text = _TEXTS.get(key)
    if text is None:
        text = _TEXTS[key] = template.format(ledger=key[1], transitions=qualified_name(conn, ledger_transitions),
                                             outbox=qualified_name(conn, outbox), **more)
    return text


def settle(conn: Connection, events: Sequence[ExpiryEvent], duplicates: Mapping[str, int], now: datetime
           ) -> dict[str, Written]:
    """Write `events`' ledger rows `applied`, one attempt up, finished at `now`: a `pending` row due
    by `now`, unclaimed and unfinished is moved so (whatever the event says); an op key with no row
    gets one inserted so, if its event is due (`settled_row`, carrying its `duplicates`). Rows in any
    other state, or created, claimed or moved by a concurrent transaction, are left out (one it is
    writing makes this wait for it). Returns op key → what was written."""
    states.check(states.PENDING, states.APPLIED)
    states.check(None, states.PENDING)
    if not events:
        return {}
    if conn.dialect.name == "postgresql":
        rows = run_prepared(conn, _text(conn, _SETTLE), {"now": now, **_batch_arrays(events, duplicates)})
        return {key: Written(attempt, fresh) for key, attempt, fresh in rows}
    moved = settle_waiting(conn, [e.op_key for e in events], now)
    written = {key: Written(row.attempt, False) for key, row in moved.items()}
    fresh = [e for e in events if e.op_key not in written and e.due_at <= now]
    inserted = insert_settled(conn, [settled_row(e, states.APPLIED, e.attempt + 1, duplicates.get(e.op_key, 0), now)
                                     for e in fresh]) if fresh else set()
    written.update({e.op_key: Written(e.attempt + 1, True) for e in fresh if e.op_key in inserted})
    return written


def _batch_arrays(events: Sequence[ExpiryEvent], duplicates: Mapping[str, int]) -> dict[str, list[Any]]:
    """The columns of `_BATCH`'s rows, one array each."""
    return {"op_key": [e.op_key for e in events], "kind": [e.kind for e in events],
            "tenant": [e.tenant for e in events], "subject_id": [e.subject_id for e in events],
            "due_at": [e.due_at for e in events], "correlation_id": [e.correlation_id for e in events],
            "source": [e.source for e in events], "attempt": [e.attempt for e in events],
            "replay_id": [e.replay_id for e in events], "duplicates": [duplicates.get(e.op_key, 0) for e in events]}


def settle_and_apply(conn: Connection, writes: LedgerWrites, events: Sequence[ExpiryEvent], subjects: str,
                     duplicates: Mapping[str, int], effect: str, subject_type: str, effect_params: Mapping[str, Any]
                     ) -> tuple[dict[str, Written], set[str]]:
    """`settle` `events` (due in-database work of one kind), run the kind's effect on the subjects
    of the rows written and `record_settled` those it changed, in one statement (PostgreSQL only).
    `subjects`: the events' parsed subjects as an array literal (`batch_values`), in their order;
    `effect`: an UPDATE or DELETE whose ids are `ARRAY(SELECT subject FROM lapse_settled)`,
    returning the id of each row it changed; `subject_type`: the array type of those ids (`BIGINT[]`);
    `effect_params`: its parameters. Returns what was written, and the op keys whose effect
    changed their row; the caller undoes the rest (`record_settled`)."""
    if conn.dialect.name != "postgresql":
        raise ValueError("settle_and_apply is PostgreSQL's; elsewhere settle, apply and record_settled")
    if writes.outcomes_topic is None:
        raise ValueError("these writes were not given an outcomes topic")
    states.check(states.PENDING, states.APPLIED)
    states.check(None, states.PENDING)
    if not events:
        return {}, set()
    now = writes.now
    positions = [writes.positions.get(e.op_key) or (None, None, None) for e in events]
    params: dict[str, Any] = {
        **effect_params, **_batch_arrays(events, duplicates), "now": now, "now_ms": millis(now),
        "actor": writes.actor, "topic": writes.outcomes_topic, "schema": CLEANUP_OUTCOME,
        "due_ms": [millis(e.due_at) for e in events], "event_topic": [p[0] for p in positions],
        "event_partition": [p[1] for p in positions], "event_offset": [p[2] for p in positions],
        "lapse_subjects": subjects}
    rows = run_prepared(conn, _text(conn, _SETTLE_AND_APPLY, effect=effect, subject_type=subject_type), params)
    return ({key: Written(attempt, fresh) for key, attempt, fresh, _ in rows},
            {key for key, _, _, changed in rows if changed})


def record_settled(conn: Connection, writes: LedgerWrites, applied: Sequence[tuple[ExpiryEvent, int]],
                   withdrawn: Sequence[str], restored: Sequence[str]) -> None:
    """For each of `applied` (an event whose row `settle` wrote, and the attempt it settled at) the
    transition `pending → applied` and the outcome a claim finished so records (`writes.settled`);
    the rows of `withdrawn` (inserted by `settle`) deleted and those of `restored` (moved by it) put
    back `pending` as they were but for `updated_at`, which stays the transaction's now: their
    effect changed nothing, and the careful path claims them next in this transaction, which
    writes it again."""
    now = writes.now
    if conn.dialect.name != "postgresql":
        withdraw_settled(conn, withdrawn, now)
        restore_waiting(conn, restored, now)
        for event, attempt in applied:
            writes.settled(event, states.APPLIED, attempt)
        return
    if not (applied or withdrawn or restored):
        return
    if writes.outcomes_topic is None:
        raise ValueError("these writes were not given an outcomes topic")
    states.check(states.PENDING, states.APPLIED)
    positions = [writes.positions.get(e.op_key) or (None, None, None) for e, _ in applied]
    params: dict[str, Any] = {
        "now": now, "now_ms": millis(now), "actor": writes.actor, "topic": writes.outcomes_topic,
        "schema": CLEANUP_OUTCOME, "op_key": [e.op_key for e, _ in applied], "kind": [e.kind for e, _ in applied],
        "tenant": [e.tenant for e, _ in applied], "subject_id": [e.subject_id for e, _ in applied],
        "attempt": [a for _, a in applied], "due_ms": [millis(e.due_at) for e, _ in applied],
        "correlation_id": [e.correlation_id for e, _ in applied], "replay_id": [e.replay_id for e, _ in applied],
        "event_topic": [p[0] for p in positions], "event_partition": [p[1] for p in positions],
        "event_offset": [p[2] for p in positions]}
    if withdrawn or restored:
        params.update(withdrawn=list(withdrawn), restored=list(restored))
        run_prepared(conn, _text(conn, _UNDO + _RECORD.replace("WITH", "", 1)), params)
    else:
        run_prepared(conn, _text(conn, _RECORD), params)
