"""The long-running roles of `lapse run` (and of the single-role commands): each builds its room's
worker from settings, stops on SIGTERM/SIGINT, and releases its clients on the way out.

A role is `target(settings, kwargs)`, run in its own process by the supervisor.
"""

from __future__ import annotations

from typing import Any

from lapse.kernel.codec import Codec
from lapse.kernel.database import engine_from_settings
from lapse.kernel.kafka_clients import make_producer
from lapse.kernel.kinds import load_kinds
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


def run_worker(settings: Settings, kwargs: dict[str, Any]) -> None:
    """A cleanup worker in group lapse-cleanup until stopped (or idle for `exit_when_idle` s)."""
    check_startup(settings)
    worker = CleanupWorker(settings, stop=stop_on_signals())
    worker.run(exit_when_idle=kwargs.get("exit_when_idle"))


def run_delay_role(settings: Settings, kwargs: dict[str, Any]) -> None:
    """The delay-tier forwarder until stopped."""
    check_startup(settings, database=False)
    worker = DelayWorker(settings, stop=stop_on_signals())
    worker.run()


def run_relay_role(settings: Settings, kwargs: dict[str, Any]) -> int:
    """Relay until stopped (or idle for kwargs["exit_when_idle"] seconds); returns rows relayed."""
    check_startup(settings)
    stop = stop_on_signals()
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
    """A sweep pass every `sweep_interval_s` until stopped; an outage (`is_transient`) is waited
    out with backoff, then the pass runs again."""
    check_startup(settings)
    stop = stop_on_signals()
    engine = engine_from_settings(settings)
    producer = make_producer(settings)
    codec = Codec.from_settings(settings)
    kinds = load_kinds(settings, engine)
    try:
        outage = Outage("sweep", log)
        while not stop.is_set():
            try:
                sweep_once(engine, producer, codec, settings, kinds, stop=stop)
            except Exception as exc:
                if not is_transient(exc):
                    raise
                outage.wait(exc, stop)
                continue
            outage.over()
            stop.wait(settings.producer.sweep_interval_s)
    finally:
        producer.flush(10)
        engine.dispose()


def run_reconcile_role(settings: Settings, kwargs: dict[str, Any]) -> None:
    """A reconciler pass every `reconcile_interval_s` until stopped; an outage (`is_transient`) is
    waited out with backoff, any other failed pass is logged and retried next time."""
    check_startup(settings)
    stop = stop_on_signals()
    engine = engine_from_settings(settings)
    producer = make_producer(settings)
    reconciler = Reconciler(engine, producer, Codec.from_settings(settings), settings,
                            load_kinds(settings, engine), stop=stop)
    try:
        outage = Outage("reconcile", log)
        while not stop.is_set():
            try:
                reconciler.run_once()
            except Exception as exc:
                if is_transient(exc):
                    outage.wait(exc, stop)
                    continue
                log.exception("reconcile pass failed")
            else:
                outage.over()
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
