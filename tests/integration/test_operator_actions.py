"""The operator actions table on PostgreSQL and SQLite: a recorded action comes back with the
database session user (PostgreSQL's current_user; the OS user on SQLite), and is logged once,
after its transaction committed."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from sqlalchemy import text

from lapse.kernel.database import make_engine
from lapse.operator_actions import (
    OFFSETS_RESET,
    OperatorAction,
    log_action,
    os_user,
    recent_actions,
    record_action,
)

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def test_an_action_is_recorded_with_the_session_user_and_logged_once(db_url):
    engine = make_engine(db_url)
    action = OperatorAction(OFFSETS_RESET, "alice", "re-read", "group g", {"partitions": [{"old": 5, "new": 0}]})
    try:
        with engine.begin() as conn:
            recorded = record_action(conn, action, NOW)
        with engine.begin() as conn:  # rolled back: no row
            record_action(conn, action, NOW)
            conn.rollback()
        with engine.connect() as conn:
            rows = recent_actions(conn)
            user = (conn.execute(text("SELECT current_user")).scalar_one()
                    if engine.dialect.name == "postgresql" else os_user())
    finally:
        engine.dispose()
    assert rows == [recorded]
    assert (recorded.action, recorded.actor, recorded.reason, recorded.db_user, recorded.target, recorded.at) == (
        "offsets_reset", "alice", "re-read", user, "group g", NOW)
    assert recorded.details == {"partitions": [{"old": 5, "new": 0}]}
    seen: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = seen.append  # type: ignore[method-assign]
    logger = logging.getLogger("lapse.operator_actions")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        log_action(recorded)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert [r.getMessage() for r in seen] == [
        f"operator action offsets_reset on group g by alice (database user {user}): re-read"]
    assert (seen[0].actor, seen[0].db_user, seen[0].action_id) == ("alice", user, recorded.id)
