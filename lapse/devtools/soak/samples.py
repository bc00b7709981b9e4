"""One reading of the soak's pipeline: what `lapse status` reads (lag per group, outbox backlog,
oldest eligible age, through the same function), the size of Lapse's tables, and how many ledger
rows turned terminal since the last reading (through the partial indexes on finish time)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, func, select, text

from lapse.kernel.ledger import APPLIED, DEAD_LETTER, SKIPPED
from lapse.kernel.ledger.partitions import OUTBOX, TRANSITIONS, is_partitioned
from lapse.kernel.models import cleanup_ledger
from lapse.kernel.settings import Settings
from lapse.readers import status_report

TABLES = ("lapse_ledger", "lapse_transitions", "lapse_outbox")


@dataclass(frozen=True)
class Sample:
    at: str
    elapsed_s: float
    lag_records: int        # the cleanup group behind the expiry topic
    lag_s: float            # age of its oldest unconsumed record
    delay_lag_records: int  # the delay group behind its tiers (waits that are not yet due count)
    outbox_unsent: int
    outbox_oldest_s: float | None
    oldest_eligible_s: float | None
    table_mb: dict[str, float]
    finished: int           # ledger rows turned terminal since the previous sample
    finished_per_min: float
    rotated: tuple[str, ...] = ()  # tables retained by whole time partitions (rotated_tables)

    @property
    def total_mb(self) -> float:
        return round(sum(self.table_mb.values()), 1)

    @property
    def pruned_mb(self) -> float:
        """The size of the tables the run's own pruning bounds: those not rotated by partitions."""
        return round(sum(mb for table, mb in self.table_mb.items() if table not in self.rotated), 1)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "total_mb": self.total_mb}


def table_sizes(engine: Engine, schema: str | None) -> dict[str, float]:
    """Each Lapse table's size with its indexes and TOAST, in MB (PostgreSQL); a partitioned
    table's is the sum of its partitions' (the parent itself stores nothing; a plain table's
    partition tree is empty)."""
    sizes = {}
    with engine.connect() as conn:
        for table in TABLES:
            name = f'"{schema}"."{table}"' if schema else f'"{table}"'
            size = conn.execute(text(
                "SELECT coalesce((SELECT sum(pg_total_relation_size(relid)) "
                "FROM pg_partition_tree(CAST(:n AS regclass))), pg_total_relation_size(CAST(:n AS regclass)))"),
                {"n": name}).scalar()
            sizes[table] = round(int(size or 0) / 1e6, 1)  # sum() of bigint is numeric
    return sizes


def rotated_tables(engine: Engine) -> tuple[str, ...]:
    """The tables whose retention drops whole time partitions (transitions and the outbox, on
    PostgreSQL): a day's or a week's, longer than a soak runs."""
    with engine.connect() as conn:
        return tuple(scheme.name for scheme in (TRANSITIONS, OUTBOX) if is_partitioned(conn, scheme))


def finished_between(engine: Engine, since: datetime, until: datetime) -> int:
    """Ledger rows that turned terminal in (since, until]: one range probe per terminal state,
    each along its partial index on finish time (never a scan of the ledger)."""
    led = cleanup_ledger.c
    total = 0
    with engine.connect() as conn:
        for state in (APPLIED, SKIPPED, DEAD_LETTER):
            total += conn.execute(select(func.count()).where(
                led.state == state, led.finished_at > since, led.finished_at <= until)).scalar() or 0
    return total


def take_sample(settings: Settings, engine: Engine, schema: str | None, now: datetime, started: datetime,
                previous: datetime, rotated: tuple[str, ...] = ()) -> Sample:
    report = status_report(settings, engine, now)
    lags = {row["group"]: row for row in report.get("lag", []) if "error" not in row}
    cleanup = lags.get(settings.topology.groups.cleanup, {})
    delay = lags.get(settings.topology.groups.delay, {})
    outbox = report["outbox"]
    window_s = max(1e-3, (now - previous).total_seconds())
    finished = finished_between(engine, previous, now)
    return Sample(
        at=now.isoformat(timespec="seconds"), elapsed_s=round((now - started).total_seconds(), 1),
        lag_records=int(cleanup.get("records", 0)), lag_s=float(cleanup.get("seconds", 0.0)),
        delay_lag_records=int(delay.get("records", 0)),
        outbox_unsent=int(outbox["unsent"]), outbox_oldest_s=outbox["oldest_unsent_age_s"],
        oldest_eligible_s=report["oldest_eligible_age_s"], table_mb=table_sizes(engine, schema),
        finished=finished, finished_per_min=round(finished * 60 / window_s, 1), rotated=rotated)
