"""Operator actions: every action an operator takes that changes something (a dead-letter replay,
redrive or discard, a pause or resume, an offsets reset, a destructive topics apply) is one row in
`lapse_operator_actions` and
one log line, so that nobody has to guess later who did what, as which database user, and why.

Every statement on the table is named here. Only actions really taken are recorded (a dry run or a
refusal is not an action). The database session user is PostgreSQL's `current_user`; SQLite has
none, so there it is the operating-system user running Lapse.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, func, insert, select

from lapse.kernel.logs import get_logger
from lapse.kernel.models import operator_actions as A

REPLAY, OFFSETS_RESET, TOPICS_APPLY_DESTRUCTIVE = "dlq_replay", "offsets_reset", "topics_apply_destructive"
DISCARD, REDRIVE = "dlq_discard", "dlq_redrive"
PAUSE, RESUME = "pause", "resume"
log = get_logger("operator_actions")


@dataclass(frozen=True)
class OperatorAction:
    """What an operator did (`action`), to what (`target`), who said they were (`actor`), why
    (`reason`), and what changed (`details`: counts, offsets before and after, config changes)."""

    action: str
    actor: str
    reason: str
    target: str
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RecordedAction:
    """A row of `lapse_operator_actions`."""

    id: int
    at: datetime
    action: str
    actor: str
    reason: str
    db_user: str
    target: str
    details: dict[str, Any]


def os_user() -> str:
    """The operating-system user this process runs as (by uid, not from the environment)."""
    try:
        import pwd  # function-local: POSIX only

        return pwd.getpwuid(os.getuid()).pw_name
    except (ImportError, KeyError):  # no passwd entry for the uid (a bare container)
        return f"uid {os.getuid()}" if hasattr(os, "getuid") else "unknown"


def session_user(conn: Connection) -> str:
    """The database session user: `current_user` on PostgreSQL, the OS user on SQLite."""
    if conn.dialect.name == "postgresql":
        return str(conn.execute(select(func.current_user())).scalar_one())
    return os_user()


def insert_action(conn: Connection, action: OperatorAction, db_user: str, now: datetime) -> int:
    """Append one operator action; returns its id."""
    stmt = insert(A).values(at=now, action=action.action, actor=action.actor, reason=action.reason,
                            db_user=db_user, target=action.target, details=action.details).returning(A.c.id)
    return int(conn.execute(stmt).scalar_one())


def recent_actions(conn: Connection, limit: int = 100) -> list[RecordedAction]:
    """The latest operator actions, newest first."""
    stmt = select(A.c.id, A.c.at, A.c.action, A.c.actor, A.c.reason, A.c.db_user, A.c.target,
                  A.c.details).order_by(A.c.id.desc()).limit(limit)
    return [RecordedAction(*row) for row in conn.execute(stmt)]


def details_of(conn: Connection, action: str) -> list[dict[str, Any]]:
    """The details of every recorded action of the kind `action`, oldest first (an operator's
    command reads them; actions are few, and never pruned)."""
    return [dict(d) for d in conn.execute(select(A.c.details).where(A.c.action == action).order_by(A.c.id))
            .scalars()]


def record_action(conn: Connection, action: OperatorAction, now: datetime, db_user: str | None = None
                  ) -> RecordedAction:
    """Record `action` in the caller's transaction; returns the row. Log it with `log_action` once
    that transaction has committed (a refused or failed action rolls the row back: no line)."""
    user = db_user if db_user is not None else session_user(conn)
    action_id = insert_action(conn, action, user, now)
    return RecordedAction(action_id, now, action.action, action.actor, action.reason, user, action.target,
                          action.details)


def log_action(recorded: RecordedAction) -> None:
    """The one log line of a recorded operator action."""
    log.info("operator action %s on %s by %s (database user %s): %s", recorded.action, recorded.target,
             recorded.actor, recorded.db_user, recorded.reason,
             extra={"action_id": recorded.id, "action": recorded.action, "actor": recorded.actor,
                    "db_user": recorded.db_user, "target": recorded.target, "reason": recorded.reason,
                    "details": recorded.details})


__all__ = ["DISCARD", "OFFSETS_RESET", "REDRIVE", "REPLAY", "TOPICS_APPLY_DESTRUCTIVE", "OperatorAction",
           "RecordedAction", "details_of", "insert_action", "log_action", "os_user", "recent_actions", "record_action",
           "session_user"]
