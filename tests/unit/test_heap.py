"""A service's heap from its start is set aside from the collector's passes, after what is garbage
then was collected (`lapse.kernel.heap`)."""

from __future__ import annotations

import gc
import weakref

from lapse.kernel.heap import set_aside_startup_heap


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def test_what_is_alive_is_set_aside_and_what_is_garbage_is_collected_first():
    kept = [Node() for _ in range(100)]
    a, b = Node(), Node()
    a.other, b.other = b, a  # a cycle: only the collector frees it
    gone = weakref.ref(a)
    del a, b
    before = gc.get_freeze_count()
    try:
        set_aside_startup_heap()
        assert gone() is None  # collected, not kept forever
        assert gc.get_freeze_count() >= before + len(kept)
        assert not any(gc.is_tracked(n) and n in gc.get_objects(generation=2) for n in kept[:3])
    finally:
        gc.unfreeze()
