"""`lapse kinds plan` on PostgreSQL: its counts are what the live kind then changes, hour by hour
(the preview taken as of a past time, then the kind run through the sweep, Kafka and a worker);
it writes nothing and runs as a role that may only SELECT; its statements read along the kind's
due index at the real cap on an empty and a 100,000-row table; and each bad input is one line
with its documented exit code, with nothing changed."""

from __future__ import annotations

import json
import random
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner
from sqlalchemy import func, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from lapse.devtools.demo_data import add_reservations
from lapse.devtools.demo_kinds import RELEASE, packaged_kinds_file
from lapse.devtools.demo_tables import reservations
from lapse.kernel.database import make_engine
from lapse.kernel.kafka_clients import make_producer
from lapse.kernel.kinds.plan import DEFAULT_CAP, PlanOptions, plan_kinds, plan_statements, read_only
from lapse.kernel.models import cleanup_ledger, ledger_transitions, operator_actions
from lapse.kernel.settings import env_var
from lapse.producers import sweep_once
from lapse.shell.app import main
from lapse.shell.error_boundary import ExitCode
from tests.fixtures.kinds import demo_kinds
from tests.fixtures.pipeline import connection_env
from tests.fixtures.processes import run_lapse
from tests.fixtures.workers import process_until_done

HOUR = timedelta(hours=1)
DUE_INDEX = "ix_reservations_held_due"


def plan_cli(env: dict[str, str], *args: str):
    result = CliRunner().invoke(main, ["kinds", "plan", *args], env=env)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def seed_around(conn, at: datetime, rng: random.Random) -> None:
    """Held reservations due long before `at`, exactly at it, in each of the 24 hours after it (on
    both edges of some hours), and after the window; paid ones among them (never eligible)."""
    add_reservations(conn, 12, expires_at=at - timedelta(days=3), tenant="backlog")
    add_reservations(conn, 5, expires_at=at, tenant="edge")
    for h in range(24):
        start = at + h * HOUR
        for i in range(rng.randrange(0, 9)):
            add_reservations(conn, 1, expires_at=start + timedelta(seconds=rng.randrange(1, 3600)),
                             tenant=f"t{i % 4}")
        if h % 5 == 0:
            add_reservations(conn, 2, expires_at=start + HOUR, tenant="edge")  # the hour's last instant
        add_reservations(conn, 1, status="paid", expires_at=start + HOUR / 2, tenant="t0")
    add_reservations(conn, 10, expires_at=at + 25 * HOUR, tenant="t1")  # past the window, still changed


