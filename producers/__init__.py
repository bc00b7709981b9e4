"""The producer room: the sweep, the transactional publish API, the outbox relay, and emitting
expiry events. This module is the room's public face."""

from lapse.producers.emit import emit_events
from lapse.producers.publish import schedule_cleanup
from lapse.producers.relay import relay_batch, relay_until_empty, run_relay
from lapse.producers.relay_queries import SLOTS
from lapse.producers.relay_slots import slot_holders
from lapse.producers.sweep import EmitWindow, SweepReport, sweep_once

__all__ = [
    "SLOTS",
    "EmitWindow",
    "SweepReport",
    "emit_events",
    "relay_batch",
    "relay_until_empty",
    "run_relay",
    "schedule_cleanup",
    "slot_holders",
    "sweep_once",
]
