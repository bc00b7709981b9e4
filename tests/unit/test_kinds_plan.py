"""The preview and the effect are one: `kinds plan`'s clause is the compiled effect's own (the
statement text says so), and on an SQLite file its counts, hour by hour, are the rows the
effect's own statement then changes when run at each hour's end; the sample shows the values
the effect binds. And `kinds plan`'s options at their boundaries (Hypothesis)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import create_engine, func, select
from sqlalchemy.exc import OperationalError

from lapse.devtools.demo_data import add_reservations
from lapse.devtools.demo_tables import artifacts, create_demo_tables, reservations
from lapse.kernel.database import make_engine
from lapse.kernel.kinds import compile_kinds, read_kinds_file
from lapse.kernel.kinds import plan as plan_module
from lapse.kernel.kinds.plan import PlanOptions, plan_kinds, read_only
from lapse.kernel.kinds.statements import MarkDone, ReadTargets, RowsEffect
from lapse.kernel.settings import env_var
from lapse.shell.app import main
from lapse.shell.commands import kinds_plan

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)
KINDS = """
kinds:
  release:
    table: reservations
    id: id
    tenant: tenant
    due: expires_at
    eligible: {status: held}
    effect: {update: {set: {status: released, released_at: now}}}
  purge:
    table: reservations
    id: id
    tenant: tenant
    due: expires_at
    eligible: {status: held}
    effect: {delete: {}}
  notify:
    table: artifacts
    id: id
    tenant: tenant
    due: retain_until
    eligible: {status: live}
    effect: {http: {url: "https://partner.example/{tenant}/{object_key}?k={op_key}", then_set: {status: deleted}}}
  drop-object:
    table: artifacts
    id: id
    due: retain_until
    eligible: {status: live}
    effect: {object-store: {url: "file:objects", key_column: object_key, then_set: {deleted_at: now}}}
