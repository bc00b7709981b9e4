"""Declared kinds on a user's own tables, in the user's own schema, on PostgreSQL and Apache Kafka:
an `update` kind and a `delete` kind (uuid ids) swept, processed, reconciled and published to with no
code of their own; a kind without its due index refused with the CREATE INDEX to add; `lapse kinds
check` on a good and a bad declaration."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import func, select, text
from sqlalchemy.engine import make_url

from lapse.kernel.codec import Codec
from lapse.kernel.database import make_engine
from lapse.kernel.kafka_clients import make_producer
from lapse.kernel.kinds import KindsFileError, load_kinds
from lapse.kernel.models import cleanup_ledger, ledger_transitions
from lapse.kernel.settings import env_var, load_settings
from lapse.producers import schedule_cleanup, sweep_once
from lapse.producers.relay import relay_until_empty
from lapse.reconciler import reconcile_once
from lapse.shell.app import main
from tests.fixtures.pipeline import make_pipeline_settings
from tests.fixtures.workers import process_until_done

NOW = datetime.now(UTC).replace(microsecond=0)
PAST = NOW - timedelta(minutes=10)
LATER = NOW + timedelta(hours=2)

SHOP = [
    "CREATE SCHEMA shop",
    """CREATE TABLE shop.orders (id bigserial PRIMARY KEY, tenant_id text NOT NULL, status text NOT NULL,
       plan text, archived_at timestamptz, expires_at timestamptz NOT NULL, expired_at timestamptz)""",
    "CREATE INDEX orders_pending_due ON shop.orders (expires_at, id) WHERE status = 'pending'",
    "CREATE TABLE shop.sessions (id uuid PRIMARY KEY, expires_at timestamptz NOT NULL)",
    "CREATE INDEX sessions_due ON shop.sessions (expires_at, id)",
    "CREATE TABLE shop.audit_log (id bigint PRIMARY KEY, kind text, created_at timestamptz NOT NULL)",
]
KINDS = """
kinds:
  expire-order:
    table: shop.orders
    id: id
    tenant: tenant_id
    due: expires_at
    eligible:
      status: pending
      archived_at: null
      plan: {in: [free, trial]}
    effect:
      update:
        set: {status: expired, expired_at: now}
  purge-session:
    table: shop.sessions
    id: id
    due: expires_at
    effect:
      delete: {}
"""
PURGE_LOG = """
  purge-log:
    table: shop.audit_log
    id: id
    due: created_at
    eligible: {kind: {not: keep}}
    effect:
      delete: {}
