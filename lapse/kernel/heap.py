"""The collector and a long-running process's heap: what a service holds from its start (modules,
settings, kinds, reflected tables, clients) is set aside once, so that the collector's full passes
walk only what came after it.

Every batch leaves a few of its objects alive long enough to reach the oldest generation, and each
time those add up to a quarter of it, CPython walks the whole heap: with the objects a worker holds
from its start, that was about 2 ms of each 500-event batch, a tenth of its time
(docs/performance.md, "The collector").
"""

from __future__ import annotations

import gc


def set_aside_startup_heap() -> None:
    """Collect once, then move every object alive now out of the collector's passes (`gc.freeze`):
    they are kept alive by the process anyway; what is garbage now is collected first."""
    gc.collect()
    gc.freeze()
