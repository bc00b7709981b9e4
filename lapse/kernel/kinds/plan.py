"""What a kind would change, read before it is live (`lapse kinds plan`): the rows its effect would
change now, and hour by hour over the next 24 hours, per tenant, and a sample with the values it
would set, the rows it would delete or the calls it would make.

Every count is a bounded walk of the kind's (due, id) index with the effect's own clause
(`CleanupKind.due_clause`, the `statements.due_rows` the effects run with), so what is previewed is
what runs. The reads run in one read-only transaction under a statement timeout; on PostgreSQL
sequential scans are priced out and each statement's plan is checked first, so a table the
preview cannot read along an index is refused rather than scanned. docs/operations.md explains it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, Select, and_, func, inspect, select
from sqlalchemy.sql.elements import ColumnElement

from lapse.kernel.kinds.columns import qualified
from lapse.kernel.kinds.effects.base import ExternalEffectType
from lapse.kernel.kinds.effects.http import HttpEffect, fill_url
from lapse.kernel.kinds.effects.kafka_produce import KafkaProduceEffect
from lapse.kernel.kinds.effects.object_store import ObjectStoreEffect
from lapse.kernel.kinds.errors import KindError, show
from lapse.kernel.kinds.indexes import create_index_sql, due_index
from lapse.kernel.kinds.kind import CleanupKind
from lapse.kernel.kinds.statements import MarkDone, RowsEffect

HORIZON_HOURS = 24
DEFAULT_CAP = 1_000_000      # rows each count walks at most; past it the count says "at least"
MAX_CAP = 100_000_000
DEFAULT_SAMPLE = 10
MAX_SAMPLE = 1_000
TOP_TENANTS = 10
DEFAULT_TIMEOUT_S = 30.0
SHOWN_VALUE_CHARS = 200


@dataclass(frozen=True)
class Count:
    """Rows counted by a bounded walk: exact, or at least `rows` when the walk reached the cap."""

    rows: int
    capped: bool = False


@dataclass(frozen=True)
class HourCount:
    """Rows that become due in (start, end]: what the effect would change in that hour."""

    start: datetime
    end: datetime
    count: Count


@dataclass(frozen=True)
class TenantCounts:
    """The tenants with the most rows of a window (at most TOP_TENANTS), how many tenants the walk
    saw, and whether the walk reached the cap (the counts are then of the rows walked)."""

    top: list[tuple[str, int]]
    tenants: int
    capped: bool


@dataclass(frozen=True)
class SampleRow:
    """One row the kind would act on, first in (due, id) order: `would` is what its effect does to
    it (the columns it sets, old → new; the row it deletes; the call it makes)."""

    subject_id: str
    op_key: str
    tenant: str
    due_at: datetime
    would: dict[str, Any]


@dataclass(frozen=True)
class KindPlan:
    """One kind's preview at `now`: the typed result `lapse kinds plan` prints (and that a
    comparison with the kind's shadow results can sit next to)."""

    kind: str
    table: str
    effect: str
    due_index: str
    now: datetime
    cap: int
    eligible: Count               # the eligibility alone, due or not
    due_now: Count                # what the effect would change at `now`
    hours: list[HourCount]        # what becomes due in each of the next HORIZON_HOURS hours
    tenants_now: TenantCounts
    tenants_next: TenantCounts    # over the next HORIZON_HOURS hours
    sample: list[SampleRow] = field(default_factory=list)

    @property
    def next_total(self) -> int:
        return sum(h.count.rows for h in self.hours)

    def to_dict(self) -> dict[str, Any]:
        """The plan as `--json` prints it: plain values, timestamps in ISO 8601."""
        def tenants(t: TenantCounts) -> dict[str, Any]:
            return {"top": [{"tenant": name, "rows": n} for name, n in t.top], "tenants": t.tenants,
                    "capped": t.capped}

        data: dict[str, Any] = jsonable({
            "kind": self.kind, "table": self.table, "effect": self.effect, "due_index": self.due_index,
            "now": self.now, "cap": self.cap, "eligible": asdict(self.eligible), "due_now": asdict(self.due_now),
            "next_24h": self.next_total,
            "hours": [{"start": h.start, "end": h.end, **asdict(h.count)} for h in self.hours],
            "tenants": {"now": tenants(self.tenants_now), "next_24h": tenants(self.tenants_next)},
            "sample": [asdict(r) for r in self.sample]})
        return data


