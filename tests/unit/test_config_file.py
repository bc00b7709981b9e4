"""The config file: flags > LAPSE_* > file > defaults, paths relative to the file, unknown keys and
broken files refused in one line, `lapse config show` naming every value's origin with secrets
masked, and `lapse init` writing a starter that loads."""

from __future__ import annotations

import itertools
import json
import os
import re
import stat
import string
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lapse.kernel import package_files
from lapse.kernel.config_file import ConfigFileError
from lapse.kernel.settings import Settings, UnknownSetting, check_environment, load_settings, setting_origins
from lapse.shell.app import main


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No LAPSE_* variable of the caller's shell, and an empty working folder (no ./lapse.toml)."""
    for var in list(os.environ):
        if var.startswith("LAPSE_") and not var.startswith("LAPSE_TEST_"):
            monkeypatch.delenv(var)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return work


def _invoke(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(main, list(args), env=env)


def _show(*args: str, env: dict[str, str] | None = None) -> dict:
    result = _invoke(*args, env=env)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def _last_line(result: Result) -> str:
    assert "Traceback" not in result.output
    return result.output.strip().splitlines()[-1]


# --- precedence -------------------------------------------------------------------------------

SOURCES = ("flag", "env", "file")


@pytest.mark.parametrize("present", [set(c) for c in itertools.chain.from_iterable(
    itertools.combinations(SOURCES, n) for n in range(len(SOURCES) + 1))], ids=lambda p: "+".join(sorted(p)) or "none")
def test_flag_over_env_over_file_over_default(clean_env: Path, present: set[str]) -> None:
    values = {"flag": "flag-host:1", "env": "env-host:2", "file": "file-host:3"}
    if "file" in present:
        (clean_env / "lapse.toml").write_text(f'[kafka]\nbootstrap_servers = "{values["file"]}"\n')
    env = {"LAPSE_KAFKA__BOOTSTRAP_SERVERS": values["env"]} if "env" in present else {}
    flags = ["--bootstrap-servers", values["flag"]] if "flag" in present else []
    winner = next((s for s in SOURCES if s in present), None)

    shown = _show("config", "show", "--json", *flags, env=env)["settings"]["kafka"]["bootstrap_servers"]

    expected_origin = {"flag": "flag", "env": "env LAPSE_KAFKA__BOOTSTRAP_SERVERS", "file": "file lapse.toml",
                       None: "default"}[winner]
    assert shown == {"value": values[winner] if winner else "127.0.0.1:9092", "origin": expected_origin}


def test_sources_merge_field_by_field(clean_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (clean_env / "lapse.toml").write_text('[processor]\nbatch_size = 7\nlease_seconds = 9.5\n'
                                          '[kafka]\nsasl_username = "from-file"\n')
    monkeypatch.setenv("LAPSE_PROCESSOR__BATCH_SIZE", "11")

    settings = load_settings(processor={"poll_timeout_s": 0.5})

    assert (settings.processor.batch_size, settings.processor.lease_seconds, settings.processor.poll_timeout_s,
            settings.kafka.sasl_username, settings.producer.sweep_page_size) == (11, 9.5, 0.5, "from-file", 500)
    origins = setting_origins(processor={"poll_timeout_s": 0.5})
    assert (origins["processor.batch_size"], origins["processor.lease_seconds"], origins["processor.poll_timeout_s"],
            origins["producer.sweep_page_size"]) == ("env LAPSE_PROCESSOR__BATCH_SIZE", "file lapse.toml", "flag",
                                                     "default")
    # with_() keeps working on settings that came from a file.
    assert settings.with_(processor={"batch_size": 3}).processor.lease_seconds == 9.5


def test_which_file_config_flag_then_lapse_config_then_local(clean_env: Path) -> None:
    for name, host in (("lapse.toml", "local:1"), ("from-env.toml", "env-file:2"), ("from-flag.toml", "flag-file:3")):
        (clean_env / name).write_text(f'[kafka]\nbootstrap_servers = "{host}"\n')
    env = {"LAPSE_CONFIG": "from-env.toml"}

    assert _show("config", "show", "--json")["settings"]["kafka"]["bootstrap_servers"]["value"] == "local:1"
    assert _show("config", "show", "--json", env=env)["config_file"] == "from-env.toml"
    shown = _show("--config", "from-flag.toml", "config", "show", "--json", env=env)
    assert shown["config_file"] == "from-flag.toml"
    assert shown["settings"]["kafka"]["bootstrap_servers"] == {"value": "flag-file:3", "origin": "file from-flag.toml"}


def test_lapse_config_is_not_an_unknown_setting() -> None:
    check_environment({"LAPSE_CONFIG": "x.toml"})
    with pytest.raises(UnknownSetting, match="LAPSE_CONFIGS"):
        check_environment({"LAPSE_CONFIGS": "x.toml"})


def test_config_reaches_every_command_through_the_root_option(clean_env: Path) -> None:
    (clean_env / "site.toml").write_text("[processor]\nbatch_size = 0\n")
    result = _invoke("--config", "site.toml", "sweep", "--once")
    assert result.exit_code == 3
    assert _last_line(result) == ("lapse: invalid setting processor.batch_size from file site.toml "
                                  "(env LAPSE_PROCESSOR__BATCH_SIZE): Input should be greater than or equal to 1")


# --- relative paths ---------------------------------------------------------------------------

def test_relative_paths_in_the_file_resolve_against_its_folder(clean_env: Path, tmp_path: Path) -> None:
    conf = tmp_path / "etc" / "lapse"
    conf.mkdir(parents=True)
    (conf / "lapse.toml").write_text(
        '[topics]\nfile = "topics.yaml"\n[kinds]\nfile = "../kinds.yaml"\n'
        '[kafka]\nssl_ca_location = "certs/ca.pem"\n[report]\ndir = "/var/reports"\n')

    settings = load_settings(config_file=conf / "lapse.toml")

    assert settings.topics.file == conf / "topics.yaml"
    assert settings.kinds.file is not None and settings.kinds.file.resolve() == tmp_path / "etc" / "kinds.yaml"
    assert settings.kafka.client_config()["ssl.ca.location"] == str(conf / "certs" / "ca.pem")
    assert settings.report.dir == Path("/var/reports")
    # A flag's relative path is the caller's, from the working folder.
    flagged = load_settings(config_file=conf / "lapse.toml", topics={"file": Path("mine.yaml")})
    assert flagged.topics.file == Path("mine.yaml")


def test_defaults_are_the_packaged_files_not_the_checkout() -> None:
    settings = load_settings()
    assert settings.topics.file == package_files.topics_file()
    assert settings.schemas.dir == package_files.schemas_dir()
    assert settings.topology.groups.cleanup  # the packaged topics.yaml loads


# --- refused files ----------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "message"), [
    ('[kafka]\nbootstrap_server = "x:1"\n',
     "unknown setting kafka.bootstrap_server; did you mean kafka.bootstrap_servers?"),
    ('[kafak]\nbootstrap_servers = "x:1"\n', "unknown section kafak; did you mean kafka?"),
    ("batch_size = 5\n", "unknown section batch_size; did you mean processor.batch_size?"),
    ('kafka = "x"\n', "kafka must be a table ([kafka]), not a value"),
    ("[processor]\nbatch_size = 5\n[processor.nested]\n", "unknown setting processor.nested"),
])
def test_unknown_keys_are_one_line_naming_the_closest(clean_env: Path, text: str, message: str) -> None:
    (clean_env / "lapse.toml").write_text(text)
    result = _invoke("config", "show")
    assert result.exit_code == 3
    assert _last_line(result) == f"lapse: lapse.toml: {message}"


