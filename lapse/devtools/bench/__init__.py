"""`lapse bench`: Lapse against its limit, a Quix Streams peer and reference baselines, in one run.

One module per stage: the limit (limits: the consumer alone, and the batch transaction alone for
`batch_vs_db_bound`; bound: the database's lower bound for Lapse's own writes), lapse_stage, the
peer (quix_stage running quix_peer in its own environment), the reference baselines (naive:
per-message and batched, faust_stage; their hand-written statements in lean), latency, relay_stage,
scans, fairness and console_pages. Every cleanup stage's end state is checked (end_state) before
its figure counts. The shared setup (databases, environments, events, ledger_watch), and the output
(report, plot); `runner` ties them together.
"""