@dataclass(frozen=True)
class PlanOptions:
    """How far a preview reads: rows per count, sample rows, tenants listed, statement timeout."""

    cap: int = DEFAULT_CAP
    sample: int = DEFAULT_SAMPLE
    top_tenants: int = TOP_TENANTS
    timeout_s: float = DEFAULT_TIMEOUT_S

    def __post_init__(self) -> None:
        if not 1 <= self.cap <= MAX_CAP or not 0 <= self.sample <= MAX_SAMPLE or not 1 <= self.top_tenants <= 1000:
            raise ValueError(f"a preview reads 1 to {MAX_CAP} rows per count and 0 to {MAX_SAMPLE} sample rows")
        if not 0 < self.timeout_s <= 3600:
            raise ValueError("a preview's statement timeout is more than 0 and at most 3600 s")


class PlanRefused(KindError):
    """The preview will not read `kind`'s table: it would not read along its due index."""

    def __init__(self, kind: str, field: str, message: str) -> None:
        super().__init__(field, message)
        self.kind = kind


@contextmanager
def read_only(engine: Engine, timeout_s: float) -> Iterator[Connection]:
    """One read-only transaction: on PostgreSQL `READ ONLY` with a local statement timeout and
    sequential scans priced out (so a usable index is always chosen); on SQLite `query_only`.
    It is rolled back at the end: nothing is written, whatever happens."""
    with engine.connect() as conn:
        if conn.dialect.name == "postgresql":
            conn.exec_driver_sql("SET TRANSACTION READ ONLY")
            conn.exec_driver_sql(f"SET LOCAL statement_timeout = {max(1, round(timeout_s * 1000))}")
            conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
            try:
                yield conn
            finally:
                conn.rollback()
            return
        conn.begin()  # first: Lapse's SQLite engine begins with BEGIN IMMEDIATE, which query_only refuses
        raw: Any = conn.connection.driver_connection
        raw.execute("PRAGMA query_only = ON")
        try:
            yield conn
        finally:
            conn.rollback()
            raw.execute("PRAGMA query_only = OFF")


def database_now(conn: Connection) -> datetime:
    """The database's clock (PostgreSQL's `now()`); UTC now on SQLite, which has no time zones."""
    if conn.dialect.name == "postgresql":
        now: datetime = conn.execute(select(func.now())).scalar_one()
        return now
    return datetime.now(UTC)


def due_indexes(conn: Connection, kind: CleanupKind) -> set[str]:
    """The names of the table's indexes that lead with the kind's due column."""
    found = inspect(conn).get_indexes(kind.table.name, schema=kind.table.schema)
    return {str(i["name"]) for i in found if i["column_names"][:1] == [kind.due_column.name]}


def _reads(node: dict[str, Any], table: str) -> Iterator[tuple[str, str | None]]:
    """(node type, index name) of every plan node reading `table`; a bitmap scan by its indexes."""
    if node.get("Relation Name") == table:
        if node.get("Node Type") == "Bitmap Heap Scan":
            below = [n for n in _nodes(node) if n.get("Node Type") == "Bitmap Index Scan"]
            yield from ((n["Node Type"], n.get("Index Name")) for n in below)
        else:
            yield str(node.get("Node Type")), node.get("Index Name")
    for child in node.get("Plans", ()):
        yield from _reads(child, table)


def _nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", ()):
        yield from _nodes(child)


def explain_reads(conn: Connection, stmt: Select[Any], table: str) -> list[tuple[str, str | None]] | None:
    """How `stmt` would read `table`, by PostgreSQL's EXPLAIN: (node type, index name) of each read
    (`Seq Scan`, None for a sequential scan); None on a database without EXPLAIN's plans."""
    if conn.dialect.name != "postgresql":
        return None
    compiled = stmt.compile(dialect=conn.dialect)
    (plan,) = conn.exec_driver_sql(f"EXPLAIN (FORMAT JSON) {compiled}", compiled.params).scalar_one()
    return list(_reads(plan["Plan"], table))


def _walk(kind: CleanupKind, where: ColumnElement[bool], cap: int, *columns: Any) -> Any:
    """The first `cap` rows of `where` in (due, id) order: a bounded walk of the due index."""
    return (select(*columns or (kind.id_column,)).where(where)
            .order_by(kind.due_column, kind.id_column).limit(cap).subquery())


def _count(kind: CleanupKind, where: ColumnElement[bool], cap: int) -> Select[Any]:
    return select(func.count()).select_from(_walk(kind, where, cap))


