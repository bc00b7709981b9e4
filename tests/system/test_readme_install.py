"""The README's "Install", run as written on a fresh virtual environment: its commands in one shell
(the venv it activates stays active), in a copy of this checkout, with a home of its own; pip
builds the wheel and installs it and its dependencies from the package index, as on a new machine
(pip's download cache kept warm). Then the database creation step, against the test's PostgreSQL
under a name of its own. Then what the install gives: the version, Lapse's tables created in that
database, the dev tools in their own help section, and the analytics extra named where it is
missing (only `[s3]` was installed)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from tests.fixtures.db import admin_url
from tests.fixtures.readme import commands, readme_blocks
from tests.fixtures.wheel import PYPROJECT, check_ok, copy_sources

pytestmark = pytest.mark.slow

SECTION = "## Install"
README_CREATEDB = "createdb -h 127.0.0.1 -U lapse shop"
INSTALL_BOUND_S = 600  # pip from the index on a cold cache, building the wheel included


def shell(script: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-e", "-c", script], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=INSTALL_BOUND_S)


def test_the_readme_install_section_works_on_a_fresh_environment(tmp_path: Path) -> None:
    blocks = readme_blocks(SECTION)
    assert [b.action for b in blocks] == ["install", "createdb"], blocks
    install, createdb = blocks
    assert commands(createdb.body) == [README_CREATEDB]

    checkout = tmp_path / "lapse"
    copy_sources(checkout)
    home = tmp_path / "home"
    home.mkdir()
    here = Path(sys.executable).parent  # this suite's own environment: not on the new one's PATH
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "LAPSE_", "VIRTUAL_ENV", "PIP_"))}
    env.setdefault("PGPASSFILE", str(Path.home() / ".pgpass"))  # where `make postgres` keeps the role's password
    env.update(HOME=str(home), PIP_CACHE_DIR=str(Path.home() / ".cache" / "pip"),
               PIP_DISABLE_PIP_VERSION_CHECK="1",
               PATH=os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if Path(p) != here))

    installed = shell("\n".join(commands(install.body)), checkout, env)
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    assert installed.stdout.strip().splitlines()[-1] == f"lapse {PYPROJECT['project']['version']}"
    lapse = home / ".venvs" / "lapse" / "bin" / "lapse"
    assert lapse.is_file()

    admin = make_url(admin_url())
    name = f"shop_{uuid.uuid4().hex[:10]}"
    mine = (README_CREATEDB.replace("127.0.0.1", f"{admin.host} -p {admin.port}")
            .replace("-U lapse", f"-U {admin.username}").replace(" shop", f" {name}"))
    created = shell(mine, tmp_path, env)
    try:
        assert created.returncode == 0, created.stderr
        url = admin.set(database=name).render_as_string(hide_password=False)
        upgraded = subprocess.run([lapse, "db", "upgrade", "--database-url", url], cwd=tmp_path, env=env,
                                  capture_output=True, text=True, timeout=120)
        assert upgraded.returncode == 0, upgraded.stderr
        engine = create_engine(url)
        with engine.connect() as conn:
            tables = set(conn.execute(text("SELECT tablename FROM pg_tables WHERE schemaname = 'lapse'")).scalars())
        engine.dispose()
        assert {"lapse_ledger", "lapse_transitions", "lapse_outbox"} <= tables

        helped = check_ok(subprocess.run([lapse, "--help"], cwd=tmp_path, env=env, capture_output=True,
                                         text=True, timeout=60))
        assert "\nDev tools:\n" in helped
        analytics = subprocess.run([lapse, "analytics"], cwd=tmp_path, env=env, capture_output=True, text=True,
                                   timeout=60)
        assert (analytics.returncode, analytics.stdout) == (3, "")
        assert analytics.stderr == ("lapse: analytics needs the `analytics` extra (faust is not installed): "
                                    "pip install 'lapse[analytics]'\n")
    finally:
        engine = create_engine(admin_url(), isolation_level="AUTOCOMMIT")
        with engine.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        engine.dispose()
