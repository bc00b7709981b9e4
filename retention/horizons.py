"""How long finished work is kept, and why: the horizons of retention (`lapse prune`).

A finished ledger row is what makes a late redelivery of its event a duplicate: while the expiry
topic still holds an event, a redelivery (a consumer group reset, an audit replay turned into a
run, a forwarded retry) must meet its row, or the effect would run again. So applied and skipped
rows are kept at least the expiry topic's retention plus the reconciler's grace (the reconciler
may re-emit work that looked stuck that long before it finished). Dead letters wait for an
operator's replay decision, which works from the ledger row: they are kept at least as long as the
dead-letter topic keeps their records, plus the grace, and never shorter than applied rows.
Transitions are the operator's history of those rows. On SQLite they go with their ledger row. On
PostgreSQL they are time-partitioned and go a whole partition at a time, by age alone, after
`retention.history_horizon_s`: by default the longest horizon of what the ledger keeps (the
dead-letter horizon), never shorter than the ledger horizon (refused). What that gives up: the
transitions older than the history horizon of a ledger row still kept, i.e. of an operation still
unfinished after that long (pending with a due time months ahead, say) and the first attempts of a
dead letter that kept failing for a while before it finished (its ledger row keeps the attempt
count, the last failure and its class). Sent outbox rows are only history (the topics hold what was
published): they are kept `retention.outbox_horizon_s`.

A horizon left unset is derived from topics.yaml; a configured one shorter than the derived one is
refused (`HorizonRefused`, one line); a topic that keeps its records forever keeps its rows
forever.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from lapse.kernel.settings import Settings
from lapse.kernel.topology import Topology


class HorizonRefused(ValueError):
    """A retention horizon that would let a late redelivery miss its row, or that cannot be derived."""


@dataclass(frozen=True)
class Horizon:
    """How long one kind of row is kept after it finished (None: forever), and why."""

    seconds: float | None
    reason: str

    def cutoff(self, now: datetime) -> datetime | None:
        """Rows finished before this are removed; None: none are."""
        return None if self.seconds is None else now - timedelta(seconds=self.seconds)

    def to_dict(self) -> dict[str, object]:
        return {"seconds": self.seconds, "reason": self.reason}


@dataclass(frozen=True)
class Horizons:
    """The horizon of each table a prune pass trims. Transitions follow their ledger row; the
    `transitions` horizon bounds the walk for them (the shorter ledger horizon)."""

    settled: Horizon
    dead_letters: Horizon
    outbox: Horizon
    # Transitions on PostgreSQL, whole partitions by age (see the module's docstring).
    history: Horizon

    @property
    def transitions(self) -> Horizon:
        return Horizon(self.settled.seconds, "with their ledger row (" + self.settled.reason + ")")

    def to_dict(self, partitioned: bool = False) -> dict[str, dict[str, object]]:
        """Per table; `partitioned`: the transitions' horizon is the history horizon (PostgreSQL)."""
        transitions = self.history if partitioned else self.transitions
        return {"ledger_settled": self.settled.to_dict(), "ledger_dead_letters": self.dead_letters.to_dict(),
                "transitions": transitions.to_dict(), "outbox": self.outbox.to_dict(),
                "shadow_effects": Horizon(self.history.seconds, "shadow records: as long as history ("
                                          + self.history.reason + ")").to_dict()}


def retention_seconds(topic: str, retention_ms: str | None) -> float | None:
    """A topic's retention.ms in seconds (None: forever, `-1`); a topic without one is refused,
    since the broker's default is not known here."""
    if retention_ms is None:
        raise HorizonRefused(f"topics.yaml sets no retention for {topic}; set its retention so the "
                             "ledger horizon can be derived")
    try:
        ms = int(retention_ms)
    except ValueError:
        raise HorizonRefused(f"{topic}: retention.ms {retention_ms!r} is not a whole number") from None
    if ms < 0:
        return None
    return ms / 1000


