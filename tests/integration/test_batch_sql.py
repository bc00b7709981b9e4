"""Batch SQL on PostgreSQL with what pasted text would get wrong: column names that need quoting
(a keyword, a quote, a space, a semicolon, capitals) in the JSON recordset inserts, and values a
cast to the column's own length or precision would shorten or round into another row's value."""

from __future__ import annotations

from decimal import Decimal

from sqlalchemy import Column, Integer, MetaData, Numeric, String, Table, Text, select

from lapse.kernel.batch_sql import any_of, bulk_insert, bulk_insert_together
from lapse.kernel.database import make_engine

HOSTILE = ["select", 'say "hi"', "two words", "semi;colon); DROP TABLE x; --", "MixedCase", "ünïcode"]


def test_recordset_inserts_quote_every_column_name(pg_url):
    metadata = MetaData()
    first = Table("batch_names", metadata, Column("id", Integer, primary_key=True),
                  *(Column(name, Text) for name in HOSTILE))
    second = Table("batch names two", metadata, Column("id", Integer, primary_key=True), Column('say "hi"', Text))
    engine = make_engine(pg_url)
    try:
        metadata.create_all(engine)
        rows = [{"id": i, **{name: f"{name}={i}" for name in HOSTILE}} for i in range(3)]
        with engine.begin() as conn:
            created = bulk_insert(conn, first, rows[:2], ignore_conflicts=True, returning=["id", 'say "hi"'])
            again = bulk_insert(conn, first, rows[:2], ignore_conflicts=True, returning=["id"])
            bulk_insert_together(conn, [(first, rows[2:]), (second, [{"id": 7, 'say "hi"': "together"}])])
        assert [tuple(row) for row in created] == [(0, 'say "hi"=0'), (1, 'say "hi"=1')] and again == []
        with engine.connect() as conn:
            assert [dict(row) for row in conn.execute(select(first).order_by(first.c.id)).mappings()] == rows
            assert [tuple(row) for row in conn.execute(select(second))] == [(7, "together")]
    finally:
        engine.dispose()


def test_a_batch_value_is_never_cast_into_another_rows_value(pg_url):
    metadata = MetaData()
    codes = Table("batch_codes", metadata, Column("select", String(4), primary_key=True),
                  Column("amount", Numeric(5, 2), nullable=False))
    engine = make_engine(pg_url)
    try:
        metadata.create_all(engine)
        with engine.begin() as conn:
            conn.execute(codes.insert(), [{"select": "abcd", "amount": Decimal("1.01")},
                                          {"select": "wxyz", "amount": Decimal("2.00")}])
        with engine.connect() as conn:
            def matched(column, values):
                return sorted(conn.execute(select(codes.c.select).where(any_of(conn, column, values))).scalars())

            assert matched(codes.c.select, ["abcdX", "wxyz"]) == ["wxyz"]  # not 'abcd', its first four letters
            assert matched(codes.c.amount, [Decimal("1.005"), Decimal("2")]) == ["wxyz"]  # not 1.01, its rounding
            assert matched(codes.c.select, ["abcd", 'a"b', "c\\d", "{e,f}"]) == ["abcd"]
    finally:
        engine.dispose()
