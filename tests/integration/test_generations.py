"""Recurring operations on Apache Kafka and PostgreSQL: a hold that lapses three times is released
three times, each once, every redelivery absorbed; a late delivery of an earlier lapse leaves the
next one alone (fast and careful path, and the shadow run and preview read it alike); the reconciler
tells a new generation from an anomaly; PostgreSQL writes a generation as Python does; and a column
that cannot be a generation is refused in one line with the documented exit codes."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from alembic import command
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select, text
from sqlalchemy.exc import IntegrityError

from lapse.kernel.codec import Codec
from lapse.kernel.database import alembic_config, make_engine, upgrade_url
from lapse.kernel.kafka_clients import make_producer
from lapse.kernel.kinds import compile_kinds, load_kinds, read_kinds_file
from lapse.kernel.kinds.generations import timestamp_text
from lapse.kernel.kinds.plan import PlanOptions, jsonable, plan_kinds
from lapse.kernel.ledger import expiry_event
from lapse.kernel.models import cleanup_ledger, ledger_transitions, shadow_effects
from lapse.kernel.settings import env_var, load_settings
from lapse.processors.rules import apply_batch
from lapse.processors.scope import BatchScope
from lapse.producers import schedule_cleanup, sweep_once
from lapse.producers.relay import relay_until_empty
from lapse.reconciler import reconcile_once
from lapse.reconciler.release import release_parked_work
from lapse.shell.app import main
from lapse.shell.console import views
from tests.fixtures.db import migrations_head, schema_diff
from tests.fixtures.pipeline import Pipeline, connection_env, make_pipeline_settings, produce
from tests.fixtures.topology import repo_topology
from tests.fixtures.workers import process_until_done

KIND = "release-hold"
NOW = datetime.now(UTC).replace(microsecond=0)
DUE = NOW - timedelta(minutes=10)
RENT = [
    "CREATE SCHEMA rent",
    """CREATE TABLE rent.holds (id bigserial PRIMARY KEY, tenant text NOT NULL, status text NOT NULL,
       hold_started_at timestamptz NOT NULL, expires_at timestamptz NOT NULL, released_at timestamptz,
       version integer NOT NULL DEFAULT 1, naive_started timestamp NOT NULL DEFAULT now(),
       paused_at timestamptz, note text NOT NULL DEFAULT '')""",
    "CREATE INDEX holds_due ON rent.holds (expires_at, id) WHERE status = 'held'",
    # Every release the business table sees, with the lapse it ended: the oracle of "each once".
    "CREATE TABLE rent.releases (hold_id bigint NOT NULL, hold_started_at timestamptz NOT NULL)",
    """CREATE FUNCTION rent.count_release() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
       INSERT INTO rent.releases VALUES (NEW.id, NEW.hold_started_at); RETURN NEW; END $$""",
    """CREATE TRIGGER holds_released AFTER UPDATE ON rent.holds FOR EACH ROW
       WHEN (OLD.status = 'held' AND NEW.status = 'released') EXECUTE FUNCTION rent.count_release()""",
]
KINDS = """
kinds:
  release-hold:
    table: rent.holds
    id: id
    tenant: tenant
    due: expires_at
    generation: {generation}
    mode: {mode}
    eligible: {{status: held}}
    effect:
      update:
        set: {{status: released, released_at: now}}
