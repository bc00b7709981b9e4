"""The end state every cleanup stage must reach before its figure counts, checked in its database
after it ran (Lapse's stages and the baselines alike):

- business: exactly the events' reservations are `released` (none left held, none other touched);
- ledger: one row per event, `applied` and finished, with the event's op key, kind, subject and
  tenant, and no other row;
- outbox: exactly one outcome row per event's op key, on the outcomes topic, saying `applied`
  with the event's identity and correlation id, and encodable with the Codec as the relay would
  publish it (its `outcome_id` added).

`verify_end_state` returns {"verified": bool, "reason": str | None} (the first problem found).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import Connection, select

from lapse.devtools.demo_tables import reservations
from lapse.kernel.codec import Codec
from lapse.kernel.database import engine_from_settings
from lapse.kernel.ledger import APPLIED, ExpiryEvent
from lapse.kernel.models import cleanup_ledger as L
from lapse.kernel.models import outbox as O
from lapse.kernel.schema_names import CLEANUP_OUTCOME
from lapse.kernel.settings import Settings

SHOWN = 3  # keys a reason quotes


def verify_end_state(settings: Settings, events: Sequence[ExpiryEvent]) -> dict[str, Any]:
    """Check the stage's database (from `settings`) against `events`; see the module doc."""
    engine = engine_from_settings(settings)
    try:
        with engine.connect() as conn:
            problem = (business_problem(conn, events) or ledger_problem(conn, events)
                       or outbox_problem(conn, events, settings.topology.outcomes, Codec.from_settings(settings)))
    finally:
        engine.dispose()
    return {"verified": problem is None, "reason": problem}


def business_problem(conn: Connection, events: Sequence[ExpiryEvent]) -> str | None:
    expected = {e.subject_id for e in events}
    released = {str(i) for i in conn.execute(
        select(reservations.c.id).where(reservations.c.status == "released")).scalars()}
    missing, extra = expected - released, released - expected
    if missing:
        return f"{len(missing)} of {len(expected)} reservations not released (e.g. {_some(missing)})"
    if extra:
        return f"{len(extra)} reservations released without an event (e.g. {_some(extra)})"
    return None


def ledger_problem(conn: Connection, events: Sequence[ExpiryEvent]) -> str | None:
    rows = {r.op_key: r for r in conn.execute(
        select(L.c.op_key, L.c.kind, L.c.subject_id, L.c.tenant, L.c.state, L.c.finished_at))}
    expected = {e.op_key: e for e in events}
    missing = expected.keys() - rows.keys()
    if missing:
        return f"{len(missing)} of {len(expected)} events have no ledger row (e.g. {_some(missing)})"
    extra = rows.keys() - expected.keys()
    if extra:
        return f"{len(extra)} ledger rows for no event (e.g. {_some(extra)})"
    not_applied = Counter(r.state for r in rows.values() if r.state != APPLIED or r.finished_at is None)
    if not_applied:
        return f"{sum(not_applied.values())} ledger rows not applied and finished ({dict(not_applied)})"
    wrong = [k for k, e in expected.items()
             if (rows[k].kind, rows[k].subject_id, rows[k].tenant) != (e.kind, e.subject_id, e.tenant)]
    if wrong:
        return f"{len(wrong)} ledger rows whose kind, subject or tenant is not the event's (e.g. {_some(wrong)})"
    return None


def outbox_problem(conn: Connection, events: Sequence[ExpiryEvent], topic: str, codec: Codec) -> str | None:
    rows = conn.execute(select(O.c.id, O.c.topic, O.c.key, O.c.payload).where(O.c.schema == CLEANUP_OUTCOME)).all()
    per_key = Counter(r.key for r in rows)
    expected = {e.op_key: e for e in events}
    missing = expected.keys() - per_key.keys()
    if missing:
        return f"{len(missing)} of {len(expected)} events have no outcome in the outbox (e.g. {_some(missing)})"
    unexpected = [k for k, n in per_key.items() if k not in expected or n != 1]
    if unexpected:
        return f"{len(unexpected)} op keys with other than one outcome row each (e.g. {_some(unexpected)})"
    for row in rows:
        event, payload = expected[row.key], dict(row.payload)
        if row.topic != topic:
            return f"the outcome of {row.key} is for topic {row.topic!r}, not {topic!r}"
        if payload.get("status") != APPLIED or any(payload.get(k) != v for k, v in event.identity().items()) \
                or payload.get("correlation_id") != event.correlation_id:
            return f"the outcome of {row.key} does not say the event was applied: {payload}"
        try:
            codec.encode(CLEANUP_OUTCOME, {**payload, "outcome_id": row.id})
        except Exception as exc:  # EncodeError, or a registry that refuses the schema
            return f"the outcome of {row.key} would not publish: {exc}"
    return None


def _some(keys: Iterable[str]) -> str:
    return ", ".join(sorted(keys)[:SHOWN])
