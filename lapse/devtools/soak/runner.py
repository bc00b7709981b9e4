"""One soak run: its own broker (or the given one), a fresh PostgreSQL database with the demo's
tables, a ledger pre-seeded with finished rows, `lapse run`'s roles (pruning among them), and a
steady offered load for `minutes`, read every `sample_s`; then the verdict.

The run's expiry topic is retained for half the run, so the ledger's retention horizon (that
retention plus the reconciler's grace, as lapse.reconciler derives it) lets the rows finished in
the run's first part be pruned in its last part: the steady state of a ledger in service. The
seeded rows finished over the day before the horizon, so pruning starts with all of them to remove
(as when retention is first turned on over an old ledger) while the load runs.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from sqlalchemy import Engine, func, select

from lapse.devtools.bench.databases import BenchDatabases, admin_url_for
from lapse.devtools.bench.events import delete_topics
from lapse.devtools.bench.runner import given_or_own_broker
from lapse.devtools.demo import prepare
from lapse.devtools.demo_kinds import write_demo_kinds
from lapse.devtools.soak.load import OfferedLoad
from lapse.devtools.soak.samples import Sample, finished_between, rotated_tables, take_sample
from lapse.devtools.soak.seed import seed_finished
from lapse.devtools.soak.verdict import judge, per_minute
from lapse.kernel.database import engine_from_settings
from lapse.kernel.ledger import APPLIED
from lapse.kernel.logs import configure_logging
from lapse.kernel.models import cleanup_ledger
from lapse.kernel.settings import Settings
from lapse.kernel.topology import load_topology
from lapse.kernel.yaml_files import load_file
from lapse.shell.progress import progress_bar
from lapse.shell.roles import child_of, pipeline_roles
from lapse.shell.supervisor import Child, Supervisor

PARTITIONS = 4
WARM_UP_S = 180.0  # the roles' start-up: spawn, imports, start-up checks, group joins
GRACE_S = 60.0  # the reconciler's grace in a soak: part of the ledger's horizon
SEED_SPAN = timedelta(days=1)  # the seeded rows' finish times spread over this, before the horizon
OBJECT_FAULT_RATE = 0.05  # share of object-store deletes that fail (retried, a few dead-lettered)


@dataclass(frozen=True)
class SoakPlan:
    minutes: float = 10.0
    rate: float = 300.0
    seed_rows: int = 2_000_000
    workers: int = 2
    sample_s: float = 60.0

    @property
    def retention_s(self) -> int:
        """The run's expiry retention: half its length (at least a minute)."""
        return max(60, int(self.minutes * 60 / 2))


def soak_topics_file(source: Path, folder: Path, retention_s: int, partitions: int) -> Path:
    """A copy of the topics file whose expiry topic keeps `retention_s` and has `partitions`."""
    doc = load_file(source, "topics file")
    for body in doc["topics"].values():
        if body.get("role") == "expiry":
            body["retention"] = f"{retention_s}s"
        body["partitions"] = min(int(body.get("partitions", 1)), partitions)
    target = folder / "topics.yaml"
    target.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return target


def soak_roles(workers: int) -> list[Child]:
    """`lapse run`'s roles, with a prune role added where the pipeline has none."""
    roles = pipeline_roles(workers)
    if not any(r.name == "prune" for r in roles):
        roles.append(child_of("prune"))
    return roles


