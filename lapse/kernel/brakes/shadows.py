"""Shadow effects: what a shadow-mode kind's effect would have done to each operation, kept in
`lapse_shadow_effects` (one row per op key, the latest word), and the reads that show it next to
the kind's preview (`lapse kinds plan --compare`, the console)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, func, select
from sqlalchemy.dialects import postgresql, sqlite

from lapse.kernel.models import shadow_effects as S

# What a shadow run says live work would do: apply the effect, skip it (the business row gone or no
# longer eligible), wait (the row due later) or dead-letter it (the event's tenant is not the row's).
APPLY, SKIP, LATER, DEAD_LETTER = "apply", "skip", "later", "dead_letter"
OUTCOMES = (APPLY, SKIP, LATER, DEAD_LETTER)
COUNT_CAP = 1_000_000  # rows each count walks at most


@dataclass(frozen=True)
class ShadowEffect:
    """One operation's shadow record: what its effect would have done (`would`) at `at`."""

    op_key: str
    kind: str
    tenant: str
    subject_id: str
    at: datetime
    outcome: str
    would: dict[str, Any]


@dataclass(frozen=True)
class ShadowResults:
    """A shadow-mode kind's results: operations by outcome (at most COUNT_CAP walked), the
    tenants with most, and the latest records."""

    kind: str
    by_outcome: dict[str, int]
    capped: bool
    tenants: list[tuple[str, int]] = field(default_factory=list)
    latest: list[ShadowEffect] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "total": sum(self.by_outcome.values()), "by_outcome": self.by_outcome,
                "capped": self.capped, "tenants": [{"tenant": t, "rows": n} for t, n in self.tenants],
                "latest": [{"op_key": e.op_key, "tenant": e.tenant, "subject_id": e.subject_id,
                            "at": e.at.isoformat(), "outcome": e.outcome, "would": e.would} for e in self.latest]}


def record_shadow_effects(conn: Connection, effects: Sequence[ShadowEffect]) -> None:
    """Keep each operation's shadow record, replacing an earlier one of the same op key."""
    if not effects:
        return
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    stmt = dialect.insert(S).values([{
        "op_key": e.op_key, "kind": e.kind, "tenant": e.tenant, "subject_id": e.subject_id, "at": e.at,
        "outcome": e.outcome, "would": e.would} for e in effects])
    conn.execute(stmt.on_conflict_do_update(
        index_elements=[S.c.op_key], set_={name: stmt.excluded[name] for name in ("at", "outcome", "would")}))


def shadow_results(conn: Connection, kind: str, *, latest: int = 10, top_tenants: int = 10,
                   cap: int = COUNT_CAP) -> ShadowResults:
    """`kind`'s shadow records: counts by outcome and tenant over its newest `cap` records (along
    ix_lapse_shadow_effects_kind_at), and the `latest` ones."""
    walked = (select(S.c.outcome, S.c.tenant).where(S.c.kind == kind).order_by(S.c.at.desc()).limit(cap)
              .subquery())
    by_outcome = {str(o): int(n) for o, n in conn.execute(
        select(walked.c.outcome, func.count()).group_by(walked.c.outcome).order_by(walked.c.outcome))}
    n = func.count().label("n")
    tenants = [(str(t), int(c)) for t, c in conn.execute(
        select(walked.c.tenant, n).group_by(walked.c.tenant).order_by(n.desc(), walked.c.tenant).limit(top_tenants))]
    rows = conn.execute(select(S.c.op_key, S.c.kind, S.c.tenant, S.c.subject_id, S.c.at, S.c.outcome, S.c.would)
                        .where(S.c.kind == kind).order_by(S.c.at.desc(), S.c.op_key).limit(latest))
    return ShadowResults(kind, by_outcome, sum(by_outcome.values()) >= cap, tenants,
                         [ShadowEffect(*row) for row in rows])

