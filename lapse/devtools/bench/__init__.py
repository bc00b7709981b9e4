"""`lapse bench`: Lapse against the naive consumer, Faust and the database's own limits, in one run.

One module per stage (limits, lapse_stage, naive, faust_stage, latency, scans), the shared setup
(databases, environments, events, ledger_watch), and the output (report, plot); `runner` ties them together.
"""
