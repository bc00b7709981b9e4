"""The baselines' cleanup, hand-written: the lean statements a competent engineer would write for
release-reservation over the demo's reservations table and Lapse's ledger and outbox tables, with
none of Lapse's batch machinery (no `apply_batch`).

Per event, in the caller's transaction:
1. insert the ledger row (`pending`) ON CONFLICT DO NOTHING RETURNING its key (no row back: the
   work was done before, a duplicate, nothing more to do);
2. the conditional business update (`held` and due, the event's tenant) — what the demo's declared
   kind does (lapse/devtools/demo_kinds.yaml): status `released`, released_at now;
3. finish the ledger row: `applied` when the update changed the reservation, else `skipped`;
4. one outbox row holding the outcome record (`outcome_record`, as Lapse's outbox holds it; the
   relay encodes it with the Codec when it publishes).

`apply_one` runs these as four statements for one event; `apply_many` runs each as one
`executemany` over a whole batch (psycopg 3 pipelines them). Both take a psycopg connection and
leave the commit to the caller. Identity, due time, attempt and correlation id are the event's,
as Lapse writes them; the finished row counts one attempt, as Lapse's does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.types.json import Json
from sqlalchemy import Engine

from lapse.devtools.demo_kinds import RELEASE
from lapse.devtools.demo_tables import reservations
from lapse.kernel.database import qualified_name
from lapse.kernel.ledger import APPLIED, PENDING, SKIPPED, ExpiryEvent, outcome_record
from lapse.kernel.models import cleanup_ledger, outbox
from lapse.kernel.schema_names import CLEANUP_OUTCOME


@dataclass(frozen=True)
class LeanSql:
    """The four statements, with the table names the stage's engine maps Lapse's schema to."""

    insert_ledger: str
    release: str
    finish: str
    insert_outbox: str

    @classmethod
    def for_engine(cls, engine: Engine) -> LeanSql:
        ledger, box = qualified_name(engine, cleanup_ledger), qualified_name(engine, outbox)
        business = qualified_name(engine, reservations)
        return cls(
            insert_ledger=(
                f"INSERT INTO {ledger} (op_key, kind, tenant, subject_id, state, attempt, due_at,"
                " correlation_id, source, replay_id, duplicates, created_at, updated_at)"
                " VALUES (%(op_key)s, %(kind)s, %(tenant)s, %(subject_id)s, %(state)s, %(attempt)s,"
                " %(due_at)s, %(correlation_id)s, %(source)s, %(replay_id)s, 0, %(now)s, %(now)s)"
                " ON CONFLICT DO NOTHING RETURNING op_key"),
            release=(
                f"UPDATE {business} SET status = 'released', released_at = %(now)s"
                " WHERE id = %(id)s AND tenant = %(tenant)s AND status = 'held' AND expires_at <= %(now)s"
                " RETURNING id"),
            finish=(
                f"UPDATE {ledger} SET state = %(state)s, attempt = attempt + 1, finished_at = %(now)s,"
                " updated_at = %(now)s WHERE op_key = %(op_key)s AND state = 'pending'"),
            insert_outbox=(
                f"INSERT INTO {box} (topic, key, schema, payload, headers, created_at)"
                f" VALUES (%(topic)s, %(key)s, '{CLEANUP_OUTCOME}', %(payload)s, '{{}}', %(now)s)"),
        )


def driver_connection(engine: Engine) -> tuple[Any, psycopg.Connection[Any]]:
    """A pooled connection of `engine` and its psycopg connection (close the first when done)."""
    raw = engine.raw_connection()
    driver = raw.driver_connection
    if not isinstance(driver, psycopg.Connection):
        raw.close()
        raise RuntimeError("the baselines need PostgreSQL through psycopg")
    return raw, driver


def _ledger_params(event: ExpiryEvent, now: datetime) -> dict[str, Any]:
    if event.kind != RELEASE:
        raise ValueError(f"the baselines clean up {RELEASE} only, not {event.kind!r}")
    return {**event.identity(), "state": PENDING, "attempt": event.attempt, "due_at": event.due_at,
            "correlation_id": event.correlation_id, "source": event.source,
            "replay_id": event.replay_id, "now": now}


def _finished(event: ExpiryEvent, state: str, worker: str, topic: str, now: datetime
              ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The finishing update's and the outbox insert's parameters for `event` ending in `state`."""
    record = outcome_record(event, state, event.attempt + 1, worker, now)
    return ({"op_key": event.op_key, "state": state, "now": now},
            {"topic": topic, "key": event.op_key, "payload": Json(record), "now": now})


def apply_one(conn: psycopg.Connection[Any], sql: LeanSql, event: ExpiryEvent, *, worker: str,
              outcomes_topic: str, now: datetime) -> str | None:
    """The cleanup of one event as four statements; its final state, None for a duplicate."""
    with conn.cursor() as cur:
        cur.execute(sql.insert_ledger, _ledger_params(event, now))
        if cur.fetchone() is None:
            return None
        cur.execute(sql.release, {"id": int(event.subject_id), "tenant": event.tenant, "now": now})
        state = APPLIED if cur.rowcount == 1 else SKIPPED
        finish, box = _finished(event, state, worker, outcomes_topic, now)
        cur.execute(sql.finish, finish)
        cur.execute(sql.insert_outbox, box)
    return state


def apply_many(conn: psycopg.Connection[Any], sql: LeanSql, events: Sequence[ExpiryEvent], *,
               worker: str, outcomes_topic: str, now: datetime) -> dict[str, str]:
    """The cleanup of a batch, each statement one executemany; op key → final state (duplicates,
    in the batch or done before, left out)."""
    unique = list({e.op_key: e for e in events}.values())
    with conn.cursor() as cur:
        cur.executemany(sql.insert_ledger, [_ledger_params(e, now) for e in unique], returning=True)
        fresh = set(_returned(cur))
        todo = [e for e in unique if e.op_key in fresh]
        if not todo:
            return {}
        cur.executemany(sql.release, [{"id": int(e.subject_id), "tenant": e.tenant, "now": now} for e in todo],
                        returning=True)
        released = {str(i) for i in _returned(cur)}
        states = {e.op_key: APPLIED if e.subject_id in released else SKIPPED for e in todo}
        done = [_finished(e, states[e.op_key], worker, outcomes_topic, now) for e in todo]
        cur.executemany(sql.finish, [finish for finish, _ in done])
        cur.executemany(sql.insert_outbox, [box for _, box in done])
    return states


def _returned(cur: psycopg.Cursor[Any]) -> list[Any]:
    """The first column of every row each statement of an executemany(returning=True) returned."""
    out: list[Any] = []
    while True:
        out += [row[0] for row in cur.fetchall()]
        if not cur.nextset():
            return out