def _tenants(kind: CleanupKind, where: ColumnElement[bool], cap: int, top: int) -> Select[Any]:
    walked = _walk(kind, where, cap, kind.tenant_column.label("tenant"))
    n = func.count().label("n")
    return (select(walked.c.tenant, n, func.count().over().label("tenants"), func.sum(n).over().label("walked"))
            .group_by(walked.c.tenant).order_by(n.desc(), walked.c.tenant).limit(top))


@dataclass(frozen=True)
class PlanStatements:
    """Every statement a kind's preview runs, each a bounded walk of the due index with the
    kind's own clause (`CleanupKind.due_clause`): what an EXPLAIN of them shows is what it reads."""

    eligible: Select[Any]
    due_now: Select[Any]
    hours: list[tuple[datetime, datetime, Select[Any]]]
    tenants_now: Select[Any]
    tenants_next: Select[Any]
    sample: Select[Any]

    def all(self) -> list[Select[Any]]:
        return [self.eligible, self.due_now, *(h[2] for h in self.hours), self.tenants_now, self.tenants_next,
                self.sample]


SAMPLE_TENANT = "lapse_plan_tenant"


def plan_statements(kind: CleanupKind, now: datetime, options: PlanOptions) -> PlanStatements:
    """The statements of `kind`'s preview at `now`: hour h counts the rows the effect's clause
    admits at now + h + 1 h whose due time is past now + h (so the walk starts there)."""
    cap = options.cap
    end = now + timedelta(hours=HORIZON_HOURS)
    hours = []
    for h in range(HORIZON_HOURS):
        start, stop = now + timedelta(hours=h), now + timedelta(hours=h + 1)
        hours.append((start, stop, _count(kind, and_(kind.due_clause(stop), kind.due_column > start), cap)))
    upcoming = and_(kind.due_clause(end), kind.due_column > now)
    sample = select(_walk(kind, kind.due_clause(end), max(options.sample, 1), *kind.table.columns,
                          kind.tenant_column.label(SAMPLE_TENANT)))
    return PlanStatements(
        eligible=_count(kind, kind.still_eligible, cap), due_now=_count(kind, kind.due_clause(now), cap),
        hours=hours, tenants_now=_tenants(kind, kind.due_clause(now), cap, options.top_tenants),
        tenants_next=_tenants(kind, upcoming, cap, options.top_tenants), sample=sample)


class _Reader:
    """Runs a kind's preview statements, each one's plan checked first."""

    def __init__(self, conn: Connection, kind: CleanupKind, cap: int) -> None:
        self.conn = conn
        self.kind = kind
        self.cap = cap
        self.indexes = due_indexes(conn, kind)
        self.used: set[str] = set()  # the indexes the reads went along, by EXPLAIN

    def rows(self, stmt: Select[Any]) -> Sequence[Any]:
        reads = explain_reads(self.conn, stmt, self.kind.table.name)
        off = [f"{node} {index}" if index else node for node, index in reads or () if index not in self.indexes]
        if off:
            k = self.kind
            raise PlanRefused(k.name, "due", f"the preview would read {qualified(k.table)} by {off[0]}, not along "
                                             f"an index on ({k.due_column.name}, {k.id_column.name}) that covers "
                                             f"the kind's condition; add one: {create_index_sql(self.conn, k)}")
        self.used.update(str(index) for _, index in reads or ())
        return self.conn.execute(stmt).all()

    def count(self, stmt: Select[Any]) -> Count:
        (rows,), = self.rows(stmt)
        return Count(int(rows), capped=rows >= self.cap)

    def tenants(self, stmt: Select[Any]) -> TenantCounts:
        found = self.rows(stmt)
        seen, walked = (int(found[0].tenants), int(found[0].walked)) if found else (0, 0)
        return TenantCounts([(str(r.tenant), int(r.n)) for r in found], seen, capped=walked >= self.cap)


