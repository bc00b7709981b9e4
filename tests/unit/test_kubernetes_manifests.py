"""deploy/kubernetes/ is compose's layout on Kubernetes, checked as compose is (structurally; no
cluster here): one Deployment per long-running Lapse service of compose/docker-compose.yml with its
command, replicas and LAPSE_* variables (the shared ones in one ConfigMap, each a Settings field),
its own config file and the CA as secrets at compose's paths; the migrate Job runs compose's migrate
then db-grants commands; every pod non-root, on a read-only root filesystem, without capabilities,
privilege escalation or a service-account token; probes on what each service serves; what a service
writes on a volume; every secret and ConfigMap the manifests need made by docs/deployment.md's
commands or the manifests themselves."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from lapse.kernel.config_file import CONFIG_ENV_VAR
from lapse.kernel.kinds.declarations import read_kinds_file
from lapse.kernel.settings import REPO_ROOT, env_var
from lapse.readers.analytics import VIEW_PATH
from tests.fixtures.compose import image_entrypoint, lapse_services, load_compose, names_a_settings_field

FOLDER = REPO_ROOT / "deploy" / "kubernetes"
DOCS = REPO_ROOT / "docs" / "deployment.md"
# prune serves nothing yet (compose/README.md): the container restarts when its process ends.
NO_PROBE = {"prune"}


def _manifests() -> list[dict[str, Any]]:
    return [doc for path in sorted(FOLDER.glob("*.yaml")) if path.name != "kustomization.yaml"
            for doc in yaml.safe_load_all(path.read_text()) if doc]


def _by_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc for doc in _manifests() if doc["kind"] == kind}


def _pod(workload: dict[str, Any]) -> dict[str, Any]:
    return workload["spec"]["template"]["spec"]


def _env(container: dict[str, Any]) -> dict[str, str]:
    """The container's variables: its ConfigMaps' (envFrom), then its own."""
    maps = _by_kind("ConfigMap")
    env = {k: str(v) for ref in container.get("envFrom", [])
           for k, v in maps[ref["configMapRef"]["name"]]["data"].items()}
    return env | {e["name"]: str(e["value"]) for e in container.get("env", [])}


def _secret_files(pod: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
    """Where each secret the container mounts lands: mount path → the secret's name."""
    volumes = {v["name"]: v for v in pod["volumes"]}
    found = {}
    for mount in container["volumeMounts"]:
        volume = volumes[mount["name"]]
        for source in volume.get("projected", {}).get("sources", []) or [{"secret": volume.get("secret")}]:
            if source.get("secret"):
                found[mount["mountPath"]] = found.get(mount["mountPath"], "") + source["secret"]["name"] + " "
    return found


def test_the_kustomization_lists_every_manifest_and_the_namespace_is_restricted():
    kustomization = yaml.safe_load((FOLDER / "kustomization.yaml").read_text())
    files = {p.name for p in FOLDER.glob("*.yaml")} - {"kustomization.yaml"}
    assert sorted(kustomization["resources"]) == sorted(files)
    (namespace,) = _by_kind("Namespace").values()
    assert kustomization["namespace"] == namespace["metadata"]["name"]
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_each_long_running_service_is_a_deployment_as_compose_runs_it():
    compose = load_compose()
    services = {n: s for n, s in lapse_services(compose).items() if n != "migrate"}
    deployments = _by_kind("Deployment")
    assert set(deployments) == {f"lapse-{n}" for n in services}
    assert image_entrypoint() == ["lapse"]  # a container's args are a `lapse` subcommand, as compose's command
    for name, service in services.items():
        deployment = deployments[f"lapse-{name}"]
        pod = _pod(deployment)
        (container,) = pod["containers"]
        assert container["image"] == compose["x-lapse"]["image"], name
        assert container["args"] == service["command"], name
        assert deployment["spec"]["replicas"] == int((service.get("deploy") or {}).get("replicas", 1)), name
        env = _env(container)
        wanted = {k: str(v) for k, v in service["environment"].items()}
        assert env.keys() == wanted.keys(), name
        hosts = {env_var("kafka.bootstrap_servers"), env_var("schemas.registry_url")}  # yours, not compose's
        assert {k: v for k, v in env.items() if k not in hosts} == {k: v for k, v in wanted.items() if k not in hosts}
        assert all(names_a_settings_field(k) for k in env if k != CONFIG_ENV_VAR), name
        secrets = _secret_files(pod, container)
        assert secrets["/run/secrets"].split() == ["lapse-ca", f"lapse-{name}"], name
        assert env[CONFIG_ENV_VAR] == f"/run/secrets/lapse-{name}.toml", name
        selector = deployment["spec"]["selector"]["matchLabels"]
        assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items(), name


