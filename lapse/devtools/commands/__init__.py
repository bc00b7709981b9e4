"""Commands of the dev tools (`lapse demo`, `lapse bench`, `lapse broker`, `lapse soak`), registered on the
shell's `main` through the `lapse.commands` entry point."""

from lapse.devtools.commands import bench, broker, demo, soak  # noqa: F401
