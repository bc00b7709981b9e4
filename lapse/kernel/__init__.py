"""The kernel every layer shares: settings, logging, models and migrations, the ledger, codec,
Kafka client factories, topology and kinds. It imports no room, no shell and no dev tool."""
