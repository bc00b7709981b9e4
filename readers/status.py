"""`lapse status` figures: the ledger by state and kind, the alarm signals (oldest eligible but
unfinished operation, expired claims, dead letters) and consumer lag of every declared group."""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine

from lapse.kernel.ledger import DEAD_LETTER, counts_by_state_and_kind, expired_claims, oldest_unfinished_due
from lapse.kernel.settings import Settings
from lapse.readers.offsets import OffsetsError, group_lag


def _age_s(now: datetime, since: datetime | None) -> float | None:
    return None if since is None else round(max(0.0, (now - since).total_seconds()), 3)


def ledger_status(conn: Connection, now: datetime) -> dict[str, Any]:
    """Counts by state and kind, the oldest eligible-but-unfinished age, expired claims."""
    by_state: dict[str, dict[str, int]] = {}
    for count in counts_by_state_and_kind(conn):
        by_state.setdefault(count.state, {})[count.kind] = count.rows
    oldest_due = oldest_unfinished_due(conn, now)
    expired = expired_claims(conn, now)
    return {
        "ledger": {s: dict(sorted(k.items())) for s, k in sorted(by_state.items())},
        "oldest_eligible_age_s": _age_s(now, oldest_due),
        "dead_letters": sum(by_state.get(DEAD_LETTER, {}).values()),
        "expired_claims": {"count": expired.count,
                           "oldest_expired_for_s": _age_s(now, expired.oldest_claim_until)},
    }


def lag_status(settings: Settings, now: datetime) -> list[dict[str, Any]]:
    """Lag per declared (group, topic): records behind and age of the oldest unconsumed record."""
    rows: list[dict[str, Any]] = []
    for group, topic in sorted(settings.topology.reads()):
        try:
            parts = group_lag(settings, group, topic, now)
        except OffsetsError as exc:
            rows.append({"group": group, "topic": topic, "error": str(exc)})
            continue
        ages = [p.seconds for p in parts if p.seconds is not None]
        rows.append({"group": group, "topic": topic, "records": sum(p.records for p in parts),
                     "seconds": round(max(ages), 3) if ages else 0.0,
                     "partitions": [asdict(p) for p in parts]})
    return rows


def status_report(settings: Settings, engine: Engine, now: datetime, *, lag: bool = True) -> dict[str, Any]:
    with engine.connect() as conn:
        report = ledger_status(conn, now)
    report["at"] = now.isoformat()
    if lag:
        report["lag"] = lag_status(settings, now)
    return report