def run_soak(settings: Settings, soak: SoakPlan, progress: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    # The load's poison and failing deletes are dead-lettered on purpose: each would log a warning.
    quiet = {} if "log_level" in settings.runtime.model_fields_set else {"log_level": "ERROR"}
    with given_or_own_broker(settings, progress) as settings:
        settings = settings.with_(runtime=quiet)
        configure_logging(settings)
        dbs = BenchDatabases(admin_url_for(settings.database.url_plain()))
        try:
            with tempfile.TemporaryDirectory(prefix="lapse-soak-") as tmp:
                folder = Path(tmp)
                (folder / "objects").mkdir()
                settings = settings.with_(
                    database={"url": dbs.create("soak")},
                    kinds={"file": write_demo_kinds(folder)},
                    topics={"file": soak_topics_file(settings.topics.file, folder, soak.retention_s, PARTITIONS),
                            "prefix": f"soak-{dbs.run_id}."},
                    reconciler={"grace_s": GRACE_S, "interval_s": 30.0},
                    # Sent outbox rows kept as long as finished ledger rows (a day by default), so
                    # the outbox reaches its steady size within the run too.
                    retention={"interval_s": 15.0, "outbox_horizon_s": soak.retention_s + GRACE_S},
                    producer={"sweep_interval_s": 2.0},
                    processor={"session_timeout_ms": 6000},
                    dev={"object_store_fault_rate": OBJECT_FAULT_RATE},
                )
                topics = _prepare(settings)
                try:
                    return _run(settings, soak, folder / "objects", progress)
                finally:
                    delete_topics(settings, topics)
        finally:
            dbs.close()


def _prepare(settings: Settings) -> list[str]:
    """The demo's tables, Lapse's migrated, the topology's topics (`lapse demo`'s preparation);
    returns the topics' names, for their deletion afterwards."""
    prepare(settings)
    topology = load_topology(settings.topics.file, settings.topics.prefix, replication_factor=1)
    return [spec.name for spec in topology.specs]


def _warm_up(engine: Engine, load: OfferedLoad, seeded: bool, timeout_s: float = WARM_UP_S) -> None:
    """Offer one event and wait until its ledger row is terminal and (with a seeded ledger) pruning
    has begun on the oldest rows: every role has started, joined its group and prepared its
    statements, so the readings measure service, not start-up."""
    since = datetime.now(UTC) - timedelta(seconds=1)
    oldest = oldest_applied(engine)
    load.offer(1)
    deadline = time.monotonic() + timeout_s
    while not (finished_between(engine, since, datetime.now(UTC) + timedelta(seconds=1))
               and (not seeded or oldest_applied(engine) != oldest)):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the roles did not finish a first event and begin pruning within {timeout_s:g} s")
        time.sleep(0.5)


def oldest_applied(engine: Engine) -> datetime | None:
    """The oldest finish time of an applied row (along retention's partial index): it moves once
    pruning has removed the oldest rows."""
    led = cleanup_ledger.c
    with engine.connect() as conn:
        return conn.execute(select(func.min(led.finished_at)).where(led.state == APPLIED)).scalar()


def _run(settings: Settings, soak: SoakPlan, objects: Path, progress: Callable[[str], None]) -> dict[str, Any]:
    engine = engine_from_settings(settings)
    schema = settings.database.schema_name
    horizon = timedelta(seconds=soak.retention_s + GRACE_S)
    started = datetime.now(UTC)
    progress(f"seeding {soak.seed_rows:,} ledger rows finished over the day before the horizon ({horizon})")
    with progress_bar("seeding", length=soak.seed_rows) as bar:
        seed_finished(engine, schema, soak.seed_rows, started - horizon - timedelta(seconds=1), SEED_SPAN,
                      bar.update)
    sup = Supervisor(settings, soak_roles(soak.workers))
    load = OfferedLoad(settings, engine, soak.rate, objects)
    samples: list[Sample] = []
    try:
        sup.start()
        progress("waiting for the roles to start and finish a first event")
        _warm_up(engine, load, seeded=soak.seed_rows > 0)
        started = previous = datetime.now(UTC)
        rotated = rotated_tables(engine)
        samples.append(take_sample(settings, engine, schema, started, started, started, rotated))
        load.start()
        progress(f"offering {soak.rate:.0f} events/s for {soak.minutes:g} min, a reading every {soak.sample_s:g} s")
        end = time.monotonic() + soak.minutes * 60
        while time.monotonic() < end:
            time.sleep(min(soak.sample_s, max(0.0, end - time.monotonic())))
            if load.error is not None:
                raise RuntimeError(f"the offered load failed: {load.error}")
            now = datetime.now(UTC)
            sample = take_sample(settings, engine, schema, now, started, previous, rotated)
            samples.append(sample)
            previous = now
            progress(f"{sample.elapsed_s:6.0f} s: lag {sample.lag_records} records ({sample.lag_s:.1f} s), "
                     f"outbox {sample.outbox_unsent}, tables {sample.total_mb} MB, "
                     f"{sample.finished_per_min:.0f} finished/min")
    finally:
        load.stop()
        sup.shutdown()
    with engine.connect() as conn:
        ledger_rows = conn.execute(select(func.count()).select_from(cleanup_ledger)).scalar()
        seeded_left = conn.execute(select(func.count()).where(
            cleanup_ledger.c.subject_id.like("seed-%"))).scalar()
    engine.dispose()
    checks = judge(samples, soak.rate)
    return {
        "minutes": soak.minutes, "rate": soak.rate, "workers": soak.workers, "seed_rows": soak.seed_rows,
        "horizon_s": horizon.total_seconds(), "offered": {"events": load.offered.events, **load.offered.by_sort},
        "finished_per_minute": per_minute(samples), "samples": [s.to_dict() for s in samples],
        "ledger_rows_at_end": ledger_rows, "seeded_rows_left": seeded_left,
        "checks": {name: check.to_dict() for name, check in checks.items()},
        "ok": all(check.ok for check in checks.values()),
    }
