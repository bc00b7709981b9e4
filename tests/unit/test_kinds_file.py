"""The kinds file: parsing, validation against a reflected table (an SQLite file), compiled
statements, and hostile configuration refused in one line that names the kind and the field,
with nothing run against the database."""

from __future__ import annotations

import re
import string
import textwrap
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import (
    Boolean,
    Column,
    DateTime,
    Index,
    Integer,
    MetaData,
    Numeric,
    String,
    Table,
    Text,
    create_engine,
    insert,
    inspect,
    select,
    text,
)

from lapse.kernel.kinds import (
    CleanupKind,
    KindsFileError,
    check_kinds,
    compile_kinds,
    declared_names,
    describe,
    load_kinds,
    read_kinds_file,
)
from lapse.kernel.kinds.declarations import parse_kinds_text
from lapse.kernel.kinds.effects import HttpEffect, ObjectStoreEffect
from lapse.kernel.kinds.errors import show
from lapse.kernel.package_files import starter_kinds_file
from lapse.kernel.settings import load_settings

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
PAST = NOW - timedelta(hours=1)

business = MetaData()
orders = Table(
    "orders", business,
    Column("id", Integer, primary_key=True),
    Column("tenant_id", String(64)),
    Column("status", String(16), nullable=False),
    Column("plan", String(16)),
    Column("archived_at", DateTime),
    Column("expires_at", DateTime, nullable=False),
    Column("expired_at", DateTime),
    Column("note", Text),
    Column("amount", Numeric(10, 2)),
    Column("flag", Boolean),
    Index("ix_orders_due", "expires_at", "id"),
)
sessions = Table(  # no index on (expires_at, id): a kind on it is refused
    "sessions", business,
    Column("id", String(64), primary_key=True),
    Column("expires_at", DateTime, nullable=False),
)
exports = Table(
    "exports", business,
    Column("id", Integer, primary_key=True),
    Column("object_key", String(512), nullable=False),
    Column("status", String(16), nullable=False),
    Column("retain_until", DateTime, nullable=False),
    Column("deleted_at", DateTime),
    Index("ix_exports_due", "retain_until", "id"),
)

EXPIRE_ORDER = {
    "table": "orders", "id": "id", "tenant": "tenant_id", "due": "expires_at",
    "eligible": {"status": "pending", "archived_at": None, "plan": {"in": ["free", "trial"]}},
    "effect": {"update": {"set": {"status": "expired", "expired_at": "now"}}},
    "retry": {"max_attempts": 6, "base_s": 5, "cap_s": 3600},
}
GOOD = {
    "expire-order": EXPIRE_ORDER,
    "purge-order": {"table": "orders", "id": "id", "due": "expires_at",
                    "eligible": {"status": {"not": "paid"}}, "effect": {"delete": {}}},
    "call-partner": {"table": "orders", "id": "id", "due": "expires_at", "eligible": {"status": "pending"},
                     "effect": {"http": {"method": "POST", "url": "https://partner.example/holds/{id}/release",
                                         "timeout_s": 5, "then_set": {"status": "released"}}},
                     "limits": {"rate_per_s": 100}},
    "drop-export": {"table": "exports", "id": "id", "due": "retain_until", "eligible": {"status": "live"},
                    "effect": {"object-store": {"url": "file:objects", "key_column": "object_key",
                                                "then_set": {"status": "deleted", "deleted_at": "now"}}}},
}


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("kinds") / "business.db"
    engine = create_engine(f"sqlite:///{path}")
    business.create_all(engine)
    engine.dispose()
    return f"sqlite:///{path}"


@pytest.fixture
def business_db(db):
    eng = create_engine(db)
    yield eng
    eng.dispose()


def write(folder: Path, kinds: dict, name: str = "kinds.yaml") -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump({"kinds": kinds}, sort_keys=False, allow_unicode=True))
    return path


def compile_file(folder: Path, kinds: dict, engine) -> dict[str, CleanupKind]:
    return compile_kinds(read_kinds_file(write(folder, kinds)), engine)


