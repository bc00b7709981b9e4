"""The fairness stage: how long four small tenants' rows take while one tenant holds a backlog,
against how long they take alone (docs/design/limits.md, "Fair shares").

Tenant A holds `backlog` due rows, due before B, C, D and E's `small` rows each. Worker processes
are started and warmed up (a first row applied); then, `repeats` times, the small tenants' rows are
seeded alone and then with A's backlog, and each time the sweep runs from a measured start until
nothing is left while a watcher notes when the small tenants' last row, and A's last row, turned
terminal. Alternating the two keeps them under the same load. The figure is the ratio of the
medians of the small tenants' times, which fairness keeps near 1 (target at most 1.1), with A's
rate, which shows the backlog kept the rest of the capacity.
"""

from __future__ import annotations

import statistics
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine, delete, func, select, text

from lapse.devtools.bench.lapse_stage import start_workers
from lapse.devtools.bench.ledger_watch import StageFailed
from lapse.kernel.codec import Codec
from lapse.kernel.database import engine_from_settings
from lapse.kernel.kafka_clients import make_producer
from lapse.kernel.kinds import load_kinds
from lapse.kernel.ledger import TERMINAL
from lapse.kernel.models import cleanup_ledger as L
from lapse.kernel.settings import Settings
from lapse.producers import EmitWindow, sweep_once
from lapse.shell.supervisor import Supervisor

SMALL_TENANTS = ("b", "c", "d", "e")
BACKLOG_TENANT = "a"
WARM_UP = "warm-up"
WARM_UP_S = 120.0
TARGET_RATIO = 1.1
POLL_S = 0.01


def _seed(engine: Engine, tenant: str, count: int, due: datetime) -> None:
    if count:
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO reservations (tenant, status, expires_at) "
                              "SELECT :tenant, 'held', :due FROM generate_series(1, :n)"),
                         {"tenant": tenant, "due": due, "n": count})


def _terminal(engine: Engine, tenants: tuple[str, ...]) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).where(L.c.tenant.in_(tenants), L.c.state.in_(TERMINAL)))
                   .scalar_one())


class _Watch(threading.Thread):
    """Notes (monotonic) when `n` rows of `tenants` are terminal."""

    def __init__(self, engine: Engine, tenants: tuple[str, ...], n: int) -> None:
        super().__init__(daemon=True)
        self.engine, self.tenants, self.n = engine, tenants, n
        self.done_at: float | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            if _terminal(self.engine, self.tenants) >= self.n:
                self.done_at = time.monotonic()
                return
            time.sleep(POLL_S)


class _Stage:
    """The stage's workers, producer and kinds, and one measured sweep after another."""

    def __init__(self, settings: Settings, workers: int) -> None:
        self.settings = settings
        self.engine = engine_from_settings(settings)
        self.sup: Supervisor = start_workers(settings, workers)
        self.producer, self.codec = make_producer(settings), Codec.from_settings(settings)
        self.kinds = load_kinds(settings, self.engine)

    def warm_up(self) -> None:
        """Wait until the workers have joined their group and applied a first row."""
        self._reset()
        _seed(self.engine, WARM_UP, 1, datetime.now(UTC) - timedelta(hours=3))
        sweep_once(self.engine, self.producer, self.codec, self.settings, self.kinds)
        deadline = time.monotonic() + WARM_UP_S
        while _terminal(self.engine, (WARM_UP,)) < 1:
            if time.monotonic() > deadline or not self._alive():
                raise StageFailed(f"the workers applied nothing in {WARM_UP_S:.0f}s")
            time.sleep(0.1)

    def _alive(self) -> bool:
        return all(p.is_alive() for p in self.sup.procs.values())

    def _reset(self) -> None:
        """No business rows, and no ledger rows of the stage's tenants: a measurement starts from none."""
        with self.engine.begin() as conn:
            conn.execute(text("DELETE FROM reservations"))
            conn.execute(delete(L).where(L.c.tenant.in_((WARM_UP, BACKLOG_TENANT, *SMALL_TENANTS))))

    def measure(self, backlog: int, small: int, timeout_s: float) -> tuple[float, float | None]:
        """The small tenants' and A's times (s) from the sweep's start, with `backlog` rows of A."""
        self._reset()
        now = datetime.now(UTC)
        _seed(self.engine, BACKLOG_TENANT, backlog, now - timedelta(hours=2))
        for tenant in SMALL_TENANTS:
            _seed(self.engine, tenant, small, now - timedelta(hours=1))
        with self.engine.begin() as conn:
            conn.execute(text("ANALYZE reservations"))  # as autovacuum would have, on a table not seeded a moment ago
        watches = [_Watch(self.engine, SMALL_TENANTS, small * len(SMALL_TENANTS)),
                   _Watch(self.engine, (BACKLOG_TENANT,), backlog)]
        for watch in watches:
            watch.start()
        windows: dict[str, EmitWindow] = {}  # a sweep that runs on, as the sweep role's
        started = time.monotonic()
        try:
            while watches[0].done_at is None or watches[1].done_at is None:
                report = sweep_once(self.engine, self.producer, self.codec, self.settings, self.kinds,
                                    windows=windows)
                if time.monotonic() - started > timeout_s or not self._alive():
                    raise StageFailed(f"the fairness stage did not finish: {report}")
                if not report.emitted:
                    time.sleep(0.05)
        finally:
            for watch in watches:
                watch.stop.set()
        small_done, backlog_done = (w.done_at - started for w in watches)  # type: ignore[operator]
        return small_done, backlog_done if backlog else None

    def close(self) -> None:
        self.sup.shutdown()
        self.producer.flush(10)
        self.engine.dispose()


def run_fairness(settings: Settings, backlog: int, small: int = 100, workers: int = 2, repeats: int = 3,
                 timeout_s: float = 1800.0) -> dict[str, Any]:
    """The figure, measured `repeats` times each way in the stage's database (its reservations
    replaced): the small tenants' median times alone and with A's backlog, their ratio, A's rate."""
    stage = _Stage(settings, workers)
    alone: list[float] = []
    with_backlog: list[float] = []
    backlog_s: list[float] = []
    try:
        stage.warm_up()
        for _ in range(repeats):
            alone.append(stage.measure(0, small, timeout_s)[0])
            small_s, backlog_done = stage.measure(backlog, small, timeout_s)
            with_backlog.append(small_s)
            backlog_s.append(backlog_done or 0.0)
    finally:
        stage.close()
    ratio = statistics.median(with_backlog) / statistics.median(alone)
    return {"backlog": backlog, "small_rows": small * len(SMALL_TENANTS), "workers": workers, "repeats": repeats,
            "small_alone_s": [round(s, 3) for s in alone], "small_with_backlog_s": [round(s, 3) for s in with_backlog],
            "backlog_done_s": [round(s, 3) for s in backlog_s],
            "backlog_rows_per_s": round(backlog / statistics.median(backlog_s), 1),
            "ratio": round(ratio, 3), "target": TARGET_RATIO, "met": ratio <= TARGET_RATIO}
