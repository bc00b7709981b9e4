"""What the operator console reads beyond `lapse status`, `lapse show` and `lapse dlq`: dead letters
filtered by failure class and time too, throughput from the transitions, the stored daily reports,
and the ledger rows of a replay's op keys. Read-only; each statement walks an index:

- dead letters: ix_lapse_ledger_dead_letters (finished_at, op_key; dead letters only), the index
  `lapse dlq list` walks, bounded by the time window and `limit`, paged by its keyset; their groups
  and total walk the same index, at most GROUPED_CAP rows;
- throughput: transitions by the state reached, ix_lapse_transitions_at over the window, and the
  same counted per time bucket for the charts;
- an operation by business id: ix_lapse_ledger_kind_subject (unique) (a tenant's operations are
  `lapse show --tenant`'s, `history.tenant_operations`, along ix_lapse_ledger_tenant);
- daily reports: the primary key (report_key sorts by date), newest first;
- an operator action, op keys' rows: the primary key.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Connection, Integer, cast, func, literal, select, tuple_

from lapse.kernel.ledger import DEAD_LETTER
from lapse.kernel.models import cleanup_ledger as L
from lapse.kernel.models import daily_reports as R
from lapse.kernel.models import ledger_transitions as T
from lapse.kernel.models import operator_actions as A

# The windows the console's throughput is counted over.
THROUGHPUT_WINDOWS = (timedelta(minutes=5), timedelta(minutes=60))
# Dead letters a group count or total reads at most (the figures say when they stopped there).
GROUPED_CAP = 50_000
# The columns a dead letter is listed with (those of `lapse dlq list`, plus its correlation id).
DEAD_LETTER_COLUMNS = (L.c.op_key, L.c.kind, L.c.tenant, L.c.subject_id, L.c.attempt, L.c.last_failure_class,
                       L.c.last_failure, L.c.replay_id, L.c.correlation_id, L.c.finished_at)


def _dead_letter_conditions(kind: str | None, tenant: str | None, failure_class: str | None, reason: str | None,
                            since: datetime | None, until: datetime | None,
                            replayed: bool | None) -> list[ColumnElement[bool]]:
    conds: list[ColumnElement[bool]] = [L.c.state == DEAD_LETTER]
    for column, value in ((L.c.kind, kind), (L.c.tenant, tenant), (L.c.last_failure_class, failure_class),
                          (L.c.last_failure, reason)):
        if value:
            conds.append(column == value)
    if since is not None:
        conds.append(L.c.finished_at >= since)
    if until is not None:
        conds.append(L.c.finished_at < until)
    if replayed is not None:
        conds.append(L.c.replay_id.is_not(None) if replayed else L.c.replay_id.is_(None))
    return conds


def filtered_dead_letters(conn: Connection, *, kind: str | None = None, tenant: str | None = None,
                          failure_class: str | None = None, reason: str | None = None,
                          since: datetime | None = None, until: datetime | None = None,
                          replayed: bool | None = None, after: tuple[datetime, str] | None = None,
                          limit: int = 100) -> list[dict[str, Any]]:
    """Dead letters dead-lettered in [since, until), of `kind`, `tenant`, `failure_class` and last
    failure `reason` where given (replayed ones too unless `replayed` says), oldest first, after
    the keyset `after` (finished_at, op_key), at most `limit`."""
    conds = _dead_letter_conditions(kind, tenant, failure_class, reason, since, until, replayed)
    if after is not None:
        conds.append(tuple_(L.c.finished_at, L.c.op_key) > tuple_(literal(after[0], L.c.finished_at.type),
                                                                  literal(after[1])))
    stmt = select(*DEAD_LETTER_COLUMNS).where(*conds).order_by(L.c.finished_at, L.c.op_key).limit(limit)
    return [dict(row) for row in conn.execute(stmt).mappings()]


def dead_letter_groups(conn: Connection, *, kind: str | None = None, tenant: str | None = None,
                       failure_class: str | None = None, since: datetime | None = None,
                       until: datetime | None = None, cap: int = GROUPED_CAP) -> dict[str, Any]:
    """The dead letters under the filters grouped by kind, failure class and reason, the largest
    group first, with the total: `groups` [{kind, failure_class, reason, count, first, last}],
    `total`, and `capped` when GROUPED_CAP rows were read and more may match."""
    conds = _dead_letter_conditions(kind, tenant, failure_class, None, since, until, None)
    rows = (select(L.c.kind, L.c.last_failure_class, L.c.last_failure, L.c.finished_at).where(*conds)
            .order_by(L.c.finished_at, L.c.op_key).limit(cap).subquery())
    stmt = (select(rows.c.kind, rows.c.last_failure_class, rows.c.last_failure, func.count().label("n"),
                   func.min(rows.c.finished_at), func.max(rows.c.finished_at))
            .group_by(rows.c.kind, rows.c.last_failure_class, rows.c.last_failure))
    groups = [{"kind": k, "failure_class": c, "reason": r, "count": n, "first": first, "last": last}
              for k, c, r, n, first, last in conn.execute(stmt)]
    groups.sort(key=lambda g: (-g["count"], g["kind"], g["failure_class"] or "", g["reason"] or ""))
    total = sum(g["count"] for g in groups)
    return {"groups": groups, "total": total, "capped": total >= cap}


def operation_of_subject(conn: Connection, kind: str, subject_id: str) -> str | None:
    """The op key of the ledger row of business row (`kind`, `subject_id`), None: none."""
    stmt = select(L.c.op_key).where(L.c.kind == kind, L.c.subject_id == subject_id)
    return conn.execute(stmt).scalar_one_or_none()


def throughput(conn: Connection, now: datetime) -> list[dict[str, Any]]:
    """Per window of THROUGHPUT_WINDOWS: the transitions recorded in the window before `now`, by
    the state they reached, and in all. One walk of ix_lapse_transitions_at per window, no join:
    the daily report's per-kind aggregate (`transitions_between`) joins every transition to its
    ledger row, too slow for a page over an hour of a busy pipeline (1.8 s for 83,000 transitions)."""
    out = []
    for window in THROUGHPUT_WINDOWS:
        stmt = (select(T.c.to_state, func.count()).where(T.c.at >= now - window, T.c.at < now)
                .group_by(T.c.to_state))
        by_state = {state: n for state, n in conn.execute(stmt)}
        out.append({"minutes": int(window.total_seconds() // 60), "by_state": dict(sorted(by_state.items())),
                    "transitions": sum(by_state.values())})
    return out


def transition_buckets(conn: Connection, since: datetime, until: datetime, step_s: int
                       ) -> dict[int, dict[str, int]]:
    """Transitions recorded in [since, until) counted per bucket of `step_s` seconds (keyed by the
    bucket's start in epoch seconds): by the state reached, and under `out_of_dead_letter` those
    that left a dead letter (a replay or a discard). One walk of ix_lapse_transitions_at."""
    epoch: ColumnElement[Any]
    if conn.dialect.name == "postgresql":
        epoch = func.floor(func.extract("epoch", T.c.at) / step_s)
    else:  # SQLite: whole seconds, integer division
        epoch = cast(func.strftime("%s", T.c.at), Integer) / step_s
    bucket = (epoch * step_s).label("bucket")
    left = (T.c.from_state == DEAD_LETTER).label("left")
    stmt = (select(bucket, T.c.to_state, left, func.count()).where(T.c.at >= since, T.c.at < until)
            .group_by(bucket, T.c.to_state, left))
    out: dict[int, dict[str, int]] = {}
    for start, state, was_dead, n in conn.execute(stmt):
        counts = out.setdefault(int(start), {})
        counts[state] = counts.get(state, 0) + n
        if was_dead:
            counts["out_of_dead_letter"] = counts.get("out_of_dead_letter", 0) + n
    return out


def daily_reports(conn: Connection, limit: int = 30) -> list[dict[str, Any]]:
    """The stored daily reports, newest day first: the payload, when stored and delivered, the
    delivery attempts and the last delivery error."""
    stmt = (select(R.c.report_key, R.c.report_date, R.c.payload, R.c.created_at, R.c.delivered_at, R.c.attempts,
                   R.c.last_error).order_by(R.c.report_key.desc()).limit(limit))
    return [dict(row) for row in conn.execute(stmt).mappings()]


def operator_action(conn: Connection, action_id: int) -> dict[str, Any] | None:
    """One operator action by id, as plain data (None: no such action)."""
    row = conn.execute(select(A).where(A.c.id == action_id)).mappings().one_or_none()
    return None if row is None else dict(row)


def ledger_states(conn: Connection, op_keys: list[str]) -> dict[str, dict[str, Any]]:
    """op key → its state, attempt, replay id and last failure class, for the keys that have a row."""
    if not op_keys:
        return {}
    stmt = select(L.c.op_key, L.c.state, L.c.attempt, L.c.replay_id, L.c.last_failure_class).where(
        L.c.op_key.in_(op_keys))
    return {row["op_key"]: dict(row) for row in conn.execute(stmt).mappings()}


__all__ = ["GROUPED_CAP", "THROUGHPUT_WINDOWS", "daily_reports", "dead_letter_groups", "filtered_dead_letters",
           "ledger_states", "operation_of_subject", "operator_action", "throughput",
           "transition_buckets"]
