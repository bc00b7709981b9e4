"""The one error every broker kind raises when it cannot start here."""

from __future__ import annotations


class BrokerUnavailable(RuntimeError):
    """A broker cannot be started here; the message is one line that says how to fix it."""