def hour_of(due: datetime, at: datetime) -> int | str:
    """The preview's bucket of a row due at `due`: "now" up to `at`, else hour h for (at+h, at+h+1]."""
    if due <= at:
        return "now"
    seconds = (due - at).total_seconds()
    return int(-(-seconds // 3600)) - 1


def test_plan_counts_equal_what_the_live_kind_then_changes_hour_by_hour(pipeline, tmp_path):
    p = pipeline
    with p.engine.connect() as conn:
        real_now = conn.execute(select(func.now())).scalar_one()
    at = (real_now - 30 * HOUR).replace(microsecond=0)
    with p.engine.begin() as conn:
        seed_around(conn, at, random.Random(21))
        add_reservations(conn, 6, expires_at=real_now + 2 * HOUR, tenant="t2")  # due later: neither
    with p.engine.connect() as conn:
        before = {r.id: r for r in conn.execute(select(reservations))}

    planned = plan_cli(connection_env(p.settings), RELEASE, "--at", at.isoformat(), "--limit", "5", "--json")
    (plan,) = planned["kinds"]
    with p.engine.connect() as conn:  # the preview wrote nothing, not even the ledger
        assert conn.execute(select(func.count()).select_from(cleanup_ledger)).scalar() == 0
        assert {r.id: r for r in conn.execute(select(reservations))} == before

    kinds = {RELEASE: demo_kinds(p.engine)[RELEASE]}
    swept = sweep_once(p.engine, make_producer(p.settings), p.codec, p.settings, kinds)
    process_until_done(p.settings, terminal=swept.emitted)

    with p.engine.connect() as conn:
        after = {r.id: r for r in conn.execute(select(reservations))}
    changed = [before[i] for i, row in after.items() if row.status != before[i].status]
    assert all(after[r.id].status == "released" and before[r.id].status == "held" for r in changed)
    by_hour = Counter(hour_of(r.expires_at, at) for r in changed)
    assert plan["due_now"] == {"rows": by_hour["now"], "capped": False}
    assert [h["rows"] for h in plan["hours"]] == [by_hour[h] for h in range(24)]
    assert plan["next_24h"] == sum(by_hour[h] for h in range(24)) > 0
    assert by_hour[24] == 10  # changed, but due after the preview's window
    assert plan["eligible"]["rows"] == sum(r.status == "held" for r in before.values())
    in_window = [r for r in changed if hour_of(r.expires_at, at) != 24]
    tenants = {"now": Counter(r.tenant for r in in_window if r.expires_at <= at),
               "next_24h": Counter(r.tenant for r in in_window if r.expires_at > at)}
    for window, counted in tenants.items():
        assert {t["tenant"]: t["rows"] for t in plan["tenants"][window]["top"]} == dict(counted)
        assert plan["tenants"][window]["tenants"] == len(counted)

    oldest = sorted((r for r in changed), key=lambda r: (r.expires_at, r.id))[:5]
    assert [s["subject_id"] for s in plan["sample"]] == [str(r.id) for r in oldest]
    for shown in plan["sample"]:
        assert shown["would"]["set"]["status"] == ["held", "released"]
        assert shown["would"]["set"]["released_at"] == [None, at.isoformat()]


def test_the_preview_is_read_only_and_needs_only_select(pg_url, login_role, tmp_path):
    engine = make_engine(pg_url)
    at = datetime.now(UTC).replace(microsecond=0)
    with engine.begin() as conn:
        add_reservations(conn, 7, expires_at=at - HOUR, tenant="a")
        add_reservations(conn, 3, expires_at=at + HOUR / 2, tenant="b")
    url = login_role(pg_url)
    role = make_url(url).username
    with engine.begin() as conn:
        conn.exec_driver_sql(f'GRANT SELECT ON reservations, artifacts TO "{role}"')
    env = {env_var("database.url"): url, env_var("kinds.file"): str(packaged_kinds_file())}
    planned = plan_cli(env, "--at", at.isoformat(), "--json")
    counts = {k["kind"]: (k["due_now"]["rows"], k["next_24h"]) for k in planned["kinds"]}
    assert counts == {"release-reservation": (7, 3), "artifact-delete": (0, 0)}

    kinds = demo_kinds(engine)
    with read_only(engine, 5.0) as conn:
        assert conn.exec_driver_sql("SHOW transaction_read_only").scalar() == "on"
        with pytest.raises(DBAPIError) as refused:
            conn.execute(reservations.update().values(status="released"))
        assert isinstance(refused.value.orig, psycopg.errors.ReadOnlySqlTransaction)
    plans = plan_kinds(engine, [kinds[RELEASE]], PlanOptions(), now=at)
    assert (plans[0].due_now.rows, plans[0].next_total) == (7, 3)
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).where(reservations.c.status == "held")).scalar() == 10
        for table in (cleanup_ledger, ledger_transitions, operator_actions):
            assert conn.execute(select(func.count()).select_from(table)).scalar() == 0
    engine.dispose()


def index_reads(node: dict, table: str) -> list[tuple[str, str | None]]:
    """(node type, index) of every node of an EXPLAIN plan that reads `table` (a bitmap heap scan
    by the bitmap index scans below it)."""
    found = []
    if node.get("Relation Name") == table and node["Node Type"] != "Bitmap Heap Scan":
        found.append((node["Node Type"], node.get("Index Name")))
    for child in node.get("Plans", ()):
        found += index_reads(child, table)
    if node["Node Type"] == "Bitmap Index Scan":
        found.append((node["Node Type"], node.get("Index Name")))
    return found


