"""Pause and resume, as `lapse pause`/`lapse resume` and the console both run them: the change and
its operator action in one transaction, then the log line. A resume releases the work the pause
held (`lapse.reconciler.release`); a resumed budget starts a new window (its usage is forgotten:
the operator has looked and says go on)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from sqlalchemy import Engine, exists, select
from sqlalchemy.exc import OperationalError

from lapse.kernel.brakes import (
    ALL_TENANTS,
    BUDGET,
    OPERATOR,
    Pause,
    delete_pause,
    forget_usage,
    insert_pause,
    read_pauses,
)
from lapse.kernel.clock import Clock, database_now
from lapse.kernel.kinds import CleanupKind
from lapse.kernel.topology import Topology
from lapse.operator_actions.record import PAUSE, RESUME, OperatorAction, log_action, record_action, session_user
from lapse.reconciler import release_parked_work

QUERY_CANCELED = "57014"  # a statement timeout


def run_pause(engine: Engine, kind: str, tenant: str | None, *, reason: str, actor: str,
              via: str | None = None) -> dict[str, Any]:
    """Pause `kind` (or one tenant of it) at the database's now and record the operator action;
    a kind (tenant) already paused is left as it was (`paused` False, the pause there)."""
    recorded = None
    with engine.begin() as conn:
        now = database_now(conn)
        db_user = session_user(conn)
        pause = Pause(kind, tenant or ALL_TENANTS, OPERATOR, reason, actor, now, {"via": via} if via else {})
        if insert_pause(conn, pause):
            recorded = record_action(conn, OperatorAction(PAUSE, actor, reason, pause.target,
                                                          {"cause": OPERATOR, **pause.details}), now, db_user)
        else:
            pause = read_pauses(conn).by_target[(pause.kind, pause.tenant)]
    if recorded is not None:
        log_action(recorded)
    return {"paused": recorded is not None, "pause": pause.to_dict(),
            "action_id": recorded.id if recorded is not None else None}


def run_resume(engine: Engine, kinds: Mapping[str, CleanupKind], topology: Topology, kind: str, tenant: str | None,
               *, reason: str, actor: str, via: str | None = None, clock: Clock | None = None,
               progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Resume `kind` (or one tenant of it) and record the operator action (a spent budget's usage
    forgotten with it), then release the work no pause holds any more; `resumed` False when it
    was not paused (nothing changed). `clock`: the release's now (a test's), else the database's."""
    recorded = None
    with engine.begin() as conn:
        now = database_now(conn)
        db_user = session_user(conn)
        pause = delete_pause(conn, kind, tenant or ALL_TENANTS)
        if pause is not None:
            forgotten = forget_usage(conn, kind, pause.tenant if pause.tenant else None) if pause.cause == BUDGET else 0
            details = {"cause": pause.cause, "paused_since": pause.since.isoformat(), "paused_by": pause.actor,
                       "pause_reason": pause.reason, "budget_usage_forgotten": forgotten}
            recorded = record_action(conn, OperatorAction(RESUME, actor, reason, pause.target,
                                                          {**details, "via": via} if via else details), now, db_user)
    if recorded is None:
        return {"resumed": False, "action_id": None, "released": 0}
    log_action(recorded)
    released = release_parked_work(engine, kinds, topology, clock=clock, progress=progress)
    return {"resumed": True, "action_id": recorded.id, "pause": pause.to_dict() if pause else None,
            "released": released.released}


def tenant_seen(engine: Engine, kind: CleanupKind, tenant: str, timeout_s: float = 5.0) -> bool | None:
    """Whether any business row of `kind` has `tenant` (one EXISTS, under a statement timeout on
    PostgreSQL); None when the read ran out of time (a table with no index on its tenant)."""
    with engine.connect() as conn, conn.begin():
        if conn.dialect.name == "postgresql":
            conn.exec_driver_sql(f"SET LOCAL statement_timeout = {round(timeout_s * 1000)}")
        try:
            return bool(conn.execute(select(exists().where(kind.tenant_column == tenant))).scalar())
        except OperationalError as exc:
            if getattr(exc.orig, "sqlstate", None) == QUERY_CANCELED:
                return None
            raise
