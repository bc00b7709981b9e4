"""Prometheus counters of the cleanup worker, counted once per committed batch (and once per
dead-letter circuit that opens).

They live in the processor room (the shell only serves them): `observe_batch` needs a
`BatchResult`, and the room must not import the shell.
"""

from __future__ import annotations

from collections import Counter as Tally

from prometheus_client import Counter, Gauge, Histogram

from lapse.kernel.ledger import ExpiryEvent
from lapse.processors.scope import BatchResult

EVENTS_CONSUMED = Counter("lapse_events_consumed", "Records consumed from the expiry topic.")
EFFECTS_APPLIED = Counter("lapse_effects_applied", "Cleanup effects applied (ledger: applied).")
EFFECTS_SKIPPED = Counter("lapse_effects_skipped", "Operations skipped: the business row no longer qualified.")
DUPLICATES = Counter("lapse_duplicates_absorbed", "Deliveries absorbed by the ledger as duplicates.")
RETRIES = Counter("lapse_retries", "Retries scheduled, by the attempt that failed.", ["attempt"])
DEAD_LETTERS = Counter("lapse_dead_letters", "Dead letters, by class (poison: undecodable input; "
                       "ledger: invalid or exhausted operations).", ["failure_class"])
CIRCUITS_OPENED = Counter("lapse_circuits_opened", "Dead-letter circuits opened: a partition paused for its "
                          "cooldown because most of its recent outcomes failed.")
PARKED = Counter("lapse_operations_parked", "Operations a brake parked before their effect ran, by state "
                 "(held: paused, undeclared or over budget; shadowed: a shadow-mode kind).", ["state"])
CLAIM_CONFLICTS = Counter("lapse_claim_conflicts", "Events whose op key another worker held under a live lease.")
BATCH_SIZE = Histogram("lapse_batch_size", "Records per processed batch.",
                       buckets=(1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000))
BATCH_SECONDS = Histogram("lapse_batch_seconds", "Wall time of one batch, decode to offset commit.",
                          buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))

# The calls of external effects, per kind and endpoint (an HTTP host and port, a bucket, a topic).
EFFECT_CALLS = Counter("lapse_effect_calls", "Calls of external effects made, by outcome (ok; throttled: a 429 or "
                       "SlowDown; else the failure class).", ["kind", "endpoint", "outcome"])
CALLS_IN_FLIGHT = Gauge("lapse_effect_calls_in_flight", "Calls of external effects under way.",
                        ["kind", "endpoint"], multiprocess_mode="livesum")
SLOT_WAIT = Histogram("lapse_effect_slot_wait_seconds", "Time a call waited for its slots (concurrency, then "
                      "rate) before it started.", ["kind", "endpoint"],
                      buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
CALL_SECONDS = Histogram("lapse_effect_call_seconds", "Time in the downstream call.", ["kind", "endpoint"],
                         buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))


def observe_in_flight(kind: str, endpoint: str, change: int) -> None:
    """One call more (or less) under way."""
    CALLS_IN_FLIGHT.labels(kind=kind, endpoint=endpoint).inc(change)


def observe_call(kind: str, endpoint: str, outcome: str, waited_s: float, called_s: float) -> None:
    """Count one call made: its outcome, how long it waited for its slots, how long it took."""
    EFFECT_CALLS.labels(kind=kind, endpoint=endpoint, outcome=outcome).inc()
    SLOT_WAIT.labels(kind=kind, endpoint=endpoint).observe(waited_s)
    CALL_SECONDS.labels(kind=kind, endpoint=endpoint).observe(called_s)


def observe_circuit_opened() -> None:
    """Count one dead-letter circuit that opened."""
    CIRCUITS_OPENED.inc()


def observe_batch(records: int, result: BatchResult, events: list[ExpiryEvent], poison: int,
                  seconds: float) -> None:
    """Count one committed batch of the cleanup worker."""
    EVENTS_CONSUMED.inc(records)
    EFFECTS_APPLIED.inc(len(result.applied))
    EFFECTS_SKIPPED.inc(len(result.skipped))
    DUPLICATES.inc(result.duplicates)
    CLAIM_CONFLICTS.inc(len(result.conflicts))
    if result.held:
        PARKED.labels(state="held").inc(len(result.held))
    if result.shadowed:
        PARKED.labels(state="shadowed").inc(len(result.shadowed))
    if result.retried:  # rare: look up attempts only for the batches that have retries
        retried = set(result.retried)
        attempts = Tally(str(e.attempt + 1) for e in events if e.op_key in retried)
        for attempt, n in attempts.items():
            RETRIES.labels(attempt=attempt).inc(n)
    if result.dead_lettered:
        DEAD_LETTERS.labels(failure_class="ledger").inc(len(result.dead_lettered))
    if poison:
        DEAD_LETTERS.labels(failure_class="poison").inc(poison)
    BATCH_SIZE.observe(records)
    BATCH_SECONDS.observe(seconds)
