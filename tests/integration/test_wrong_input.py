"""Wrong input given to the commands, as a table: each case is one line on stderr, nothing on
stdout, and the exit code of docs/troubleshooting.md. Unknown kinds, tenants and groups are
refused rather than matching nothing; times take durations; a database URL's scheme is named with
its fix. A ledger with a few operations on PostgreSQL; no broker is needed (none is reached)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lapse.devtools.demo_kinds import packaged_kinds_file
from lapse.kernel.database import make_engine
from lapse.kernel.ledger import expiry_event
from lapse.kernel.settings import env_var
from lapse.kernel.topology import load_topology
from lapse.processors import BatchScope, apply_batch
from lapse.shell.app import main
from lapse.shell.error_boundary import ExitCode
from tests.fixtures.kinds import demo_kinds
from tests.fixtures.topology import TOPICS_FILE

NOW = datetime.now(UTC).replace(microsecond=0)
CLOSED = "127.0.0.1:9"  # no broker: a case that reached one would fail on it, not pass
DML = ["--reason", "r", "--actor", "a", "--limit", "1", "--yes"]

# (what, arguments, exit code, the one line's start)
CASES = [
    ("a misspelt kind", ["dlq", "list", "--no-poison", "--kind", "release-reservatoin"], ExitCode.USAGE,
     "lapse: unknown kind 'release-reservatoin': no operation has it and no declaration names it; "
     "did you mean 'release-reservation'?"),
    ("an unknown tenant", ["dlq", "list", "--no-poison", "--tenant", "globex"], ExitCode.USAGE,
     "lapse: unknown tenant 'globex': no operation has it"),
    ("a replay of an unknown kind", ["dlq", "replay", "--kind", "expire-order", *DML], ExitCode.USAGE,
     "lapse: unknown kind 'expire-order': no operation has it and no declaration names it; the kinds file "
     "declares artifact-delete, release-reservation"),
    ("a discard of a tenant no column holds", ["dlq", "discard", "--tenant", "a\x00b", *DML], ExitCode.USAGE,
     "lapse: unknown tenant 'a\\u0000b': no operation has it"),
    ("show by an unknown kind", ["show", "--subject", "release-reservatoin", "1"], ExitCode.USAGE,
     "lapse: unknown kind 'release-reservatoin'"),
    ("show a subject no op key can name", ["show", "--subject", "release-reservation", "a b"], ExitCode.USAGE,
     "lapse: show: malformed op key 'release-reservation:a b': expected <kind>:<subject_id>"),
    ("show an unknown tenant", ["show", "--tenant", "globex"], ExitCode.USAGE,
     "lapse: unknown tenant 'globex': no operation has it"),
    ("show a tenant's unknown kind", ["show", "--tenant", "acme", "--kind", "nope"], ExitCode.USAGE,
     "lapse: unknown kind 'nope'"),
    ("a page of nothing", ["show", "--tenant", "acme", "--limit", "0"], ExitCode.USAGE,
     "lapse: show: Invalid value for '--limit': 0 is not in the range 1<=x<=1000."),
    ("an undeclared group", ["offsets", "reset", "--group", "lapse-cleanp", "--to-earliest"], ExitCode.USAGE,
     "lapse: group lapse-cleanp is not declared in topics.yaml (declared: "),
    ("a time that is none", ["audit", "--since", "yesterday"], ExitCode.USAGE,
     "lapse: audit: Invalid value for '--since': 'yesterday' is not an ISO 8601 timestamp, epoch milliseconds "
     "or a duration ago like 2h"),
    ("durations as times, the wrong way round", ["audit", "--since", "2h", "--until", "3h"], ExitCode.USAGE,
     "lapse: audit: --since "),
    ("a duration that is none", ["process", "--exit-when-idle", "soon"], ExitCode.USAGE,
     "lapse: process: Invalid value for '--exit-when-idle': 'soon' is not a duration like 30s, 15m, 2h or 1d"),
    ("a log format that is none", ["status", "--log-format", "xml"], ExitCode.USAGE,
     "lapse: status: Invalid value for '--log-format': 'xml' is not one of 'auto', 'text', 'json'."),
    ("another PostgreSQL driver", ["status", "--database-url", "postgresql+psycopg2://lapse@db/shop"],
     ExitCode.CONFIG, "lapse: invalid setting database.url from flag (env LAPSE_DATABASE__URL): Lapse reaches "
                      "PostgreSQL through psycopg 3: write postgresql+psycopg:// instead of postgresql+psycopg2://"),
    ("an unknown command", ["sweeep"], ExitCode.USAGE, "lapse: No such command 'sweeep'."),
]


def with_operations(url: str) -> None:
    """A few operations of tenant acme (release-reservation) in the ledger at `url`."""
    engine = make_engine(url)
    events = [expiry_event("release-reservation", 900 + i, "acme", NOW - timedelta(hours=1), source="sweep")
              for i in range(3)]
    with engine.begin() as conn:
        apply_batch(BatchScope(conn, kinds=demo_kinds(engine), topics=load_topology(TOPICS_FILE), worker="w1",
                               now=NOW, lease=timedelta(seconds=30)), events)
    engine.dispose()


def test_wrong_input_is_one_line_with_its_exit_code(pg_url) -> None:
    with_operations(pg_url)
    env = {env_var("database.url"): pg_url, env_var("kinds.file"): str(packaged_kinds_file()),
           env_var("kafka.bootstrap_servers"): CLOSED, env_var("topics.file"): str(TOPICS_FILE)}
    for what, args, code, start in CASES:
        result = CliRunner().invoke(main, args, env=env, prog_name="lapse")
        assert (result.exit_code, result.stdout) == (code, ""), (what, result.output)
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith(start), (what, lines)
        assert "s3cret" not in lines[0]


def test_the_right_input_of_the_same_shapes_is_taken(pg_url) -> None:
    """The durations, the postgres:// URL and a known tenant and kind are accepted."""
    with_operations(pg_url)
    env = {env_var("kinds.file"): str(packaged_kinds_file()), env_var("kafka.bootstrap_servers"): CLOSED}
    url = pg_url.replace("postgresql+psycopg://", "postgres://")
    listed = CliRunner().invoke(main, ["show", "--tenant", "acme", "--kind", "release-reservation",
                                       "--database-url", url], env=env)
    assert listed.exit_code == 0, listed.output
    assert listed.stdout.splitlines()[0] == "tenant acme, kind release-reservation: 3 operation(s)"
    window = CliRunner().invoke(main, ["show", "--correlation-id", "nobody", "--since", "90m", "--until", "30m",
                                       "--database-url", url], env=env)
    assert window.exit_code == 1 and window.stderr.startswith("lapse: no operation with correlation id nobody")
    assert datetime.fromisoformat(window.stderr.split(" from ")[1].split(" to ")[0].replace("Z", "+00:00")) \
        < datetime.now(UTC) - timedelta(minutes=89)


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=200))
def test_any_kind_or_tenant_is_refused_in_one_line_or_found(pg_url, name: str) -> None:
    """Whatever text an operator (or a script) gives as a kind or a tenant, NUL and controls
    included: refused in one line with exit 2, never an internal error."""
    env = {env_var("database.url"): pg_url, env_var("kinds.file"): str(packaged_kinds_file())}
    for args in (["show", "--tenant", name], ["dlq", "list", "--no-poison", "--kind", name]):
        result = CliRunner().invoke(main, args, env=env)
        assert result.exit_code == ExitCode.USAGE, (args, result.output)
        assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith("lapse: unknown "), result.stderr
