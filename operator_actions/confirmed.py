"""An operator's replay or discard of dead letters as `lapse dlq` and the console both run it: the
preview of what it would take, then the change and its operator action in one transaction."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Engine

from lapse.kernel.clock import database_now
from lapse.kernel.ledger import Selection, dead_letters
from lapse.operator_actions.dead_letters import discard, replay
from lapse.operator_actions.record import DISCARD, REPLAY, OperatorAction, log_action, record_action, session_user


def describe_selection(selection: Selection) -> str:
    """The selection in one line, as it is shown and recorded: `all` or its terms."""
    terms = [f"{name}={value}" for name, value in (("kind", selection.kind), ("tenant", selection.tenant))
             if value]
    if selection.op_keys:
        terms.append("op_keys=" + ",".join(selection.op_keys))
    text = " ".join(terms) or "all"
    return text + (" (replayed ones included)" if selection.include_replayed else "")


def discard_selection(kind: str | None = None, tenant: str | None = None, op_keys: tuple[str, ...] = ()
                      ) -> Selection:
    """The dead letters a discard names; replayed ones are included (a discard never loops)."""
    return Selection(kind, tenant, tuple(sorted(set(op_keys))), include_replayed=True)


def preview(engine: Engine, selection: Selection, limit: int) -> dict[str, Any]:
    """The dry run: the op keys of `selection` a replay or discard would take now (at most `limit`)."""
    with engine.connect() as conn:
        matching = [row.op_key for row in dead_letters(conn, selection, limit)]
    return {"selection": describe_selection(selection), "matching": len(matching), "op_keys": matching,
            "limit": limit}


def _details(counts: dict[str, Any], rows: list[dict[str, Any]], limit: int, shown: int,
             via: str | None) -> dict[str, Any]:
    details = {**counts, "limit": limit, "shown_before_confirming": shown, "op_keys": [r["op_key"] for r in rows]}
    return {**details, "via": via} if via else details


def run_replay(engine: Engine, selection: Selection, *, limit: int, actor: str, reason: str, shown: int,
               expiry_topic: str, now: datetime | None = None, via: str | None = None) -> dict[str, Any]:
    """Release up to `limit` dead letters of `selection` under one replay id and record the operator
    action in the same transaction, then log it; returns the replay id (None: nothing matched any
    more, nothing recorded), the rows released and the action's id. `now`: the database's unless given."""
    recorded = None
    with engine.begin() as conn:
        now = now or database_now(conn)
        db_user = session_user(conn)
        replay_id, released = replay(conn, selection, limit=limit, reason=reason, actor=actor, now=now,
                                     expiry_topic=expiry_topic)
        if released:
            details = _details({"replay_id": replay_id, "released": len(released)}, released, limit, shown, via)
            recorded = record_action(conn, OperatorAction(REPLAY, actor, reason, describe_selection(selection),
                                                          details), now, db_user)
    if recorded is None:
        return {"replay_id": None, "released": [], "action_id": None}
    log_action(recorded)
    return {"replay_id": replay_id, "released": released, "action_id": recorded.id}


def run_discard(engine: Engine, selection: Selection, *, limit: int, actor: str, reason: str, shown: int,
                now: datetime | None = None, via: str | None = None) -> dict[str, Any]:
    """Discard up to `limit` dead letters of `selection` and record the operator action in the same
    transaction, then log it; returns the rows discarded and the action's id (None: nothing matched
    any more, nothing recorded). `now`: the database's unless given."""
    recorded = None
    with engine.begin() as conn:
        now = now or database_now(conn)
        db_user = session_user(conn)
        discarded = discard(conn, selection, limit=limit, reason=reason, actor=actor, now=now)
        if discarded:
            details = _details({"discarded": len(discarded)}, discarded, limit, shown, via)
            recorded = record_action(conn, OperatorAction(DISCARD, actor, reason, describe_selection(selection),
                                                          details), now, db_user)
    if recorded is not None:
        log_action(recorded)
    return {"discarded": discarded, "action_id": recorded.id if recorded else None}