def test_invalid_toml_names_the_file_and_line(clean_env: Path) -> None:
    (clean_env / "bad.toml").write_text('[kafka]\nbootstrap_servers = "a:1"\nthis is not toml\n')
    result = _invoke("--config", "bad.toml", "status")
    assert result.exit_code == 3
    last = _last_line(result)
    assert last.startswith("lapse: bad.toml: not valid TOML:") and "line 3" in last


@pytest.mark.parametrize("how", ["flag", "env"])
def test_a_named_file_that_is_missing_is_one_line(clean_env: Path, how: str) -> None:
    args, env = (["--config", "nowhere.toml"], None) if how == "flag" else ([], {"LAPSE_CONFIG": "nowhere.toml"})
    result = _invoke(*args, "config", "show", env=env)
    assert result.exit_code == 3
    assert _last_line(result) == "lapse: config file nowhere.toml does not exist"


_KEY = st.text(alphabet=string.ascii_lowercase + "_", min_size=1, max_size=20)


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(section=st.sampled_from(sorted(Settings.model_fields)), key=_KEY)
def test_any_unknown_key_is_refused_by_name(clean_env: Path, section: str, key: str) -> None:
    model = Settings.model_fields[section].annotation
    path = clean_env / "any.toml"
    path.write_text(f"[{section}]\n{key} = 1\n")
    if key in model.model_fields:  # type: ignore[union-attr]
        return
    with pytest.raises(ConfigFileError, match=rf"^{re.escape(str(path))}: unknown setting {section}\.{key}\b"):
        load_settings(config_file=path)


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=200))
def test_any_file_text_loads_or_is_one_line(clean_env: Path, text: str) -> None:
    path = clean_env / "any.toml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    result = _invoke("--config", str(path), "config", "show", "--json")
    assert result.exit_code in (0, 3), result.output
    if result.exit_code == 3:
        errors = [line for line in result.output.splitlines() if line.startswith("lapse:")]
        assert errors == [_last_line(result)] and str(path) in errors[0]