"""
PURGE_LOG_INDEX = ("CREATE INDEX CONCURRENTLY ix_audit_log_purge_log_due ON shop.audit_log (created_at, id) "
                   "WHERE kind IS DISTINCT FROM 'keep'")


@pytest.fixture
def shop(pg_url):
    engine = make_engine(pg_url)
    with engine.begin() as conn:
        for statement in SHOP:
            conn.exec_driver_sql(statement)
    yield engine
    engine.dispose()


def kinds_file(folder: Path, extra: str = "") -> Path:
    path = folder / "kinds.yaml"
    path.write_text(KINDS + extra)
    return path


def add_orders(conn, n: int, *, status="pending", plan="free", archived_at=None, expires_at=PAST) -> list[int]:
    rows = [{"tenant": f"tenant-{i % 3}", "status": status, "plan": plan, "archived": archived_at,
             "expires": expires_at} for i in range(n)]
    return [conn.execute(text(
        "INSERT INTO shop.orders (tenant_id, status, plan, archived_at, expires_at) "
        "VALUES (:tenant, :status, :plan, :archived, :expires) RETURNING id"), row).scalar_one() for row in rows]


def add_sessions(conn, n: int, expires_at) -> list[str]:
    ids = [str(uuid.uuid4()) for _ in range(n)]
    conn.execute(text("INSERT INTO shop.sessions (id, expires_at) VALUES (CAST(:id AS uuid), :expires)"),
                 [{"id": i, "expires": expires_at} for i in ids])
    return ids


def orders_by_id(engine) -> dict[int, tuple]:
    with engine.connect() as conn:
        return {row[0]: tuple(row) for row in conn.exec_driver_sql(
            "SELECT id, tenant_id, status, plan, archived_at, expires_at, expired_at FROM shop.orders")}


def test_update_and_delete_kinds_clean_up_every_eligible_row_exactly_once(kafka_bootstrap, pg_url, unique, shop,
                                                                          tmp_path):
    with shop.begin() as conn:
        eligible = add_orders(conn, 20) + add_orders(conn, 10, plan="trial")
        ineligible = (add_orders(conn, 5, status="paid") + add_orders(conn, 5, archived_at=PAST)
                      + add_orders(conn, 5, plan="pro") + add_orders(conn, 5, expires_at=LATER))
        due_sessions = add_sessions(conn, 20, PAST)
        live_sessions = add_sessions(conn, 5, LATER)
    before = orders_by_id(shop)
    settings = make_pipeline_settings(kafka_bootstrap, pg_url, unique, kinds={"file": kinds_file(tmp_path)})
    kinds = load_kinds(settings, shop)

    # The publish API, in the application's transaction, for one more order.
    with shop.begin() as conn:
        (published,) = add_orders(conn, 1)
        assert schedule_cleanup(conn, "expire-order", published, "tenant-0", PAST, settings=settings)
        with pytest.raises(ValueError, match="unknown cleanup kind 'release-reservation'"):
            schedule_cleanup(conn, "release-reservation", 1, "t", PAST, settings=settings)
    relay_until_empty(shop, make_producer(settings), Codec.from_settings(settings), 100)

    first = sweep_once(shop, make_producer(settings), Codec.from_settings(settings), settings, kinds)
    again = sweep_once(shop, make_producer(settings), Codec.from_settings(settings), settings, kinds)
    assert first.by_kind == {"expire-order": 30, "purge-session": 20} and again.emitted == 0

    process_until_done(settings, terminal=51)

    after = orders_by_id(shop)
    assert {i: after[i][2] for i in [*eligible, published]} == dict.fromkeys([*eligible, published], "expired")
    assert all(after[i][6] is not None for i in eligible)
    assert {i: after[i] for i in ineligible} == {i: before[i] for i in ineligible}  # untouched
    with shop.connect() as conn:
        sessions_left = {str(i) for i in conn.exec_driver_sql("SELECT id FROM shop.sessions").scalars()}
        states = Counter(conn.execute(select(cleanup_ledger.c.kind, cleanup_ledger.c.state)).all())
        per_key = Counter(conn.execute(select(ledger_transitions.c.op_key)
                                       .where(ledger_transitions.c.to_state == "applied")).scalars())
        tenants = dict(conn.execute(select(cleanup_ledger.c.subject_id, cleanup_ledger.c.tenant)
                                    .where(cleanup_ledger.c.kind == "purge-session")).all())
    assert sessions_left == set(live_sessions)
    assert states == {("expire-order", "applied"): 31, ("purge-session", "applied"): 20}
    assert len(per_key) == 51 and set(per_key.values()) == {1}  # each op key applied exactly once
    assert set(tenants) == set(due_sessions) and set(tenants.values()) == {"default"}  # no tenant column

    report = reconcile_once(shop, make_producer(settings), Codec.from_settings(settings),
                            settings.with_(reconciler={"grace_s": 0.0}), kinds)
    assert (report.gaps, report.reemitted, report.anomalies) == ({}, 0, {})


def test_a_kind_without_a_due_index_is_refused_with_the_create_index_and_nothing_runs(pg_url, shop, tmp_path):
    path = kinds_file(tmp_path, PURGE_LOG)
    settings = load_settings(database={"url": pg_url}, kinds={"file": path})
    with pytest.raises(KindsFileError) as caught:
        load_kinds(settings, shop)
    assert str(caught.value) == (
        f"{path}: kind 'purge-log': due: no index on (created_at, id) of shop.audit_log for the sweep; "
        f"add it: {PURGE_LOG_INDEX}")

    env = {env_var("database.url"): pg_url, env_var("kinds.file"): str(path),
           env_var("kafka.bootstrap_servers"): "127.0.0.1:1"}
    swept = CliRunner().invoke(main, ["sweep", "--once"], env=env)
    assert swept.exit_code != 0 and "Traceback" not in swept.output
    assert swept.output.strip().splitlines()[-1].endswith(f": {caught.value}")  # the same one line
    with shop.connect() as conn:
        assert conn.execute(select(func.count()).select_from(cleanup_ledger)).scalar() == 0

    # The statement printed is the one to run: CONCURRENTLY, so outside a transaction, writes going on.
    with shop.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql(PURGE_LOG_INDEX)
    assert sorted(load_kinds(settings, shop)) == ["expire-order", "purge-log", "purge-session"]


LEDGER_KIND = """
kinds:
  purge-ledger:
    table: {table}
    id: op_key
    due: claim_until
    effect:
      delete: {{}}
