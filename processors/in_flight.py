"""One batch in flight: its `commit_batch` runs on a batch thread while the worker consumes and
decodes the next batch, so the broker fetch and the decoding overlap the database round trips.

Why order, offsets, rebalances, failures and circuits hold as in a serial loop:
docs/design/processing.md, "The batch in flight".
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from confluent_kafka import Message

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class Collected(Generic[T]):
    """A batch that left the batch thread: its records, what the worker decoded from them, and
    its result or the error that ended it."""

    messages: list[Message]
    decoded: Any
    result: T | None
    error: BaseException | None
    seconds: float  # the batch thread's own time for it


class InFlight(Generic[T]):
    """A one-slot batch thread: `submit` a batch's work, `collect` to wait for it and take it back.
    Calls the batch's work makes on the consumer are handed over (`on_consumer_thread`) and run by
    `collect`, on the consumer's own thread, while it waits."""

    def __init__(self, name: str) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._batch: tuple[list[Message], Any, Future[tuple[T, float]]] | None = None
        # Calls for the consumer's thread, then None when the batch's work has ended.
        self._calls: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]] | None] = queue.SimpleQueue()
        self._batch_thread: int | None = None

    @property
    def busy(self) -> bool:
        return self._batch is not None

    def ready(self) -> bool:
        """Whether `collect` would not wait: no batch is in flight (a rebalance callback may have
        collected it while the worker waited for more records), or its work has ended or waits for
        a call."""
        return self._batch is None or not self._calls.empty()

    def submit(self, messages: list[Message], decoded: Any, work: Callable[[], T]) -> None:
        """Start `work` for `messages` (decoded as `decoded`) on the batch thread; the slot must
        be free."""
        if self._batch is not None:
            raise RuntimeError("a batch is already in flight: collect it first")
        self._batch = (messages, decoded, self._pool.submit(self._timed, work))

    def on_consumer_thread(self, call: Callable[[], R]) -> R:
        """Run `call` on the consumer's thread (from the batch thread: at its next `collect`) and
        return its answer; called on any other thread than the batch thread, it runs at once."""
        if threading.get_ident() != self._batch_thread:
            return call()
        answer: Future[R] = Future()
        self._calls.put((call, answer))
        return answer.result()

    def collect(self) -> Collected[T] | None:
        """Wait for the batch in flight, if any, running the calls it hands over, and free the
        slot; never raises the batch's error."""
        if self._batch is None:
            return None
        messages, decoded, future = self._batch
        self._batch = None
        while (item := self._calls.get()) is not None:
            call, answer = item
            try:
                answer.set_result(call())
            except BaseException as exc:
                answer.set_exception(exc)
        try:
            result, seconds = future.result()
        except BaseException as exc:  # handed to the worker, which decides (rewind or stop)
            return Collected(messages, decoded, None, exc, 0.0)
        return Collected(messages, decoded, result, None, seconds)

    def close(self) -> None:
        """Stop the thread; `collect` first, or a batch in flight waits for calls nobody runs."""
        self._pool.shutdown(wait=True)

    def _timed(self, work: Callable[[], T]) -> tuple[T, float]:
        self._batch_thread = threading.get_ident()
        started = time.monotonic()
        try:
            return work(), time.monotonic() - started
        finally:
            self._calls.put(None)  # the batch's work has ended: collect stops serving calls
