"""compose/ is consistent with the code: every LAPSE_<SECTION>__<FIELD> variable names a field of
that Settings section, topics.yaml
fits the three brokers, each image is pinned, and Prometheus scrapes what serves metrics. And it is
least privilege: ports published on loopback only, Grafana's admin password a secret with anonymous
access off, SASL_SSL and mutual TLS on Kafka with an authorizer, registry authentication, and each
service its own Kafka user and database role with only its grants (make-secrets.sh is run).
(Docker cannot run here; see compose/README.md.)"""

from __future__ import annotations

import json
import re
import shutil
import ssl
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml
from sqlalchemy.engine import make_url

from lapse.kernel.config_file import CONFIG_ENV_VAR
from lapse.kernel.connections import faust_credentials
from lapse.kernel.kinds.declarations import read_kinds_file
from lapse.kernel.settings import REPO_ROOT, env_var, load_settings
from lapse.kernel.topology import load_topology
from tests.fixtures.compose import names_a_settings_field

COMPOSE = REPO_ROOT / "compose"


def _compose() -> dict:
    return yaml.safe_load((COMPOSE / "docker-compose.yml").read_text())


def _lapse_vars(env: dict) -> set[str]:
    return {k for k in env if k.startswith("LAPSE_")}


def test_every_lapse_variable_is_a_settings_field():
    services = _compose()["services"]
    seen = set()
    for name, service in services.items():
        variables = _lapse_vars(service.get("environment") or {})
        unknown = {var for var in variables if not names_a_settings_field(var) and var != CONFIG_ENV_VAR}
        assert not unknown, f"service {name} sets {sorted(unknown)}, which name no Settings field"
        seen |= variables
    dockerfile = (COMPOSE / "Dockerfile").read_text()
    dockerfile_vars = set(re.findall(r"\b(LAPSE_[A-Z_]+)=", dockerfile))
    assert dockerfile_vars and all(names_a_settings_field(var) for var in dockerfile_vars), sorted(dockerfile_vars)
    # The database URL and every credential come from each service's config file (LAPSE_CONFIG, a secret).
    assert {env_var("kafka.bootstrap_servers"), env_var("runtime.metrics_port"), CONFIG_ENV_VAR} <= seen


def test_old_flat_names_are_not_fields():
    assert not names_a_settings_field("LAPSE_BATCH_SIZE")
    assert not names_a_settings_field("LAPSE_PROCESSOR__NO_SUCH_FIELD")
    assert not names_a_settings_field("LAPSE_NO_SUCH_SECTION__BATCH_SIZE")
    assert names_a_settings_field("LAPSE_PROCESSOR__BATCH_SIZE")


def test_topics_fit_three_brokers_and_services_are_there():
    services = _compose()["services"]
    brokers = [n for n, s in services.items() if "KAFKA_NODE_ID" in (s.get("environment") or {})]
    assert len(brokers) == 3
    for spec in load_topology(REPO_ROOT / "topics.yaml").specs:
        assert spec.replication_factor <= len(brokers), spec.name
        assert int(spec.config.get("min.insync.replicas", "1")) < spec.replication_factor, spec.name
    for role in ("sweep", "process", "relay", "delay", "reconcile", "analytics", "monitor", "prune", "report",
                 "console", "migrate", "postgres", "schema-registry", "prometheus", "grafana", "kafka-init"):
        assert role in services, role
    assert services["process"]["deploy"]["replicas"] == 3


