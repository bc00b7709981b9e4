"""The console's pages, one module each; every module's `routes(console)` gives its page, its forms
and its JSON under `/api/v1/`. A new page is a module here and one entry in PAGES (and, for the
navigation, a link in `templates/base.html`)."""

from lapse.shell.console.pages import activity, brakes, dead_letters, health, operations, overview, signin

PAGES = (signin, health, overview, dead_letters, operations, brakes, activity)

__all__ = ["PAGES"]