@pytest.mark.parametrize("rows", [0, 100_000])
def test_every_preview_statement_reads_along_the_due_index_at_the_real_cap(pg_url, rows):
    engine = make_engine(pg_url)
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO reservations (tenant, status, expires_at) SELECT 'tenant-' || (g % 13), "
            "CASE WHEN g % 4 = 0 THEN 'paid' ELSE 'held' END, now() - interval '2 days' + g * interval '3 seconds' "
            "FROM generate_series(1, :n) g"), {"n": rows})
        conn.exec_driver_sql("ANALYZE reservations")
    kind = demo_kinds(engine)[RELEASE]
    with read_only(engine, 30.0) as conn:
        now = conn.execute(select(func.now())).scalar_one()
        statements = plan_statements(kind, now, PlanOptions(cap=DEFAULT_CAP, sample=1000)).all()
        assert len(statements) == 29
        for stmt in statements:
            compiled = stmt.compile(dialect=conn.dialect)
            (plan,) = conn.exec_driver_sql(f"EXPLAIN (FORMAT JSON) {compiled}", compiled.params).scalar_one()
            reads = index_reads(plan["Plan"], "reservations")
            assert reads and {index for _, index in reads} == {DUE_INDEX}, (str(compiled), reads)
            assert {node for node, _ in reads} <= {"Index Scan", "Index Only Scan", "Bitmap Index Scan"}
    engine.dispose()


# In public by name: the test role is named like Lapse's schema, where its default search path would
# put a bare name (and the kinds check refuses a table in Lapse's schema).
NO_INDEX_TABLE = ("CREATE TABLE public.holds (id bigint PRIMARY KEY, state text NOT NULL, "
                  "until timestamptz NOT NULL)")
BAD_KINDS = {
    "no-index": """
kinds:
  drop-hold:
    table: holds
    id: id
    due: until
    eligible: {state: open}
    effect: {delete: {}}
""",
    "uncovered": """
kinds:
  release-paid:
    table: reservations
    id: id
    due: expires_at
    eligible: {status: paid}
    effect: {update: {set: {status: released}}}
""",
    "not-yaml": "kinds:\n  release-reservation: [unclosed\n",
    "wrong-column": """
kinds:
  release-reservation:
    table: reservations
    id: id
    due: expires_at
    eligible: {statuz: held}
    effect: {update: {set: {status: released}}}
""",
}