"""


@pytest.fixture
def shop(tmp_path):
    engine = create_engine(f"sqlite:///{tmp_path / 'shop.db'}")
    create_demo_tables(engine)
    path = tmp_path / "kinds.yaml"
    path.write_text(KINDS)
    yield engine, path
    engine.dispose()


def seed(engine) -> None:
    with engine.begin() as conn:
        add_reservations(conn, 4, expires_at=NOW - 3 * HOUR, tenant="a")
        add_reservations(conn, 2, expires_at=NOW, tenant="b")
        for h in range(0, 24, 3):
            add_reservations(conn, h % 4 + 1, expires_at=NOW + h * HOUR + timedelta(minutes=20), tenant="c")
            add_reservations(conn, 1, expires_at=NOW + (h + 1) * HOUR, tenant="d")  # the hour's last instant
        add_reservations(conn, 3, status="paid", expires_at=NOW - HOUR, tenant="a")
        add_reservations(conn, 5, expires_at=NOW + 30 * HOUR, tenant="a")
        conn.execute(artifacts.insert(), [{"tenant": "t", "object_key": f"k/{i}", "status": "live",
                                           "retain_until": NOW - HOUR} for i in range(3)])


def sql(conn, clause) -> str:
    return str(clause.compile(dialect=conn.dialect, compile_kwargs={"literal_binds": True}))


def test_the_preview_clause_is_the_compiled_effects_own(shop):
    engine, path = shop
    kinds = compile_kinds(read_kinds_file(path), engine)
    with engine.connect() as conn:
        for kind in kinds.values():
            due = sql(conn, kind.due_clause(NOW))
            effect = kind.apply_in_db if kind.apply_in_db is not None else kind.external_effect.targets
            assert isinstance(effect, (RowsEffect, ReadTargets))
            assert sql(conn, effect.where(NOW)) == due
            if isinstance(effect, RowsEffect):  # the statement the processor runs holds that clause
                assert due in sql(conn, effect.statement(conn, [1, 2], NOW))
            assert due in sql(conn, kind.eligible_page(NOW, None, 10, without_ledger=False))
        assert isinstance(kinds["notify"].external_effect.complete, MarkDone)


@pytest.mark.parametrize("name", ["release", "purge"])
def test_each_hours_count_is_what_the_effect_changes_when_that_hour_ends(shop, name):
    engine, path = shop
    seed(engine)
    kind = compile_kinds(read_kinds_file(path), engine)[name]
    (plan,) = plan_kinds(engine, [kind], PlanOptions(sample=3), now=NOW)
    with engine.connect() as conn:  # the preview wrote nothing
        assert conn.execute(select(func.count()).where(reservations.c.status == "held")).scalar() == 39
    with engine.begin() as conn:
        ids = list(conn.execute(select(reservations.c.id)).scalars())
        assert len(kind.apply_in_db(conn, ids, NOW)) == plan.due_now.rows == 6
        for hour in plan.hours:
            assert len(kind.apply_in_db(conn, ids, hour.end)) == hour.count.rows, hour
    assert plan.next_total == sum(h % 4 + 2 for h in range(0, 24, 3))
    assert plan.tenants_now.top == [("a", 4), ("b", 2)]
    assert plan.tenants_next.top == [("c", sum(h % 4 + 1 for h in range(0, 24, 3))), ("d", 8)]
    assert plan.eligible.rows == 39 and not plan.eligible.capped
    first = plan.sample[0]
    assert (first.op_key, first.tenant, first.due_at) == (f"{name}:1", "a", NOW - 3 * HOUR)
    if name == "release":
        assert first.would == {"set": {"status": ["held", "released"], "released_at": [None, NOW]}}
    else:
        assert first.would["delete"]["status"] == "held"


def test_external_effects_show_the_call_and_what_it_sets(shop):
    engine, path = shop
    seed(engine)
    kinds = compile_kinds(read_kinds_file(path), engine)
    notify, drop = plan_kinds(engine, [kinds["notify"], kinds["drop-object"]], PlanOptions(sample=1), now=NOW)
    assert notify.sample[0].would == {
        "http": {"method": "POST", "url": "https://partner.example/t/k%2F0?k=notify%3A1"},
        "then_set": {"status": ["live", "deleted"]}}
    assert drop.sample[0].would["object-store"]["delete"] == "k/0"
    assert drop.sample[0].would["then_set"] == {"deleted_at": [None, NOW]}
    assert (notify.effect, drop.effect, notify.due_now.rows, drop.tenants_now.top) == (
        "http", "object-store", 3, [("default", 3)])


def test_a_count_stops_at_the_cap_and_says_so(shop):
    engine, path = shop
    seed(engine)
    kind = compile_kinds(read_kinds_file(path), engine)["release"]
    (plan,) = plan_kinds(engine, [kind], PlanOptions(cap=5, sample=0), now=NOW)
    assert (plan.due_now.rows, plan.due_now.capped, plan.eligible.rows, plan.eligible.capped) == (5, True, 5, True)
    assert plan.tenants_now.capped and plan.sample == []
    data = plan.to_dict()
    assert json.loads(json.dumps(data))["due_now"] == {"rows": 5, "capped": True}


def test_the_commands_bounds_are_the_planners():
    assert (kinds_plan.MAX_CAP, kinds_plan.MAX_SAMPLE, kinds_plan.DEFAULT_CAP, kinds_plan.DEFAULT_SAMPLE,
            kinds_plan.DEFAULT_TIMEOUT_S) == (plan_module.MAX_CAP, plan_module.MAX_SAMPLE, plan_module.DEFAULT_CAP,
                                              plan_module.DEFAULT_SAMPLE, plan_module.DEFAULT_TIMEOUT_S)


def run(path: Path, engine, *args: str):
    env = {env_var("database.url"): str(engine.url), env_var("kinds.file"): str(path)}
    return CliRunner().invoke(main, ["kinds", "plan", *args], env=env)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.one_of(st.sampled_from(["release", "purge", "notify"]), st.text(max_size=80)))
def test_any_kind_name_is_planned_or_refused_in_one_line(shop, name):
    engine, path = shop
    result = run(path, engine, "--", name, "--limit", "1", "--json") if name.startswith("-") else \
        run(path, engine, name, "--limit", "1", "--json")
    if name in ("release", "purge", "notify"):
        assert result.exit_code == 0, result.output
        assert [k["kind"] for k in json.loads(result.output)["kinds"]] == [name]
    else:
        assert result.exit_code == 2, result.output
        assert len(result.output.strip().splitlines()) <= 1 and "Traceback" not in result.output


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(limit=st.integers(-5, 1_010), cap=st.integers(-2, 100_000_002))
def test_limit_and_cap_are_taken_within_their_bounds_and_refused_outside(shop, limit, cap):
    engine, path = shop
    result = run(path, engine, "release", "--limit", str(limit), "--cap", str(cap), "--json")
    if 0 <= limit <= plan_module.MAX_SAMPLE and 1 <= cap <= plan_module.MAX_CAP:
        assert result.exit_code == 0, result.output
        assert len(json.loads(result.output)["kinds"][0]["sample"]) <= limit
    else:
        assert result.exit_code == 2 and "Invalid value for" in result.output


def test_on_sqlite_the_preview_transaction_refuses_writes_and_the_connection_writes_after(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path / 'shop.db'}")
    create_demo_tables(engine)
    with read_only(engine, 5.0) as conn, pytest.raises(OperationalError, match="readonly"):
        conn.execute(reservations.insert().values(tenant="a", status="held", expires_at=NOW))
    with engine.begin() as conn:  # the pooled connection is writable again
        add_reservations(conn, 1, expires_at=NOW)
    engine.dispose()


def test_the_text_output_names_the_counts_the_hours_the_tenants_and_the_sample(shop):
    engine, path = shop
    seed(engine)
    result = run(path, engine, "release", "--at", NOW.isoformat(), "--limit", "1", "--cap", "5")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == f"release: update on reservations (index ix_reservations_held_due) at {NOW.isoformat()}"
    assert lines[1] == "  eligible 5+   due now 5+   due in the next 24 h 28+"
    assert lines[2].startswith("  per hour  +0h 2  +1h 0  +2h 0  +3h 5+")
    assert lines[5] == "  tenants now: a 4, b 1"
    assert lines[7] == (f"  release:1  tenant a  due {(NOW - 3 * HOUR).isoformat()}: set status 'held' -> "
                        f"'released', released_at None -> '{NOW.isoformat()}'")
