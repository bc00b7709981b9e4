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
    dlq_redrive,
    init,
    kinds,
    kinds_plan,
    offsets,
    pauses,
    pipeline,
    prune,
    reconcile,
    report,
    show,
    status,
    topics,
)