"""


@pytest.mark.parametrize("table", ["lapse_ledger", "lapse.lapse_ledger"])
def test_lapses_own_table_is_refused_whichever_name_the_search_path_resolves(pg_url, tmp_path, table):
    """The test role is named like Lapse's schema, so the default search path (`"$user", public`)
    resolves the bare name to Lapse's ledger: the guard checks the table found, not the name given."""
    engine = make_engine(pg_url)
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT relnamespace::regnamespace::text FROM pg_class "
                                        "WHERE oid = to_regclass('lapse_ledger')").scalar() == "lapse"
        path = tmp_path / "kinds.yaml"
        path.write_text(LEDGER_KIND.format(table=table))
        settings = load_settings(database={"url": pg_url}, kinds={"file": path})
        with pytest.raises(KindsFileError) as caught:
            load_kinds(settings, engine)
        assert str(caught.value) == (f"{path}: kind 'purge-ledger': table: '{table}' is in Lapse's own schema; "
                                     "kinds clean up business tables")
    finally:
        engine.dispose()


def kinds_cli(args: list[str], url: str, path: Path):
    env = {env_var("database.url"): url, env_var("kinds.file"): str(path)}
    return CliRunner().invoke(main, ["kinds", *args], env=env)


def test_kinds_check_and_list_on_a_good_and_a_bad_declaration(pg_url, shop, tmp_path):
    good = kinds_file(tmp_path)
    listed = kinds_cli(["list", "--json"], pg_url, good)
    assert listed.exit_code == 0, listed.output
    assert [(k["name"], k["effect"], k["table"], k["due"]) for k in json.loads(listed.output)["kinds"]] == [
        ("expire-order", "update", "shop.orders", "expires_at"), ("purge-session", "delete", "shop.sessions",
                                                                  "expires_at")]
    checked = kinds_cli(["check", "--json"], pg_url, good)
    assert checked.exit_code == 0, checked.output
    report = json.loads(checked.output)
    assert report["ok"] is True
    assert {k["name"]: (k["due_index"], k["privileges"]) for k in report["kinds"]} == {
        "expire-order": ("orders_pending_due", {"SELECT": True, "UPDATE": True}),
        "purge-session": ("sessions_due", {"SELECT": True, "DELETE": True})}

    bad = tmp_path / "bad"
    bad.mkdir()
    bad_file = kinds_file(bad, PURGE_LOG + """
  typo:
    table: shop.orders
    id: id
    due: expires_at
    eligible: {statuz: pending}
    effect: {delete: {}}
""")
    checked = kinds_cli(["check"], pg_url, bad_file)
    assert checked.exit_code == 1
    assert checked.output.splitlines() == [
        "ok      expire-order (update on shop.orders, index orders_pending_due)",
        "ok      purge-session (delete on shop.sessions, index sessions_due)",
        f"FAILED  purge-log: due: no index on (created_at, id); add it: {PURGE_LOG_INDEX}",
        "FAILED  typo: eligible.statuz: no column 'statuz' in shop.orders",
    ]


def test_kinds_check_names_what_the_role_may_not_do(pg_url, shop, tmp_path, login_role):
    url = login_role(pg_url)
    role = make_url(url).username
    with shop.begin() as conn:
        conn.exec_driver_sql(f"GRANT USAGE ON SCHEMA shop TO {role}")
        conn.exec_driver_sql(f"GRANT SELECT ON shop.orders, shop.sessions TO {role}")
    checked = kinds_cli(["check", "--json"], url, kinds_file(tmp_path))
    assert checked.exit_code == 1, checked.output
    problems = {k["name"]: k["problems"] for k in json.loads(checked.output)["kinds"]}
    assert problems == {"expire-order": ["table: the current role may not UPDATE shop.orders"],
                        "purge-session": ["table: the current role may not DELETE shop.sessions"]}


