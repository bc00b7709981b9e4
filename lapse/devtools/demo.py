"""`lapse demo`: the whole pipeline on one machine, with the checks that prove it worked.

It seeds reservations (expired, not yet due, paid, cancelled), sweeps them onto the expiry topic,
injects duplicate deliveries and late payments, runs processors and the relay until every due
record is terminal, and checks one effect per op key and one published outcome per ledger row.
"""

from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Engine, func, select, update

from lapse.devtools.demo_data import add_artifacts, mix_for, seed_mix
from lapse.devtools.demo_kinds import object_folder
from lapse.devtools.demo_tables import artifacts, create_demo_tables, reservations
from lapse.kernel.codec import Codec
from lapse.kernel.database import engine_from_settings, upgrade
from lapse.kernel.kafka_clients import DeliveryTracker, make_admin, make_producer
from lapse.kernel.kinds import load_kinds
from lapse.kernel.ledger import TERMINAL, expiry_event
from lapse.kernel.logs import get_logger
from lapse.kernel.models import cleanup_ledger, ledger_transitions, outbox
from lapse.kernel.schema_names import CLEANUP_OUTCOME
from lapse.kernel.settings import Settings
from lapse.kernel.topology import load_topology
from lapse.processors import FilesystemObjectStore
from lapse.producers import emit_events, sweep_once
from lapse.readers import Span, manual_consumer, partitions_of, read_spans
from lapse.shell.progress import progress_bar
from lapse.shell.provisioning import apply, plan
from lapse.shell.roles import pipeline_roles
from lapse.shell.supervisor import Supervisor

log = get_logger("demo")
NO_END = 2**62  # read to partition EOF: right on every broker (PITFALLS: ListOffsets on tansu)


@dataclass
class DemoSummary:
    reservations: int
    expired: int
    released: int = 0
    skipped: int = 0
    dead_letters: int = 0
    duplicates_injected: int = 0
    duplicates_absorbed: int = 0
    paid_after_event: int = 0
    artifacts_expired: int = 0
    objects_deleted: int = 0
    retries_by_attempt: dict[str, int] = field(default_factory=dict)
    dead_letters_by_class: dict[str, int] = field(default_factory=dict)
    outcomes_published: int = 0
    elapsed_s: float = 0.0
    events_per_s: float = 0.0
    checks: dict[str, bool] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(self.checks.values())

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}

    def text(self) -> str:
        lines = [
            f"reservations seeded     {self.reservations}",
            f"expired (due)           {self.expired}",
            f"released                {self.released}",
            f"skipped (paid in time)  {self.skipped}",
            f"artifacts expired       {self.artifacts_expired} ({self.objects_deleted} objects deleted)",
            f"retries by attempt      {self.retries_by_attempt or '-'}",
            f"dead letters            {self.dead_letters} {self.dead_letters_by_class or ''}".rstrip(),
            f"duplicates absorbed     {self.duplicates_absorbed} (injected {self.duplicates_injected})",
            f"outcomes published      {self.outcomes_published}",
            f"elapsed                 {self.elapsed_s:.1f} s",
            f"events/s (incl. startup) {self.events_per_s:.0f}",
        ]
        lines += [f"check {name:<28} {'ok' if good else 'FAILED'}" for name, good in self.checks.items()]
        return "\n".join(lines)


def prepare(settings: Settings) -> None:
    """Create the demo's own tables, migrate Lapse's, and create the topology's topics (replication
    1: one broker). Business tables come first, as in a real install: on PostgreSQL, a role named
    like Lapse's schema would otherwise create them in it (the default search path is "$user")."""
    engine = engine_from_settings(settings)
    try:
        create_demo_tables(engine)
    finally:
        engine.dispose()
    upgrade(settings)
    admin = make_admin(settings)
    topology = load_topology(settings.topics.file, settings.topics.prefix, replication_factor=1)
    apply(admin, plan(admin, list(topology.specs)))


def seed_and_emit(settings: Settings, engine: Engine, reservations_n: int, rng: random.Random) -> DemoSummary:
    """Seed, sweep, then inject duplicates and payments that race the cleanup."""
    now = datetime.now(UTC)
    kinds = load_kinds(settings, engine)
    mix = mix_for(reservations_n)
    with engine.begin() as conn:
        ids = seed_mix(conn, mix, now, rng)
    with engine.begin() as conn:
        artifact_ids = add_artifacts(conn, reservations_n // 4, retain_until=now,
                                     store=FilesystemObjectStore(object_folder(kinds)))
    codec = Codec.from_settings(settings)
    producer = make_producer(settings)
    sweep_once(engine, producer, codec, settings, kinds, clock=lambda: now)

    expired = ids["expired_held"]
    dup_ids = rng.sample(expired, k=len(expired) // 10)
    with engine.connect() as conn:
        rows = conn.execute(select(cleanup_ledger).where(
            cleanup_ledger.c.subject_id.in_([str(i) for i in dup_ids]))).mappings().all()
    dups = [expiry_event(r["kind"], r["subject_id"], r["tenant"], r["due_at"], source="demo-duplicate",
                         correlation_id=r["correlation_id"]) for r in rows]
    emit_events(producer, codec, DeliveryTracker(), settings.topology.expiry, dups, now)

    paid = rng.sample(sorted(set(expired) - set(dup_ids)), k=len(expired) // 20)
    with engine.begin() as conn:
        conn.execute(update(reservations).where(reservations.c.id.in_(paid)).values(status="paid"))
    return DemoSummary(reservations=reservations_n, expired=len(expired),
                       duplicates_injected=len(dups), paid_after_event=len(paid),
                       artifacts_expired=len(artifact_ids))


def terminal_rows(engine: Engine) -> int:
    """Ledger rows in a terminal state (the progress bar's count)."""
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).where(cleanup_ledger.c.state.in_(list(TERMINAL)))).scalar_one())


