"""The ledger's state machine as data: its states and, for each, the states a row may move to.

Every transition the ledger records is checked against `ALLOWED` (`check`); a move that is not in
the table is a programming error and raises. The conditional UPDATEs in `queries` only ever make
moves from this table, each guarded by the state it moves from.
"""

from __future__ import annotations

from collections.abc import Mapping

PENDING = "pending"
CLAIMED = "claimed"
APPLIED = "applied"
SKIPPED = "skipped"
RETRY_SCHEDULED = "retry_scheduled"
DEAD_LETTER = "dead_letter"
# An operator's decision that a dead letter will never be retried: final, never replayed, and a
# late redelivery of its event is absorbed as a duplicate.
DISCARDED = "discarded"
# Parked: work a brake stopped before its effect ran (docs/design/brakes.md). Held: its kind or
# tenant is paused (by an operator or a spent budget) or its kind is not declared; shadowed: a
# shadow-mode kind recorded what its effect would have done. Released back to pending, attempt
# unchanged, once the brake is off (`lapse.reconciler.release`).
HELD = "held"
SHADOWED = "shadowed"

STATES = (PENDING, CLAIMED, APPLIED, SKIPPED, RETRY_SCHEDULED, DEAD_LETTER, DISCARDED, HELD, SHADOWED)
# Settled: the work is over and its outcome known, the cleanup applied or not needed (skipped).
SETTLED = (APPLIED, SKIPPED)
# Terminal: the pipeline moves the row no further (settled, or dead-lettered or discarded; only an
# operator's replay takes a dead letter back to pending).
TERMINAL = frozenset({*SETTLED, DEAD_LETTER, DISCARDED})
WAITING = (PENDING, RETRY_SCHEDULED)
PARKED = (HELD, SHADOWED)
# Due work not yet finished: waiting, or claimed and not yet applied, skipped or dead-lettered.
UNFINISHED = (PENDING, CLAIMED, RETRY_SCHEDULED)

# From each state (None: no row yet), the states a committed transaction may leave the row in.
# An in-database effect claims and finishes in one transaction, so pending → applied is one move;
# an external effect is claimed in one transaction (→ claimed) and finished in the next.
ALLOWED: Mapping[str | None, frozenset[str]] = {
    # sweep, publish, reconciler (a gap) and processor create the row
    None: frozenset({PENDING}),
    PENDING: frozenset({
        PENDING,        # reconciler: stuck pending, re-emitted; sweep, reconciler, processor:
                        # waiting past its due subject's time, brought forward to now
        CLAIMED,        # processor: leased for an external effect
        APPLIED,        # processor: in-database effect applied
        SKIPPED,        # processor: the business row no longer qualified
        DEAD_LETTER,    # processor: invalid work
        HELD,           # processor: due, but its kind or tenant is paused, or its kind undeclared
        SHADOWED,       # processor: due, of a shadow-mode kind: what its effect would do recorded
    }),
    RETRY_SCHEDULED: frozenset({
        RETRY_SCHEDULED,  # reconciler: stuck retry, re-emitted
        CLAIMED, APPLIED, SKIPPED, DEAD_LETTER, HELD, SHADOWED,  # the retry's wake-up, as from pending
    }),
    CLAIMED: frozenset({
        CLAIMED,          # lease taken over after it expired; reconciler: stuck claim, re-emitted
        PENDING,          # processor: rescheduled, the business row is due later now, or does not
                          # exist yet (rechecked later; never a terminal state for it)
        APPLIED, SKIPPED,  # effect done (or a claim whose lease expired, redone in the database)
        RETRY_SCHEDULED,  # processor: failed attempt, retried later
        DEAD_LETTER,      # processor: invalid, exhausted or ambiguous
        HELD,             # processor: paused before its leased call ran (or an expired claim, paused)
        SHADOWED,         # processor: an expired claim of a kind that runs in shadow mode now
    }),
    HELD: frozenset({
        PENDING,          # release: the brake is off; due now, re-emitted through the outbox
        CLAIMED, APPLIED, SKIPPED, DEAD_LETTER,  # an event of it met no brake: as from pending
        SHADOWED,         # processor: its kind runs in shadow mode now
    }),
    SHADOWED: frozenset({
        PENDING,          # release: the kind is live now; due now, re-emitted through the outbox
        CLAIMED, APPLIED, SKIPPED, DEAD_LETTER,  # an event of it met a live kind: as from pending
    }),
    DEAD_LETTER: frozenset({
        PENDING,          # operator replay
        DISCARDED,        # operator discard: never to be retried
    }),
    APPLIED: frozenset(),
    SKIPPED: frozenset(),
    DISCARDED: frozenset(),
}


class IllegalTransition(RuntimeError):
    """A ledger move the state machine does not allow: a bug in the code that asked for it."""


def allowed(from_state: str | None, to_state: str) -> bool:
    return to_state in ALLOWED.get(from_state, frozenset())


def check(from_state: str | None, to_state: str) -> None:
    """Raise IllegalTransition unless `from_state` → `to_state` is in `ALLOWED`."""
    if not allowed(from_state, to_state):
        raise IllegalTransition(f"ledger transition {from_state} → {to_state} is not allowed")
