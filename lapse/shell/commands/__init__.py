"""Subcommands of `lapse`, one module per concern; importing this package registers each on
`lapse.shell.cli.main`."""

from lapse.shell.commands import (  # noqa: F401
    analytics,
    archive,
    audit,
    config,
    console,
    db,
    delay,
    dlq,
    init,
    kinds,
    kinds_plan,
    offsets,
    pipeline,
    prune,
    reconcile,
    report,
    show,
    status,
    topics,
)
