"""The brakes' own tables: pauses (by an operator or a spent budget) and budget usage, every
statement on them named here. What the processors do with them: docs/design/brakes.md.

- `pauses`  — who paused which kind (or tenant of a kind), when and why; the set a batch reads;
- `budgets` — a kind's blast-radius budget, and the usage it is counted against, under a lock;
- `shadows` — what a shadow-mode kind's effect would have done, per operation.
"""

from lapse.kernel.brakes.budgets import Budget, forget_usage, lock_budget, record_usage, used_in_window
from lapse.kernel.brakes.pauses import (
    ALL_TENANTS,
    BUDGET,
    CAUSES,
    OPERATOR,
    UNDECLARED,
    Pause,
    Pauses,
    covered,
    delete_pause,
    insert_pause,
    now_and_pauses,
    read_pauses,
)
from lapse.kernel.brakes.shadows import (
    OUTCOMES,
    ShadowEffect,
    ShadowResults,
    record_shadow_effects,
    shadow_results,
)

__all__ = [
    "ALL_TENANTS",
    "BUDGET",
    "CAUSES",
    "OPERATOR",
    "OUTCOMES",
    "UNDECLARED",
    "Budget",
    "Pause",
    "Pauses",
    "ShadowEffect",
    "ShadowResults",
    "covered",
    "delete_pause",
    "forget_usage",
    "insert_pause",
    "lock_budget",
    "now_and_pauses",
    "read_pauses",
    "record_shadow_effects",
    "record_usage",
    "shadow_results",
    "used_in_window",
]