def plan_kind(conn: Connection, kind: CleanupKind, options: PlanOptions, now: datetime) -> KindPlan:
    """The preview of `kind` at `now` on `conn` (open it with `read_only`). PlanRefused when the
    table has no (due, id) index or a statement would not read along one."""
    index = due_index(conn, kind)
    if index is None:
        raise PlanRefused(kind.name, "due", f"no index on ({kind.due_column.name}, {kind.id_column.name}) of "
                                            f"{qualified(kind.table)}: the preview does not scan a table; add it: "
                                            f"{create_index_sql(conn, kind)}")
    read = _Reader(conn, kind, options.cap)
    stmts = plan_statements(kind, now, options)
    eligible, due_now = read.count(stmts.eligible), read.count(stmts.due_now)
    hours = [HourCount(start, stop, read.count(stmt)) for start, stop, stmt in stmts.hours]
    tenants_now = read.tenants(stmts.tenants_now)
    tenants_next = read.tenants(stmts.tenants_next)
    sample = sample_rows(read, kind, now, stmts.sample) if options.sample else []
    return KindPlan(
        kind=kind.name, table=qualified(kind.table), effect=effect_tag(kind),
        due_index=", ".join(sorted(read.used)) or index, now=now, cap=options.cap, eligible=eligible,
        due_now=due_now, hours=hours, tenants_now=tenants_now, tenants_next=tenants_next, sample=sample)


def plan_kinds(engine: Engine, kinds: Sequence[CleanupKind], options: PlanOptions,
               now: datetime | None = None) -> list[KindPlan]:
    """Each kind's preview, all in one read-only transaction at one `now` (the database's clock
    unless given: a test or an operator may ask about another time)."""
    with read_only(engine, options.timeout_s) as conn:
        at = now if now is not None else database_now(conn)
        return [plan_kind(conn, kind, options, at) for kind in kinds]


def effect_tag(kind: CleanupKind) -> str:
    if isinstance(kind.apply_in_db, RowsEffect):
        return "delete" if kind.apply_in_db.deletes else "update"
    declared = kind.external_effect.declared if kind.external_effect is not None else None
    return declared.tag if isinstance(declared, ExternalEffectType) else "python"


def sample_rows(read: _Reader, kind: CleanupKind, now: datetime, stmt: Select[Any]) -> list[SampleRow]:
    """The sample's rows, each with what the effect would do to it at its due time (or at `now`,
    for a row due already)."""
    out = []
    for row in read.rows(stmt):
        values = row._mapping
        subject, tenant, due = values[kind.id_column.name], str(values[SAMPLE_TENANT]), values[kind.due_column.name]
        current = {c.name: values[c.name] for c in kind.table.columns}
        out.append(SampleRow(str(subject), kind.row_op_key(subject, current), tenant, due,
                             would(kind, current, str(subject), tenant, max(now, due))))
    return out


def _changes(set_values: dict[str, Any], current: dict[str, Any]) -> dict[str, list[Any]]:
    return {name: [current.get(name), value] for name, value in set_values.items()}


def would(kind: CleanupKind, row: dict[str, Any], subject_id: str, tenant: str, at: datetime) -> dict[str, Any]:
    """What the kind's effect would do to `row` at `at`, from the effect's own compiled values: the
    columns an update sets (old → new), the row a delete removes, the call an external effect makes
    and what it sets afterwards; a Python kind's effect is its own code, so only its name."""
    effect = kind.apply_in_db
    if isinstance(effect, RowsEffect):
        return {"delete": row} if effect.deletes else {"set": _changes(effect.set_values(at), row)}
    external = kind.external_effect
    if external is None:
        return {"python": "the kind's own apply_in_db"}
    declared = external.declared
    call: dict[str, Any]
    op_key = kind.row_op_key(subject_id, row)
    if isinstance(declared, HttpEffect):
        values = {**row, "op_key": op_key, "subject_id": subject_id, "tenant": tenant}
        try:
            url = fill_url(declared.url, values)
        except ValueError as exc:
            url = f"(invalid: {exc})"
        call = {"http": {"method": declared.method, "url": url}}
    elif isinstance(declared, ObjectStoreEffect):
        call = {"object-store": {"url": declared.url, "delete": row.get(declared.key_column)}}
    elif isinstance(declared, KafkaProduceEffect):
        call = {"kafka-produce": {"topic": declared.topic, "key": op_key}}
    else:
        return {"python": "the kind's own call"}
    done = external.complete
    if isinstance(done, MarkDone) and done.values:
        call["then_set"] = _changes(done.set_values(at), row)
    return call


def jsonable(value: Any) -> Any:
    """`value` as plain JSON: timestamps in ISO 8601, other values as text cut to SHOWN_VALUE_CHARS."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if value is None or isinstance(value, (bool, int, float)):
        return value
    text_value = value if isinstance(value, str) else str(value)
    return text_value if len(text_value) <= SHOWN_VALUE_CHARS else show(text_value)

