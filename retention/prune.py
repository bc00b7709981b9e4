"""The prune pass: remove what retention no longer keeps, in bounded batches, each its own short
transaction, so the hot path never waits long behind it and a stop takes effect between batches.

Order matters for transitions: a transition goes once its ledger row is gone, so ledger rows are
removed first (applied and skipped, then dead letters), then the transitions they leave behind,
then sent outbox rows. A dry run counts the same rows and changes nothing. The horizons and why
they are what they are come from `lapse.retention.horizons`.

On PostgreSQL, where transitions and the outbox are time-partitioned (migration 0009), a pass
first creates the partitions ahead that are missing (moving rows that waited in DEFAULT into
them), and instead of deleting transitions and sent outbox rows one by one it drops the partitions
past their horizon: transitions' after the history horizon, the outbox's after the outbox horizon
unless one holds an unsent row or a row sent within the horizon (it is then reported as pinned).
Only the DEFAULT partitions' old rows are deleted in batches. When a lock is not granted within
`rotation.LOCK_TIMEOUT_MS`, that partition and the table's next ones are left for the next pass
(reported as skipped: one wait per table, not one per partition). A dry run lists the partitions
it would create and drop.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError, OperationalError

from lapse.kernel.ledger import partitions as parts
from lapse.kernel.logs import get_logger
from lapse.retention import partitions as rotation
from lapse.retention.horizons import Horizons
from lapse.retention.queries import (
    count_history_statement,
    count_outbox_statement,
    count_prunable,
    prune_dead_letters,
    prune_history,
    prune_outbox,
    prune_settled,
    prune_shadow_effects,
    prune_transitions,
)

log = get_logger("prune")

TABLES = ("ledger_settled", "ledger_dead_letters", "transitions", "outbox", "shadow_effects")
# The partitioned tables (PostgreSQL), by the name the report gives their rows.
SCHEMES = {"transitions": parts.TRANSITIONS, "outbox": parts.OUTBOX}
# Progress: called after every batch with (table, rows removed from it so far in this pass).
Progress = Callable[[str, int], None]


@dataclass
class PartitionWork:
    """What a pass did (or, dry, would do) with one partitioned table's partitions."""

    create: list[str] = field(default_factory=list)
    drop: list[dict[str, Any]] = field(default_factory=list)
    pinned: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)  # lock not granted: next pass
    moved_from_default: int = 0
    default_rows_estimate: int | None = 0  # None: not analyzed yet

    def to_dict(self) -> dict[str, Any]:
        return {"create": self.create, "drop": self.drop, "pinned": self.pinned, "skipped": self.skipped,
                "moved_from_default": self.moved_from_default, "default_rows_estimate": self.default_rows_estimate}


@dataclass
class PruneReport:
    """What a pass removed (or, dry, would remove) per table, in how many batches, and the horizon
    and cutoff of each; on PostgreSQL also the partitions created and dropped (`partitions`, by
    table; empty where a table is not partitioned). Rows of dropped partitions are not counted in
    `removed` (that would read them): each dropped partition carries the planner's estimate."""

    dry_run: bool
    at: datetime
    horizons: Horizons
    removed: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TABLES, 0))
    batches: int = 0
    stopped: bool = False
    partitions: dict[str, PartitionWork] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        partitioned = "transitions" in self.partitions
        horizons = self.horizons.to_dict(partitioned)
        cutoffs = _cutoffs(self.horizons, self.at, partitioned)
        return {
            "dry_run": self.dry_run,
            "at": self.at.isoformat(),
            "tables": {t: {("would_remove" if self.dry_run else "removed"): self.removed[t],
                           "horizon_s": horizons[t]["seconds"], "reason": horizons[t]["reason"],
                           "cutoff": None if cutoffs[t] is None else cutoffs[t].isoformat()}  # type: ignore[union-attr]
                       for t in TABLES},
            "partitions": {t: w.to_dict() for t, w in self.partitions.items()},
            "total": sum(self.removed.values()),
            "batches": self.batches,
            "stopped": self.stopped,
        }