def test_images_are_pinned_and_prometheus_scrapes_the_metrics_port():
    for name, service in _compose()["services"].items():
        image = service.get("image")
        assert image and ":" in image and not image.endswith(":latest"), f"{name}: unpinned image {image}"
    scrape = yaml.safe_load((COMPOSE / "prometheus.yml").read_text())["scrape_configs"]
    targets = {t for job in scrape for c in job.get("static_configs", []) for t in c["targets"]}
    targets |= {f"{n}:{c['port']}" for job in scrape for c in job.get("dns_sd_configs", []) for n in c["names"]}
    port = _compose()["x-lapse-env"][env_var("runtime.metrics_port")]
    assert {f"{s}:{port}" for s in ("sweep", "process", "relay", "monitor", "report")} <= targets
    dashboard = json.loads(Path(COMPOSE / "grafana/dashboards/lapse.json").read_text())
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p["targets"])
    for metric in ("lapse_oldest_eligible_age_seconds", "lapse_consumer_lag_records",
                   "lapse_dead_letters_total", "lapse_batch_seconds_bucket", "lapse_retries_total"):
        assert metric in exprs


# --- least privilege: published ports, Grafana, Kafka listeners, one identity per service ------------

LAPSE_SERVICES = ("migrate", "sweep", "process", "relay", "delay", "reconcile", "analytics", "monitor",
                  "prune", "report", "console")
# The topics.yaml role each service runs as on Kafka (`lapse status --watch` is the status role; the
# console reads lag as status does).
KAFKA_ROLE = {"sweep": "sweep", "process": "process", "relay": "relay", "delay": "delay",
              "reconcile": "reconcile", "analytics": "analytics", "monitor": "status", "console": "console"}
# The services that use no Kafka (their start-up checks read only files and the database): no user,
# no registry login.
NO_KAFKA = {"prune", "report"}
# The services that use no database (and so get no role and no URL).
NO_DATABASE = {"delay", "analytics"}


def test_published_ports_listen_on_loopback_only():
    published = {name: service["ports"] for name, service in _compose()["services"].items() if service.get("ports")}
    assert set(published) == {"analytics", "prometheus", "grafana", "console", "kafka-ui"}
    for name, ports in published.items():
        assert all(str(port).startswith("127.0.0.1:") for port in ports), f"{name} publishes {ports}"


def test_grafana_takes_its_admin_password_from_a_secret_and_lets_no_one_in_anonymously():
    compose = _compose()
    grafana = compose["services"]["grafana"]
    env = grafana["environment"]
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "false"
    assert "GF_SECURITY_ADMIN_PASSWORD" not in env
    secret = env["GF_SECURITY_ADMIN_PASSWORD__FILE"].removeprefix("/run/secrets/")
    assert secret in grafana["secrets"] and secret in compose["secrets"]


def test_no_secret_is_written_in_the_compose_file():
    text = (COMPOSE / "docker-compose.yml").read_text()
    assert not re.search(r"://[^/\s:@\"]+:[^/\s@\"]+@", text), "a URL with a password"
    compose = _compose()
    for name, service in compose["services"].items():
        for key, value in (service.get("environment") or {}).items():
            if re.search(r"PASSWORD|SECRET|TOKEN", key):
                assert key.endswith("_FILE") and str(value).startswith("/run/secrets/"), f"{name}: {key}"
        assert env_var("database.url") not in (service.get("environment") or {}), name
    for name, service in compose["services"].items():
        for secret in service.get("secrets", []):
            assert secret in compose["secrets"], f"{name}: undeclared secret {secret}"


