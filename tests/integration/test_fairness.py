"""Fair shares across tenants and priority across kinds (docs/design/limits.md), asserted as the
order of completion they imply, never as timings: the order in which the ledger recorded the rows
applied (its transitions' ids) after the sweep and a worker ran on Apache Kafka and PostgreSQL.

- A tenant with a backlog due first does not hold back the others: their rows finish among the
  first of the backlog's, not after it; tenant weights share each page in proportion.
- A kind declared `priority: high` finishes before a bulk kind's backlog due at the same time.
- The sweep keeps only a window of each kind's events in flight, so a backlog waits in the business
  table and a tenant whose rows fall due later still goes ahead of the rest of it.
The 100,000-row figure is in `make scale` (tests/system/test_fairness_scale.py) and `lapse bench`.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select, update

from lapse.devtools.demo_data import add_artifacts, add_reservations
from lapse.devtools.demo_kinds import packaged_kinds_file
from lapse.kernel.database import make_engine
from lapse.kernel.kafka_clients import make_producer
from lapse.kernel.kinds import compile_kinds, load_kinds, read_kinds_file
from lapse.kernel.models import cleanup_ledger, ledger_transitions
from lapse.processors import FilesystemObjectStore
from lapse.producers import EmitWindow, sweep_once
from lapse.producers.fair_pages import FairPages
from tests.fixtures.kafka import read_topic
from tests.fixtures.pipeline import PAST, Pipeline, with_demo_kinds
from tests.fixtures.workers import process_until_done

RELEASE, DELETE = "release-reservation", "artifact-delete"
SMALL = ("b", "c", "d", "e")


def sweep(p: Pipeline, **windows: EmitWindow):
    return sweep_once(p.engine, make_producer(p.settings), p.codec, p.settings, load_kinds(p.settings, p.engine),
                      windows=windows or None)


def completion_order(p: Pipeline) -> list[tuple[str, str]]:
    """(kind, tenant) of each operation in the order the ledger recorded it applied."""
    with p.engine.connect() as conn:
        return [(kind, tenant) for kind, tenant in conn.execute(
            select(cleanup_ledger.c.kind, cleanup_ledger.c.tenant)
            .join(ledger_transitions, ledger_transitions.c.op_key == cleanup_ledger.c.op_key)
            .where(ledger_transitions.c.to_state == "applied").order_by(ledger_transitions.c.id))]


@pytest.mark.parametrize("weights", [{}, {"a": 3}])
def test_a_page_takes_its_rows_in_turns_across_tenants_by_weight(db_url, weights):
    """A's 600 rows are due before B's 600: a page of 400 holds 200 of each (3 of A's for 1 of
    B's with weight 3), each tenant's in due order, the tenants taking turns."""
    engine = make_engine(db_url)
    try:
        with engine.begin() as conn:
            a = add_reservations(conn, 600, tenant="a", expires_at=PAST - timedelta(hours=1))
            b = add_reservations(conn, 600, tenant="b", expires_at=PAST)
        kind = compile_kinds(read_kinds_file(packaged_kinds_file()), engine)[RELEASE]
        kind = replace(kind, tenant_weights=weights)
        with engine.connect() as conn:
            page = FairPages(kind, datetime.now(UTC)).next_page(conn, 400)
    finally:
        engine.dispose()
    share = 300 if weights else 200
    assert [int(r.subject_id) for r in page if r.tenant == "a"] == a[:share]
    assert [int(r.subject_id) for r in page if r.tenant == "b"] == b[:400 - share]
    assert [r.tenant for r in page[:8]] == (["a", "a", "a", "b"] * 2 if weights else ["a", "b"] * 4)


@pytest.mark.slow
def test_a_tenant_backlog_due_first_does_not_hold_back_the_other_tenants(pipeline, tmp_path):
    """A holds 3,000 rows due before B-E's 100 each: every B-E row is applied before A's 600th."""
    with pipeline.engine.begin() as conn:
        add_reservations(conn, 3000, tenant="a", expires_at=PAST - timedelta(hours=1))
        for tenant in SMALL:
            add_reservations(conn, 100, tenant=tenant, expires_at=PAST)
    report = sweep(pipeline)
    assert report.emitted == 3400
    process_until_done(pipeline.settings, terminal=3400)
    order = completion_order(pipeline)
    last_small = max(i for i, (_, tenant) in enumerate(order) if tenant in SMALL)
    assert sum(tenant == "a" for _, tenant in order[:last_small]) < 600, last_small
    assert len(order) == 3400


def test_a_high_priority_kind_goes_ahead_of_a_bulk_backlog(pipeline, tmp_path):
    """2,000 reservations (a normal kind, first in the file) and 1,200 artifacts (`priority:
    high`) all due at once: in every partition of the expiry topic each artifact's event comes
    before every reservation's, so a worker reaches the high-priority work first (and starts its
    calls first within a batch: tests/integration/test_call_limits.py)."""
    p = with_demo_kinds(pipeline, tmp_path, **{DELETE: "priority: high"})
    store = FilesystemObjectStore(tmp_path / "kinds" / "objects")
    with p.engine.begin() as conn:
        add_reservations(conn, 2000, tenant="t1", expires_at=PAST - timedelta(hours=1))
        add_artifacts(conn, 1200, retain_until=PAST, store=store, tenant="t1")
    assert sweep(p).by_kind == {DELETE: 1200, RELEASE: 2000}
    kinds_by_partition: dict[int, list[str]] = {}
    for record in read_topic(p.settings.kafka.bootstrap_servers, p.settings.topology.expiry):
        kinds_by_partition.setdefault(record.partition(), []).append(record.key().decode().split(":")[0])
    for partition, kinds in kinds_by_partition.items():
        highs = kinds.count(DELETE)
        assert kinds[:highs] == [DELETE] * highs and DELETE not in kinds[highs:], partition
    assert sum(k.count(DELETE) for k in kinds_by_partition.values()) == 1200


@pytest.mark.slow
def test_a_backlog_waits_in_the_table_and_a_tenant_due_later_goes_ahead_of_it(pipeline):
    """With a window of 500, a pass emits 500 of A's 2,000 due rows and ends (nothing processes
    them); once those are done, B's 100 rows, due since, are all in the next pass's first page."""
    settings = pipeline.settings.with_(producer={"sweep_in_flight": 500})
    p = Pipeline(settings, pipeline.engine, pipeline.codec)
    with p.engine.begin() as conn:
        add_reservations(conn, 2000, tenant="a", expires_at=PAST - timedelta(hours=1))
    windows: dict[str, EmitWindow] = {}
    first = sweep_once(p.engine, make_producer(settings), p.codec, settings, load_kinds(settings, p.engine),
                       windows=windows)
    assert (first.emitted, first.stalled) == (500, True)
    with p.engine.begin() as conn:  # what a processor would have done with them
        conn.execute(update(cleanup_ledger).values(state="applied", finished_at=datetime.now(UTC)))
        b = add_reservations(conn, 100, tenant="b", expires_at=datetime.now(UTC) - timedelta(seconds=1))
    second = sweep_once(p.engine, make_producer(settings), p.codec, settings, load_kinds(settings, p.engine),
                        windows=windows)
    assert second.emitted == 500 and second.pages == 1
    with p.engine.connect() as conn:
        emitted = set(conn.execute(select(cleanup_ledger.c.subject_id).where(cleanup_ledger.c.state == "pending"))
                      .scalars())
    assert {str(i) for i in b} <= emitted and len(emitted) == 500