def refusal(folder: Path, kinds: dict, engine) -> str:
    with pytest.raises(KindsFileError) as caught:
        compile_file(folder, kinds, engine)
    message = str(caught.value)
    assert "\n" not in message and "\r" not in message
    return message


def schema_of(engine) -> tuple:
    """What the database holds, to prove that nothing ran: tables, their columns and indexes, rows."""
    insp = inspect(engine)
    with engine.connect() as conn:
        rows = tuple(conn.execute(select(t)).all() for t in (orders, sessions, exports))
    return (tuple(sorted(insp.get_table_names())),
            tuple((t, tuple(c["name"] for c in insp.get_columns(t)), tuple(i["name"] for i in insp.get_indexes(t)))
                  for t in sorted(insp.get_table_names())), rows)


# --- what a good file compiles into ---------------------------------------------------------------

def test_declared_kinds_compile_into_the_interface_the_rooms_use(tmp_path, business_db):
    kinds = compile_file(tmp_path, GOOD, business_db)
    assert list(kinds) == list(GOOD)
    expire = kinds["expire-order"]
    assert (expire.table.name, expire.id_column.name, expire.due_column.name) == ("orders", "id", "expires_at")
    assert (expire.max_attempts, expire.retry_base_s, expire.retry_cap_s) == (6, 5.0, 3600.0)
    assert expire.apply_in_db is not None and expire.external_effect is None
    assert expire.op_key(42) == "expire-order:42"
    assert expire.parse_subject("42") == 42
    call = kinds["call-partner"].external_effect
    assert isinstance(call.declared, HttpEffect) and kinds["call-partner"].limits.rate_per_s == 100
    drop = kinds["drop-export"].external_effect
    # A relative file: store resolves against the kinds file's folder.
    assert isinstance(drop.declared, ObjectStoreEffect) and drop.declared.url == f"file:{tmp_path / 'objects'}"


def test_update_and_delete_change_only_rows_still_eligible_and_due(tmp_path, db):
    engine = create_engine(db)
    kinds = compile_file(tmp_path, GOOD, engine)
    rows = [
        {"id": 101, "tenant_id": "acme", "status": "pending", "plan": "free", "expires_at": PAST},   # eligible
        {"id": 102, "tenant_id": None, "status": "pending", "plan": "trial", "expires_at": PAST},     # eligible
        {"id": 103, "tenant_id": "acme", "status": "paid", "plan": "free", "expires_at": PAST},      # paid
        {"id": 104, "tenant_id": "acme", "status": "pending", "plan": "pro", "expires_at": PAST},    # plan
        {"id": 105, "tenant_id": "acme", "status": "pending", "plan": "free", "expires_at": PAST,
         "archived_at": PAST},                                                                      # archived
        {"id": 106, "tenant_id": "acme", "status": "pending", "plan": "free", "expires_at": NOW + timedelta(hours=1)},
    ]
    # executemany takes the first row's keys: every row names them all.
    naive = [{k: (v.replace(tzinfo=None) if isinstance(v, datetime) else v)
              for k, v in {"archived_at": None, **r}.items()} for r in rows]
    try:
        with engine.connect() as conn:  # never committed: the module's database stays as it was
            conn.execute(insert(orders), naive)
            expire = kinds["expire-order"]
            page = [expire.to_eligible(r) for r in conn.execute(expire.eligible_page(
                NOW, None, 100, without_ledger=False))]
            assert [(r.subject_id, r.tenant) for r in page] == [("101", "acme"), ("102", "default")]
            assert expire.apply_in_db(conn, list(range(101, 107)), NOW) == {"101", "102"}
            assert expire.apply_in_db(conn, [101, 102], NOW) == set()  # a second delivery: no effect
            statuses = dict(conn.execute(select(orders.c.id, orders.c.status)).all())
            assert statuses == {101: "expired", 102: "expired", 103: "paid", 104: "pending", 105: "pending",
                                106: "pending"}
            assert conn.execute(select(orders.c.expired_at).where(orders.c.id == 101)).scalar() == \
                NOW.replace(tzinfo=None)
            # Deleted: 101 and 104 (not paid, due); kept: 103 (paid), 106 (not due), 102 and 105 (not asked).
            assert kinds["purge-order"].apply_in_db(conn, [101, 103, 104, 106], NOW) == {"101", "104"}
            assert set(conn.execute(select(orders.c.id)).scalars()) == {102, 103, 105, 106}
    finally:
        engine.dispose()


