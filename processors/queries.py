"""SQL of the processor room: read ledger states, claim, finish, count duplicates.

Every transition is a conditional update: the row must still be in a state the caller may move it
from, so two workers racing on one op key cannot both win.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime

from sqlalchemy import Connection, and_, bindparam, or_, select, update

from lapse.kernel.batch_sql import any_of
from lapse.kernel.ledger import CLAIMED, WAITING
from lapse.kernel.models import cleanup_ledger as L


def read_states(conn: Connection, op_keys: Iterable[str]) -> dict[str, tuple]:
    """op_key → (state, attempt, due_at, claim_owner, claim_until, kind, subject_id, tenant,
    correlation_id, replay_id) for the keys that have a ledger row."""
    stmt = select(
        L.c.op_key, L.c.state, L.c.attempt, L.c.due_at, L.c.claim_owner, L.c.claim_until,
        L.c.kind, L.c.subject_id, L.c.tenant, L.c.correlation_id, L.c.replay_id,
    ).where(any_of(conn, L.c.op_key, list(op_keys)))
    return {row[0]: tuple(row[1:]) for row in conn.execute(stmt)}


def claimable(now: datetime):
    """Waiting and due, or claimed under a lease that has expired."""
    return or_(
        and_(L.c.state.in_(WAITING), L.c.due_at <= now),
        and_(L.c.state == CLAIMED, L.c.claim_until < now),
    )


def claim(conn: Connection, op_keys: list[str], owner: str, now: datetime, until: datetime) -> set[str]:
    """Claim the claimable rows among `op_keys` for `owner`; returns the op keys claimed."""
    if not op_keys:
        return set()
    stmt = (
        update(L)
        .where(any_of(conn, L.c.op_key, op_keys), claimable(now))
        .values(state=CLAIMED, claim_owner=owner, claim_until=until, updated_at=now)
        .returning(L.c.op_key)
    )
    return set(conn.execute(stmt).scalars())


def finish(conn: Connection, op_keys: list[str], owner: str, state: str, now: datetime) -> int:
    """Move rows this owner claimed to a terminal state; returns how many moved.

    `claim_owner` is set only while a row is claimed (every transition out of `claimed` clears
    it), so it stands for `state = 'claimed'` here; leaving `state` out keeps the planner on the
    primary key instead of a state index full of dead entries from earlier transitions."""
    if not op_keys:
        return 0
    stmt = (
        update(L)
        .where(any_of(conn, L.c.op_key, op_keys), L.c.claim_owner == owner)
        .values(state=state, attempt=L.c.attempt + 1, finished_at=now, updated_at=now,
                claim_owner=None, claim_until=None)
    )
    return conn.execute(stmt).rowcount


def finish_with_failure(
    conn: Connection, rows: list[dict], owner: str, now: datetime
) -> int:
    """Move claimed rows to retry_scheduled or dead_letter with their attempt, due time and failure.

    Each row dict has op_key, state, attempt, due_at, failure_class, failure, finished_at."""
    if not rows:
        return 0
    stmt = (
        update(L)
        .where(
            L.c.op_key == bindparam("k"),
            L.c.state == CLAIMED,
            L.c.claim_owner == owner,
        )
        .values(
            state=bindparam("new_state"),
            attempt=bindparam("new_attempt"),
            due_at=bindparam("new_due_at"),
            last_failure_class=bindparam("failure_class"),
            last_failure=bindparam("failure"),
            finished_at=bindparam("new_finished_at"),
            claim_owner=None,
            claim_until=None,
            updated_at=now,
        )
    )
    params = [
        {
            "k": r["op_key"],
            "new_state": r["state"],
            "new_attempt": r["attempt"],
            "new_due_at": r["due_at"],
            "failure_class": r["failure_class"],
            "failure": r["failure"],
            "new_finished_at": r.get("finished_at"),
        }
        for r in rows
    ]
    return conn.execute(stmt, params).rowcount


def add_duplicates(conn: Connection, counts: Mapping[str, int]) -> None:
    """Count deliveries absorbed because the op key was already handled (or repeated in a batch)."""
    if not counts:
        return
    stmt = (
        update(L)
        .where(L.c.op_key == bindparam("k"))
        .values(duplicates=L.c.duplicates + bindparam("n"))
    )
    conn.execute(stmt, [{"k": k, "n": n} for k, n in counts.items()])