def test_bad_input_is_one_line_with_its_exit_code_and_nothing_changes(pg_url, tmp_path):
    engine = make_engine(pg_url)
    with engine.begin() as conn:
        conn.exec_driver_sql(NO_INDEX_TABLE)
        conn.exec_driver_sql("INSERT INTO holds SELECT g, 'open', now() - interval '1 hour' FROM "
                             "generate_series(1, 50) g")
        add_reservations(conn, 20, expires_at=datetime.now(UTC) - HOUR, tenant="a")
        add_reservations(conn, 5, status="paid", expires_at=datetime.now(UTC) - HOUR, tenant="a")

    def snapshot() -> tuple:
        with engine.connect() as conn:
            return (conn.execute(text("SELECT id, status FROM reservations ORDER BY id")).all(),
                    conn.execute(text("SELECT count(*) FROM holds")).scalar(),
                    conn.execute(select(func.count()).select_from(cleanup_ledger)).scalar())

    before = snapshot()
    files = {}
    for name, body in BAD_KINDS.items():
        files[name] = tmp_path / f"{name}.yaml"
        files[name].write_text(body)
    good = str(packaged_kinds_file())
    env = {env_var("database.url"): pg_url}
    dead = make_url(pg_url).set(port=1).render_as_string(hide_password=False)
    cases = {
        ("unknown kind", ExitCode.USAGE, "lapse: kinds plan: no kind 'nope' in "): ["nope", "--kinds-file", good],
        ("bad kind name", ExitCode.USAGE, "lapse: kinds plan: no kind 'Not A Kind;' in "):
            ["Not A Kind;", "--kinds-file", good],
        ("limit", ExitCode.USAGE, "lapse: kinds plan: Invalid value for '--limit'"):
            ["--limit", "-1", "--kinds-file", good],
        ("no index", ExitCode.CONFIG, f"lapse: {files['no-index']}: kind 'drop-hold': due: no index on (until, id)"):
            ["--kinds-file", str(files["no-index"])],
        ("uncovered", ExitCode.CONFIG,
         f"lapse: {files['uncovered']}: kind 'release-paid': due: the preview would read reservations by Seq Scan"):
            ["--kinds-file", str(files["uncovered"])],
        ("unreachable", ExitCode.UNREACHABLE, "lapse: database "):
            ["--kinds-file", good, "--database-url", dead],
        ("not yaml", ExitCode.CONFIG, f"lapse: {files['not-yaml']}: not valid YAML"):
            ["--kinds-file", str(files["not-yaml"])],
        ("wrong column", ExitCode.CONFIG,
         f"lapse: {files['wrong-column']}: kind 'release-reservation': eligible.statuz: no column 'statuz'"):
            ["--kinds-file", str(files["wrong-column"])],
    }
    finished = run_lapse(*(["kinds", "plan", *args] for args in cases.values()), env=env, cwd=tmp_path)
    for (what, code, start), done in zip(cases, finished, strict=True):
        assert (done.code, len(done.stderr), done.stdout) == (code, 1, ""), (what, done)
        assert done.stderr[0].startswith(start), (what, done.stderr[0])
    assert ("CREATE INDEX CONCURRENTLY ix_holds_drop_hold_due ON holds (until, id) WHERE state = 'open'"
            in finished[3].stderr[0])
    assert "unreachable" in finished[5].stderr[0]
    assert snapshot() == before
    engine.dispose()


def test_the_plan_of_a_file_not_yet_live_shows_the_changed_declaration(pg_url, tmp_path: Path):
    engine = make_engine(pg_url)
    at = datetime.now(UTC).replace(microsecond=0)
    with engine.begin() as conn:
        add_reservations(conn, 4, expires_at=at - HOUR, tenant="a")
        add_reservations(conn, 3, status="paid", expires_at=at - HOUR, tenant="a")
        conn.exec_driver_sql("CREATE INDEX ix_paid_due ON reservations (expires_at, id) WHERE status = 'paid'")
    changed = tmp_path / "kinds.yaml"
    changed.write_text(packaged_kinds_file().read_text().replace("status: held", "status: paid"))
    env = {env_var("database.url"): pg_url, env_var("kinds.file"): str(packaged_kinds_file())}
    live = plan_cli(env, RELEASE, "--at", at.isoformat(), "--json")["kinds"][0]
    new = plan_cli(env, RELEASE, "--kinds-file", str(changed), "--at", at.isoformat(), "--json")["kinds"][0]
    assert (live["due_now"]["rows"], live["due_index"]) == (4, DUE_INDEX)
    assert (new["due_now"]["rows"], new["due_index"]) == (3, "ix_paid_due")
    assert [s["would"]["set"]["status"] for s in new["sample"]] == [["paid", "released"]] * 3
    engine.dispose()


def test_a_preview_past_its_timeout_is_one_line_and_exit_5(pg_url, tmp_path):
    engine = make_engine(pg_url)
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO reservations (tenant, status, expires_at) SELECT 't', 'held', "
                          "now() - g * interval '1 second' FROM generate_series(1, 300000) g"))
    engine.dispose()
    env = {env_var("database.url"): pg_url, env_var("kinds.file"): str(packaged_kinds_file())}
    (done,) = run_lapse(["kinds", "plan", RELEASE, "--timeout", "0.001"], env=env, cwd=tmp_path)
    assert (done.code, len(done.stderr), done.stdout) == (ExitCode.INTERRUPTED, 1, ""), done
    assert "timed out: canceling statement due to statement timeout" in done.stderr[0]
