"""Failure classification and the retry policy, in one place for every kind.

An effect reports a failure by raising `EffectFailure` with one of four classes; anything else it
raises is classified here, and so is a far side's status code (HTTP, or an S3 error's status) and
its Retry-After. `decide` turns a failure into the next ledger step: a retry at a persisted time
(jittered exponential backoff, or exactly the server's Retry-After), or a dead letter.

A rate-limited failure burns no attempt, so attempts alone would never end an operation that is
rate-limited for ever. Its end is a deadline instead: the kind's `rate_limited_for_s`, measured
from the operation's first failed attempt (of its current replay: a replay starts a new run).
Past it, the next rate-limited failure is a dead letter of class `rate_limited` whose reason says
how many deferrals since when. So every operation ends within `max_attempts` attempt-burning
failures plus the deadline. A rate-limited failure without a Retry-After backs off on the count of
rate-limited tries so far (not the attempt, which does not rise), so its waits grow to the cap.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime

from lapse.kernel.kinds import CleanupKind
from lapse.kernel.text import one_line

RATE_LIMITED = "rate_limited"  # the far side said "slow down"; retry after it, no attempt burnt
TEMPORARY = "temporary"        # try again later, up to the kind's attempt cap
INVALID = "invalid"            # retrying cannot help: dead letter at once
AMBIGUOUS = "ambiguous"        # the effect may have happened: retry only if it is idempotent
EXHAUSTED = "exhausted"        # the dead-letter class once the attempt cap is reached

CLASSES = (RATE_LIMITED, TEMPORARY, INVALID, AMBIGUOUS)

# The longest Retry-After honoured: a far side asking for more (or for years) waits this long.
MAX_RETRY_AFTER_S = 3600.0
_DELAY_SECONDS = re.compile(r"[0-9]{1,12}")  # RFC 9110 delay-seconds, short enough to parse


class EffectFailure(Exception):
    """A classified failure of an effect; `retry_after` only for rate_limited: a wait in seconds,
    or the time to wait until (an HTTP-date with no `Date` to measure it from), which `wait_s`
    compares with the transaction's now, the database's. The reason is kept as one line of at most
    500 characters with no control characters (a NUL would make PostgreSQL refuse the very row that
    records the failure)."""

    def __init__(self, failure_class: str, reason: str, retry_after: float | datetime | None = None, *,
                 slow_down: bool = False, stop_route: bool = False):
        if failure_class not in CLASSES:
            raise ValueError(f"unknown failure class {failure_class!r}")
        if isinstance(retry_after, datetime) and retry_after.tzinfo is None:
            raise ValueError("retry_after as a time must be timezone-aware")
        reason = one_line(str(reason), 500)
        super().__init__(reason)
        self.failure_class = failure_class
        self.reason = reason
        self.retry_after = retry_after
        # What the answer asks of every call of the route (processors/limiter.py), not only of this
        # operation: "too many" (a 429, a SlowDown) halves the route's rate; a far side's Retry-After
        # (a 429's, a 503's) stops the route's calls until then.
        self.slow_down = slow_down
        self.stop_route = stop_route and retry_after is not None

    def wait_s(self, now: datetime) -> float | None:
        """The Retry-After wait from `now` (the database's), clamped; None: back off as usual."""
        if isinstance(self.retry_after, datetime):
            return clamped_wait((self.retry_after - now).total_seconds())
        return self.retry_after


def classify(exc: BaseException) -> EffectFailure:
    """An EffectFailure for any exception: timeouts are ambiguous (the effect may have landed),
    connection and OS errors temporary, value/type errors invalid, anything else ambiguous."""
    if isinstance(exc, EffectFailure):
        return exc
    reason = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, TimeoutError):
        return EffectFailure(AMBIGUOUS, reason)
    if isinstance(exc, (ConnectionError, OSError)):
        return EffectFailure(TEMPORARY, reason)
    if isinstance(exc, (ValueError, TypeError, KeyError)):
        return EffectFailure(INVALID, reason)
    return EffectFailure(AMBIGUOUS, reason)


def retry_after_wait(value: str | None, server_date: str | None = None) -> float | datetime | None:
    """The wait a Retry-After value asks for: delay-seconds, or an HTTP-date less the answer's own
    `Date` (the far side's clock against itself), clamped to [0, MAX_RETRY_AFTER_S]. An HTTP-date
    with no readable `Date` is returned as the time itself, for the database's clock to measure
    (`EffectFailure.wait_s`): never this machine's clock, which may be minutes off. None when the
    value is missing or unreadable (a negative number too): the caller backs off as usual."""
    if value is None:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        value = value.lstrip("0") or "0"
        if not _DELAY_SECONDS.fullmatch(value):
            return MAX_RETRY_AFTER_S  # more digits than any sane wait
        return min(float(value), MAX_RETRY_AFTER_S)
    when = http_date(value)
    if when is None:
        return None
    sent = http_date(server_date)
    return when if sent is None else clamped_wait((when - sent).total_seconds())


