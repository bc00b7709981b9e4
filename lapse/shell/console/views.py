"""What each console page shows, as plain data, read through the functions the CLI reads with:
`lapse status` (`status_report`), `lapse show` (`operation_history`, `correlated_op_keys`),
`lapse dlq list` (its poison records) and `lapse dlq replay` (`dead_letters`, `replay`,
`record_action`). A page never runs SQL of its own."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError

from lapse.kernel.ledger import InvalidOpKey, Selection, parse_op_key
from lapse.kernel.outages import is_transient
from lapse.kernel.settings import Settings
from lapse.operator_actions import poison_records, recent_actions
from lapse.readers import (
    correlated_op_keys,
    daily_reports,
    filtered_dead_letters,
    has_operation,
    lag_status,
    lapse_op_keys,
    ledger_states,
    operation_history,
    operator_action,
    status_report,
    throughput,
)
from lapse.shell.console.verdict import judge
from lapse.shell.error_boundary import diagnose
from lapse.shell.time_args import parse_timestamp

# How far back a correlation id is looked for, and how many operations a search shows (as `lapse show`).
CORRELATION_LOOKBACK = timedelta(days=1)
SEARCH_LIMIT = 20
# The most dead letters one console replay releases (the CLI's --limit, bounded for a page).
REPLAY_LIMIT = 500
LIST_LIMIT = 200
# How long one reading of the broker serves the pages (its figures are seconds old at most): the
# consumer lag, and the poison records of the DLQ topic (a read of the whole topic to its end).
FRESH_S = 5.0


class Recent:
    """Readings of the broker kept FRESH_S per settings and key: pages opened together, or
    reloaded, the sampler and the live updates share one. A reading that failed is not kept."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: dict[tuple[int, str], tuple[Settings, float, Any]] = {}

    def get(self, settings: Settings, key: str, read: Callable[[], Any]) -> Any:
        with self._lock:
            kept = self._kept.get((id(settings), key))
            if kept is not None and kept[0] is settings and time.monotonic() - kept[1] < FRESH_S:
                return kept[2]
        value = read()
        with self._lock:
            self._kept[(id(settings), key)] = (settings, time.monotonic(), value)
        return value


_recent = Recent()


def overview_report(settings: Settings, engine: Engine, now: datetime) -> dict[str, Any]:
    """The status report (`lapse status --json`'s figures) with its lag rows marked `judged`. With
    the broker away the ledger's figures are still given, and the lag as unreadable. The broker's
    lag (kept FRESH_S: see fresh_lag) and the ledger's figures are read at once."""
    with ThreadPoolExecutor(1, thread_name_prefix="console-lag") as pool:
        lag = pool.submit(fresh_lag, settings, now)
        report = status_report(settings, engine, now, lag=False)
        try:
            report["lag"] = mark_judged(settings, lag.result())  # what status_report(lag=True) would add
        except Exception as exc:
            if not is_transient(exc):
                raise
            report["lag"] = [{"group": "every group", "topic": "every topic", "judged": True,
                              "error": error_line(exc, settings)}]
    return report