def test_external_effect_reads_targets_and_completes_with_then_set(tmp_path, db):
    engine = create_engine(db)
    kinds = compile_file(tmp_path, GOOD, engine)
    effect = kinds["drop-export"].external_effect
    try:
        with engine.connect() as conn:  # never committed
            conn.execute(insert(exports), [
                {"id": 1, "object_key": "a.csv", "status": "live", "retain_until": PAST.replace(tzinfo=None)},
                {"id": 2, "object_key": "b.csv", "status": "gone", "retain_until": PAST.replace(tzinfo=None)}])
            targets = effect.targets(conn, [1, 2], NOW)
            assert list(targets) == ["1"] and targets["1"]["object_key"] == "a.csv"
            assert effect.complete(conn, [1, 2], NOW) == {"1"}
            assert conn.execute(select(exports.c.status).where(exports.c.id == 1)).scalar() == "deleted"
    finally:
        engine.dispose()


def test_subject_ids_must_fit_the_id_column_in_canonical_form(tmp_path, business_db):
    kinds = compile_file(tmp_path, {**GOOD, "bare-delete": {
        "table": "orders", "id": "id", "due": "expires_at", "effect": {"delete": None}}}, business_db)
    assert kinds["bare-delete"].apply_in_db is not None  # `delete:` with nothing after it
    parse = kinds["expire-order"].parse_subject
    assert parse("7") == 7 and parse("0") == 0
    for bad in ("007", "7.0", " 7", "x", "9" * 30, "-0", ""):
        with pytest.raises(ValueError, match="not a numeric id"):
            parse(bad)


def test_a_kind_without_a_due_index_is_refused_with_the_create_index_to_add(tmp_path, business_db):
    message = refusal(tmp_path, {"purge-session": {"table": "sessions", "id": "id", "due": "expires_at",
                                                   "effect": {"delete": {}}}}, business_db)
    assert message.startswith(f"{tmp_path / 'kinds.yaml'}: kind 'purge-session': due: no index")
    assert message.endswith("CREATE INDEX ix_sessions_purge_session_due ON sessions (expires_at, id)")


def test_the_create_index_is_partial_on_the_eligibility_with_literals_quoted(tmp_path, business_db):
    hostile = "x'); DROP TABLE orders; --"
    message = refusal(tmp_path, {"purge-session": {
        "table": "sessions", "id": "id", "due": "expires_at", "eligible": {"id": {"not": hostile}},
        "effect": {"delete": {}}}}, business_db)
    statement = message.partition("add it: ")[2]
    assert statement == ("CREATE INDEX ix_sessions_purge_session_due ON sessions (expires_at, id) "
                         "WHERE id != 'x''); DROP TABLE orders; --'")
    before = schema_of(business_db)
    with business_db.begin() as conn:  # the statement is one statement and creates one index
        conn.exec_driver_sql(statement)
    after = schema_of(business_db)
    assert after[0] == before[0] and "ix_sessions_purge_session_due" in str(after[1])
    with business_db.begin() as conn:
        conn.exec_driver_sql("DROP INDEX ix_sessions_purge_session_due")


def test_check_reports_each_kind_and_describe_shows_the_declarations(tmp_path, business_db):
    path = write(tmp_path, {**GOOD, "purge-session": {"table": "sessions", "id": "id", "due": "expires_at",
                                                      "effect": {"delete": {}}},
                            "typo": {"table": "orders", "id": "id", "due": "expires_at",
                                     "eligible": {"statuz": "x"}, "effect": {"delete": {}}}})
    checks = {c.name: c for c in check_kinds(read_kinds_file(path), business_db)}
    assert all(checks[name].ok for name in GOOD)
    assert checks["expire-order"].due_index == "ix_orders_due"
    assert checks["purge-session"].create_index.startswith("CREATE INDEX")
    assert checks["typo"].problems == ["eligible.statuz: no column 'statuz' in orders"]
    listed = {k["name"]: k for k in describe(read_kinds_file(path))}
    assert listed["expire-order"]["conditions"] == [
        "status = 'pending'", "archived_at is null", "plan in ('free', 'trial')"]
    assert (listed["drop-export"]["effect"], listed["drop-export"]["due"]) == ("object-store", "retain_until")