def _derived(topic: str, retention_ms: str | None, grace_s: float) -> Horizon:
    kept = retention_seconds(topic, retention_ms)
    if kept is None:
        return Horizon(None, f"{topic} keeps its records forever")
    return Horizon(kept + grace_s,
                   f"{topic} retention {duration_text(kept)} + reconciler grace {duration_text(grace_s)}")


def _chosen(name: str, configured: float | None, floor: Horizon) -> Horizon:
    """The configured horizon, unless it is shorter than `floor` (refused); `floor` when unset."""
    if configured is None:
        return floor
    if floor.seconds is None or configured < floor.seconds:
        least = "forever" if floor.seconds is None else duration_text(floor.seconds)
        raise HorizonRefused(f"retention.{name} {duration_text(configured)} is shorter than {least} ({floor.reason}): "
                             "a late redelivery could miss its ledger row")
    return Horizon(configured, f"retention.{name} (at least {floor.reason})")


def _history(configured: float | None, settled: Horizon, dead: Horizon) -> Horizon:
    """The history horizon: the dead-letter horizon unless configured; never shorter than `settled`."""
    if configured is None:
        return Horizon(dead.seconds, f"as long as dead letters: {dead.reason}")
    if settled.seconds is None or configured < settled.seconds:
        least = "forever" if settled.seconds is None else duration_text(settled.seconds)
        raise HorizonRefused(f"retention.history_horizon_s {duration_text(configured)} is shorter than {least} "
                             f"({settled.reason}): a kept ledger row would lose its history")
    return Horizon(configured, f"retention.history_horizon_s (at least {settled.reason})")


def horizons(*, expiry_topic: str, expiry_retention_ms: str | None, dlq_topic: str,
             dlq_retention_ms: str | None, grace_s: float, ledger_horizon_s: float | None = None,
             dead_letter_horizon_s: float | None = None, outbox_horizon_s: float,
             history_horizon_s: float | None = None) -> Horizons:
    """The horizons from the topics' retention.ms, the reconciler's grace and what is configured;
    raises HorizonRefused for a configured horizon shorter than the derived one."""
    settled = _chosen("ledger_horizon_s", ledger_horizon_s, _derived(expiry_topic, expiry_retention_ms, grace_s))
    dlq = _derived(dlq_topic, dlq_retention_ms, grace_s)
    if dlq.seconds is not None and (settled.seconds is None or settled.seconds > dlq.seconds):
        dlq = Horizon(settled.seconds, f"as long as applied rows: {settled.reason}")
    dead = _chosen("dead_letter_horizon_s", dead_letter_horizon_s, dlq)
    outbox = Horizon(outbox_horizon_s, f"retention.outbox_horizon_s {duration_text(outbox_horizon_s)}; "
                                       "the topics keep what was published")
    return Horizons(settled, dead, outbox, _history(history_horizon_s, settled, dead))


def horizons_from_settings(settings: Settings, topology: Topology | None = None) -> Horizons:
    """`horizons` of the configured topology (topics.yaml) and retention settings."""
    topology = topology or settings.topology
    config = {spec.name: spec.config for spec in topology.specs}
    retention = settings.retention
    return horizons(
        expiry_topic=topology.expiry, expiry_retention_ms=config[topology.expiry].get("retention.ms"),
        dlq_topic=topology.dlq, dlq_retention_ms=config[topology.dlq].get("retention.ms"),
        grace_s=settings.reconciler.grace_s, ledger_horizon_s=retention.ledger_horizon_s,
        dead_letter_horizon_s=retention.dead_letter_horizon_s, outbox_horizon_s=retention.outbox_horizon_s,
        history_horizon_s=retention.history_horizon_s)


def duration_text(seconds: float) -> str:
    """A duration as people read it: 14d 5m, 1h, 1m 30s (whole seconds)."""
    left = round(seconds)
    parts = []
    for unit, size in (("d", 86_400), ("h", 3600), ("m", 60), ("s", 1)):
        if left >= size:
            parts.append(f"{left // size}{unit}")
            left %= size
    return " ".join(parts) or f"{seconds:g}s"