def test_kafka_clients_use_sasl_ssl_brokers_mutual_tls_and_an_authorizer():
    env = _compose()["x-kafka-env"]
    protocols = dict(pair.split(":") for pair in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    assert protocols == {"CLIENT": "SASL_SSL", "CONTROLLER": "SSL", "INTERNAL": "SSL"}
    assert env["KAFKA_SASL_ENABLED_MECHANISMS"] == "SCRAM-SHA-512"
    assert env["KAFKA_LISTENER_NAME_INTERNAL_SSL_CLIENT_AUTH"] == "required"
    assert env["KAFKA_LISTENER_NAME_CONTROLLER_SSL_CLIENT_AUTH"] == "required"
    assert env["KAFKA_AUTHORIZER_CLASS_NAME"].endswith("StandardAuthorizer")
    assert env["KAFKA_ALLOW_EVERYONE_IF_NO_ACL_FOUND"] == "false"
    services = _compose()["services"]
    for n in (1, 2, 3):
        advertised = services[f"kafka-{n}"]["environment"]["KAFKA_ADVERTISED_LISTENERS"]
        assert advertised == f"CLIENT://kafka-{n}:9092,INTERNAL://kafka-{n}:9094"
    registry = services["schema-registry"]["environment"]
    assert registry["SCHEMA_REGISTRY_KAFKASTORE_SECURITY_PROTOCOL"] == "SASL_SSL"
    assert registry["SCHEMA_REGISTRY_AUTHENTICATION_METHOD"] == "BASIC"


@pytest.fixture(scope="module")
def made_secrets(tmp_path_factory) -> Path:
    """compose/make-secrets.sh run in a copy of compose/ (it needs openssl); its secrets folder."""
    copy = tmp_path_factory.mktemp("compose") / "compose"
    shutil.copytree(COMPOSE, copy, ignore=shutil.ignore_patterns("secrets"))
    first = subprocess.run(["bash", str(copy / "make-secrets.sh")], capture_output=True, text=True, check=True)
    assert "made ca.pem" in first.stdout
    again = subprocess.run(["bash", str(copy / "make-secrets.sh")], capture_output=True, text=True, check=True)
    assert "made" not in again.stdout  # a second run keeps every file
    return copy / "secrets"


def test_make_secrets_makes_every_declared_secret(made_secrets):
    declared = {spec["file"].removeprefix("./secrets/") for spec in _compose()["secrets"].values()}
    assert declared <= {p.name for p in made_secrets.iterdir()}
    assert oct(made_secrets.stat().st_mode & 0o777) == "0o700"
    assert oct((made_secrets / "ca.key").stat().st_mode & 0o777) == "0o600"


def test_each_lapse_service_has_its_own_kafka_user_and_database_role(made_secrets):
    services = _compose()["services"]
    topology = load_topology(REPO_ROOT / "topics.yaml")
    super_users = _compose()["x-kafka-env"]["KAFKA_SUPER_USERS"].split(";")
    db_users = set()
    for name in LAPSE_SERVICES:
        env = services[name]["environment"]
        config = env["LAPSE_CONFIG"].removeprefix("/run/secrets/")
        assert config in services[name]["secrets"], name
        settings = load_settings(made_secrets / config)
        kafka = settings.kafka
        if name in NO_KAFKA:
            assert not {"kafka", "schemas"} & set(tomllib.loads((made_secrets / config).read_text())), name
            assert kafka.sasl_username is None and settings.schemas.registry_auth is None, name
        else:
            assert (kafka.security_protocol, kafka.sasl_mechanism) == ("SASL_SSL", "SCRAM-SHA-512"), name
            assert kafka.ssl_ca_location == Path("/run/secrets/ca.pem")
            if name == "migrate":
                assert f"User:{kafka.sasl_username}" in super_users  # topics apply creates topics and ACLs
            else:
                assert f"User:{kafka.sasl_username}" == topology.principal(KAFKA_ROLE[name]), name
                assert f"User:{kafka.sasl_username}" not in super_users
            assert settings.schemas.registry_auth is not None
        if name in NO_DATABASE:
            assert "url" not in settings.database.model_fields_set, name
            continue
        url = make_url(settings.database.url_plain())
        assert url.username == f"lapse_{name}" and (url.host, url.database) == ("postgres", "lapse")
        assert (settings.database.sslmode, settings.database.ssl_root_cert) == (
            "verify-full", Path("/run/secrets/ca.pem"))
        db_users.add(url.username)
    assert len(db_users) == len(LAPSE_SERVICES) - len(NO_DATABASE)
    assert set(KAFKA_ROLE) | NO_KAFKA | {"migrate"} == set(LAPSE_SERVICES)
    analytics = load_settings(made_secrets / "lapse-analytics.toml").kafka
    assert faust_credentials(analytics.model_copy(update={"ssl_ca_location": made_secrets / "ca.pem"})) is not None


def _heredoc(script: str, function: str) -> str:
    """The SQL the shell function `function` of init-roles.sh sends to psql."""
    start = script.index("<<SQL", script.index(f"{function}() {{"))
    return script[start:script.index("\nSQL\n", start)]


def test_database_roles_get_grants_table_by_table_and_nothing_more():
    """init-roles.sh makes a login role per service with nothing but CONNECT (and TEMPORARY for the
    owner, which migrations use); no role is a member of another; its grants step names each table,
    a column list with every UPDATE, and leaves the audit trail append-only. What the grants allow
    and refuse on the real PostgreSQL: tests/integration/test_compose_roles.py."""
    script = (COMPOSE / "postgres" / "init-roles.sh").read_text()
    roles_sql, grants_sql = _heredoc(script, "roles"), _heredoc(script, "grants")
    created = set(re.findall(r"CREATE ROLE \$(\w+) LOGIN PASSWORD '\$\(secret (\w+)\)'", roles_sql))
    assert created == {(s, s) for s in LAPSE_SERVICES if s not in NO_DATABASE}
    assert not re.search(r"SUPERUSER|CREATEDB|CREATEROLE|BYPASSRLS|GRANT ALL|GRANT CREATE|DEFAULT PRIVILEGES .*GRANT",
                         script)
    assert "CREATE SCHEMA lapse AUTHORIZATION $migrate" in roles_sql
    assert re.findall(r"GRANT (\w+) ON DATABASE \S+ TO ([$\w, ]+);", roles_sql) == [
        ("CONNECT", "$migrate, $services"), ("TEMPORARY", "$migrate")]
    assert "REVOKE ALL ON DATABASE" in roles_sql and "REVOKE CREATE ON SCHEMA public FROM PUBLIC" in roles_sql
    assert not re.search(r"GRANT \$?\w+ TO ", script)  # no membership: prune rotates through the owner's functions
    statements = [" ".join(g.split()) for g in re.findall(r"^GRANT [^;]+;", grants_sql, re.MULTILINE)]
    for statement in statements:
        privileges = statement.split(" ON ")[0]
        assert "UPDATE" not in privileges or "UPDATE (" in privileges, f"an UPDATE of whole rows: {statement}"
    for table in ("lapse_transitions", "lapse_operator_actions"):  # append-only, but prune's horizon deletes
        on_it = [g for g in statements if re.search(rf" ON {table}\s", g)]
        assert on_it and all(re.match(r"GRANT (SELECT|INSERT|SELECT, INSERT) ON", g) or g.endswith("TO $prune;")
                             for g in on_it), on_it
        assert all("UPDATE" not in g and "TRUNCATE" not in g for g in on_it), on_it
    assert "psql -v ON_ERROR_STOP=1 -q --single-transaction <<SQL" in script  # revoke all, grant: one step
    compose = _compose()["services"]
    postgres = compose["postgres"]
    assert "./postgres/init-roles.sh:/docker-entrypoint-initdb.d/10-roles.sh:ro" in postgres["volumes"]
    assert "ssl=on" in postgres["command"]
    grants = compose["db-grants"]
    assert grants["image"] == postgres["image"] and grants["entrypoint"] == ["bash", "/init-roles.sh", "grants"]
    assert "./postgres/init-roles.sh:/init-roles.sh:ro" in grants["volumes"]
    assert grants["environment"]["PGSSLMODE"] == "verify-full" and "db-migrate.password" in grants["secrets"]


def test_the_console_carries_its_tokens_and_session_key_and_the_report_its_volume(made_secrets):
    """The console binds beyond loopback in its container, which it refuses without tokens and TLS:
    its config file has an operator and a viewer token, a session key and its certificate. The
    report writes its files to a named volume."""
    compose = _compose()
    console = load_settings(made_secrets / "lapse-console.toml").console
    assert set(console.operator_tokens) == {"operator"} and set(console.viewer_tokens) == {"viewer"}
    tokens = [t.get_secret_value() for t in (*console.operator_tokens.values(), *console.viewer_tokens.values())]
    assert all(len(t) >= 32 for t in tokens) and len(set(tokens)) == 2
    assert console.secret_key is not None and len(console.secret_key.get_secret_value()) >= 32
    # Beyond loopback the console needs TLS: its certificate from the compose CA, mounted as secrets.
    assert (console.tls_cert, console.tls_key) == (Path("/run/secrets/console.crt"), Path("/run/secrets/console.key"))
    ssl.create_default_context(cafile=str(made_secrets / "ca.pem"))  # the CA loads
    ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(made_secrets / "console.crt", made_secrets / "console.key")
    assert set(console.allowed_hosts) == {"localhost", "console"}
    service = compose["services"]["console"]
    assert service["command"] == ["console", "--bind", "0.0.0.0", "--port", "8088"]
    assert service["ports"] == ["127.0.0.1:8088:8088"]
    report = compose["services"]["report"]
    assert report["environment"][env_var("report.dir")] == "/app/.lapse/reports"
    assert report["environment"][env_var("report.notifier")] == "file"
    assert "reports:/app/.lapse/reports" in report["volumes"] and "reports" in compose["volumes"]
    assert compose["services"]["prune"]["command"] == ["prune", "--watch"]


# --- what tests/system/test_compose_processes.py cannot prove: the image, volumes, mounts, start-up order ----

def _mounted_secrets(text: str) -> set[str]:
    """The secrets a command line, variable or file names by their mount path (/run/secrets/NAME)."""
    names = re.findall(r"/run/secrets/([A-Za-z0-9._$*{}-]+)", text)
    return {n for n in names if not re.search(r"[$*{}]", n)}  # a glob or a variable: checked by name below


def test_every_lapse_service_runs_the_one_image_built_from_the_dockerfile():
    """One image for every Lapse service, built from compose/Dockerfile, whose ENTRYPOINT is `lapse`
    (each `command:` is a subcommand), with the console extra (the console service) and every
    package folder the wheel is built from; its state folder /app/.lapse belongs to its user, and the
    paths the services write to (the reports volume, Faust's data) are under it."""
    compose = _compose()
    image = compose["x-lapse"]["image"]
    services = {n: s for n, s in compose["services"].items() if s.get("image") == image}
    assert set(services) == set(LAPSE_SERVICES)
    for name, service in services.items():
        build = service.get("build") or compose["x-lapse"]["build"]
        assert (COMPOSE / build["context"] / build["dockerfile"]).resolve() == (COMPOSE / "Dockerfile").resolve(), name
    dockerfile = (COMPOSE / "Dockerfile").read_text()
    assert re.search(r'^ENTRYPOINT \["lapse"\]$', dockerfile, re.MULTILINE)
    assert "[console]" in dockerfile
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    folders = set(pyproject["tool"]["setuptools"]["package-dir"].values())
    copied = {line.split()[1] for line in dockerfile.splitlines() if line.startswith("COPY ") and "--from" not in line}
    assert folders <= copied and "topics.yaml" in " ".join(dockerfile.splitlines())
    assert re.search(r"^WORKDIR /app$", dockerfile, re.MULTILINE) and "chown -R lapse /app/.lapse" in dockerfile
    assert re.search(r"^USER lapse$", dockerfile, re.MULTILINE)
    analytics = services["analytics"]["command"]
    assert analytics[analytics.index("--data-dir") + 1].startswith("/app/.lapse/")
    assert services["report"]["environment"][env_var("report.dir")].startswith("/app/.lapse/")


def test_volumes_are_declared_used_and_bind_mounts_exist():
    """Every named volume a service mounts is declared and every declared one is mounted; every
    file or folder bind-mounted from the repository exists; the services that keep data (brokers,
    PostgreSQL, reports) keep it on a named volume."""
    compose = _compose()
    named, binds = set(), []
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source, target = str(volume).split(":")[:2]
            if source.startswith((".", "/")):
                binds.append((name, source, target))
            else:
                named.add(source)
    assert named == set(compose["volumes"])
    for name, source, _target in binds:
        assert (COMPOSE / source).exists(), f"{name}: {source} is not in compose/"
    kept = {n: [str(v) for v in s.get("volumes", [])] for n, s in compose["services"].items()}
    for n in (1, 2, 3):
        assert f"kafka-{n}:/var/lib/kafka/data" in kept[f"kafka-{n}"]
    assert "postgres:/var/lib/postgresql/data" in kept["postgres"]


def test_each_broker_keeps_its_log_and_metadata_on_its_volume():
    """KAFKA_LOG_DIRS (log.dirs, where KRaft keeps its metadata log too) is the folder each node's
    volume is mounted at: left unset, the image writes under /tmp in the container, and a new
    container starts with an empty broker that cannot rejoin its cluster."""
    compose = _compose()
    log_dirs = compose["x-kafka-env"]["KAFKA_LOG_DIRS"].split(",")
    for n in (1, 2, 3):
        service = compose["services"][f"kafka-{n}"]
        env = service["environment"]
        assert "KAFKA_METADATA_LOG_DIR" not in env and env["KAFKA_LOG_DIRS"] == ",".join(log_dirs)
        mounts = {str(v).split(":")[1]: str(v).split(":")[0] for v in service["volumes"]}
        assert all(d in mounts and mounts[d] in compose["volumes"] for d in log_dirs), (log_dirs, mounts)


def test_every_secret_a_service_reads_is_mounted_into_it(made_secrets):
    """A secret named by its mount path (in a variable, a command, a health check, the Lapse config
    file a service reads, or the script a service runs) is among that service's secrets; the init
    scripts get a password file for every user or role they create."""
    compose = _compose()
    for name, service in compose["services"].items():
        mounted = set(service.get("secrets", []))
        text = json.dumps({k: service.get(k) for k in ("environment", "command", "entrypoint", "healthcheck")})
        for volume in service.get("volumes", []):
            source = str(volume).split(":")[0]
            if source.startswith(".") and (COMPOSE / source).is_file():
                text += (COMPOSE / source).read_text()
        config = (service.get("environment") or {}).get(CONFIG_ENV_VAR)
        if config:
            text += (made_secrets / config.removeprefix("/run/secrets/")).read_text()
        for file in ("registry-jaas.conf", "kafka-ui.yaml"):  # secrets that name other secrets
            if file in mounted:
                text += (made_secrets / file).read_text()
        named = _mounted_secrets(text)
        assert named <= mounted, f"{name} reads {sorted(named - mounted)}, which it does not mount"
    kafka_passwords = {s for s in compose["secrets"] if s.startswith("kafka-") and s.endswith(".password")}
    assert kafka_passwords <= set(compose["services"]["kafka-init"]["secrets"])  # init-users.sh reads them all
    script = (COMPOSE / "postgres" / "init-roles.sh").read_text()
    roles = set(re.findall(r"\$\(secret (\w+)\)", script[script.index("roles() {"):script.index("grants() {")]))
    assert {f"db-{r}.password" for r in roles} <= set(compose["services"]["postgres"]["secrets"])
    grants = set(re.findall(r"\$\(secret (\w+)\)", script[script.index("grants() {"):]))
    assert grants == {"migrate"} and "db-migrate.password" in compose["services"]["db-grants"]["secrets"]


def test_start_up_order_waits_for_health_and_for_the_one_shots():
    """depends_on names existing services without a cycle; a `service_healthy` condition waits for a
    service with a health check, `service_completed_successfully` for a one-shot (restart "no");
    the brokers are healthy before their users are made, the users exist before the registry starts,
    the database and registry are up before migrate, the grants follow migrate, and every other
    Lapse service starts after them."""
    services = _compose()["services"]
    edges: dict[str, dict[str, str]] = {}
    for name, service in services.items():
        deps = service.get("depends_on") or {}
        edges[name] = ({d: "service_started" for d in deps} if isinstance(deps, list)
                       else {d: spec.get("condition", "service_started") for d, spec in deps.items()})
        for dep, condition in edges[name].items():
            assert dep in services, f"{name} depends on unknown {dep}"
            if condition == "service_healthy":
                assert services[dep].get("healthcheck", {}).get("test"), f"{name} waits for {dep}'s health"
            elif condition == "service_completed_successfully":
                assert str(services[dep].get("restart")) == "no", f"{name} waits for {dep} to complete"
    done: set[str] = set()
    while len(done) < len(services):  # a topological order exists: no cycle
        ready = {n for n in services if n not in done and set(edges[n]) <= done}
        assert ready, f"depends_on cycle among {sorted(set(services) - done)}"
        done |= ready
    assert edges["kafka-init"] == {f"kafka-{n}": "service_healthy" for n in (1, 2, 3)}
    assert edges["schema-registry"] == {"kafka-init": "service_completed_successfully"}
    assert edges["migrate"] == {"postgres": "service_healthy", "schema-registry": "service_healthy"}
    assert edges["db-grants"] == {"migrate": "service_completed_successfully"}
    for name in set(LAPSE_SERVICES) - {"migrate"}:
        assert edges[name] == {"db-grants": "service_completed_successfully"}, name
        assert services[name]["restart"] == "unless-stopped", name
    assert edges["kafka-ui"] == {"schema-registry": "service_healthy"}
    assert services["migrate"]["entrypoint"] == ["sh", "-c", "lapse db upgrade && lapse topics apply"]


def test_published_ports_are_the_ports_the_services_listen_on():
    """The analytics and console ports compose publishes are the ones their commands listen on;
    the metrics port stays inside the network."""
    services = _compose()["services"]
    for name, flag in (("analytics", "--web-port"), ("console", "--port")):
        command = services[name]["command"]
        port = command[command.index(flag) + 1]
        assert services[name]["ports"] == [f"127.0.0.1:{port}:{port}"], name
    metrics = _compose()["x-lapse-env"][env_var("runtime.metrics_port")]
    assert not any(str(p).endswith(f":{metrics}") for s in services.values() for p in s.get("ports", []))


def test_every_lapse_service_reads_the_deployments_kinds_file():
    """compose/kinds.yaml is mounted read-only where LAPSE_KINDS__FILE points, in every Lapse
    service, and is a valid kinds file (as shipped it declares none, so the services start idle
    instead of refusing without a kinds file)."""
    compose = _compose()
    for name in LAPSE_SERVICES:
        service = compose["services"][name]
        where = service["environment"][env_var("kinds.file")]
        assert f"./kinds.yaml:{where}:ro" in [str(v) for v in service.get("volumes", [])], name
    assert read_kinds_file(COMPOSE / "kinds.yaml").kinds == {}


def test_services_run_unprivileged_on_a_read_only_root_filesystem():
    """Every Lapse service, the grants step and the Kafka UI: a read-only root filesystem, no
    capabilities, no privilege gained (setuid); the Lapse image's user is not root. What a Lapse
    service writes is on a volume (the reports) or a tmpfs (/tmp, Faust's data folder)."""
    compose = _compose()
    services = compose["services"]
    for name in (*LAPSE_SERVICES, "db-grants", "kafka-ui"):
        service = {**compose["x-lapse"], **services[name]} if name not in ("db-grants", "kafka-ui") else services[name]
        assert service.get("read_only") is True, name
        assert service.get("cap_drop") == ["ALL"], name
        assert "no-new-privileges:true" in service.get("security_opt", []), name
    for name in LAPSE_SERVICES:
        service = {**compose["x-lapse"], **services[name]}
        assert "/tmp" in service["tmpfs"], name  # tempfile's folder: a process tree's metrics
    analytics = services["analytics"]["command"]
    assert analytics[analytics.index("--data-dir") + 1] in services["analytics"]["tmpfs"]
    report_dir = services["report"]["environment"][env_var("report.dir")]
    assert any(str(v).split(":")[1] == report_dir for v in services["report"]["volumes"])
    dockerfile = (COMPOSE / "Dockerfile").read_text()
    assert re.search(r"useradd --system --uid (\d+) lapse", dockerfile) and "--uid 0 " not in dockerfile
    assert services["db-grants"]["user"] == "postgres"


def test_the_kafka_ui_is_read_only_on_loopback_with_a_user_that_can_only_look(made_secrets):
    """Kafka UI (kafbat): published on the host's loopback; its cluster readOnly (nothing created,
    changed, produced or deleted from the UI); its own SCRAM user over SASL_SSL, whose ACLs
    (kafka-init) only describe and read; the registry's login; a sign-in form with a generated
    password. Its config is a secret make-secrets.sh writes."""
    compose = _compose()
    ui = compose["services"]["kafka-ui"]
    assert ui["ports"] == ["127.0.0.1:8080:8080"]
    location = ui["environment"]["SPRING_CONFIG_ADDITIONAL-LOCATION"].removeprefix("/run/secrets/")
    assert location in ui["secrets"]
    config = yaml.safe_load((made_secrets / location).read_text())
    (cluster,) = config["kafka"]["clusters"]
    lapse_env = compose["x-lapse-env"]
    assert cluster["readOnly"] is True
    assert cluster["bootstrapServers"] == lapse_env[env_var("kafka.bootstrap_servers")]
    properties = cluster["properties"]
    assert (properties["security.protocol"], properties["sasl.mechanism"]) == ("SASL_SSL", "SCRAM-SHA-512")
    password = (made_secrets / "kafka-ui.password").read_text()
    assert f'username="lapse-ui" password="{password}"' in properties["sasl.jaas.config"]
    assert properties["ssl.truststore.location"] == "/run/secrets/ca.pem" and "ca.pem" in ui["secrets"]
    assert cluster["schemaRegistry"] == lapse_env[env_var("schemas.registry_url")]
    assert cluster["schemaRegistryAuth"] == {"username": "lapse",
                                             "password": (made_secrets / "registry-lapse.password").read_text()}
    assert config["auth"]["type"] == "LOGIN_FORM"
    assert config["spring"]["security"]["user"]["password"] == (made_secrets / "ui-login.password").read_text()
    assert len(config["spring"]["security"]["user"]["password"]) >= 32
    # Its Kafka user: a credential kafka-init makes (from kafka-ui.password), no super user, ACLs that look.
    assert "kafka-ui.password" in compose["services"]["kafka-init"]["secrets"]
    assert "User:lapse-ui" not in compose["x-kafka-env"]["KAFKA_SUPER_USERS"].split(";")
    init_users = (COMPOSE / "kafka" / "init-users.sh").read_text().replace("\\\n", " ")
    ui_acls = [line for line in init_users.splitlines() if '"${ui[@]}"' in line]
    assert "ui=(--allow-principal User:lapse-ui)" in init_users and ui_acls
    assert {op for line in ui_acls for op in re.findall(r"--operation (\w+)", line)} == {
        "Describe", "DescribeConfigs", "Read"}
    assert all("--deny-principal" not in line and "--producer" not in line for line in ui_acls)