# --- masking ----------------------------------------------------------------------------------

_SECRET = st.text(alphabet=string.ascii_letters + string.digits, min_size=12, max_size=40)
# Secret-looking librdkafka keys that no settings field also sets (extra would override that field).
_SECRET_EXTRA_KEYS = ("sasl.oauthbearer.client.secret", "ssl.keystore.password", "ssl.truststore.password",
                      "sasl.oauthbearer.config", "ssl.key.pem", "my.api.Token", "aws.Credentials")


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(secrets=st.lists(_SECRET, min_size=6, max_size=6, unique=True), extra_key=st.sampled_from(_SECRET_EXTRA_KEYS))
def test_no_secret_value_ever_shows(clean_env: Path, secrets: list[str], extra_key: str) -> None:
    sasl, key_pw, registry, db_pw, extra, query = secrets
    (clean_env / "lapse.toml").write_text(
        f'[kafka]\nssl_key_password = "{key_pw}"\nextra = {{ "{extra_key}" = "{extra}", "client.rack" = "r1" }}\n'
        f'[schemas]\nregistry_auth = "user:{registry}"\n')
    url = f"postgresql+psycopg://lapse:{db_pw}@db.example:5432/lapse?sslpassword={query}"
    env = {"LAPSE_KAFKA__SASL_PASSWORD": sasl, "LAPSE_DATABASE__URL": url}

    # The secrets are in effect ...
    loaded = _load_with_env(env, database={"url": url})
    assert loaded.kafka.client_config()["sasl.password"] == sasl
    assert loaded.kafka.client_config()["ssl.key.password"] == key_pw
    assert loaded.kafka.client_config()[extra_key] == extra
    assert loaded.schemas.registry_auth is not None and registry in loaded.schemas.registry_auth.get_secret_value()
    assert loaded.database.url_plain() == url
    # ... and never printed, as text or JSON.
    as_json = _invoke("config", "show", "--json", env=env)
    as_text = _invoke("config", "show", env=env)
    for result in (as_json, as_text):
        assert result.exit_code == 0, result.output
        assert [s for s in secrets if s in result.output] == []
    shown = json.loads(as_json.output)["settings"]
    assert shown["database"]["url"] == {
        "value": "postgresql+psycopg://lapse:********@db.example:5432/lapse?sslpassword=********",
        "origin": "env LAPSE_DATABASE__URL"}
    assert shown["kafka"]["extra"]["value"] == {extra_key: "********", "client.rack": "r1"}
    assert shown["kafka"]["sasl_password"] == {"value": "********", "origin": "env LAPSE_KAFKA__SASL_PASSWORD"}
    assert shown["kafka"]["ssl_key_password"] == {"value": "********", "origin": "file lapse.toml"}


def _load_with_env(env: dict[str, str], **sections: dict) -> Settings:
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return load_settings(**sections)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# --- lapse init -------------------------------------------------------------------------------

def test_init_writes_a_starter_that_loads(clean_env: Path) -> None:
    result = _invoke("init")

    assert result.exit_code == 0, result.output
    assert (clean_env / "topics.yaml").read_bytes() == package_files.topics_file().read_bytes()
    assert (clean_env / "kinds.yaml").read_bytes() == package_files.starter_kinds_file().read_bytes()
    assert "lapse db upgrade" in result.output and "kinds.yaml" in result.output
    shown = _show("config", "show", "--json")
    assert shown["config_file"] == "lapse.toml"
    assert shown["settings"]["topics"]["file"] == {"value": str(clean_env / "topics.yaml"), "origin": "file lapse.toml"}
    assert shown["settings"]["kinds"]["file"] == {"value": str(clean_env / "kinds.yaml"), "origin": "file lapse.toml"}
    assert shown["settings"]["database"]["url"]["origin"] == "file lapse.toml"
    assert shown["settings"]["kafka"]["bootstrap_servers"]["origin"] == "file lapse.toml"
    assert shown["settings"]["processor"]["batch_size"]["origin"] == "default"
    assert load_settings().topology.groups.cleanup  # the written topics.yaml is the one in effect