"""


@pytest.fixture
def rent(engine):
    with engine.begin() as conn:
        for statement in RENT:
            conn.exec_driver_sql(statement)
    return engine


def kinds_file(folder: Path, generation: str = "hold_started_at", mode: str = "live") -> Path:
    path = folder / f"kinds-{mode}.yaml"
    path.write_text(KINDS.format(generation=generation, mode=mode))
    return path


def hold(conn, started: datetime, expires: datetime = DUE, tenant: str = "t1") -> int:
    return conn.execute(text("INSERT INTO rent.holds (tenant, status, hold_started_at, expires_at) "
                             "VALUES (:t, 'held', :s, :e) RETURNING id"), {"t": tenant, "s": started, "e": expires}
                        ).scalar_one()


def hold_again(conn, hold_id: int, started: datetime, expires: datetime = DUE) -> None:
    conn.execute(text("UPDATE rent.holds SET status = 'held', hold_started_at = :s, expires_at = :e, "
                      "released_at = NULL WHERE id = :id"), {"s": started, "e": expires, "id": hold_id})


def releases(engine) -> Counter:
    with engine.connect() as conn:
        return Counter(conn.execute(text("SELECT hold_id, hold_started_at FROM rent.releases")).all())


def key(hold_id: int, started: datetime) -> str:
    return f"{KIND}:{hold_id}@{timestamp_text(started)}"


@pytest.mark.slow
def test_a_hold_that_lapses_three_times_is_released_three_times_each_once(kafka_bootstrap, pg_url, unique, rent,
                                                                          tmp_path):
    settings = make_pipeline_settings(kafka_bootstrap, pg_url, unique, kinds={"file": kinds_file(tmp_path)})
    kinds = load_kinds(settings, rent)
    codec = Codec.from_settings(settings)

    def sweep():
        return sweep_once(rent, make_producer(settings), codec, settings, kinds).emitted

    first, second, third = NOW - timedelta(days=2), NOW - timedelta(days=1), NOW - timedelta(hours=1)
    with rent.begin() as conn:
        hold_id = hold(conn, first)
    assert sweep() == 1
    process_until_done(settings)
    with rent.begin() as conn:  # held again: a new lapse, which the sweep finds although one is applied
        hold_again(conn, hold_id, second)
    assert (sweep(), sweep()) == (1, 0)
    process_until_done(settings)
    with rent.begin() as conn:  # held a third time, scheduled by the application in its transaction
        hold_again(conn, hold_id, third)
        assert schedule_cleanup(conn, KIND, hold_id, "t1", DUE, generation=third, settings=settings)
        assert not schedule_cleanup(conn, KIND, hold_id, "t1", DUE, generation=third, settings=settings)
    relay_until_empty(rent, make_producer(settings), codec, 100)
    assert sweep() == 0
    process_until_done(settings)

    # Every lapse's event delivered again, twice: each absorbed by its own ledger row.
    redelivered = [expiry_event(KIND, hold_id, "t1", DUE, source="sweep", generation=timestamp_text(g))
                   for g in (first, second, third)]
    produce(Pipeline(settings, rent, codec), redelivered * 2)
    process_until_done(settings)

    assert releases(rent) == {(hold_id, first): 1, (hold_id, second): 1, (hold_id, third): 1}
    keys = [key(hold_id, g) for g in (first, second, third)]
    with rent.connect() as conn:
        rows = {r.op_key: r for r in conn.execute(select(cleanup_ledger))}
        applied = Counter(conn.execute(select(ledger_transitions.c.op_key)
                                       .where(ledger_transitions.c.to_state == "applied")).scalars())
    assert sorted(rows) == sorted(keys) and {r.state for r in rows.values()} == {"applied"}
    assert applied == dict.fromkeys(keys, 1)
    assert all(rows[k].duplicates >= 2 and rows[k].subject_id == str(hold_id) for k in keys)

    shown = CliRunner().invoke(main, ["show", f"{KIND}:{hold_id}", "--json"], env=connection_env(settings))
    assert shown.exit_code == 0, shown.output
    history = json.loads(shown.output)
    assert [h["op_key"] for h in history["operations"]] == keys and not history["more"]
    assert [h["ledger"]["state"] for h in history["operations"]] == ["applied"] * 3
    one = CliRunner().invoke(main, ["show", keys[1]], env=connection_env(settings))
    assert one.exit_code == 0 and one.output.startswith(f"{keys[1]}  applied"), one.output

    # A fourth lapse nobody swept is a new generation to status and the reconciler, not an anomaly; a
    # lapse applied while its row is held again under the same generation is the anomaly.
    with rent.begin() as conn:
        odd = hold(conn, first)
    assert sweep() == 1
    process_until_done(settings)
    fourth = NOW - timedelta(minutes=30)
    with rent.begin() as conn:
        conn.execute(text("UPDATE rent.holds SET status = 'held' WHERE id = :id"), {"id": odd})
        hold_again(conn, hold_id, fourth)
    status = CliRunner().invoke(main, ["status", "--json", "--no-lag"], env=connection_env(settings))
    eligible = json.loads(status.output)["eligible"][KIND]
    assert (eligible["rows"], eligible["generation"]) == (1, "hold_started_at"), status.output
    report = reconcile_once(rent, make_producer(settings), codec, settings.with_(reconciler={"grace_s": 60.0}), kinds)
    assert (report.gaps, report.reemitted) == ({"new_generation": 1}, 1)
    assert (report.anomalies, report.anomaly_keys) == ({"applied_but_eligible": 1}, [key(odd, first)])
    process_until_done(settings)
    assert releases(rent) == {(hold_id, first): 1, (hold_id, second): 1, (hold_id, third): 1,
                              (hold_id, fourth): 1, (odd, first): 1}


def batch(engine, kinds, events, *, fast_path=True):
    with engine.begin() as conn:
        return apply_batch(BatchScope(conn, kinds=kinds, topics=repo_topology(), worker="w1", now=NOW,
                                      lease=timedelta(seconds=30)), events, fast_path=fast_path)


def compiled(engine, path: Path):
    return compile_kinds(read_kinds_file(path), engine)


@pytest.mark.parametrize("fast_path", [True, False], ids=["fast-path", "careful-path"])
def test_a_late_delivery_of_an_earlier_lapse_leaves_the_next_one_alone(rent, tmp_path, fast_path):
    kinds = compiled(rent, kinds_file(tmp_path))
    first, second = NOW - timedelta(days=1), NOW - timedelta(hours=1)
    with rent.begin() as conn:
        hold_id = hold(conn, first)
        hold_again(conn, hold_id, second)  # released by someone else and held again before its event came
    old, new = (expiry_event(KIND, hold_id, "t1", DUE, source="sweep", generation=timestamp_text(g))
                for g in (first, second))
    late = batch(rent, kinds, [old], fast_path=fast_path)
    assert (late.skipped, late.applied) == ([old.op_key], [])
    assert releases(rent) == {}
    both = batch(rent, kinds, [old, new, new], fast_path=fast_path)
    assert (both.applied, both.duplicates) == ([new.op_key], 2)
    assert releases(rent) == {(hold_id, second): 1}
    # The console's search for the subject lists both operations (as `lapse show` does).
    found = views.search(rent, load_settings(database={"url": str(rent.url)}), f"{KIND}:{hold_id}", NOW)
    assert [h["op_key"] for h in found["operations"]] == [old.op_key, new.op_key]


def test_a_shadow_run_and_the_preview_see_each_lapse_as_the_live_work_does(rent, tmp_path):
    live = compiled(rent, kinds_file(tmp_path))
    shadow = compiled(rent, kinds_file(tmp_path, mode="shadow"))
    first, second = NOW - timedelta(days=1), NOW - timedelta(hours=1)
    with rent.begin() as conn:
        hold_id = hold(conn, first)
        hold_again(conn, hold_id, second)
    old, new = (expiry_event(KIND, hold_id, "t1", DUE, source="sweep", generation=timestamp_text(g))
                for g in (first, second))

    (plan,) = plan_kinds(rent, [shadow[KIND]], PlanOptions(), now=NOW)
    assert plan.due_now.rows == 1 and [s.op_key for s in plan.sample] == [new.op_key]
    assert sorted(batch(rent, shadow, [old, new]).shadowed) == sorted([old.op_key, new.op_key])
    with rent.connect() as conn:
        would = {r.op_key: (r.outcome, r.would) for r in conn.execute(select(shadow_effects))}
    assert would[old.op_key] == ("skip", {"skip": "the business row is no longer eligible"})
    assert would[new.op_key] == ("apply", jsonable(plan.sample[0].would))  # what the preview showed
    assert releases(rent) == {}

    assert release_parked_work(rent, live, repo_topology(), clock=lambda: NOW).released == 2  # now live
    done = batch(rent, live, [old, new])
    assert (done.applied, done.skipped) == ([new.op_key], [old.op_key])
    assert releases(rent) == {(hold_id, second): 1}


COMPILED: dict[str, tuple] = {}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.datetimes(min_value=datetime(1000, 1, 1), max_value=datetime(9999, 12, 30),
                                       timezones=st.just(UTC)),
                          st.integers(-(2**31), 2**31 - 1)), min_size=1, max_size=30))
def test_postgresql_writes_a_generation_as_python_does(rent, tmp_path_factory, values):
    """The sweep's, the reconciler's and status's ledger probes compare the op key PostgreSQL writes
    for a business row with the one Python wrote for its event: the same text, or work is lost or doubled."""
    if str(rent.url) not in COMPILED:  # once per test, not per example
        folder = tmp_path_factory.mktemp("kinds")
        COMPILED[str(rent.url)] = (compiled(rent, kinds_file(folder))[KIND],
                                   compiled(rent, kinds_file(folder, generation="version"))[KIND])
    by_time, by_version = COMPILED[str(rent.url)]
    with rent.begin() as conn:
        conn.exec_driver_sql("DELETE FROM rent.holds")
        for moment, version in values:
            conn.execute(text("INSERT INTO rent.holds (tenant, status, hold_started_at, expires_at, version) "
                              "VALUES ('t', 'held', :m, :m, :v)"), {"m": moment, "v": version})
        written = {kind.name + kind.generation.name: conn.execute(
            select(kind.generation_sql()).order_by(kind.id_column)).scalars().all() for kind in (by_time, by_version)}
    assert written == {KIND + "hold_started_at": [timestamp_text(m) for m, _ in values],
                       KIND + "version": [str(v) for _, v in values]}


def cli(args: list[str], url: str, path: Path):
    env = {env_var("database.url"): url, env_var("kinds.file"): str(path),
           env_var("kafka.bootstrap_servers"): "127.0.0.1:1"}
    return CliRunner().invoke(main, args, env=env)


@pytest.mark.parametrize(("generation", "expected"), [
    ("naive_started", "generation: column 'naive_started' is a timestamp without time zone; a generation is a "
                      "timestamp with time zone or an integer column"),
    ("paused_at", "generation: column 'paused_at' of rent.holds is nullable; a generation column is NOT NULL"),
    ("note", "generation: column 'note' has type TEXT; a generation is a timestamp with time zone or an integer "
             "column"),
    ("started", "generation: no column 'started' in rent.holds"),
])
def test_a_column_that_cannot_be_a_generation_is_refused_in_one_line(pg_url, rent, tmp_path, generation, expected):
    path = kinds_file(tmp_path, generation=generation)
    line = f"{path}: kind '{KIND}': {expected}"
    checked = cli(["kinds", "check"], pg_url, path)
    assert checked.exit_code == 1 and checked.output.splitlines() == [f"FAILED  {KIND}: {expected}"], checked.output
    swept = cli(["sweep", "--once"], pg_url, path)  # a role's start: configuration invalid
    assert swept.exit_code == 3 and "Traceback" not in swept.output, swept.output
    assert swept.output.strip().splitlines()[-1].endswith(line)


def test_the_application_passes_the_generation_its_kind_declares(pg_url, rent, tmp_path):
    settings = load_settings(database={"url": pg_url}, kinds={"file": kinds_file(tmp_path)})
    (tmp_path / "plain").mkdir()
    plain = load_settings(database={"url": pg_url}, kinds={"file": kinds_file(tmp_path / "plain", generation="~")})
    started = NOW - timedelta(hours=1)
    with rent.begin() as conn:
        hold_id = hold(conn, started)
        with pytest.raises(ValueError, match="tells its lapses apart by hold_started_at: pass the row's "
                                             "hold_started_at as generation="):
            schedule_cleanup(conn, KIND, hold_id, "t1", DUE, settings=settings)
        with pytest.raises(ValueError, match="timezone-aware"):
            schedule_cleanup(conn, KIND, hold_id, "t1", DUE, generation=started.replace(tzinfo=None),
                             settings=settings)
        with pytest.raises(ValueError, match="a generation is an aware datetime or an int, not str"):
            schedule_cleanup(conn, KIND, hold_id, "t1", DUE, generation=str(started), settings=settings)
        kind = load_kinds(settings, conn)[KIND]
        with pytest.raises(ValueError, match="generation hold_started_at is a timestamp, not int"):
            schedule_cleanup(conn, kind, hold_id, "t1", DUE, generation=7, settings=settings)
        with pytest.raises(ValueError, match="declares no generation column: schedule it without generation="):
            schedule_cleanup(conn, KIND, hold_id, "t1", DUE, generation=started, settings=plain)
        assert schedule_cleanup(conn, kind, hold_id, "t1", DUE, generation=started, settings=settings)
    with rent.connect() as conn:
        assert conn.execute(select(cleanup_ledger.c.op_key)).scalars().all() == [key(hold_id, started)]


def test_a_ledger_migrates_in_place_and_a_subject_then_has_one_row_per_lapse(pg_empty_url):
    upgrade_url(pg_empty_url, "0010")
    engine = make_engine(pg_empty_url)
    row = {"kind": KIND, "tenant": "t1", "subject_id": "7", "state": "applied", "due_at": DUE, "correlation_id": "c",
           "source": "sweep", "created_at": NOW, "updated_at": NOW, "finished_at": NOW}
    try:
        with engine.begin() as conn:
            conn.execute(cleanup_ledger.insert(), [{**row, "op_key": f"{KIND}:7"}])
        assert upgrade_url(pg_empty_url).after == migrations_head()
        assert schema_diff(pg_empty_url) == []
        with engine.begin() as conn:  # the row as it was; the next lapse of its subject beside it
            conn.execute(cleanup_ledger.insert(), [{**row, "op_key": key(7, NOW)}])
        with engine.connect() as conn:
            assert conn.execute(select(cleanup_ledger.c.op_key).order_by(cleanup_ledger.c.op_key)
                                ).scalars().all() == [f"{KIND}:7", key(7, NOW)]
            config = alembic_config(pg_empty_url)
            config.attributes["connection"] = conn
            with pytest.raises(IntegrityError, match="ix_lapse_ledger_kind_subject"):  # two operations: refused
                command.downgrade(config, "0010")
    finally:
        engine.dispose()


def test_the_effect_of_a_batch_joins_its_pairs_once_not_once_per_row(rent, tmp_path):
    """500 (id, generation) pairs over 30,000 rows: the pairs are joined once (a hash join, or a
    lookup of the id's index per pair on a larger table), never re-read for each row of the table,
    as a draft was (docs/performance.md: quadratic in the batch size)."""
    kind = compiled(rent, kinds_file(tmp_path))[KIND]
    with rent.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO rent.holds (tenant, status, hold_started_at, expires_at) SELECT 't1', "
            "CASE WHEN mod(g, 3) = 0 THEN 'held' ELSE 'released' END, now() - g * interval '1 s', "
            "now() - interval '1 day' - g * interval '1 s' FROM generate_series(1, 30000) g")  # all due at NOW
        conn.exec_driver_sql("ANALYZE rent.holds")
        pairs = [tuple(r) for r in conn.exec_driver_sql(
            "SELECT id, hold_started_at FROM rent.holds WHERE status = 'held' ORDER BY random() LIMIT 500")]
    assert kind.apply_in_db is not None
    with rent.connect() as conn:
        compiled_stmt = kind.apply_in_db.statement(conn, pairs, NOW).compile(dialect=conn.dialect)
        plan = "\n".join(conn.exec_driver_sql(f"EXPLAIN (ANALYZE, COSTS OFF) {compiled_stmt}",
                                              compiled_stmt.params).scalars())
        conn.rollback()
    assert "Rows Removed by Join Filter" not in plan and "Semi Join" not in plan, plan
    assert "rows=500 loops=1" in plan.splitlines()[0], plan  # every pair's row updated, in one pass