def _cutoffs(horizons: Horizons, now: datetime, partitioned: bool = False) -> dict[str, datetime | None]:
    return {"ledger_settled": horizons.settled.cutoff(now),
            "ledger_dead_letters": horizons.dead_letters.cutoff(now),
            "transitions": (horizons.history if partitioned else horizons.transitions).cutoff(now),
            "outbox": horizons.outbox.cutoff(now), "shadow_effects": horizons.history.cutoff(now)}


def _partitioned(engine: Engine) -> dict[str, parts.Scheme]:
    """The tables partitioned in this database (none on SQLite)."""
    with engine.connect() as conn:
        return {t: s for t, s in SCHEMES.items() if parts.is_partitioned(conn, s)}


def _plan(conn: Connection, table: str, scheme: parts.Scheme, cutoff: datetime | None, now: datetime,
          work: PartitionWork) -> list[parts.Partition]:
    """Fill `work` with what a pass would do to `scheme`'s partitions; returns those it would drop."""
    found = parts.partitions(conn, scheme)
    work.create = [scheme.partition_name(lo) for lo, _ in rotation.missing_ahead(found, scheme, now)]
    work.default_rows_estimate = next((p.rows for p in found if p.is_default), 0)
    if cutoff is None:
        return []
    droppable = []
    for p in rotation.expired(found, cutoff):
        pin = rotation.outbox_pin(conn, p, cutoff) if table == "outbox" else None
        if pin is None:
            droppable.append(p)
        else:
            work.pinned.append({"name": p.name, "reason": pin})
    return droppable


def prune_dry_run(engine: Engine, horizons: Horizons, now: datetime) -> PruneReport:
    """Count per table what `prune_once` would remove at `now`, and list the partitions it would
    create and drop; nothing is changed."""
    partitioned = _partitioned(engine)
    cutoffs = _cutoffs(horizons, now, bool(partitioned))
    outbox_cutoff = cutoffs["outbox"]
    assert outbox_cutoff is not None  # the outbox horizon is always finite
    report = PruneReport(True, now, horizons)
    with engine.connect() as conn:
        counts = count_prunable(conn, settled_cutoff=cutoffs["ledger_settled"],
                                dead_letter_cutoff=cutoffs["ledger_dead_letters"],
                                transitions_cutoff=None if "transitions" in partitioned else cutoffs["transitions"],
                                outbox_cutoff=None if "outbox" in partitioned else outbox_cutoff,
                                shadow_cutoff=cutoffs["shadow_effects"])
        for table, scheme in partitioned.items():
            work = report.partitions[table] = PartitionWork()
            cutoff = cutoffs[table]
            work.drop = [p.to_dict() for p in _plan(conn, table, scheme, cutoff, now, work)]
            if cutoff is not None:
                default = scheme.default_table()
                counted = (count_history_statement(default, cutoff) if table == "transitions"
                           else count_outbox_statement(cutoff, default))
                counts[table] = conn.execute(counted).scalar_one()
        conn.rollback()
    report.removed = counts
    return report


def _ensure_ahead(engine: Engine, partitioned: dict[str, parts.Scheme], now: datetime, report: PruneReport) -> None:
    """Create the missing partitions ahead, each in its own transaction."""
    for table, scheme in partitioned.items():
        work = report.partitions[table]
        with engine.connect() as conn:
            missing = rotation.missing_ahead(parts.partitions(conn, scheme), scheme, now)
        for lower, _ in missing:
            name = scheme.partition_name(lower)
            if work.skipped:  # the table is busy: the rest waits for the next pass too, without waiting
                work.skipped.append({"name": name, "action": "create", "reason": "lock not granted"})
                continue
            try:
                with engine.begin() as conn:
                    work.moved_from_default += rotation.create_partition(conn, scheme, lower)
            except DBAPIError as exc:
                if rotation.already_exists(exc):  # another pass made it meanwhile
                    continue
                if not rotation.lock_not_available(exc):
                    raise
                work.skipped.append({"name": name, "action": "create", "reason": "lock not granted"})
                continue
            work.create.append(name)


