"""`lapse status` figures: the ledger by state and kind, the alarm signals (oldest eligible but
unfinished operation, expired claims, dead letters, the outbox backlog), the call limits (each
route's rate and slots, each endpoint's calls) and consumer lag of every declared group.

The alarm's oldest eligible age is the oldest of two: unfinished ledger rows past due, and due
business rows that have no ledger row yet (with no sweep running, nothing else shows them)."""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, func, or_, select

from lapse.kernel.brakes import ALL_TENANTS, read_pauses
from lapse.kernel.clock import database_now
from lapse.kernel.findings import (
    ARCHIVE,
    AUDIT,
    CIRCUIT,
    CLOCK,
    LAST_PASS,
    LAST_VERDICT,
    RECONCILE,
    TRANSITIONS_ARCHIVED,
    Finding,
    latest_findings,
)
from lapse.kernel.kinds import CleanupKind, KindsFileError, declared_names, load_kinds
from lapse.kernel.ledger import (
    DEAD_LETTER,
    DISCARDED,
    HELD,
    SHADOWED,
    UNFINISHED,
    expired_claims,
    has_ledger_row,
    ledger_counts,
    ledger_state_of,
    oldest_unfinished_due,
    outbox_backlog,
    parked_counts,
)
from lapse.kernel.ledger.partitions import OUTBOX, TRANSITIONS, default_rows
from lapse.kernel.limits import endpoints_status, routes_status
from lapse.kernel.settings import Settings
from lapse.readers.offsets import OffsetsError, group_lag, group_states


def _age_s(now: datetime, since: datetime | None) -> float | None:
    return None if since is None else round(max(0.0, (now - since).total_seconds()), 3)


def ledger_status(conn: Connection, now: datetime) -> dict[str, Any]:
    """Counts by state and kind, the oldest eligible-but-unfinished age, expired claims.

    `ledger` is {state: {kind: rows}}; the states listed in `ledger_estimated` (applied and skipped
    on a large PostgreSQL ledger, none otherwise) carry the planner's estimates, not exact counts
    (`lapse.kernel.ledger.reads.ledger_counts` says when and how). On a large ledger no query here
    scans it: each reads a partial index or the planner's statistics."""
    by_state: dict[str, dict[str, int]] = {}
    counted = ledger_counts(conn)
    for count in counted.counts:
        by_state.setdefault(count.state, {})[count.kind] = count.rows
    oldest_due = oldest_unfinished_due(conn, now)
    expired = expired_claims(conn, now)
    backlog = outbox_backlog(conn)
    return {
        "ledger": {s: dict(sorted(k.items())) for s, k in sorted(by_state.items())},
        "ledger_estimated": sorted(counted.estimated),
        "oldest_eligible_age_s": _age_s(now, oldest_due),
        "dead_letters": sum(by_state.get(DEAD_LETTER, {}).values()),
        "discarded": sum(by_state.get(DISCARDED, {}).values()),
        "expired_claims": {"count": expired.count,
                           "oldest_expired_for_s": _age_s(now, expired.oldest_claim_until)},
        "outbox": {"unsent": backlog.unsent, "oldest_unsent_age_s": _age_s(now, backlog.oldest_created_at)},
    }


# Eligible rows counted per kind, at most: enough to tell "none", "a few" and "a backlog" apart
# without counting a whole business table (each probe walks the kind's due index).
ELIGIBLE_CAP = 10_000


def eligible_work(conn: Connection, kind: CleanupKind, now: datetime, cap: int = ELIGIBLE_CAP) -> dict[str, Any]:
    """Due business rows of `kind` still eligible whose cleanup is not done: no ledger row yet, or
    an unfinished one (for a kind with a generation, of the row's current generation: a subject
    that lapsed again is work left). Counted up to `cap` along the kind's (due, id) index, with the
    oldest due, and the kind's generation column when it has one."""
    generation = kind.generation_sql()  # a kind with one: the work of the row's current generation
    waiting = or_(~has_ledger_row(kind.name, kind.id_column, generation),
                  ledger_state_of(kind.name, kind.id_column, generation).in_(UNFINISHED))
    due = (select(kind.due_column.label("due")).where(kind.still_eligible, kind.due_column <= now, waiting)
           .order_by(kind.due_column, kind.id_column).limit(cap).subquery())
    rows, oldest = conn.execute(select(func.count(), func.min(due.c.due))).one()
    work = {"rows": rows, "capped": rows >= cap, "oldest_due_age_s": _age_s(now, oldest)}
    return work if kind.generation is None else {**work, "generation": kind.generation.name}


def eligible_status(settings: Settings, conn: Connection, now: datetime) -> dict[str, Any] | None:
    """Eligible work left per declared kind; None when no kinds file is configured."""
    if settings.kinds.file is None:
        return None
    kinds = load_kinds(settings, conn)
    return {name: eligible_work(conn, kind, now) for name, kind in sorted(kinds.items())}


def lag_status(settings: Settings, now: datetime) -> list[dict[str, Any]]:
    """Lag per declared (group, topic): records behind and age of the oldest unconsumed record,
    with the group's state and members (`group_state`: running or not)."""
    reads = sorted(settings.topology.reads())
    rows: list[dict[str, Any]] = []
    for group, topic in reads:
        try:
            parts = group_lag(settings, group, topic, now)
        except OffsetsError as exc:
            rows.append({"group": group, "topic": topic, "error": str(exc)})
            continue
        ages = [p.seconds for p in parts if p.seconds is not None]
        rows.append({"group": group, "topic": topic, "records": sum(p.records for p in parts),
                     "seconds": round(max(ages), 3) if ages else 0.0,
                     "partitions": [asdict(p) for p in parts]})
    # Asked after the offsets, whose reading found each group's coordinator.
    states = group_states(settings, sorted({group for group, _ in reads}))
    return [{**row, "group_state": states.get(row["group"])} for row in rows]


