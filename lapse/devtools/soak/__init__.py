"""`lapse soak`: a steady offered load with retries, extended holds and poison over a pre-seeded
ledger, with pruning running; lag, outbox backlog, table sizes and throughput read every sample,
and whether they held steady."""

from lapse.devtools.soak.runner import SoakPlan, run_soak

__all__ = ["SoakPlan", "run_soak"]
