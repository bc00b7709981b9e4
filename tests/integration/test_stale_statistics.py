"""Plans that hold whatever the tables' statistics say. A batch's statements on the business table
find their rows by the batch's ids: analyzed while none of its rows were held, the table's
statistics count no held row, and a plain `status = 'held' AND expires_at <= now` made the planner
read the batch along the sweep's partial index of held rows, through every due row
(`statements.on_each_row`). The sweep's reads probe the ledger once per business row, also while
the ledger's statistics count none of its rows (`ledger.has_row_not_waiting_past`)."""

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
from lapse.kernel.models import cleanup_ledger

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


def _ledger_probes(plan: Any) -> list[tuple[str, str]]:
    """(node type, index condition) of every read of the ledger in `plan`."""
    if isinstance(plan, list):
        return [p for item in plan for p in _ledger_probes(item)]
    if not isinstance(plan, dict):
        return []
    own = [(plan["Node Type"], plan.get("Index Cond", ""))] if (
        plan.get("Relation Name") == "lapse_ledger" and "Index Cond" not in plan and plan["Node Type"] == "Seq Scan"
    ) or plan.get("Index Name", "").startswith(("ix_lapse_ledger", "lapse_ledger_pkey")) else []
    return own + [p for child in plan.get("Plans", []) + ([plan["Plan"]] if "Plan" in plan else [])
                  for p in _ledger_probes(child)]


def test_the_sweeps_reads_probe_the_ledger_per_row_while_its_statistics_count_none(pipeline):
    """A ledger never analyzed (a fresh one, autovacuum not yet round) holding the rows of the
    sweep's first pages: each read of the sweep probes it once per business row along its
    (kind, subject) index, never a scan of the kind's every row for each of them (a NOT EXISTS
    planned as a nested-loop anti-join: 1.4 s a discovery and 1.1 s a page at 10,000 rows)."""
    now = datetime.now(UTC)
    with pipeline.engine.begin() as conn:
        ledger = qualified_name(conn, cleanup_ledger)
        conn.exec_driver_sql(f"ALTER TABLE {ledger} SET (autovacuum_enabled = false)")
        ids = add_reservations(conn, 4_000, expires_at=now - timedelta(minutes=5))
        conn.execute(text(
            f"INSERT INTO {ledger} (op_key, kind, tenant, subject_id, state, attempt, due_at, correlation_id, source,"
            " duplicates, created_at, updated_at) SELECT 'release-reservation:' || g, 'release-reservation',"
            " 'tenant-' || (g % 7), g::text, 'pending', 0, now(), md5(g::text), 'sweep', 0, now(), now()"
            " FROM unnest(CAST(:ids AS bigint[])) g"), {"ids": ids[:2_000]})
    kind = load_demo_kinds(pipeline.engine)[RELEASE]
    with pipeline.engine.connect() as conn:
        assert conn.execute(text(f"SELECT reltuples FROM pg_class WHERE oid = '{ledger}'::regclass")).scalar() < 0
        for stmt in (kind.due_tenants(now, 10_000, 501, walk=True), kind.tenant_page(now, ["tenant-1"], None, 500),
                     kind.tenant_page(now, ["tenant-1", "tenant-2"], None, 500)):
            compiled = stmt.compile(conn, compile_kwargs={"render_postcompile": True})
            with conn.connection.driver_connection.cursor() as cur:
                cur.execute("EXPLAIN (FORMAT JSON) " + str(compiled), compiled.params)
                probes = _ledger_probes(cur.fetchone()[0])
            assert probes and all("subject_id" in cond for _, cond in probes), probes