# How recent a role's clock measurement must be to be shown (roles measure every minute by default).
CLOCK_FRESH = timedelta(minutes=15)
# How many rows of a DEFAULT partition status counts at most (a bounded read).
DEFAULT_ROWS_CAP = 10_000


def findings_status(conn: Connection, now: datetime) -> dict[str, Any]:
    """What the roles last found: the dead-letter circuits open at `now`, the reconciler's last
    pass and the audit's last verdict (None: never recorded), the clock skew of each role process
    that measured it in the last CLOCK_FRESH by the database's clock (a process gone is left out),
    and how far the archive of transitions reaches, with its lag by the database's clock (the
    archive's lag on the topics is its group's lag)."""
    kept = latest_findings(conn)
    db_now = database_now(conn)
    shown_after = db_now - CLOCK_FRESH
    one = {(f.role, f.subject): f for f in kept if f.role in (RECONCILE, AUDIT, ARCHIVE)}
    archived = one.get((ARCHIVE, TRANSITIONS_ARCHIVED))
    return {"open_circuits": [f.to_dict() for f in kept if f.role == CIRCUIT and f.until and f.until > now],
            "reconciler": _dict(one.get((RECONCILE, LAST_PASS))), "audit": _dict(one.get((AUDIT, LAST_VERDICT))),
            "clocks": [f.to_dict() for f in kept if f.role == CLOCK and f.at >= shown_after],
            "archive": None if archived is None else {**archived.to_dict(), "lag_s": _age_s(db_now, archived.at)}}


def _dict(finding: Finding | None) -> dict[str, Any] | None:
    return None if finding is None else finding.to_dict()


def brakes_status(conn: Connection, now: datetime, declared: frozenset[str] | None) -> dict[str, Any]:
    """What the brakes hold: each pause (since when, by whom, why, how much work waits under it),
    the held work of kinds the kinds file no longer declares (`declared`; None: no file to ask),
    and the work each shadow-mode kind parked, all read along ix_lapse_ledger_parked."""
    held: dict[tuple[str, str], int] = {}
    shadowed: dict[str, int] = {}
    for state, kind, tenant, n in parked_counts(conn):
        if state == HELD:
            held[(kind, tenant)] = n
        elif state == SHADOWED:
            shadowed[kind] = shadowed.get(kind, 0) + n
    pauses = []
    for pause in read_pauses(conn):
        waiting = sum(n for (kind, tenant), n in held.items()
                      if kind == pause.kind and pause.tenant in (ALL_TENANTS, tenant))
        pauses.append({**pause.to_dict(), "age_s": _age_s(now, pause.since), "waiting": waiting})
    undeclared: dict[str, int] = {}
    for (kind, _), n in held.items():
        if declared is not None and kind not in declared:
            undeclared[kind] = undeclared.get(kind, 0) + n
    return {"pauses": pauses, "undeclared": dict(sorted(undeclared.items())),
            "shadowed": dict(sorted(shadowed.items())), "held": sum(held.values())}


def limits_status(conn: Connection) -> dict[str, Any]:
    """The call limits as every worker shares them, at the database's now: each route used in the
    last hour (its rate now and declared, how long a Retry-After still stops it, the concurrency
    slots held) and each endpoint's calls over the workers' last minute (in flight, per minute,
    429s, the mean wait for a slot and time in the call)."""
    now = database_now(conn)
    routes = [{"kind": r.key.kind, "route": r.key.route, "rate_per_s": round(r.rate_per_s, 2),
               "ceiling_per_s": r.ceiling_per_s, "concurrency": r.concurrency, "slots_held": r.slots_held,
               "blocked_for_s": _age_s(r.blocked_until, now) if r.blocked_until else None}
              for r in routes_status(conn, now)]
    return {"routes": routes, "endpoints": [e.to_dict() for e in endpoints_status(conn, now)]}


def declared_or_none(settings: Settings) -> frozenset[str] | None:
    """The kind names the kinds file declares; None without a readable file (status still answers)."""
    try:
        return declared_names(settings.kinds.file) if settings.kinds.file is not None else None
    except KindsFileError:
        return None


def outside_partitions(conn: Connection) -> dict[str, int] | None:
    """Rows in the DEFAULT partitions of transitions and the outbox (PostgreSQL), counted up to
    DEFAULT_ROWS_CAP: rows no time partition covers wait there until `lapse prune` creates theirs.
    None where nothing is partitioned (SQLite)."""
    counted = {scheme.name: default_rows(conn, scheme, DEFAULT_ROWS_CAP) for scheme in (TRANSITIONS, OUTBOX)}
    return None if all(n is None for n in counted.values()) else {k: n or 0 for k, n in counted.items()}


def status_report(settings: Settings, engine: Engine, now: datetime, *, lag: bool = True) -> dict[str, Any]:
    with engine.connect() as conn:
        report = ledger_status(conn, now)
        report["eligible"] = eligible_status(settings, conn, now)
        report["findings"] = findings_status(conn, now)
        report["brakes"] = brakes_status(conn, now, declared_or_none(settings))
        report["limits"] = limits_status(conn)
        report["outside_partitions"] = outside_partitions(conn)
    ages = [report["oldest_eligible_age_s"], *(k["oldest_due_age_s"] for k in (report["eligible"] or {}).values())]
    report["oldest_eligible_age_s"] = max((a for a in ages if a is not None), default=None)
    report["at"] = now.isoformat()
    if lag:
        report["lag"] = lag_status(settings, now)
    return report
