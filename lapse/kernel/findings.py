"""Findings: the latest word of each role on each subject, kept in `lapse_findings` so that status
and the console can show what the roles found without having run them — the reconciler's last pass,
the audit's last verdict, each dead-letter circuit a worker opened, each process's clock skew, each
budget that paused its kind, how far the archive of the ledger's transitions reaches.

One row per (role, subject), overwritten in place: a handful of rows, read whole by primary key.
Every statement on the table is named here. Recording a finding never stops the role that found
it: a database that cannot take it is logged and the role goes on (`record_quietly`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, delete, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import SQLAlchemyError

from lapse.kernel.logs import get_logger
from lapse.kernel.models import findings as F

RECONCILE, AUDIT, CIRCUIT, CLOCK, BUDGET, ARCHIVE = "reconcile", "audit", "circuit", "clock", "budget", "archive"
LAST_PASS, LAST_VERDICT = "last pass", "last verdict"  # the subjects of the reconciler's and the audit's rows
TRANSITIONS_ARCHIVED = "transitions"  # the subject of the archive's row
log = get_logger("findings")


@dataclass(frozen=True)
class Finding:
    """What `role` found about `subject` at `at` (until `until`, for a state that lapses: an open
    circuit), in one line (`summary`) and in figures (`details`)."""

    role: str
    subject: str
    at: datetime
    summary: str
    details: dict[str, Any] = field(default_factory=dict)
    until: datetime | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"role": self.role, "subject": self.subject, "at": self.at.isoformat(),
                "until": self.until.isoformat() if self.until else None, "summary": self.summary,
                "details": self.details}


def record_finding(conn: Connection, finding: Finding) -> None:
    """Insert `finding`, or overwrite the row its role and subject already have."""
    values = {"role": finding.role, "subject": finding.subject[:300], "at": finding.at, "until": finding.until,
              "summary": finding.summary, "details": finding.details}
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    stmt = dialect.insert(F).values(values)
    conn.execute(stmt.on_conflict_do_update(
        index_elements=[F.c.role, F.c.subject],
        set_={name: stmt.excluded[name] for name in ("at", "until", "summary", "details")}))


def record_quietly(engine: Engine, finding: Finding) -> None:
    """`record_finding` in its own transaction; a database error is logged, not raised."""
    try:
        with engine.begin() as conn:
            record_finding(conn, finding)
    except SQLAlchemyError as exc:
        log.warning("finding not recorded", extra={"role": finding.role, "subject": finding.subject,
                                                   "error": type(exc).__name__})


def forget_findings(conn: Connection, role: str, before: datetime) -> None:
    """Remove `role`'s findings last recorded before `before` (a clock of a process long gone)."""
    conn.execute(delete(F).where(F.c.role == role, F.c.at < before))


def latest_findings(conn: Connection) -> list[Finding]:
    """Every kept finding, by role and subject."""
    rows = conn.execute(select(F.c.role, F.c.subject, F.c.at, F.c.summary, F.c.details, F.c.until)
                        .order_by(F.c.role, F.c.subject))
    return [Finding(*row) for row in rows]
