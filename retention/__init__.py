"""The retention room: how long finished work is kept and why (the horizons), and the prune pass
that removes what is older — finished ledger rows, their transitions, sent outbox rows, and on
PostgreSQL whole time partitions — with its statements. This module is the room's public face."""

from lapse.retention.horizons import Horizon, HorizonRefused, Horizons, duration_text, horizons_from_settings
from lapse.retention.prune import PruneReport, prune_dry_run, prune_once

__all__ = [
    "Horizon",
    "HorizonRefused",
    "Horizons",
    "PruneReport",
    "duration_text",
    "horizons_from_settings",
    "prune_dry_run",
    "prune_once",
]