def mark_judged(settings: Settings, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The lag rows, each marked `judged`: whether its group counts in the verdict. The groups of
    the roles `lapse run` runs (cleanup, delay) always do; another declared group (analytics) only
    once it runs here: it has members, or committed offsets on some partition. A group nobody
    started is shown, never judged: its lag says nothing about this deployment."""
    ran = {settings.topology.groups.cleanup, settings.topology.groups.delay}
    started: set[str] = set()
    for row in rows:
        members = (row.get("group_state") or {}).get("members") or 0
        if members or any(p.get("committed") is not None for p in row.get("partitions", [])):
            started.add(row["group"])
    return [{**row, "judged": row["group"] in ran or row["group"] in started} for row in rows]


def overview(settings: Settings, engine: Engine, now: datetime) -> dict[str, Any]:
    """The overview's figures: the status report, its verdict and the throughput, the throughput
    read on its own connection while the status is."""
    with ThreadPoolExecutor(1, thread_name_prefix="console-overview") as pool:
        rates = pool.submit(_throughput, engine, now)
        report = overview_report(settings, engine, now)
        return {"status": report, "verdict": asdict(judge(report)), "throughput": rates.result()}


def fresh_lag(settings: Settings, now: datetime) -> list[dict[str, Any]]:
    """`lag_status` read at most once per FRESH_S for these settings: each declared group and
    topic takes the broker a round of requests (about 300 ms for the six of the default topology),
    the most of an overview."""
    lag: list[dict[str, Any]] = _recent.get(settings, "lag", lambda: lag_status(settings, now))
    return lag


def _throughput(engine: Engine, now: datetime) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return throughput(conn, now)


@dataclass(frozen=True)
class DeadLetterFilter:
    """The dead-letter list's filters and page, from the page's query string (`after_at` and
    `after_key`: the keyset of the last row of the page before); `problems` names what was refused
    (an unparsable time)."""

    kind: str | None = None
    tenant: str | None = None
    failure_class: str | None = None
    reason: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    poison: bool = True
    after: tuple[datetime, str] | None = None
    problems: tuple[str, ...] = field(default=())

    @classmethod
    def parse(cls, query: dict[str, str]) -> DeadLetterFilter:
        def text(name: str) -> str | None:
            return (query.get(name) or "").strip() or None

        times: dict[str, datetime | None] = {}
        problems = []
        for name in ("since", "until", "after_at"):
            value = text(name)
            try:
                times[name] = parse_timestamp(value) if value else None
            except ValueError as exc:
                problems.append(f"{name}: {exc}")
                times[name] = None
        after_key = text("after_key")
        after = (times["after_at"], after_key) if times["after_at"] and after_key else None
        return cls(text("kind"), text("tenant"), text("failure_class"), text("reason"), times["since"],
                   times["until"], query.get("poison", "1") != "0", after, tuple(problems))

    @property
    def wants_poison(self) -> bool:
        """Poison records have no tenant, reason or time in the ledger: listed on the first page
        unless those filter."""
        return (self.poison and not self.tenant and not self.reason and self.after is None
                and self.failure_class in (None, "poison"))

    def query(self, **changes: Any) -> dict[str, str]:
        """The query string of these filters (without the page), with `changes`."""
        out = {name: value for name, value in (
            ("kind", self.kind), ("tenant", self.tenant), ("failure_class", self.failure_class),
            ("reason", self.reason), ("since", self.since.isoformat() if self.since else None),
            ("until", self.until.isoformat() if self.until else None)) if value}
        if not self.poison:
            out["poison"] = "0"
        for name, value in changes.items():
            if value is None:
                out.pop(name, None)
            else:
                out[name] = str(value)
        return out

    def rows(self, conn: Connection, *, limit: int, replayed: bool | None = None,
             paged: bool = True) -> list[dict[str, Any]]:
        """The ledger's dead letters under these filters (from this page on, when `paged`)."""
        return filtered_dead_letters(conn, kind=self.kind, tenant=self.tenant, failure_class=self.failure_class,
                                     reason=self.reason, since=self.since, until=self.until, replayed=replayed,
                                     after=self.after if paged else None, limit=limit)


def poison_of(settings: Settings, flt: DeadLetterFilter) -> tuple[list[dict[str, Any]], str | None]:
    """The poison records of the DLQ topic under `flt` (none unless it wants them; read at most once
    per FRESH_S), or the one line saying why they could not be read (the broker away: the ledger's
    dead letters are still shown)."""
    if not flt.wants_poison:
        return [], None
    try:
        found: list[dict[str, Any]] = _recent.get(settings, f"poison:{flt.kind or ''}",
                                                  lambda: poison_records(settings, flt.kind, None, LIST_LIMIT))
        return found, None
    except Exception as exc:
        if not is_transient(exc) or isinstance(exc, DBAPIError):
            raise
        return [], error_line(exc, settings)


def with_timeline(h: dict[str, Any] | None) -> dict[str, Any] | None:
    """`h` with its transitions and outbox records merged into one `timeline`, oldest first, a
    transition before the records its transaction wrote (as `lapse show` prints them)."""
    if h is None:
        return None
    entries = ([(t["at"], 0, t["id"], "transition", t) for t in h["transitions"]]
               + [(o["created_at"], 1, o["id"], "outbox", o) for o in h["outbox"]])
    return {**h, "timeline": [{"type": kind, **entry} for *_, kind, entry in sorted(entries, key=lambda e: e[:3])]}


def history(engine: Engine, settings: Settings, op_key: str) -> dict[str, Any] | None:
    """One operation's whole history, as `lapse show OP_KEY` has it (None: no ledger row)."""
    with engine.connect() as conn:
        return with_timeline(operation_history(conn, op_key, settings.topology))


def search(engine: Engine, settings: Settings, query: str, now: datetime) -> dict[str, Any]:
    """An op key that has a ledger row (named only: see the search page), or the histories of the
    lapses of a subject (`kind:subject` of a kind with a generation) or of the operations a
    correlation id was seen with in the last day (as `lapse show`)."""
    query = query.strip()
    try:
        parse_op_key(query)
        is_key = True
    except InvalidOpKey:
        is_key = False
    with engine.connect() as conn:
        lapses = lapse_op_keys(conn, query, SEARCH_LIMIT + 1) if is_key else []
        if is_key and lapses in ([], [query]):
            # Named only: the page sends the browser to the operation's page, which reads its history.
            found = {"op_key": query} if has_operation(conn, query) else None
            return {"query": query, "operations": [found] if found else [], "more": False}
        # Each lapse of a subject of a kind with a generation, or what a correlation id was seen with.
        keys = lapses or correlated_op_keys(conn, query, now - CORRELATION_LOOKBACK, now, SEARCH_LIMIT + 1)
        found_all = [with_timeline(operation_history(conn, k, settings.topology)) for k in keys[:SEARCH_LIMIT]]
    return {"query": query, "operations": [h for h in found_all if h is not None], "more": len(keys) > SEARCH_LIMIT}


def replay_selection(op_keys: list[str], include_replayed: bool) -> Selection:
    """The dead letters a console replay names: the op keys ticked on the list."""
    return Selection(op_keys=tuple(sorted(set(op_keys))), include_replayed=include_replayed)


def action_progress(engine: Engine, action_id: int) -> dict[str, Any] | None:
    """An operator action and, for a console replay, where each released op key is now."""
    with engine.connect() as conn:
        action = operator_action(conn, action_id)
        if action is None:
            return None
        keys = list((action["details"] or {}).get("op_keys") or [])
        states = ledger_states(conn, keys)
    return {"action": action, "op_keys": [states.get(k, {"op_key": k, "state": None}) for k in keys]}


def activity(engine: Engine) -> dict[str, Any]:
    """The stored daily reports and the recent operator actions."""
    with engine.connect() as conn:
        return {"reports": daily_reports(conn), "actions": [asdict(a) for a in recent_actions(conn, 100)]}


def now_utc() -> datetime:
    return datetime.now(UTC)


def error_line(exc: BaseException, settings: Settings) -> str:
    """An error as the CLI's one line says it (secrets masked, no traceback, SQL or parameters)."""
    return diagnose(exc, settings).line.removeprefix("lapse: ").removesuffix(" (run with --debug for the traceback)")


__all__ = ["DeadLetterFilter", "action_progress", "activity", "history", "mark_judged", "now_utc", "overview",
           "overview_report", "poison_of", "replay_selection", "search"]
