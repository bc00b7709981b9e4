"""What every long-running role shares: `Role` (start-up checks, clients, run, run once, close) and
`run_role`, the one way each entry point (`lapse run`, a single-role command, its `--once`) runs one.

A service waits out a dependency that is away at start with backoff (`when_reachable`); a bounded
run (`--once`, `--exit-when-idle`) raises it at once, for the error boundary's one line.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from functools import cached_property
from typing import ClassVar, Generic, TypeVar

from confluent_kafka import Producer
from sqlalchemy import Engine

from lapse.kernel.clock_watch import ClockWatch
from lapse.kernel.database import engine_from_settings
from lapse.kernel.heap import set_aside_startup_heap
from lapse.kernel.kafka_clients import make_producer
from lapse.kernel.kafka_logs import leave_connection_failures_to_caller
from lapse.kernel.kinds import CleanupKind, load_kinds
from lapse.kernel.logs import get_logger
from lapse.kernel.outages import Outage, outage_in
from lapse.kernel.settings import Settings
from lapse.shell.signals import stop_on_signals
from lapse.shell.startup_checks import check_kafka, check_startup
from lapse.shell.tracing_setup import start_tracing

log = get_logger("roles")
T = TypeVar("T")
R = TypeVar("R")


def is_outage(exc: BaseException) -> bool:
    """An outage, or an error raised while meeting one (a kinds file that could not read its table
    because the database was away); a connection that failed (an archive store's endpoint away) too."""
    if outage_in(exc) is not None:
        return True
    seen: BaseException | None = exc
    for _ in range(5):
        if seen is None:
            return False
        if isinstance(seen, ConnectionError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def when_reachable(role: str, stop: threading.Event, start: Callable[[], T],
                   settings: Settings | None = None) -> T | None:
    """`start()`, waiting out an outage with backoff (a warning naming what is away when it begins,
    and again while it lasts) and raising anything else; None when stopped first."""
    outage = Outage(role, log, settings=settings)
    while not stop.is_set():
        try:
            started = start()
        except Exception as exc:
            if not is_outage(exc):
                raise
            outage.wait(exc, stop)
            continue
        outage.over()
        return started
    return None


def every_interval(role: str, stop: threading.Event, interval_s: float, run: Callable[[], object]) -> None:
    """`run` a pass every `interval_s` until stopped: an outage is waited out (`when_reachable`),
    any other failed pass is logged and tried again at the next interval."""
    def one_pass() -> bool:
        try:
            run()
        except Exception as exc:
            if is_outage(exc):
                raise
            log.exception("%s pass failed", role)
        return True

    while when_reachable(role, stop, one_pass) is not None:
        stop.wait(interval_s)


class Role(ABC, Generic[R]):
    """One long-running role built from settings: `check` (start-up checks), `open` (its clients),
    `run` until stopped or, when `bounded`, `run_once`; `close` releases what it opened."""

    name: ClassVar[str]
    uses_database: ClassVar[bool] = True  # False: the start-up checks leave the database alone
    uses_kafka: ClassVar[bool] = True  # False: the start-up checks leave the brokers alone
    uses_kinds: ClassVar[bool] = False  # True: `check` compiles the kinds file against the database
    produces: ClassVar[bool] = False  # True: `open` makes a producer, `close` flushes it

    def __init__(self, settings: Settings, *, stop: threading.Event | None = None) -> None:
        self.settings = settings
        self.stop = stop or threading.Event()
        self.kinds: dict[str, CleanupKind] = {}
        self._producer: Producer | None = None
        # This process's wall clock against the database's, measured while a service runs.
        self.clock_watch = ClockWatch(settings, self.name, lambda: self.engine)

    @property
    def bounded(self) -> bool:
        """A bounded run (`--once`, `--exit-when-idle`) reports an outage at once; a service waits."""
        return False

    @property
    def producer(self) -> Producer:
        """The role's producer (`produces`), made by `open`."""
        assert self._producer is not None, "the producer is made by open"
        return self._producer

    @property
    def stops_on_signals(self) -> bool:
        """Whether SIGTERM/SIGINT end the run between steps; a one-pass run is interrupted instead
        (Ctrl-C: exit 5), as any one-shot command."""
        return not self.bounded

    @cached_property
    def engine(self) -> Engine:
        """The role's database engine, made on first use and disposed by `close`."""
        return engine_from_settings(self.settings)

    def check(self) -> None:
        """The start-up checks (StartupRefused: exit 3), tracing where it is configured, the kinds
        where the role uses them, then that a broker answers; an unreachable dependency raises its
        outage."""
        check_startup(self.settings, database=self.uses_database)
        start_tracing(self.settings)
        if self.uses_kinds:
            self.kinds = load_kinds(self.settings, self.engine)
        if self.uses_kafka:
            check_kafka(self.settings)

    def open(self) -> None:
        """Make the role's clients once the checks passed; retried while a dependency is away."""
        if self.produces and self._producer is None:
            self._producer = make_producer(self.settings)

    @abstractmethod
    def run(self) -> R:
        """Work until stopped (or, for `--exit-when-idle`, until idle)."""

    def run_once(self) -> R:
        """One pass, then return (the role's `--once`); by default the same as `run`."""
        return self.run()

    def close(self) -> None:
        """Release the role's clients: flush the producer, dispose of the engine (subclasses add their own)."""
        try:
            if self._producer is not None:
                self._producer.flush(10)
        finally:
            if "engine" in self.__dict__:
                self.engine.dispose()

    def start(self) -> bool:
        """`check` then `open`: a bounded run raises an unreachable dependency at once, a service
        waits it out with backoff. False when stopped first."""
        def begin() -> bool:
            self.check()
            self.open()
            return True

        if self.bounded:
            leave_connection_failures_to_caller()  # the command says it once, in its one line
            return begin()
        return when_reachable(self.name, self.stop, begin, self.settings) is not None


class PassRole(Role[R]):
    """A role that works in passes; `once`: one pass, reported (`--once`)."""

    def __init__(self, settings: Settings, *, once: bool = False, stop: threading.Event | None = None) -> None:
        super().__init__(settings, stop=stop)
        self.once = once

    @property
    def bounded(self) -> bool:
        return self.once


class StreamRole(Role[R]):
    """A role that consumes or relays until stopped; `exit_when_idle`: stop after that many seconds
    with nothing to do (`--exit-when-idle`). SIGTERM ends it after its step, idle or not."""

    def __init__(self, settings: Settings, *, exit_when_idle: float | None = None,
                 stop: threading.Event | None = None) -> None:
        super().__init__(settings, stop=stop)
        self.exit_when_idle = exit_when_idle

    @property
    def bounded(self) -> bool:
        return self.exit_when_idle is not None

    @property
    def stops_on_signals(self) -> bool:
        return True


def run_role(role: Role[R]) -> R | None:
    """Run `role` to its end in this process: SIGTERM/SIGINT stop it (`Role.stops_on_signals`),
    start-up as `Role.start`, then `run_once` when bounded or `run`; always `close`. None when
    stopped before it started."""
    if role.stops_on_signals:
        stop_on_signals(role.stop)
    watched = threading.Event()  # set: the clock watch of a service ends
    try:
        if not role.start():
            return None
        if role.bounded:
            return role.run_once()
        set_aside_startup_heap()  # a service: what it holds from its start, out of the collector's passes
        role.clock_watch.start(watched)
        return role.run()
    finally:
        watched.set()
        role.close()
