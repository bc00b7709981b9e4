"""What each console page shows, as plain data, read through the functions the CLI reads with:
`lapse status` (`status_report`), `lapse show` (`operation_history`, `correlated_op_keys`),
`lapse dlq list` (its poison records) and `lapse dlq replay` (`dead_letters`, `replay`,
`record_action`). A page never runs SQL of its own."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine
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
# How long one reading of the consumer lag serves the overview (its figures are seconds old at most).
LAG_FRESH_S = 5.0
_lag_lock = threading.Lock()
_lag_kept: dict[int, tuple[Settings, float, list[dict[str, Any]]]] = {}


def overview(settings: Settings, engine: Engine, now: datetime) -> dict[str, Any]:
    """The status report (`lapse status --json`'s figures), its verdict and the throughput. With
    the broker away the ledger's figures are still shown, and the lag as unreadable (failing).
    The broker's lag (kept LAG_FRESH_S: see fresh_lag), the ledger's figures and the throughput
    are read at once, each on its own connection: the page takes the slowest of the three."""
    with ThreadPoolExecutor(3, thread_name_prefix="console-overview") as pool:
        lag = pool.submit(fresh_lag, settings, now)
        rates = pool.submit(_throughput, engine, now)
        report = status_report(settings, engine, now, lag=False)
        try:
            report["lag"] = lag.result()  # what status_report(lag=True) would add
        except Exception as exc:
            if not is_transient(exc):
                raise
            report["lag"] = [{"group": "every group", "topic": "every topic", "error": error_line(exc, settings)}]
        return {"status": report, "verdict": asdict(judge(report)), "throughput": rates.result()}


def fresh_lag(settings: Settings, now: datetime) -> list[dict[str, Any]]:
    """`lag_status` read at most once per LAG_FRESH_S for these settings: each declared group and
    topic takes the broker a round of requests (about 300 ms for the six of the default topology),
    the most of an overview; pages opened together, or reloaded, share one reading. A reading
    that failed is not kept."""
    with _lag_lock:
        kept = _lag_kept.get(id(settings))
        if kept is not None and kept[0] is settings and time.monotonic() - kept[1] < LAG_FRESH_S:
            return kept[2]
    lag = lag_status(settings, now)
    with _lag_lock:
        _lag_kept[id(settings)] = (settings, time.monotonic(), lag)
    return lag


def _throughput(engine: Engine, now: datetime) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return throughput(conn, now)


@dataclass(frozen=True)
class DeadLetterFilter:
    """The dead-letter list's filters, from the page's query string; `problems` names what was
    refused (an unparsable time)."""

    kind: str | None = None
    tenant: str | None = None
    failure_class: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    poison: bool = True
    problems: tuple[str, ...] = field(default=())

    @classmethod
    def parse(cls, query: dict[str, str]) -> DeadLetterFilter:
        def text(name: str) -> str | None:
            return (query.get(name) or "").strip() or None

        times: dict[str, datetime | None] = {}
        problems = []
        for name in ("since", "until"):
            value = text(name)
            try:
                times[name] = parse_timestamp(value) if value else None
            except ValueError as exc:
                problems.append(f"{name}: {exc}")
                times[name] = None
        return cls(text("kind"), text("tenant"), text("failure_class"), times["since"], times["until"],
                   query.get("poison", "1") != "0", tuple(problems))

    @property
    def wants_poison(self) -> bool:
        """Poison records have no tenant and no time in the ledger: listed unless those filter."""
        return self.poison and not self.tenant and self.failure_class in (None, "poison")


def dead_letter_list(settings: Settings, engine: Engine, flt: DeadLetterFilter) -> dict[str, Any]:
    """The ledger's dead letters under `flt`, then the poison records of the DLQ topic."""
    rows: list[dict[str, Any]] = []
    if flt.failure_class != "poison":
        with engine.connect() as conn:
            rows = filtered_dead_letters(conn, kind=flt.kind, tenant=flt.tenant, failure_class=flt.failure_class,
                                         since=flt.since, until=flt.until, limit=LIST_LIMIT)
    poison: list[dict[str, Any]] = []
    poison_error = None
    if flt.wants_poison:
        try:
            poison = poison_records(settings, flt.kind, None, LIST_LIMIT)
        except Exception as exc:  # the broker away: the ledger's dead letters are still shown
            if not is_transient(exc) or isinstance(exc, DBAPIError):
                raise
            poison_error = error_line(exc, settings)
    return {"dead_letters": rows, "poison": poison, "poison_error": poison_error}


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


__all__ = ["DeadLetterFilter", "action_progress", "activity", "dead_letter_list", "history", "now_utc", "overview",
           "replay_selection", "search"]
