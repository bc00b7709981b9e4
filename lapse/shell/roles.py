"""The long-running roles of `lapse run` (and of the single-role commands): each builds its room's
worker from settings, stops on SIGTERM/SIGINT, and releases its clients on the way out.

A role is `target(settings, kwargs)`, run in its own process by the supervisor.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
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
from lapse.reconciler import Reconciler
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

    def one_pass() -> bool:
        try:
            reconciler.run_once()
        except Exception as exc:
            if _is_outage(exc):
                raise
            log.exception("reconcile pass failed")
        return True

    try:
        while when_reachable("reconcile", stop, one_pass) is not None:
            stop.wait(settings.reconciler.interval_s)
    finally:
        producer.flush(10)
        engine.dispose()


def run_monitor_role(settings: Settings, kwargs: dict[str, Any]) -> None:
    """Keep the oldest-eligible, claim and lag gauges current until stopped."""
    check_startup(settings)
    monitor(settings, stop_on_signals(), kwargs.get("interval_s", 15.0))


def pipeline_roles(workers: int) -> list[Role]:
    """The smallest topology: a sweep, `workers` processors, a relay, a delay-tier forwarder and a
    reconciler; role i serves metrics on metrics_port + i."""
    roles = [Role("sweep", run_sweep_role, {}), Role("relay", run_relay_role, {})]
    roles += [Role(f"process-{i}", run_worker, {}) for i in range(workers)]
    roles.append(Role("delay", run_delay_role, {}))  # forwards retries and wake-ups when due
    roles.append(Role("reconcile", run_reconcile_role, {}))  # its own, slower interval
    for offset, role in enumerate(roles):
        role.kwargs["metrics_offset"] = offset
    return roles