def test_python_kinds_load_by_dotted_path_under_their_own_name(tmp_path, business_db, monkeypatch):
    (tmp_path / "mykinds.py").write_text(textwrap.dedent("""
        from sqlalchemy import Column, DateTime, Integer, MetaData, String, Table
        from lapse.kernel.kinds import CleanupKind
        orders = Table("orders", MetaData(), Column("id", Integer, primary_key=True),
                       Column("tenant_id", String), Column("status", String), Column("expires_at", DateTime))
        MINE = CleanupKind(name="mine", table=orders, id_column=orders.c.id, tenant_column=orders.c.tenant_id,
                           due_column=orders.c.expires_at, still_eligible=orders.c.status == "pending",
                           parse_subject=int, apply_in_db=lambda conn, ids, now: set())
        NOT_A_KIND = 42
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    assert compile_file(tmp_path, {"mine": {"python": "mykinds:MINE"}}, business_db)["mine"].name == "mine"
    assert refusal(tmp_path, {"other": {"python": "mykinds:MINE"}}, business_db).endswith(
        "kind 'other': python: mykinds:MINE is the kind 'mine', not 'other'")
    assert "python: 'mykinds:NOT_A_KIND' is a int, not a CleanupKind" in refusal(
        tmp_path, {"mine": {"python": "mykinds:NOT_A_KIND"}}, business_db)
    assert "python: cannot load 'nowhere_at_all:X'" in refusal(tmp_path, {"mine": {"python": "nowhere_at_all:X"}},
                                                                business_db)
    assert refusal(tmp_path, {"mine": {"python": "mykinds:MINE", "table": "orders"}}, business_db).endswith(
        "kind 'mine': table: Extra inputs are not permitted")


def test_the_starter_file_loads_and_its_commented_example_is_valid(tmp_path):
    assert read_kinds_file(starter_kinds_file()).kinds == {}
    lines = starter_kinds_file().read_text().splitlines()
    start = lines.index("# kinds:")
    example = "\n".join(line[2:] for line in lines[start:] if line.startswith("# "))
    declared = parse_kinds_text(example, tmp_path / "starter.yaml")
    assert list(declared.kinds) == ["expire-order", "purge-session", "call-partner", "drop-export", "announce-erasure",
                                    "custom"]


def test_load_kinds_needs_a_kinds_file_and_names_the_setting(business_db):
    with pytest.raises(KindsFileError, match=r"set kinds.file \(LAPSE_KINDS__FILE\) or run `lapse init`"):
        load_kinds(load_settings(kinds={"file": None}), business_db)
    with pytest.raises(KindsFileError, match=r"no-such\.yaml: cannot read the kinds file"):
        declared_names(Path("no-such.yaml"))


# --- refused, one line, naming the kind and the field --------------------------------------------

def expire(**changes) -> dict:
    return {"expire-order": {**EXPIRE_ORDER, **changes}}


REFUSED = [
    (expire(eligible={"statuz": "pending"}), "eligible.statuz: no column 'statuz' in orders"),
    (expire(table="nowhere"), "table: no table 'nowhere'"),
    (expire(table="a.b.c"), "table: expected name or schema.name, not 'a.b.c'"),
    (expire(id="ID"), "id: no column 'ID' in orders"),
    (expire(due="status"), "due: column 'status' is not a timestamp with time zone"),
    (expire(id="archived_at"), "id: column 'archived_at' has type DATETIME; an id is an integer, text or uuid"),
    (expire(tenant="amount"),
     "tenant: column 'amount' has type NUMERIC(10, 2); a tenant is a text, uuid or integer column"),
    (expire(eligible={"status": 5}),
     "eligible.status: 5 does not fit column 'status' (VARCHAR(16)): expected a string"),
    (expire(eligible={"status": True}), "eligible.status: True does not fit column 'status'"),
    (expire(eligible={"id": "7"}), "eligible.id: '7' does not fit column 'id' (INTEGER): expected an integer"),
    (expire(eligible={"status": "x" * 17}), "expected a string of at most 16 characters"),
    (expire(eligible={"flag": "yes"}), "eligible.flag: 'yes' does not fit column 'flag' (BOOLEAN): expected true"),
    (expire(eligible={"archived_at": "2026-01-01"}),
     "eligible.archived_at: timestamp column 'archived_at' takes only null"),
    (expire(eligible={"plan": {"in": []}}), "eligible.plan: in takes a list of 1 to 1000 values"),
    (expire(eligible={"plan": {"in": ["a", None]}}), "eligible.plan: in takes values, not null"),
    (expire(eligible={"plan": {"like": "a%"}}), "eligible.plan: expected a value, null, {in: [...]}"),
    (expire(eligible={"plan": ["free"]}), "eligible.plan: expected a value or null, not list"),
    (expire(eligible={"status": "a\nb"}), "eligible.status: a condition value holds no control characters"),
    (expire(effect={"update": {"set": {"status": "expired"}}, "delete": {}}),
     "effect: exactly one of update, delete, http, object-store"),
    (expire(effect={}), "effect: exactly one of update, delete, http, object-store"),
    (expire(effect={"truncate": {}}), "effect.truncate: Extra inputs are not permitted"),
    (expire(effect={"update": {}}), "effect.update.set: Field required"),
    (expire(effect={"update": {"set": {}}}), "effect.update.set: Dictionary should have at least 1 item"),
    (expire(effect={"update": {"set": {"statuz": "x"}}}), "effect.update.set.statuz: no column 'statuz' in orders"),
    (expire(effect={"update": {"set": {"status": "now"}}}), None),  # `now` for a text column is the string
    (expire(effect={"update": {"set": {"amount": "now"}}}),
     "effect.update.set.amount: `now` is only for timestamp columns, and 'amount' is not one"),
    (expire(effect={"update": {"set": {"expired_at": "2026-01-01"}}}),
     "effect.update.set.expired_at: timestamp column 'expired_at' takes `now` or null"),
    (expire(effect={"update": {"set": {"status": None}}}), "effect.update.set.status: column 'status' is NOT NULL"),
    (expire(effect={"update": {"set": {"id": 5}}}), "effect.update.set.id: an effect does not change the id column"),
    (expire(effect={"http": {"method": "POST"}}), "effect.http.url: Field required"),
    (expire(effect={"http": {"url": "ftp://x/{id}"}}), "effect.http.url: expected an http:// or https:// URL"),
    (expire(effect={"http": {"url": "https://x/{ident}"}}), "effect.http.url: no column 'ident' in orders"),
    (expire(effect={"http": {"url": "https://x/{id!r}"}}), "effect.http.url: placeholder 'id' takes no format"),
    (expire(effect={"http": {"url": "https://x/{id"}}), "effect.http.url: not a URL template"),
    (expire(effect={"http": {"url": "https://{tenant_id}.partner.example/{id}"}}),
     "effect.http.url: placeholder 'tenant_id' is in the URL's authority; placeholders go in path segments"),
    (expire(effect={"http": {"url": "https://partner.example{note}/{id}"}}),
     "effect.http.url: placeholder 'note' is in the URL's authority"),
    (expire(effect={"http": {"url": "https://partner.example:{id}/"}}),
     "effect.http.url: placeholder 'id' is in the URL's authority"),
    (expire(effect={"http": {"url": "https://x/holds?{note}=1"}}), "placeholder 'note' is in the URL's query key"),
    (expire(effect={"http": {"url": "https://x/holds#{id}"}}), "placeholder 'id' is in the URL's fragment"),
    (expire(effect={"http": {"url": "https://x/", "verb": "GET"}}), "effect.http.verb: Extra inputs"),
    (expire(effect={"object-store": {"url": "s3://b"}}), "effect.object-store.key_column: Field required"),
    (expire(effect={"object-store": {"url": "gs://b", "key_column": "note"}}),
     "effect.object-store.url: expected s3://bucket[/prefix] or file:FOLDER"),
    (expire(effect={"object-store": {"url": "s3://b", "key_column": "amount"}}),
     "effect.object-store.key_column: column 'amount' is not a text column"),
    (expire(retry={"max_attempts": "6"}), "retry.max_attempts: Input should be a valid integer"),
    (expire(retry={"max_attempts": 0}), "retry.max_attempts: Input should be greater than or equal to 1"),
    (expire(retry={"base_s": 10, "cap_s": 5}), "retry: cap_s must be at least base_s"),
    (expire(limits={"rate_per_s": 10}), "limits apply to http, object-store and kafka-produce effects only"),
    (expire(rate_per_s=10), "rate_per_s is now limits.rate_per_s, counted for all workers together"),
    (expire(due=None), "due: Input should be a valid string"),
    (expire(colour="blue"), "colour: Extra inputs are not permitted"),
    ({"Expire Order": EXPIRE_ORDER}, "kind 'Expire Order': name: a kind name is a lowercase letter"),
    ({"x" * 64: EXPIRE_ORDER}, "name: a kind name is a lowercase letter"),
    ({"ok": "orders"}, "kind 'ok': (kind): expected a mapping"),
    ({"ok": {"table": "lapse.orders", "id": "id", "due": "expires_at", "effect": {"delete": {}}}},
     "kind 'ok': table: 'lapse.orders' is in Lapse's own schema"),
    (expire(table="pg_catalog.pg_class"), "table: 'pg_catalog.pg_class' is in a system schema"),
    (expire(table="lapse_ledger"), "table: 'lapse_ledger' is one of Lapse's own tables"),
]


@pytest.mark.parametrize(("kinds", "expected"), REFUSED)
def test_wrong_declarations_are_refused_in_one_line_naming_kind_and_field(tmp_path, business_db, kinds, expected):
    before = schema_of(business_db)
    if expected is None:
        compile_file(tmp_path, kinds, business_db)
        return
    message = refusal(tmp_path, kinds, business_db)
    assert message.startswith(f"{tmp_path / 'kinds.yaml'}: kind {show(next(iter(kinds)))}: "), message
    assert expected in message, message
    assert schema_of(business_db) == before


@pytest.mark.parametrize(("text", "expected"), [
    ("kinds: [a, b]", "kinds: expected a mapping of kind name to declaration"),
    ("kinds: {}\nextra: 1", "expected one top-level key `kinds`, not 'extra'"),
    ("kinds:\n  a: {python: 'x:Y'}\n  a: {python: 'x:Z'}", "not valid YAML at line 3: key 'a' given twice"),
    ("kinds: {a: [}", "not valid YAML at line 1"),
    ("- just a list", "expected one top-level key `kinds`"),
])
def test_a_file_that_is_not_a_kinds_file_is_refused_in_one_line(tmp_path, text, expected):
    path = tmp_path / "kinds.yaml"
    path.write_text(text)
    with pytest.raises(KindsFileError) as caught:
        read_kinds_file(path)
    assert str(caught.value).startswith(f"{path}: ") and expected in str(caught.value)
    assert "\n" not in str(caught.value)


# --- hostile configuration, generated ------------------------------------------------------------

ODD = " \t\n\"'`;\\-()[]{}%$#*.,=:\0"
IDENTIFIERS = st.text(alphabet=st.sampled_from(string.ascii_letters + string.digits + "_" + ODD), min_size=1,
                      max_size=40).filter(lambda s: any(c in ODD for c in s) and "orders" not in s and
                                          s.replace("{", "").replace("}", "") not in {*orders.c.keys(), "op_key",
                                                                                       "subject_id", "tenant"})
SLOTS = ["table", "id", "tenant", "due", "eligible", "set", "key_column", "url"]


def with_identifier(slot: str, name: str) -> dict:
    """EXPIRE_ORDER with `name` in one identifier slot."""
    if slot == "eligible":
        return {**EXPIRE_ORDER, "eligible": {name: "pending"}}
    if slot == "set":
        return {**EXPIRE_ORDER, "effect": {"update": {"set": {name: "x"}}}}
    if slot == "key_column":
        return {**EXPIRE_ORDER, "effect": {"object-store": {"url": "s3://bucket", "key_column": name}}}
    if slot == "url":
        return {**EXPIRE_ORDER, "effect": {"http": {"url": "https://x/" + "{" + name.replace("{", "").replace(
            "}", "") + "}"}}}
    return {**EXPIRE_ORDER, slot: name}


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(slot=st.sampled_from(SLOTS), name=IDENTIFIERS)
def test_identifiers_that_are_no_column_are_refused_and_nothing_runs(tmp_path, business_db, slot, name):
    before = schema_of(business_db)
    with pytest.raises(KindsFileError) as caught:
        compile_file(tmp_path, {"expire-order": with_identifier(slot, name)}, business_db)
    message = str(caught.value)
    assert "\n" not in message and "\0" not in message
    assert re.match(rf"^{re.escape(str(tmp_path / 'kinds.yaml'))}: kind 'expire-order': [\w.\-']+", message)
    assert schema_of(business_db) == before


SQLISH = st.one_of(
    st.sampled_from(["'; DROP TABLE orders; --", "pending' OR '1'='1", "x\"); DELETE FROM orders; --",
                     "now()", "NULL", "1; SELECT 1", "$1", ":status", "%(x)s", "?"]),
    st.text(alphabet=st.sampled_from(string.ascii_letters + " ';\"-()=*%?:$\\"), min_size=1, max_size=16),
)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=SQLISH)
def test_values_that_look_like_sql_are_bound_strings(tmp_path, db, value):
    engine = create_engine(db)
    try:
        kinds = compile_file(tmp_path, {"expire-order": {**EXPIRE_ORDER, "eligible": {"note": value}, "effect": {
            "update": {"set": {"tenant_id": value}}}}}, engine)
        with engine.connect() as conn:  # never committed
            due = PAST.replace(tzinfo=None)
            conn.execute(insert(orders), [{"id": 1, "status": "pending", "note": value, "expires_at": due},
                                          {"id": 2, "status": "pending", "note": value + "!", "expires_at": due}])
            assert kinds["expire-order"].apply_in_db(conn, [1, 2], NOW) == {"1"}
            assert dict(conn.execute(select(orders.c.id, orders.c.tenant_id)).all()) == {1: value, 2: None}
            assert conn.execute(text("SELECT count(*) FROM sqlite_master WHERE type = 'table'")).scalar() == 3
    finally:
        engine.dispose()


YAMLISH = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-10**20, 10**20), st.floats(allow_nan=False),
              st.text(max_size=20), st.sampled_from(["now", "orders", "id", "expires_at", "status"])),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.sampled_from(["table", "id", "tenant", "due", "eligible", "effect",
                                                             "update", "delete", "http", "object-store", "set",
                                                             "url", "key_column", "retry", "in", "not", "python",
                                                             "status", "then_set", "rate_per_s", "limits",
                                                             "concurrency", "per", "priority",
                                                             "tenant_weights", "zzz"]),
                                            inner, max_size=4)),
    max_leaves=12)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.dictionaries(st.sampled_from(["table", "id", "tenant", "due", "eligible", "effect", "retry",
                                            "rate_per_s", "limits", "priority", "tenant_weights", "python",
                                            "extra"]), YAMLISH, max_size=7))
def test_any_shape_of_declaration_is_a_kind_or_a_one_line_refusal(tmp_path, business_db, raw):
    before = schema_of(business_db)
    try:
        compile_file(tmp_path, {"fuzzed": raw}, business_db)
    except KindsFileError as exc:
        assert str(exc).startswith(f"{tmp_path / 'kinds.yaml'}: kind 'fuzzed': ")
        assert "\n" not in str(exc)
    assert schema_of(business_db) == before