def http_date(value: str | None) -> datetime | None:
    """An HTTP-date as an aware time (a date with no zone, "-0000", is UTC); None if unreadable."""
    if value is None:
        return None
    try:
        when = parsedate_to_datetime(value.strip())
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def clamped_wait(seconds: float) -> float:
    """`seconds` within [0, MAX_RETRY_AFTER_S]."""
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)


def for_status(status: int, reason: str, retry_after: float | datetime | None = None) -> EffectFailure | None:
    """The failure a far side's status code means, or None for success (2xx): 429 is rate_limited
    and slows the route down (with `retry_after`, None meaning "back off as usual"); a 503 with a
    Retry-After is rate_limited too (the far side said when to come back: no attempt is burnt);
    408 and other 5xx are temporary; anything else (a redirect, another 4xx) invalid: retrying the
    same request cannot help."""
    if 200 <= status < 300:
        return None
    if status == 429:
        return EffectFailure(RATE_LIMITED, reason, retry_after=retry_after, slow_down=True, stop_route=True)
    if status == 503 and retry_after is not None:
        return EffectFailure(RATE_LIMITED, reason, retry_after=retry_after, stop_route=True)
    if status == 408 or 500 <= status < 600:
        return EffectFailure(TEMPORARY, reason)
    return EffectFailure(INVALID, reason)


@dataclass(frozen=True)
class Decision:
    """The next ledger step for a failed attempt: retry at `due_at` with `attempt`, or dead letter."""

    retry: bool
    attempt: int          # the ledger's attempt count after this failure
    failure_class: str    # as recorded; EXHAUSTED or the original class for a dead letter
    reason: str
    due_at: datetime | None = None


def backoff_seconds(kind: CleanupKind, tries: int, rng: random.Random) -> float:
    """Capped exponential backoff with equal jitter: uniform in [d/2, d] where d = min(cap, base *
    2**tries). The lower half grows with every try, so waits provably grow to the cap; the upper half
    spreads operations that failed together (tests/unit/test_backoff.py)."""
    nominal = min(kind.retry_cap_s, kind.retry_base_s * 2.0 ** min(tries, 64))
    return rng.uniform(nominal / 2, nominal)


def to_millis(ts: datetime) -> datetime:
    """Drop sub-millisecond precision, so a due time survives Avro timestamp-millis unchanged."""
    return ts.replace(microsecond=ts.microsecond // 1000 * 1000)


@dataclass(frozen=True)
class Deferrals:
    """An operation's failures so far in its current run, as the rate-limit deadline needs them:
    how many were rate-limited, and when the first failed attempt was (None: this is the first)."""

    rate_limited: int = 0
    since: datetime | None = None


NO_DEFERRALS = Deferrals()


def decide(kind: CleanupKind, attempt_before: int, failure: EffectFailure, now: datetime,
           rng: random.Random, deferrals: Deferrals = NO_DEFERRALS) -> Decision:
    """What to do after `failure` on the attempt following `attempt_before` earlier ones."""
    cls, reason = failure.failure_class, failure.reason
    if cls == RATE_LIMITED:
        since = deferrals.since or now
        if (now - since).total_seconds() >= kind.rate_limited_for_s:
            return Decision(False, attempt_before, cls, one_line(
                f"rate limited {deferrals.rate_limited + 1} times since {since.isoformat()}, past the "
                f"kind's {kind.rate_limited_for_s:g} s deadline; last: {reason}", 500))
        asked = failure.wait_s(now)
        wait = asked if asked is not None else backoff_seconds(kind, deferrals.rate_limited, rng)
        return Decision(True, attempt_before, cls, reason, to_millis(now + timedelta(seconds=wait)))
    attempt = attempt_before + 1
    if cls == INVALID:
        return Decision(False, attempt, cls, reason)
    if cls == AMBIGUOUS and not kind.idempotent_effect:
        return Decision(False, attempt, cls, f"{reason} (effect not idempotent: a person must check)")
    if attempt >= kind.max_attempts:
        return Decision(False, attempt, EXHAUSTED,
                        f"{attempt} attempts failed, last: {cls}: {reason}")
    wait = backoff_seconds(kind, attempt, rng)
    return Decision(True, attempt, cls, reason, to_millis(now + timedelta(seconds=wait)))
