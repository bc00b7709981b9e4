"""The operator console: server-rendered pages over what the CLI reads (status, dead letters, one
operation's history, reports and operator actions) and the one action it takes, a bounded,
confirmed, recorded dead-letter replay. `lapse console` serves it; `create_app` builds it."""

from lapse.shell.console.app import create_app

__all__ = ["create_app"]