def settled(engine: Engine) -> bool:
    """Every ledger row terminal and every outbox row published."""
    with engine.connect() as conn:
        open_rows = conn.execute(select(func.count()).where(
            cleanup_ledger.c.state.not_in(list(TERMINAL)))).scalar()
        unsent = conn.execute(select(func.count()).where(outbox.c.sent_at.is_(None))).scalar()
    return open_rows == 0 and unsent == 0


def published_outcomes(settings: Settings, codec: Codec) -> dict[str, set[int]]:
    """op key → outcome ids read back from the outcomes topic (to partition EOF)."""
    consumer = manual_consumer(settings)
    try:
        topic = settings.topology.outcomes
        spans = [Span(topic, p, 0, NO_END) for p in partitions_of(consumer, topic)]
        seen: dict[str, set[int]] = {}
        for msg in read_spans(consumer, spans, stall_s=30):
            record = codec.decode_expected(CLEANUP_OUTCOME, msg.value() or b"")
            seen.setdefault(record["op_key"], set()).add(record["outcome_id"])
        return seen
    finally:
        consumer.close()


def verify(settings: Settings, engine: Engine, summary: DemoSummary) -> None:
    codec = Codec.from_settings(settings)
    with engine.connect() as conn:
        states: dict[str, int] = dict(conn.execute(select(cleanup_ledger.c.state, func.count()).group_by(
            cleanup_ledger.c.state)).all())
        summary.released = conn.execute(select(func.count()).where(
            reservations.c.status == "released")).scalar_one()
        summary.duplicates_absorbed = conn.execute(select(func.coalesce(func.sum(
            cleanup_ledger.c.duplicates), 0))).scalar_one()
        applied_twice = conn.execute(
            select(func.count()).select_from(
                select(ledger_transitions.c.op_key).where(ledger_transitions.c.to_state == "applied")
                .group_by(ledger_transitions.c.op_key).having(func.count() > 1).subquery())).scalar()
        ledger_keys = set(conn.execute(select(cleanup_ledger.c.op_key)).scalars())
        summary.retries_by_attempt = {str(a): n for a, n in conn.execute(
            select(ledger_transitions.c.attempt, func.count())
            .where(ledger_transitions.c.to_state == "retry_scheduled")
            .group_by(ledger_transitions.c.attempt).order_by(ledger_transitions.c.attempt))}
        summary.dead_letters_by_class = dict(conn.execute(
            select(cleanup_ledger.c.last_failure_class, func.count())
            .where(cleanup_ledger.c.state == "dead_letter")
            .group_by(cleanup_ledger.c.last_failure_class)).all())
        deleted_rows = list(conn.execute(select(artifacts.c.object_key)
                                         .where(artifacts.c.status == "deleted")).scalars())
        artifact_states: dict[str, int] = dict(conn.execute(
            select(cleanup_ledger.c.state, func.count())
            .where(cleanup_ledger.c.kind == "artifact-delete")
            .group_by(cleanup_ledger.c.state)).all())

    store = FilesystemObjectStore(object_folder(load_kinds(settings, engine)))
    summary.objects_deleted = len(deleted_rows)
    summary.skipped = states.get("skipped", 0)
    summary.dead_letters = states.get("dead_letter", 0)
    outcomes = published_outcomes(settings, codec)
    summary.outcomes_published = sum(len(ids) for ids in outcomes.values())
    summary.checks = {
        "released_exactly_due_holds": summary.released == summary.expired - summary.paid_after_event,
        "late_payments_skipped": summary.skipped == summary.paid_after_event,
        "one_effect_per_op_key": applied_twice == 0,
        "duplicates_absorbed": summary.duplicates_absorbed >= summary.duplicates_injected,
        "every_row_has_an_outcome": ledger_keys <= set(outcomes),
        "deleted_objects_are_gone": not any(store.exists(k) for k in deleted_rows),
        "artifacts_applied_or_dead": artifact_states.get("applied", 0) == len(deleted_rows)
        and sum(artifact_states.values()) == summary.artifacts_expired,
        "every_row_terminal": sum(states.values()) == sum(states.get(s, 0) for s in TERMINAL),
    }


def run_demo(settings: Settings, *, reservations_n: int, workers: int, timeout_s: float = 300.0,
             seed: int = 7) -> DemoSummary:
    """Run the demo against the broker and database in `settings`; returns the checked summary."""

    prepare(settings)
    engine = engine_from_settings(settings)
    rng = random.Random(seed)
    started = time.monotonic()
    summary = seed_and_emit(settings, engine, reservations_n, rng)
    sup = Supervisor(settings, pipeline_roles(workers))
    sup.start()
    deadline = time.monotonic() + timeout_s
    try:
        with progress_bar("cleaning up", length=summary.expired + summary.artifacts_expired) as bar:
            def done() -> bool:
                bar.update(terminal_rows(engine) - bar.pos)
                return settled(engine) or time.monotonic() > deadline

            sup.watch(until=done, poll_s=0.5)
    finally:
        sup.shutdown()
    summary.elapsed_s = round(time.monotonic() - started, 2)
    with engine.connect() as conn:
        total = conn.execute(select(func.count()).select_from(cleanup_ledger)).scalar_one()
    summary.events_per_s = round((total + summary.duplicates_injected) / max(summary.elapsed_s, 1e-3), 1)
    verify(settings, engine, summary)
    summary.checks["settled_before_timeout"] = settled(engine)
    engine.dispose()
    return summary