TENANT_TABLES = [
    "CREATE SCHEMA crm",
    # A Django-style table: uuid keys, the organisation a uuid (null for rows made before it existed).
    """CREATE TABLE crm.invites (id uuid PRIMARY KEY, org_id uuid, expires_at timestamptz NOT NULL,
       status text NOT NULL)""",
    "CREATE INDEX invites_due ON crm.invites (expires_at, id) WHERE status = 'open'",
    "CREATE TABLE crm.carts (id bigint PRIMARY KEY, shop_id integer NOT NULL, expires_at timestamptz NOT NULL)",
    "CREATE INDEX carts_due ON crm.carts (expires_at, id)",
]
TENANT_KINDS = """
kinds:
  expire-invite:
    table: crm.invites
    id: id
    tenant: org_id
    due: expires_at
    eligible: {status: open}
    effect:
      update: {set: {status: expired}}
  purge-cart:
    table: crm.carts
    id: id
    tenant: shop_id
    due: expires_at
    effect:
      delete: {}
"""


def test_uuid_and_integer_tenant_columns_are_carried_as_text(kafka_bootstrap, pg_url, unique, tmp_path):
    engine = make_engine(pg_url)
    orgs = [uuid.uuid4() for _ in range(3)]
    invites = {uuid.uuid4(): orgs[i % 3] if i % 4 else None for i in range(12)}
    with engine.begin() as conn:
        for statement in TENANT_TABLES:
            conn.exec_driver_sql(statement)
        conn.execute(text("INSERT INTO crm.invites VALUES (:id, :org, :due, 'open')"),
                     [{"id": i, "org": org, "due": PAST} for i, org in invites.items()])
        conn.execute(text("INSERT INTO crm.carts VALUES (:id, :shop, :due)"),
                     [{"id": i, "shop": 7000 + i % 2, "due": PAST} for i in range(1, 9)])
    path = tmp_path / "kinds.yaml"
    path.write_text(TENANT_KINDS)
    settings = make_pipeline_settings(kafka_bootstrap, pg_url, unique, kinds={"file": path})
    kinds = load_kinds(settings, engine)
    late = uuid.uuid4()
    with engine.begin() as conn:  # the application schedules one itself, naming its tenant as text
        conn.execute(text("INSERT INTO crm.invites VALUES (:id, :org, :due, 'open')"),
                     {"id": late, "org": orgs[0], "due": PAST})
        assert schedule_cleanup(conn, "expire-invite", str(late), str(orgs[0]), PAST, settings=settings)
    relay_until_empty(engine, make_producer(settings), Codec.from_settings(settings), 100)
    swept = sweep_once(engine, make_producer(settings), Codec.from_settings(settings), settings, kinds)
    assert swept.by_kind == {"expire-invite": 12, "purge-cart": 8}

    process_until_done(settings, terminal=21)

    with engine.connect() as conn:
        ledger = {(k, s): (t, st) for k, s, t, st in conn.execute(select(
            cleanup_ledger.c.kind, cleanup_ledger.c.subject_id, cleanup_ledger.c.tenant, cleanup_ledger.c.state))}
        left = conn.execute(text("SELECT count(*) FROM crm.carts")).scalar()
        open_invites = conn.execute(text("SELECT count(*) FROM crm.invites WHERE status = 'open'")).scalar()
    expected = {("expire-invite", str(i)): (str(org) if org else "default", "applied") for i, org in invites.items()}
    expected[("expire-invite", str(late))] = (str(orgs[0]), "applied")
    expected |= {("purge-cart", str(i)): (str(7000 + i % 2), "applied") for i in range(1, 9)}
    assert ledger == expected
    assert (left, open_invites) == (0, 0)
    report = reconcile_once(engine, make_producer(settings), Codec.from_settings(settings),
                            settings.with_(reconciler={"grace_s": 0.0}), kinds)
    assert (report.gaps, report.reemitted, report.anomalies) == ({}, 0, {})
    engine.dispose()
