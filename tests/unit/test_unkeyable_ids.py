"""`CleanupKind.events_of`: whatever text id a team's table holds, its due row becomes an event
named by its op key or is set aside with why; it never raises (the sweep and the reconciler go on
with the rows after it)."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import Column, DateTime, MetaData, String, Table

from lapse.kernel.kinds import CleanupKind, EligibleRow
from lapse.kernel.ledger.keys import OP_KEY_RE

_table = Table("exports", MetaData(), Column("id", String, primary_key=True), Column("due", DateTime))
KIND = CleanupKind(name="purge-export", table=_table, id_column=_table.c.id, tenant_column=_table.c.id,
                   due_column=_table.c.due, still_eligible=_table.c.id.is_not(None), parse_subject=str,
)
DUE = datetime(2026, 12, 6, tzinfo=UTC)


@given(st.lists(st.text(max_size=140), max_size=20))
def test_each_row_becomes_its_event_or_is_set_aside_with_why(ids):
    rows = [EligibleRow(i, "t", DUE, (DUE, i)) for i in ids]
    events, aside = KIND.events_of(rows, source="sweep")
    assert len(events) + len(aside) == len(rows)
    assert [e.subject_id for e in events] == [i for i in ids if OP_KEY_RE.match(f"purge-export:{i}")]
    assert all(e.op_key == f"purge-export:{e.subject_id}" for e in events)
    assert all(why.startswith("malformed op key") for _, why in aside)
