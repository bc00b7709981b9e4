"""Recurring operations, without a broker or PostgreSQL: the op-key form with a generation (round
trip, hostile values, every existing key unchanged), a generation's canonical text in Python and in
SQL (an SQLite file), the effect statements checking the generation, and generation columns that
cannot be one refused in one line naming the kind and the field."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Index,
    Integer,
    MetaData,
    Numeric,
    SmallInteger,
    String,
    Table,
    create_engine,
    delete,
    insert,
    select,
    update,
)

from lapse.kernel.kinds import KindsFileError, compile_kinds, generation_text, read_kinds_file
from lapse.kernel.kinds.errors import show
from lapse.kernel.kinds.generations import Generation, timestamp_text
from lapse.kernel.ledger import (
    MAX_OP_KEY,
    ExpiryEvent,
    InvalidEvent,
    InvalidOpKey,
    expiry_event,
    expiry_record,
    op_key,
    op_key_parts,
    parse_op_key,
)

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
RUN = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# The op key's parts as the ledger's columns and the design page (docs/design/generations.md) state
# them, restated here as the oracle: kind, subject id, generation.
KINDS = st.from_regex(r"\A[a-z][a-z0-9-]{0,62}\Z")
SUBJECTS = st.from_regex(r"\A[A-Za-z0-9._/-]{1,128}\Z")
AWARE = st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30),
                     timezones=st.sampled_from([UTC, timezone(timedelta(hours=14)), timezone(-timedelta(hours=12))]))
INT64 = st.integers(-(2**63), 2**63 - 1)
GENERATIONS = st.one_of(AWARE.map(timestamp_text), INT64.map(str))
TIMESTAMPS = Generation(Column("hold_started_at", DateTime(timezone=True)), "postgresql", timestamp=True)
VERSIONS = Generation(Column("version", BigInteger), "postgresql", timestamp=False, low=-(2**63), high=2**63 - 1)

business = MetaData()
holds = Table(
    "holds", business,
    Column("id", Integer, primary_key=True),
    Column("tenant", String(64), nullable=False),
    Column("status", String(16), nullable=False),
    Column("hold_started_at", DateTime, nullable=False),
    Column("version", BigInteger, nullable=False),
    Column("small_version", SmallInteger, nullable=False),
    Column("expires_at", DateTime, nullable=False),
    Column("paused_at", DateTime),
    Column("label", String(32), nullable=False),
    Column("amount", Numeric(10, 2), nullable=False),
    Column("released_at", DateTime),
    Index("ix_holds_due", "expires_at", "id"),
)
RELEASE = {"table": "holds", "id": "id", "tenant": "tenant", "due": "expires_at", "eligible": {"status": "held"},
           "generation": "hold_started_at",
           "effect": {"update": {"set": {"status": "released", "released_at": "now"}}}}


@pytest.fixture(scope="module")
def holds_db(tmp_path_factory):
    path = tmp_path_factory.mktemp("generations") / "business.db"
    eng = create_engine(f"sqlite:///{path}")
    business.create_all(eng)
    yield eng
    eng.dispose()


def compiled(folder, engine, **changes):
    path = folder / "kinds.yaml"
    path.write_text(yaml.safe_dump({"kinds": {"release-hold": {**RELEASE, **changes}}}, sort_keys=False))
    return compile_kinds(read_kinds_file(path), engine)["release-hold"]


# --- the op-key form ------------------------------------------------------------------------------

@RUN
@given(KINDS, SUBJECTS, GENERATIONS)
@example("k" * 63, "s" * 128, "99991230T235959.999999Z")  # the longest: past the ledger's 200
@example("release-reservation", "42", "20261130T120000.000000Z")
def test_an_op_key_with_a_generation_parses_back_to_its_parts(kind, subject, generation):
    key = f"{kind}:{subject}@{generation}"
    if len(key) > MAX_OP_KEY:
        with pytest.raises(InvalidOpKey, match="at most 200 characters"):
            op_key(kind, subject, generation)
        with pytest.raises(InvalidOpKey):
            op_key_parts(key)
        return
    assert op_key(kind, subject, generation) == key
    assert op_key_parts(key) == (kind, subject, generation)
    assert parse_op_key(key) == (kind, subject)  # what every reader of a kind and subject id sees
    # An event naming it passes the validation every consumed record goes through.
    event = expiry_event(kind, subject, "t1", NOW, source="sweep", generation=generation)
    decoded = {**expiry_record(event, NOW), "due_at": NOW, "produced_at": NOW}
    again = ExpiryEvent.from_record(decoded, NOW)
    assert (again.op_key, again.subject_id, again.subject_key) == (key, subject, f"{subject}@{generation}")
    # The subject id is the part before the mark: an event whose subject id carries the generation
    # too does not match its own op key.
    with pytest.raises(InvalidEvent):
        ExpiryEvent.from_record({**decoded, "subject_id": f"{subject}@{generation}"}, NOW)


@RUN
@given(KINDS, SUBJECTS)
def test_every_op_key_without_a_generation_stays_as_it_was(kind, subject):
    key = f"{kind}:{subject}"
    assert op_key(kind, subject) == key
    assert op_key_parts(key) == (kind, subject, None)
    assert expiry_event(kind, subject, "t1", NOW, source="sweep").subject_key == subject


HOSTILE_KEYS = st.one_of(
    st.text(max_size=260),
    st.lists(st.sampled_from(["k", ":", "@", "42", "-", ".", "/", "Z", "T", " ", "\x00", "é", "@@", "::"]),
             max_size=40).map("".join),
    st.tuples(KINDS, SUBJECTS, st.text(max_size=40)).map(lambda p: f"{p[0]}:{p[1]}@{p[2]}"),
)


@RUN
@given(HOSTILE_KEYS)
@example("k:1@")
@example("k:1@2@3")
@example("k:@1")
@example("k:1@2:3")
@example("k:1@ 2")
@example("k:1@2\n")
@example("k:1\n")
def test_a_hostile_op_key_is_refused_or_is_exactly_what_its_parts_make(key):
    try:
        kind, subject, generation = op_key_parts(key)
    except InvalidOpKey as exc:
        assert "\n" not in str(exc).replace(repr(key[:80]), "")
        return
    assert op_key(kind, subject, generation) == key and len(key) <= MAX_OP_KEY
    assert re.fullmatch(r"[A-Za-z0-9._/:@-]+", key) and key.count(":") == 1 and key.count("@") <= 1


# --- a generation's text -------------------------------------------------------------------------

@RUN
@given(AWARE, INT64)
def test_a_generation_reads_back_as_it_was_written(moment, version):
    assert TIMESTAMPS.parse(TIMESTAMPS.text(moment)) == moment
    assert len(TIMESTAMPS.text(moment)) == 23 and TIMESTAMPS.text(moment) == generation_text(moment)
    assert VERSIONS.parse(VERSIONS.text(version)) == version == VERSIONS.parse(generation_text(version))


@RUN
@given(st.one_of(st.text(max_size=40), GENERATIONS.map(lambda g: g.replace("0", "00", 1)),
                 GENERATIONS.map(lambda g: g.lower()), GENERATIONS.map(lambda g: "+" + g)))
@example("20261130T120000Z")
@example("20261130T120000.000000z")
@example("20261130T240000.000000Z")
@example("20260230T120000.000000Z")
@example("00000101T000000.000000Z")
@example("-0")
@example("007")
@example("9223372036854775808")
@example("7\n")
@example("20261130T120000.000000Z\n")
def test_a_generation_in_any_other_text_is_refused(text):
    for generation in (TIMESTAMPS, VERSIONS):
        try:
            value = generation.parse(text)
        except ValueError as exc:
            assert generation.name in str(exc)
            continue
        assert generation.text(value) == text  # canonical: one op key per lapse


@pytest.mark.parametrize("value", [datetime(2026, 1, 1), True, 1.5, "2026-01-01", None])
def test_an_application_generation_is_an_aware_datetime_or_an_int(value):
    with pytest.raises(ValueError, match=r"a generation is|timezone-aware"):
        generation_text(value)


@pytest.fixture(scope="module")
def release_hold(holds_db, tmp_path_factory):
    return compiled(tmp_path_factory.mktemp("kinds"), holds_db)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.datetimes(min_value=datetime(1000, 1, 1), max_value=datetime(9999, 12, 30), timezones=st.just(UTC)),
                min_size=1, max_size=20, unique=True))
def test_sql_writes_a_timestamp_generation_as_python_does(holds_db, release_hold, moments):
    """The sweep's and the reconciler's probes compare the text SQL writes with op keys Python
    wrote: on SQLite (PostgreSQL: tests/integration/test_generations.py)."""
    kind = release_hold
    rows = [{"id": i, "tenant": "t", "status": "held", "hold_started_at": m, "version": 1, "small_version": 1,
             "expires_at": m, "label": "x", "amount": 1} for i, m in enumerate(moments)]
    with holds_db.begin() as conn:
        conn.execute(delete(kind.table))
        conn.execute(insert(kind.table), rows)
        written = dict(conn.execute(select(kind.id_column, kind.generation_sql())).all())
        conn.execute(delete(kind.table))
    assert written == {i: timestamp_text(m) for i, m in enumerate(moments)}


# --- the effect checks the generation ------------------------------------------------------------

def held_again(engine, kind, hold_id: int, first: datetime, second: datetime) -> tuple:
    """The only hold: `hold_id`, held since `second` and due; the parsed subjects of its lapses since
    `first` and since `second`."""
    with engine.begin() as conn:
        conn.execute(delete(kind.table))
        conn.execute(insert(kind.table).values(id=hold_id, tenant="t", status="held", hold_started_at=second,
                                               version=1, small_version=1, expires_at=NOW - timedelta(minutes=5),
                                               label="x", amount=1))
    return kind.parse_key(f"{hold_id}@{timestamp_text(first)}"), kind.parse_key(f"{hold_id}@{timestamp_text(second)}")


def test_the_effect_changes_a_row_only_while_it_is_of_the_asked_generation(tmp_path, holds_db):
    kind = compiled(tmp_path, holds_db)
    first, second = NOW - timedelta(days=2), NOW - timedelta(hours=1)
    old, new = held_again(holds_db, kind, 7, first, second)
    assert kind.apply_in_db is not None
    with holds_db.begin() as conn:
        rows = kind.subject_rows(conn, [old, new])
        assert not rows[f"7@{timestamp_text(first)}"].eligible and rows[f"7@{timestamp_text(second)}"].eligible
        assert kind.apply_in_db(conn, [old], NOW) == set()  # a late delivery of the earlier lapse
        assert conn.execute(select(kind.table.c.status)).scalar() == "held"
        assert kind.apply_in_db(conn, [old, new], NOW) == {f"7@{timestamp_text(second)}"}
        assert conn.execute(select(kind.table.c.status)).scalar() == "released"
        # Held again: the next lapse is another operation, its key from the row.
        conn.execute(update(kind.table).values(status="held", hold_started_at=NOW))
        page = [kind.to_eligible(r) for r in conn.execute(kind.eligible_page(NOW, None, 10, without_ledger=False))]
    assert [kind.op_key(r.subject_id, r.generation) for r in page] == [f"release-hold:7@{timestamp_text(NOW)}"]


def test_an_external_effect_is_called_and_completed_only_for_the_asked_generation(tmp_path, holds_db):
    kind = compiled(tmp_path, holds_db, effect={"http": {"url": "https://partner.example/holds/{id}",
                                                          "then_set": {"status": "released"}}})
    first, second = NOW - timedelta(days=2), NOW - timedelta(hours=1)
    old, new = held_again(holds_db, kind, 8, first, second)
    external = kind.external_effect
    assert external is not None
    with holds_db.begin() as conn:
        assert list(external.targets(conn, [old, new], NOW)) == [f"8@{timestamp_text(second)}"]
        assert external.complete(conn, [old], NOW) == set()
        assert conn.execute(select(kind.table.c.status)).scalar() == "held"
        assert external.complete(conn, [new], NOW) == {f"8@{timestamp_text(second)}"}
        assert conn.execute(select(kind.table.c.status)).scalar() == "released"


def test_an_op_key_that_does_not_fit_the_kind_is_refused_by_its_parser(tmp_path, holds_db):
    with_generation, without = compiled(tmp_path, holds_db), compiled(tmp_path, holds_db, generation=None)
    with pytest.raises(ValueError, match="tells its lapses apart by hold_started_at"):
        with_generation.parse_key("7")
    with pytest.raises(ValueError, match="is not a time of hold_started_at"):
        with_generation.parse_key("7@42")
    with pytest.raises(ValueError, match="declares no generation"):
        without.parse_key("7@20261130T120000.000000Z")
    versioned = compiled(tmp_path, holds_db, generation="small_version")
    assert versioned.parse_key("7@-32768") == (7, -32768)
    with pytest.raises(ValueError, match="an integer from -32768 to 32767"):
        versioned.parse_key("7@32768")


# --- refused, one line, naming the kind and the field ---------------------------------------------

@pytest.mark.parametrize(("generation", "expected"), [
    ("started", "generation: no column 'started' in holds"),
    ("paused_at", "generation: column 'paused_at' of holds is nullable; a generation column is NOT NULL"),
    ("label", "generation: column 'label' has type VARCHAR(32); a generation is a timestamp with time zone "
              "or an integer column"),
    ("amount", "generation: column 'amount' has type NUMERIC(10, 2); a generation is a timestamp"),
    ("id", "generation: column 'id' is the kind's id or due column"),
    ("expires_at", "generation: column 'expires_at' is the kind's id or due column"),
    ("", "generation: String should have at least 1 character"),
    (5, "generation: Input should be a valid string"),
    ("hold_started_at; drop table holds", "generation: no column 'hold_started_at; drop table holds'"),
])
def test_a_generation_column_that_cannot_be_one_is_refused_in_one_line(tmp_path, holds_db, generation, expected):
    with pytest.raises(KindsFileError) as caught:
        compiled(tmp_path, holds_db, generation=generation)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{tmp_path / 'kinds.yaml'}: kind {show('release-hold')}: ")
    assert expected in message, message