def test_the_starter_lists_real_settings_and_every_commented_value_loads(clean_env: Path) -> None:
    assert _invoke("init").exit_code == 0
    text = (clean_env / "lapse.toml").read_text()
    # Uncomment every `# key = value` line: the file still loads, so every name and value is real.
    uncommented = re.sub(r"^# (\w+ = .+)$", r"\1", text, flags=re.MULTILINE)
    assert uncommented != text
    data = tomllib.loads(uncommented)
    assert set(data) == set(Settings.model_fields) - {"dev"}
    assert data["processor"]["batch_size"] == 500 and data["runtime"]["log_format"] == "auto"
    (clean_env / "lapse.toml").write_text(uncommented)
    assert load_settings().processor.batch_size == 500  # unknown names would be refused here


def test_init_refuses_to_overwrite_without_force(clean_env: Path) -> None:
    (clean_env / "lapse.toml").write_text("# mine\n")
    (clean_env / "kinds.yaml").write_text("# mine too\n")

    refused = _invoke("init")

    assert refused.exit_code == 1
    assert _last_line(refused) == f"lapse: lapse.toml, kinds.yaml already exist in {clean_env}; --force overwrites"
    assert (clean_env / "lapse.toml").read_text() == "# mine\n"
    assert not (clean_env / "topics.yaml").exists()

    forced = _invoke("init", "--force")

    assert forced.exit_code == 0, forced.output
    assert (clean_env / "lapse.toml").read_text().startswith("# Lapse configuration")
    assert (clean_env / "kinds.yaml").read_bytes() == package_files.starter_kinds_file().read_bytes()


@pytest.mark.parametrize(("command", "flag", "value", "instead"), [
    (["status"], "--database-url", "postgresql+psycopg://lapse:{secret}@db.example:5432/lapse", "LAPSE_DATABASE__URL"),
    (["db", "current"], "--database-url", "postgresql+psycopg://lapse:@db.example/lapse", "LAPSE_DATABASE__URL"),
    (["dlq", "list"], "--database-url", "postgresql+psycopg://lapse@db.example/lapse?sslmode=require&PASSWORD={secret}",
     "~/.pgpass"),
    (["config", "show"], "--database-url", "postgresql+psycopg://lapse@db.example/lapse?sslpassword={secret}",
     "database.url in"),
    (["status"], "--schema-registry-url", "https://reader:{secret}@registry.example", "LAPSE_SCHEMAS__REGISTRY_AUTH"),
])
def test_a_password_in_a_url_flag_is_refused_as_every_user_could_read_it(
        clean_env: Path, command: list[str], flag: str, value: str, instead: str) -> None:
    secret = "flag-s3cret-4b1d"
    result = _invoke(*command, flag, value.format(secret=secret))
    assert result.exit_code == 2, result.output
    assert _last_line(result).startswith(f"lapse: {' '.join(command)}: Invalid value for '{flag}': holds a "
                                         "password, which every user of this machine can read in the process list")
    assert instead in _last_line(result) and result.output.count("\n") == 1
    assert secret not in result.output


def test_init_writes_what_can_hold_secrets_for_its_owner_only(clean_env: Path) -> None:
    before = os.umask(0o022)  # a usual umask: files would be world-readable unless written otherwise
    try:
        assert _invoke("init").exit_code == 0
    finally:
        os.umask(before)
    modes = {name: stat.S_IMODE((clean_env / name).stat().st_mode)
             for name in ("lapse.toml", "kinds.yaml", "topics.yaml")}
    assert modes == {"lapse.toml": 0o600, "kinds.yaml": 0o600, "topics.yaml": 0o644}
    (clean_env / "lapse.toml").chmod(0o644)
    assert _invoke("init", "--force").exit_code == 0
    assert stat.S_IMODE((clean_env / "lapse.toml").stat().st_mode) == 0o600  # rewritten, not kept
    assert [p.name for p in clean_env.iterdir() if p.name.startswith(".")] == []  # no temporary file left


@pytest.mark.parametrize("force", [False, True])
@pytest.mark.parametrize("target", ["dangling", "existing"])
def test_init_never_writes_through_a_symbolic_link(clean_env: Path, tmp_path: Path, force: bool, target: str) -> None:
    elsewhere = tmp_path / "elsewhere.toml"
    if target == "existing":
        elsewhere.write_text("# someone else's file\n")
    (clean_env / "lapse.toml").symlink_to(elsewhere)

    refused = _invoke("init", *(["--force"] if force else []))

    assert refused.exit_code == 3
    assert _last_line(refused) == (f"lapse: {clean_env / 'lapse.toml'} is a symbolic link; lapse init never "
                                   "writes through one: remove it first")
    if target == "existing":
        assert elsewhere.read_text() == "# someone else's file\n"
    else:
        assert not elsewhere.exists()
    assert sorted(p.name for p in clean_env.iterdir()) == ["lapse.toml"]  # nothing else written either
