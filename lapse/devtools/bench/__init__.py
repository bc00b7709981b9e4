"""`lapse bench`: Lapse against honest baselines and the ceilings, in one run.

One module per stage: the ceilings (limits: COPY of the ledger rows, the consumer alone; the batch
transaction alone for information), lapse_stage, the baselines (naive: per-message and batched,
faust_stage; their hand-written statements in lean), latency, scans. Every cleanup stage's end
state is checked (end_state) before its figure counts. The shared setup (databases, environments,
events, ledger_watch), and the output (report, plot); `runner` ties them together.
"""
