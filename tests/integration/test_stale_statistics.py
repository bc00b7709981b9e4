"""A batch's statements on the business table find their rows by the batch's ids whatever the
table's statistics say. Analyzed while none of its rows were held, the table's statistics count no
held row; a plain `status = 'held' AND expires_at <= now` then made the planner read the batch
along the sweep's partial index of held rows, through every due row (`statements.on_each_row`).
The sweep's window finds its keys by key (`ledger.queries.in_flight`)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import event as sa_event
from sqlalchemy import text, update

from lapse.devtools.demo_data import add_reservations
from lapse.devtools.demo_kinds import load_demo_kinds
from lapse.devtools.demo_tables import reservations
from lapse.kernel.batch_sql import any_of
from lapse.kernel.database import qualified_name
from lapse.kernel.kinds.statements import due_rows
from lapse.kernel.ledger import expiry_event
from lapse.kernel.ledger.queries import in_flight
from lapse.kernel.models import cleanup_ledger
from lapse.processors import BatchScope, apply_batch

RELEASE = "release-reservation"


def _indexes(plan: Any) -> set[str]:
    if isinstance(plan, list):
        return {name for item in plan for name in _indexes(item)}
    if not isinstance(plan, dict):
        return set()
    own = {plan["Index Name"]} if "Index Name" in plan else set()
    return own | {name for child in plan.get("Plans", []) + ([plan["Plan"]] if "Plan" in plan else [])
                  for name in _indexes(child)}


def _explained(conn, statement: str, parameters: Any) -> set[str]:
    with conn.connection.driver_connection.cursor() as cur:  # planned with its own values, as sent
        cur.execute("EXPLAIN (FORMAT JSON) " + statement, parameters)
        return _indexes(cur.fetchone()[0])


def test_the_effect_finds_its_rows_by_id_while_statistics_count_no_held_row(pipeline):
    now = datetime.now(UTC)
    with pipeline.engine.begin() as conn:
        add_reservations(conn, 20_000, status="paid", expires_at=now - timedelta(days=1))
    with pipeline.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("ANALYZE reservations")
    with pipeline.engine.begin() as conn:  # held rows the statistics do not know of yet
        ids = add_reservations(conn, 5_000, expires_at=now - timedelta(minutes=5))
    kind = load_demo_kinds(pipeline.engine)[RELEASE]
    batch = ids[-500:]
    sent: list[tuple[str, Any]] = []
    with pipeline.engine.connect() as conn:
        sa_event.listen(conn, "before_cursor_execute", lambda *a: sent.append((a[2], a[3])))
        with conn.begin() as trans:
            assert kind.apply_in_db is not None
            assert len(kind.apply_in_db(conn, batch, now)) == 500
            (statement, parameters), = sent
            used = _explained(conn, statement, parameters)
            # The same condition as a plain WHERE: along the partial index of held rows (the hazard is real).
            plain = update(reservations).where(any_of(conn, reservations.c.id, batch), due_rows(
                reservations.c.status == "held", reservations.c.expires_at, now)).values(status="released")
            compiled = plain.compile(conn)
            trans.rollback()
        with conn.begin():
            unguarded = _explained(conn, str(compiled), compiled.params)
    assert used == {"reservations_pkey"}, json.dumps(sorted(used))
    assert "ix_reservations_held_due" in unguarded, sorted(unguarded)


def test_the_one_statement_finds_its_rows_by_id_while_statistics_count_no_held_row(pipeline):
    """The fast path's one statement on PostgreSQL (ledger rows, the effect, records) reads the
    business table by its primary key alone in the same state: the effect's ids come from the
    rows it wrote, and its condition is checked on each."""
    now = datetime.now(UTC)
    with pipeline.engine.begin() as conn:
        add_reservations(conn, 20_000, status="paid", expires_at=now - timedelta(days=1))
    with pipeline.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("ANALYZE reservations")
    with pipeline.engine.begin() as conn:
        ids = add_reservations(conn, 5_000, expires_at=now - timedelta(minutes=5), tenant="t1")
    kinds = load_demo_kinds(pipeline.engine)
    events = [expiry_event(RELEASE, rid, "t1", now - timedelta(minutes=5), source="sweep") for rid in ids[-500:]]
    sent: list[tuple[str, Any]] = []
    with pipeline.engine.connect() as conn:
        sa_event.listen(conn, "before_cursor_execute", lambda *a: sent.append((a[2], a[3])))
        with conn.begin() as trans:
            scope = BatchScope(conn, kinds=kinds, topics=pipeline.settings.topology, worker="w", now=now,
                               lease=timedelta(seconds=30))
            assert len(apply_batch(scope, events).applied) == 500
            (statement, parameters), = [(s, p) for s, p in sent if "UPDATE reservations" in s]
            assert "INSERT INTO" in statement  # the one statement, not the effect alone
            used = _explained(conn, statement, parameters)
            trans.rollback()
    # The business table's indexes only (the ledger's are the ledger's statements' own matter).
    assert {name for name in used if not name.startswith(("lapse_", "ix_lapse"))} == {"reservations_pkey"}, \
        json.dumps(sorted(used))


def test_the_sweeps_window_finds_its_keys_by_key_while_the_ledger_statistics_count_none(pipeline):
    """The sweep's window asks which of its emitted keys are still unfinished (`in_flight`): on a
    ledger whose statistics count none of its 20,000 pending rows (autovacuum not yet round), never
    along the partial index of unfinished rows, through every one of them (up to 1 s a call behind
    the fairness stage's 100,000-row backlog)."""
    with pipeline.engine.begin() as conn:
        ledger = qualified_name(conn, cleanup_ledger)
        conn.exec_driver_sql(f"ALTER TABLE {ledger} SET (autovacuum_enabled = false)")
        conn.execute(text(
            f"INSERT INTO {ledger} (op_key, kind, tenant, subject_id, state, attempt, due_at, correlation_id, source,"
            " duplicates, created_at, updated_at) SELECT 'release-reservation:' || g, 'release-reservation', 't1',"
            " g::text, 'pending', 0, now(), md5(g::text), 'sweep', 0, now(), now() FROM generate_series(1, 20000) g"))
    keys = [f"release-reservation:{i}" for i in range(1, 2001)]
    sent: list[tuple[str, Any]] = []
    with pipeline.engine.connect() as conn:
        sa_event.listen(conn, "before_cursor_execute", lambda *a: sent.append((a[2], a[3])))
        assert in_flight(conn, keys) == set(keys)
        (statement, parameters), = sent
        # By key (or, at this size, one pass over the table): never along the unfinished rows' index.
        assert "ix_lapse_ledger_unfinished_due" not in _explained(conn, statement, parameters)