def test_the_migrate_job_runs_composes_migrate_then_its_grants():
    compose = load_compose()["services"]
    (job,) = _by_kind("Job").values()
    pod = _pod(job)
    (migrate,), (grants,) = pod["initContainers"], pod["containers"]
    assert migrate["command"] == compose["migrate"]["entrypoint"]
    assert _env(migrate)[CONFIG_ENV_VAR] == compose["migrate"]["environment"][CONFIG_ENV_VAR]
    assert _secret_files(pod, migrate)["/run/secrets"].split() == ["lapse-ca", "lapse-migrate"]
    assert grants["image"] == compose["db-grants"]["image"]
    script = Path(compose["db-grants"]["entrypoint"][1]).name
    mounts = {m["mountPath"]: m["name"] for m in grants["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    where, _, file = grants["command"][1].rpartition("/")
    assert grants["command"] == ["bash", f"{where}/{file}", "grants"] and file == script
    assert volumes[mounts[where]]["configMap"]["name"] == "lapse-db-roles"
    assert _env(grants).keys() == compose["db-grants"]["environment"].keys()
    assert _env(grants)["PGSSLMODE"] == "verify-full"
    assert _secret_files(pod, grants)["/run/secrets"].split() == ["lapse-ca", "lapse-db-migrate"]
    assert pod["restartPolicy"] == "OnFailure"


def test_every_pod_runs_unprivileged_on_a_read_only_root_filesystem():
    uid = int(re.search(r"useradd --system --uid (\d+) lapse", (REPO_ROOT / "compose" / "Dockerfile").read_text())[1])
    for workload in (*_by_kind("Deployment").values(), *_by_kind("Job").values()):
        name, pod = workload["metadata"]["name"], _pod(workload)
        context = pod["securityContext"]
        assert context["runAsNonRoot"] is True and context["runAsUser"] == uid != 0, name
        assert context["seccompProfile"] == {"type": "RuntimeDefault"}, name
        assert pod["automountServiceAccountToken"] is False, name
        volumes = {v["name"]: v for v in pod["volumes"]}
        for container in (*pod.get("initContainers", []), *pod["containers"]):
            assert container["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                                    "capabilities": {"drop": ["ALL"]}}, name
            tmp = next(m for m in container["volumeMounts"] if m["mountPath"] == "/tmp")
            assert "emptyDir" in volumes[tmp["name"]], name
            assert ":" in container["image"] and not container["image"].endswith(":latest"), name


def test_what_a_service_writes_is_on_a_volume():
    compose = load_compose()["services"]
    deployments = _by_kind("Deployment")

    def volume_at(deployment: str, path: str) -> dict[str, Any]:
        pod = _pod(deployments[deployment])
        (container,) = pod["containers"]
        mount = next(m for m in container["volumeMounts"] if m["mountPath"] == path)
        return next(v for v in pod["volumes"] if v["name"] == mount["name"])

    report = volume_at("lapse-report", compose["report"]["environment"][env_var("report.dir")])
    claim = _by_kind("PersistentVolumeClaim")[report["persistentVolumeClaim"]["claimName"]]
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert deployments["lapse-report"]["spec"]["strategy"]["type"] == "Recreate"  # one pod holds the claim
    command = compose["analytics"]["command"]
    assert "emptyDir" in volume_at("lapse-analytics", command[command.index("--data-dir") + 1])


def test_probes_ask_what_each_service_serves():
    """Metrics on the metrics port for the services that serve them, the analytics view on its web
    port, the console's /healthz and /readyz on its port; prune serves nothing yet."""
    compose = load_compose()
    metrics_port = int(compose["x-lapse-env"][env_var("runtime.metrics_port")])
    for name, deployment in _by_kind("Deployment").items():
        service = name.removeprefix("lapse-")
        (container,) = _pod(deployment)["containers"]
        if service in NO_PROBE:
            assert "livenessProbe" not in container and "readinessProbe" not in container
            continue
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        probes = {kind: (container[kind]["httpGet"]["path"], ports[container[kind]["httpGet"]["port"]])
                  for kind in ("livenessProbe", "readinessProbe")}
        command = compose["services"][service]["command"]
        if service == "console":
            port = int(command[command.index("--port") + 1])
            assert probes == {"livenessProbe": ("/healthz", port), "readinessProbe": ("/readyz", port)}
        elif service == "analytics":
            port = int(command[command.index("--web-port") + 1])
            assert probes == {"livenessProbe": (VIEW_PATH, port), "readinessProbe": (VIEW_PATH, port)}
        else:
            assert probes == {"livenessProbe": ("/metrics", metrics_port), "readinessProbe": ("/metrics", metrics_port)}
            annotations = deployment["spec"]["template"]["metadata"]["annotations"]
            assert annotations["prometheus.io/port"] == str(metrics_port)
    services = _by_kind("Service")
    for name in ("lapse-console", "lapse-analytics"):
        assert services[name]["spec"].get("type", "ClusterIP") == "ClusterIP"  # nothing published


def _made_by_the_docs() -> set[tuple[str, str]]:
    """(secret | configmap, name) of each `kubectl -n lapse create` command docs/deployment.md gives,
    a loop's `lapse-$service` expanded over its services."""
    docs = DOCS.read_text()
    made = set(re.findall(r'kubectl -n lapse create (secret|configmap) (?:generic )?"?([\w-]+)"? ', docs))
    for services, kind in re.findall(r'for service in ([\w ]+); do\s+kubectl -n lapse create (secret|configmap) '
                                     r'(?:generic )?"lapse-\$service"', docs):
        made |= {(kind, f"lapse-{s}") for s in services.split()}
    return made


def test_every_secret_and_config_map_is_made_by_the_docs_or_the_manifests():
    """The commands docs/deployment.md gives create each secret and ConfigMap a pod mounts that the
    manifests do not define (from the files compose/make-secrets.sh makes)."""
    made = _made_by_the_docs()
    defined = set(_by_kind("ConfigMap"))
    needed = set()
    for workload in (*_by_kind("Deployment").values(), *_by_kind("Job").values()):
        for volume in _pod(workload)["volumes"]:
            needed |= {("secret", s["secret"]["name"]) for s in volume.get("projected", {}).get("sources", [])}
            if "configMap" in volume and volume["configMap"]["name"] not in defined:
                needed.add(("configmap", volume["configMap"]["name"]))
    assert needed <= made, sorted(needed - made)


def test_the_kinds_config_map_is_a_kinds_file_declaring_none(tmp_path):
    data = _by_kind("ConfigMap")["lapse-kinds"]["data"]["kinds.yaml"]
    (tmp_path / "kinds.yaml").write_text(data)
    assert read_kinds_file(tmp_path / "kinds.yaml").kinds == {}
