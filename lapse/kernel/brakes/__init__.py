"""The brakes on a pipeline that deletes: pauses of a kind or one tenant of it (an operator's, or a
spent budget's), the budgets' grants, and the shadow mode's records. Each statement is named here;
the processors decide when to hold work, the ledger's state machine (`held`, `shadowed`) records it.
"""

from lapse.kernel.brakes.pauses import (
    BUDGET,
    EVERY_TENANT,
    OPERATOR,
    REASONS,
    Pause,
    Pauses,
    add_pause,
    read_pauses,
    remove_pause,
)

__all__ = [
    "BUDGET",
    "EVERY_TENANT",
    "OPERATOR",
    "REASONS",
    "Pause",
    "Pauses",
    "add_pause",
    "read_pauses",
    "remove_pause",
]
