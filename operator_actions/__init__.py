"""The operator actions room: what an operator does to dead letters (list them, poison included;
preview, then replay or discard a bounded selection, as `lapse dlq` and the console both do;
redrive poison that decodes now), the pauses an operator makes and lifts (`lapse pause`/`resume`,
the console), and the record of every operator action that changes something — one row in
`lapse_operator_actions` and one log line. This module is the room's public face."""

from lapse.operator_actions.confirmed import discard_selection, preview, run_discard, run_replay
from lapse.operator_actions.dead_letters import discard, list_dead_letters, replay
from lapse.operator_actions.pauses import run_pause, run_resume, tenant_seen
from lapse.operator_actions.poison import poison_records
from lapse.operator_actions.record import (
    DISCARD,
    OFFSETS_RESET,
    PAUSE,
    REDRIVE,
    REPLAY,
    RESUME,
    TOPICS_APPLY_DESTRUCTIVE,
    OperatorAction,
    RecordedAction,
    log_action,
    os_user,
    recent_actions,
    record_action,
    session_user,
)
from lapse.operator_actions.redrive import PoisonSelector, plan_redrive, run_redrive

__all__ = [
    "DISCARD",
    "OFFSETS_RESET",
    "PAUSE",
    "REDRIVE",
    "REPLAY",
    "RESUME",
    "TOPICS_APPLY_DESTRUCTIVE",
    "OperatorAction",
    "PoisonSelector",
    "RecordedAction",
    "discard",
    "discard_selection",
    "list_dead_letters",
    "log_action",
    "os_user",
    "plan_redrive",
    "poison_records",
    "preview",
    "recent_actions",
    "record_action",
    "replay",
    "run_discard",
    "run_pause",
    "run_redrive",
    "run_replay",
    "run_resume",
    "session_user",
    "tenant_seen",
]