def _drop_expired(engine: Engine, table: str, scheme: parts.Scheme, cutoff: datetime, now: datetime,
                  report: PruneReport, stop: threading.Event | None) -> bool:
    """Drop `scheme`'s partitions past `cutoff`, each in its own transaction; False when stopped."""
    work = report.partitions[table]
    with engine.connect() as conn:
        droppable = _plan(conn, table, scheme, cutoff, now, PartitionWork(pinned=work.pinned))
        conn.rollback()
    for p in droppable:
        if stop is not None and stop.is_set():
            return False
        if any(s["action"] == "drop" for s in work.skipped):  # busy: the rest waits for the next pass
            work.skipped.append({"name": p.name, "action": "drop", "reason": "lock not granted"})
            continue
        try:
            with engine.connect() as conn, conn.begin() as tx:
                if rotation.drop_partition(conn, scheme, p):
                    work.drop.append(p.to_dict())
                else:
                    tx.rollback()
                    work.pinned.append({"name": p.name, "reason": "holds unsent rows"})
        except OperationalError as exc:
            if not rotation.lock_not_available(exc):
                raise
            work.skipped.append({"name": p.name, "action": "drop", "reason": "lock not granted"})
    return True


def prune_once(engine: Engine, horizons: Horizons, now: datetime, batch_size: int, *,
               stop: threading.Event | None = None, progress: Progress | None = None) -> PruneReport:
    """Remove, batch by batch, every row older than its horizon at `now` (and, on PostgreSQL, create
    the partitions ahead and drop those past their horizon); returns what was done. Stops between
    batches once `stop` is set (the report says so)."""
    report = PruneReport(False, now, horizons)
    partitioned = _partitioned(engine)
    for table in partitioned:
        report.partitions[table] = PartitionWork()
    _ensure_ahead(engine, partitioned, now, report)
    cutoffs = _cutoffs(horizons, now, bool(partitioned))
    after: list[datetime | None] = [None]
    defaults = {table: scheme.default_table() for table, scheme in partitioned.items()}

    def transitions(conn: Connection, cutoff: datetime) -> int:
        if "transitions" in defaults:  # the DEFAULT partition's old rows; the partitions are dropped whole
            return prune_history(conn, defaults["transitions"], cutoff, batch_size)
        n, after[0] = prune_transitions(conn, cutoff, after[0], batch_size)
        return n

    def outbox(conn: Connection, cutoff: datetime) -> int:
        if "outbox" in defaults:
            return prune_outbox(conn, cutoff, batch_size, defaults["outbox"])
        return prune_outbox(conn, cutoff, batch_size)

    steps: list[tuple[str, Callable[[Connection, datetime], int]]] = [
        ("ledger_settled", lambda conn, cutoff: prune_settled(conn, cutoff, batch_size)),
        ("ledger_dead_letters", lambda conn, cutoff: prune_dead_letters(conn, cutoff, batch_size)),
        ("transitions", transitions),
        ("outbox", outbox),
        ("shadow_effects", lambda conn, cutoff: prune_shadow_effects(conn, cutoff, batch_size)),
    ]
    for table, step in steps:
        cutoff = cutoffs[table]
        if cutoff is None:
            continue
        if table in partitioned and not _drop_expired(engine, table, partitioned[table], cutoff, now, report, stop):
            report.stopped = True
            return report
        while True:
            if stop is not None and stop.is_set():
                report.stopped = True
                return report
            with engine.begin() as conn:
                n = step(conn, cutoff)
            report.batches += 1
            report.removed[table] += n
            if progress is not None:
                progress(table, report.removed[table])
            if n < batch_size:
                break
    if partitioned:
        with engine.connect() as conn:
            for table, scheme in partitioned.items():
                report.partitions[table].default_rows_estimate = next(
                    (p.rows for p in parts.partitions(conn, scheme) if p.is_default), 0)
    log.info("prune pass removed %d rows in %d batches", sum(report.removed.values()), report.batches,
             extra={"removed": report.removed,
                    "partitions": {t: w.to_dict() for t, w in report.partitions.items()}})
    return report
