"""The processor room: consume expiry events, apply each cleanup once, retry, dead-letter.

This module is the room's public face: other rooms, the shell and the dev tools import from here.
A Python kind's `ExternalEffect.call` reports a failure by raising `EffectFailure` with one of
the classes RATE_LIMITED, TEMPORARY, INVALID, AMBIGUOUS.
"""

from lapse.processors.commit import WorkerContext, commit_batch
from lapse.processors.decode import decode_event
from lapse.processors.delay_worker import DelayWorker
from lapse.processors.effects.object_stores import FilesystemObjectStore
from lapse.processors.failures import AMBIGUOUS, INVALID, RATE_LIMITED, TEMPORARY, EffectFailure
from lapse.processors.rules import apply_batch
from lapse.processors.scope import BatchResult, BatchScope
from lapse.processors.worker import CleanupWorker, WorkerStats

__all__ = [
    "AMBIGUOUS",
    "INVALID",
    "RATE_LIMITED",
    "TEMPORARY",
    "BatchResult",
    "BatchScope",
    "CleanupWorker",
    "DelayWorker",
    "EffectFailure",
    "FilesystemObjectStore",
    "WorkerContext",
    "WorkerStats",
    "apply_batch",
    "commit_batch",
    "decode_event",
]
