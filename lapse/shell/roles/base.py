"""The long-running roles of `lapse run` (and of the single-role commands): each builds its room's
worker from settings, stops on SIGTERM/SIGINT, and releases its clients on the way out.

A role is `target(settings, kwargs)`, run in its own process by the supervisor.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy import Engine

from lapse.kernel.codec import Codec
from lapse.kernel.database import engine_from_settings
from lapse.kernel.kafka_clients import make_producer
from lapse.kernel.kinds import CleanupKind, load_kinds
from lapse.kernel.logs import get_logger
from lapse.kernel.outages import Outage, is_transient
from lapse.kernel.settings import Settings
from lapse.kernel.signals import stop_on_signals
from lapse.kernel.startup_checks import check_startup
from lapse.processors import CleanupWorker, DelayWorker
from lapse.producers import run_relay, sweep_once
from lapse.reconciler import (
    PassResult,
    Reconciler,
    horizons_from_settings,
    notifier_from_settings,
    prune_once,
    run_daily_reports,
)
from lapse.shell.metrics import monitor
from lapse.shell.supervisor import Role

log = get_logger("roles")
T = TypeVar("T")


def _is_outage(exc: BaseException) -> bool:
    """An outage, or an error raised while meeting one (a kinds file that could not read its table
    because the database was away)."""
    seen: BaseException | None = exc
    for _ in range(5):
        if seen is None:
            return False
        if is_transient(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def when_reachable(role: str, stop: threading.Event, start: Callable[[], T]) -> T | None:
    """The role's start-up (`start`: checks, kinds, clients), waiting out an outage with backoff
    instead of exiting, so a role started while the database or broker is away starts once it is
    back; anything else is raised. None when stopped first."""
    outage = Outage(role, log)
    while not stop.is_set():
        try:
            started = start()
        except Exception as exc:
            if not _is_outage(exc):
                raise
            outage.wait(exc, stop)
            continue
        outage.over()
        return started
    return None


def every_interval(role: str, stop: threading.Event, interval_s: float, run: Callable[[], object]) -> None:
    """`run` a pass every `interval_s` until stopped: a pass that meets an outage is waited out
    with backoff and run again (`when_reachable`); any other failed pass is logged and tried again
    at the next interval."""
    def one_pass() -> bool:
        try:
            run()
        except Exception as exc:
            if _is_outage(exc):
                raise
            log.exception("%s pass failed", role)
        return True

    while when_reachable(role, stop, one_pass) is not None:
        stop.wait(interval_s)


def checked_kinds(settings: Settings, engine: Engine) -> dict[str, CleanupKind]:
    """The start-up checks, then the kinds compiled against the database: what the sweep and the
    reconciler need before their first pass."""
    check_startup(settings)
    return load_kinds(settings, engine)


def run_worker(settings: Settings, kwargs: dict[str, Any]) -> None:
    """A cleanup worker in group lapse-cleanup until stopped (or idle for `exit_when_idle` s)."""
    stop = stop_on_signals()
    exit_when_idle = kwargs.get("exit_when_idle")

    def start() -> CleanupWorker:
        check_startup(settings)
        return CleanupWorker(settings, stop=stop)

    # A bounded run reports an unreachable dependency at once; a service waits for it.
    worker = start() if exit_when_idle is not None else when_reachable("process", stop, start)
    if worker is not None:
        worker.run(exit_when_idle=exit_when_idle)


def run_delay_role(settings: Settings, kwargs: dict[str, Any]) -> None:
    """The delay-tier forwarder until stopped."""
    check_startup(settings, database=False)
    worker = DelayWorker(settings, stop=stop_on_signals())
    worker.run()


def run_relay_role(settings: Settings, kwargs: dict[str, Any]) -> int:
    """Relay until stopped (or idle for kwargs["exit_when_idle"] seconds); returns rows relayed."""
    stop = stop_on_signals()

    def start() -> bool:
        check_startup(settings)
        return True

    if kwargs.get("exit_when_idle") is not None:  # a bounded run reports an outage at once
        start()
    elif when_reachable("relay", stop, start) is None:
        return 0
    engine = engine_from_settings(settings)
    producer = make_producer(settings)
    try:
        return run_relay(engine, producer, Codec.from_settings(settings),
                         limit=settings.producer.relay_batch_size, idle_s=settings.producer.relay_interval_s,
                         stop=stop, exit_when_idle=kwargs.get("exit_when_idle"))
    finally:
        producer.flush(10)
        engine.dispose()


def run_sweep_role(settings: Settings, kwargs: dict[str, Any]) -> None:
    """A sweep pass every `sweep_interval_s` until stopped; a pass that meets an outage is waited
    out with backoff and run again (`when_reachable`)."""
    stop = stop_on_signals()
    engine = engine_from_settings(settings)
    kinds = when_reachable("sweep", stop, lambda: checked_kinds(settings, engine))
    if kinds is None:
        engine.dispose()
        return
    producer = make_producer(settings)
    codec = Codec.from_settings(settings)
    try:
        while when_reachable("sweep", stop, lambda: sweep_once(engine, producer, codec, settings, kinds,
                                                               stop=stop)) is not None:
            stop.wait(settings.producer.sweep_interval_s)
    finally:
        producer.flush(10)
        engine.dispose()


def run_reconcile_role(settings: Settings, kwargs: dict[str, Any]) -> None:
    """A reconciler pass every `reconcile_interval_s` until stopped; a pass that meets an outage is
    waited out with backoff and run again (`when_reachable`), any other failed pass is logged and
    retried next time."""
    stop = stop_on_signals()
    engine = engine_from_settings(settings)
    kinds = when_reachable("reconcile", stop, lambda: checked_kinds(settings, engine))
    if kinds is None:
        engine.dispose()
        return
    producer = make_producer(settings)
    reconciler = Reconciler(engine, producer, Codec.from_settings(settings), settings, kinds, stop=stop)

    try:
        every_interval("reconcile", stop, settings.reconciler.interval_s, reconciler.run_once)
    finally:
        producer.flush(10)
        engine.dispose()


def run_monitor_role(settings: Settings, kwargs: dict[str, Any]) -> None:
    """Add the status samples (oldest eligible age, ledger rows, outbox, lag) to this process's
    metrics, read when scraped, until stopped: a monitor of its own (`lapse status --watch`,
    compose's monitor service). `lapse run` needs none: its supervisor serves them."""
    check_startup(settings)
    monitor(settings, stop_on_signals(), kwargs.get("interval_s", 15.0))


def run_report_role(settings: Settings, kwargs: dict[str, Any]) -> None:
    """The daily report until stopped: each pass (every `report.interval_s`) rebuilds the open day's
    partial report and stores and sends the final report of a day once it has closed. A pass that
    meets an outage is waited out with backoff (`when_reachable`); any other failed pass is logged
    and retried next time."""
    stop = stop_on_signals()
    notifier = notifier_from_settings(settings)  # a notifier without what it needs: a config error
    engine = engine_from_settings(settings)

    def start() -> bool:
        check_startup(settings)
        return True

    if when_reachable("report", stop, start) is None:
        engine.dispose()
        return

    def guarded(run: Callable[[], PassResult]) -> Callable[[], PassResult]:
        def one_pass() -> PassResult:
            try:
                return run()
            except Exception as exc:
                if _is_outage(exc):
                    raise
                log.exception("report pass failed")
                return PassResult()
        return one_pass

    try:
        run_daily_reports(engine, notifier, settle=timedelta(seconds=settings.report.settle_s),
                          interval_s=settings.report.interval_s, stop=stop,
                          attempt=lambda run: when_reachable("report", stop, guarded(run)))
    finally:
        engine.dispose()


def run_prune_role(settings: Settings, kwargs: dict[str, Any]) -> None:
    """Retention until stopped: a prune pass every `retention.interval_s`, each in bounded batches
    that stop between batches on SIGTERM. A horizon shorter than topics.yaml allows is refused
    before any work; a pass that meets an outage is waited out with backoff (`when_reachable`), any
    other failed pass is logged and retried next time."""
    stop = stop_on_signals()
    horizons = horizons_from_settings(settings)  # a refused horizon is a configuration error

    def start() -> bool:
        check_startup(settings)
        return True

    if when_reachable("prune", stop, start) is None:  # stopped first
        return
    engine = engine_from_settings(settings)

    try:
        every_interval("prune", stop, settings.retention.interval_s, lambda: prune_once(
            engine, horizons, datetime.now(UTC), settings.retention.batch_size, stop=stop))
    finally:
        engine.dispose()


def run_console_role(settings: Settings, kwargs: dict[str, Any]) -> None:
    """The operator console (`lapse console`) until SIGTERM, which uvicorn turns into a clean stop."""
    # function-local: the console's web stack (starlette, uvicorn) is the optional `console` extra
    from lapse.shell.console.server import serve

    serve(settings)


def pipeline_roles(workers: int, *, console: bool = False) -> list[Role]:
    """The smallest topology: a sweep, `workers` processors, a relay, a delay-tier forwarder, a
    reconciler, the daily report and retention's prune, and with `console` the operator console.
    With a metrics port, the supervisor serves all their metrics on that one port."""
    roles = [Role("sweep", run_sweep_role, {}), Role("relay", run_relay_role, {})]
    roles += [Role(f"process-{i}", run_worker, {}) for i in range(workers)]
    roles.append(Role("delay", run_delay_role, {}))  # forwards retries and wake-ups when due
    roles.append(Role("reconcile", run_reconcile_role, {}))  # its own, slower interval
    roles.append(Role("report", run_report_role, {}))  # the daily report, once each day closes
    roles.append(Role("prune", run_prune_role, {}))  # retention, every retention.interval_s
    if console:
        roles.append(Role("console", run_console_role, {}))
    return roles
