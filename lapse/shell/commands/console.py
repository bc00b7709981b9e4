"""`lapse console`: the operator console in the browser (overview, dead letters and their replay,
one operation's history, reports and operator actions), served until interrupted.

Beyond loopback it needs tokens (`console.viewer_tokens`, `console.operator_tokens`) and TLS
(`console.tls_cert`, `console.tls_key`): a non-loopback `--bind` without them is refused in one
line (exit 3), as is a certificate that does not load."""

from __future__ import annotations

from lapse.kernel.settings import Settings
from lapse.shell.cli import main
from lapse.shell.cli_options import connection_options, pass_settings, setting_option
from lapse.shell.error_boundary import CommandFailed, ExitCode


@main.command()
@connection_options
@setting_option("console.bind", "--bind")
@setting_option("console.port", "--port")
@pass_settings
def console(settings: Settings) -> None:
    """Serve the operator console at http(s)://BIND:PORT/ until interrupted."""
    # function-local: keeps `lapse --help` fast (the role loads starlette and uvicorn as it starts)
    from lapse.shell.roles import ConsoleRole, run_role

    try:
        role = ConsoleRole(settings)
    except ValueError as exc:  # a bind beyond this host without tokens or TLS, a certificate that does not load
        raise CommandFailed(ExitCode.CONFIG, str(exc)) from None
    run_role(role)
