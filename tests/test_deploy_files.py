"""Deployment files, validated offline: Dockerfile (hadolint), docker-compose.yml (the compose
specification), k8s/ (kustomize build, then every object against the Kubernetes 1.33 schemas,
strictly, and every pod against Pod Security "restricted"), host tuning files — the values that
must agree across them and the app, and that they are secure by default (docs/security.md,
"Attacks and what stops them")."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ipaddress
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.routing import APIRoute
from redis.asyncio import Redis
from redis.exceptions import AuthenticationError, ResponseError

from app.main import create_app
from app.settings import Settings, SettingsError, load_settings
from app.web import admin, files, page
from tests.helpers import free_port
from tests.processes import ROOT, wait_for_port

KUBERNETES_VERSION = "1.33.0"
DEFAULTS = Settings.model_construct()  # the defaults, unvalidated (jwt needs a key)
VENV_BIN = Path(sys.executable).parent


async def _run_status(
    *command: str, cwd: Path = ROOT, env: Mapping[str, str] | None = None, timeout: float = 120
) -> tuple[int, str, str]:
    """Run ``command`` (in ``env``, when given): its exit status, stdout and stderr."""
    proc = await asyncio.create_subprocess_exec(
        *command, cwd=cwd, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    async with asyncio.timeout(timeout):
        out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def _run(*command: str, cwd: Path = ROOT) -> str:
    """Run ``command``; fail the test with its output unless it exits 0."""
    code, out, err = await _run_status(*command, cwd=cwd)
    assert code == 0, f"{' '.join(command)}:\n{out}\n{err}"
    return out


def _settings_from(env: Mapping[str, str], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """What the app makes of exactly ``env`` (the process's own CHAT_* variables removed)."""
    for key in list(os.environ):
        if key.startswith("CHAT_"):
            monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return load_settings()


# -- Dockerfile ---------------------------------------------------------------------------


def _dockerfile() -> dict[str, list[str]]:
    """Instruction -> arguments, continuation lines joined."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            word, _, rest = line.strip().partition(" ")
            found.setdefault(word.upper(), []).append(rest.strip())
    return found


async def test_dockerfile_passes_hadolint() -> None:
    await _run(str(VENV_BIN / "hadolint"), "Dockerfile")


def test_dockerfile_runs_the_production_command_as_a_user() -> None:
    docker = _dockerfile()
    assert docker["FROM"] == ["${BASE_IMAGE} AS build", "${BASE_IMAGE}"]  # multi-stage
    assert docker["ARG"][0].startswith("BASE_IMAGE=python:3.11-slim")
    assert docker["CMD"] == ['["gunicorn", "-c", "deploy/gunicorn.conf.py"]']  # exec form
    assert docker["USER"] == ["10001:10001"]
    assert any("uv sync --frozen --no-dev" in run for run in docker["RUN"])  # the lock file
    env = docker["ENV"][-1]
    assert "CHAT_PORT=8000" in env and "CHAT_METRICS_PORT=9100" in env
    assert docker["EXPOSE"] == ["8000 9100"]
    assert docker["HEALTHCHECK"][0].endswith('CMD ["python", "-m", "app.ops.healthcheck"]')
    # The image keeps the app's secure defaults: it sets no auth mode (jwt, the default, then
    # needs a key from the deployment), no secret and no trusted proxies.
    for instruction in ("ENV", "ARG"):
        for line in docker.get(instruction, []):
            for variable in (
                "CHAT_AUTH_MODE", "CHAT_JWT_", "CHAT_ADMIN_TOKEN", "CHAT_TRUSTED_PROXIES",
            ):  # fmt: skip
                assert variable not in line, f"{instruction} {line}"
    # Everything the image copies is let through .dockerignore.
    ignore = (ROOT / ".dockerignore").read_text().split()
    for copy in docker["COPY"]:
        if "--from" not in copy:
            for source in copy.split()[:-1]:
                assert f"!{source}" in ignore, f"{source} is excluded by .dockerignore"


# -- docker compose -----------------------------------------------------------------------


def _compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return loaded


class ComposeRefuses(Exception):
    """A ``${VAR:?message}`` whose variable is unset or empty: compose refuses the file."""


# Compose's interpolation (https://docs.docker.com/compose/how-tos/environment-variables/
# variable-interpolation/): $$, $VAR, ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?error},
# ${VAR?error}, ${VAR:+replacement}, ${VAR+replacement}.
_COMPOSE_VARIABLE = re.compile(
    r"\$(?:(?P<dollar>\$)|\{(?P<name>[A-Za-z_]\w*)(?:(?P<op>:?[-?+])(?P<arg>[^}]*))?\}"
    r"|(?P<bare>[A-Za-z_]\w*))"
)


def _interpolate(value: Any, env: Mapping[str, str]) -> Any:
    """``value`` (a loaded compose file or any part of it) as compose sees it with ``env``."""
    if isinstance(value, dict):
        return {key: _interpolate(item, env) for key, item in value.items()}
    if isinstance(value, list):
        return [_interpolate(item, env) for item in value]
    if not isinstance(value, str):
        return value

    def one(match: re.Match[str]) -> str:
        if match["dollar"]:
            return "$"
        name = match["name"] or match["bare"]
        op, arg = match["op"], match["arg"] or ""
        present = name in env
        usable = present if op in ("-", "?", "+") else bool(env.get(name))
        if op in ("?", ":?") and not usable:
            raise ComposeRefuses(f"{name}: {arg}")
        if op in ("+", ":+"):
            return arg if usable else ""
        if op in ("-", ":-") and not usable:
            return arg
        return env.get(name, "")

    return _COMPOSE_VARIABLE.sub(one, value)


@pytest.mark.parametrize(
    "name", ["docker-compose.yml", "docker-compose.sentinel.yml", "docker-compose.cluster.yml"]
)
async def test_compose_file_follows_the_compose_specification(name: str) -> None:
    await _run(
        str(VENV_BIN / "check-jsonschema"), "--builtin-schema", "vendor.compose-spec", name,
    )  # fmt: skip


def test_compose_cluster_override_runs_the_app_on_the_cluster(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """docker-compose.cluster.yml: six nodes made three masters with a replica each by a
    one-shot job the app waits for; the app's settings accept the cluster's seed nodes alone."""
    override = yaml.safe_load((ROOT / "docker-compose.cluster.yml").read_text())
    services = override["services"]
    nodes = sorted(name for name in services if name.startswith("redis-node-"))
    assert len(nodes) == 6
    create = services["redis-cluster-init"]["entrypoint"][2]
    assert all(f"{node}:6379" in create for node in nodes) and "--cluster-replicas 1" in create
    assert set(services["redis-cluster-init"]["depends_on"]) == set(nodes)
    app = _compose()["services"]["app"]["environment"] | services["app"]["environment"]
    assert services["app"]["depends_on"]["redis-cluster-init"] == {
        "condition": "service_completed_successfully"
    }
    plain = {key: str(value) for key, value in app.items() if "$" not in str(value)}
    settings = _settings_from(plain | {"CHAT_AUTH_MODE": "guest"}, monkeypatch)
    assert settings.redis_url is None and len(settings.redis_cluster_nodes) == 3
    assert settings.redis_wait_replicas == 1


async def test_compose_sentinel_override_runs_the_app_on_sentinels(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """docker-compose.sentinel.yml: the app's Redis URL is emptied (empty is unset, so the
    settings accept the Sentinels alone), it names the three Sentinels and waits for them, and
    each Sentinel's generated configuration monitors the "redis" service, quorum 2 of 3."""
    override = yaml.safe_load((ROOT / "docker-compose.sentinel.yml").read_text())
    services = override["services"]
    app = _compose()["services"]["app"]["environment"] | services["app"]["environment"]
    sentinels = [name for name in services if name.startswith("sentinel-")]
    assert app["CHAT_REDIS_SENTINELS"] == ",".join(f"{name}:26379" for name in sentinels)
    assert len(sentinels) == 3 and set(sentinels) <= set(services["app"]["depends_on"])
    plain = {key: str(value) for key, value in app.items() if "$" not in str(value)}
    settings = _settings_from(plain | {"CHAT_AUTH_MODE": "guest"}, monkeypatch)
    assert settings.uses_redis and settings.redis_url is None and settings.redis_wait_replicas == 1
    script = services["sentinel-1"]["entrypoint"][2].replace(
        "> /tmp/sentinel.conf && exec redis-server /tmp/sentinel.conf --sentinel", ""
    )
    conf = (await _run("sh", "-c", script)).splitlines()
    assert "sentinel monitor hubbub redis 6379 2" in conf, conf
    assert "port 26379" in conf and "sentinel resolve-hostnames yes" in conf, conf


def test_compose_stack_is_wired_together() -> None:
    services = _compose()["services"]
    assert set(services) == {
        "redis", "postgres", "seaweedfs", "app", "nginx", "prometheus", "grafana"
    }  # fmt: skip
    app = services["app"]
    assert app["deploy"]["replicas"] == 2
    for store in ("redis", "postgres"):
        assert app["depends_on"][store]["condition"] == "service_healthy"
        assert "healthcheck" in services[store]
    assert app["environment"]["CHAT_REDIS_URL"].startswith("redis://redis:6379")
    # PostgreSQL keeps its data in a volume, and the app reaches it by its service name.
    assert "postgres-data:/var/lib/postgresql/data" in services["postgres"]["volumes"]
    assert "@postgres:5432/hubbub" in app["environment"]["CHAT_DATABASE_URL"]
    assert "ports" not in app  # reachable through nginx only
    # Files: the app's bucket is SeaweedFS's, made at start, with the app's key.
    files = services["seaweedfs"]
    assert app["environment"]["CHAT_FILE_STORAGE"] == "s3"
    assert app["environment"]["CHAT_S3_ENDPOINT_URL"] == "http://seaweedfs:8333"
    assert f"-bucket={app['environment']['CHAT_S3_BUCKET']}" in files["command"]
    assert "-s3.port=8333" in files["command"] and files["ports"] == ["8333:8333"]
    assert files["environment"]["AWS_ACCESS_KEY_ID"] == app["environment"]["CHAT_S3_ACCESS_KEY_ID"]
    assert (
        files["environment"]["AWS_SECRET_ACCESS_KEY"]
        == app["environment"]["CHAT_S3_SECRET_ACCESS_KEY"]
    )
    assert services["nginx"]["ports"] == ["8080:8080"]
    assert "./nginx/nginx.conf:/etc/nginx/nginx.conf:ro" in services["nginx"]["volumes"]
    # The drain finishes before compose's SIGKILL.
    grace = int(app["stop_grace_period"].removesuffix("s"))
    assert grace > DEFAULTS.drain_window_s + DEFAULTS.close_timeout_s
    # Every file or directory mounted from the repository exists.
    for service in services.values():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), source
    # Prometheus scrapes the app's metrics port under the name nginx uses too.
    prometheus = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    (job,) = [j for j in prometheus["scrape_configs"] if j["job_name"] == "hubbub"]
    assert job["dns_sd_configs"][0] == {
        "names": ["app"], "type": "A", "port": 9100, "refresh_interval": "15s",
    }  # fmt: skip
    assert "server app:8000 " in (ROOT / "nginx/nginx.conf").read_text()


def test_compose_takes_its_secrets_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """jwt by default, its key from the environment (or .env) and never from the file: without
    one the app refuses to start, naming the variable; guest only when asked for. Grafana has
    no default admin password (compose refuses to start without one) and, like Prometheus, is
    published on loopback only."""
    secret = "5f" * 32
    database = {"POSTGRES_PASSWORD": "d0" * 16, "S3_SECRET_KEY": "5e" * 20}
    env = {"CHAT_JWT_SECRET": secret, "GRAFANA_ADMIN_PASSWORD": "g" * 32} | database
    with pytest.raises(ComposeRefuses, match="GRAFANA_ADMIN_PASSWORD"):
        _interpolate(_compose(), {"CHAT_JWT_SECRET": secret} | database)
    with pytest.raises(ComposeRefuses, match="GRAFANA_ADMIN_PASSWORD"):
        _interpolate(
            _compose(), {"CHAT_JWT_SECRET": secret, "GRAFANA_ADMIN_PASSWORD": ""} | database
        )
    with pytest.raises(ComposeRefuses, match="POSTGRES_PASSWORD"):
        _interpolate(_compose(), {"CHAT_JWT_SECRET": secret, "GRAFANA_ADMIN_PASSWORD": "g" * 32})

    services = _interpolate(_compose(), env)["services"]
    app_env = services["app"]["environment"]
    settings = _settings_from(app_env, monkeypatch)
    assert settings.auth_mode == "jwt" and settings.jwt_secret is not None
    assert settings.jwt_secret.get_secret_value() == secret
    assert settings.admin_token is None  # no CHAT_ADMIN_TOKEN: the moderation API is off
    assert settings.database_url == (
        f"postgresql://hubbub:{database['POSTGRES_PASSWORD']}@postgres:5432/hubbub"
    )
    assert services["postgres"]["environment"]["POSTGRES_PASSWORD"] == database["POSTGRES_PASSWORD"]

    no_secret = _interpolate(_compose(), {"GRAFANA_ADMIN_PASSWORD": "g" * 32} | database)[
        "services"
    ]
    assert no_secret["app"]["environment"]["CHAT_AUTH_MODE"] == "jwt"
    with pytest.raises(SettingsError, match="CHAT_JWT_SECRET"):
        _settings_from(no_secret["app"]["environment"], monkeypatch)
    demo = _interpolate(_compose(), env | {"CHAT_AUTH_MODE": "guest"})["services"]
    assert demo["app"]["environment"]["CHAT_AUTH_MODE"] == "guest"
    # No secret has a default in the file: each comes from the environment or is empty.
    raw = (ROOT / "docker-compose.yml").read_text()
    for match in _COMPOSE_VARIABLE.finditer(raw):
        if re.search("SECRET|TOKEN|PASSWORD", match["name"] or match["bare"] or ""):
            assert match["op"] in (None, ":-", ":?") and (
                match["op"] == ":?" or not match["arg"]
            ), match[0]

    grafana = services["grafana"]["environment"]
    assert grafana["GF_SECURITY_ADMIN_PASSWORD"] == env["GRAFANA_ADMIN_PASSWORD"]
    assert (
        "${GRAFANA_ADMIN_PASSWORD:?"
        in _compose()["services"]["grafana"]["environment"]["GF_SECURITY_ADMIN_PASSWORD"]
    )
    if grafana.get("GF_AUTH_ANONYMOUS_ENABLED") == "true":
        assert grafana["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"  # read-only
    # Published ports: the chat (nginx) and the files' bucket (browsers use its presigned
    # links; every object in it is private) on every address, the monitoring on loopback only.
    for name, service in services.items():
        for port in service.get("ports", []):
            assert name in ("nginx", "seaweedfs") or port.startswith("127.0.0.1:"), (
                f"{name}: {port}"
            )


# -- Kubernetes ---------------------------------------------------------------------------


def _kubectl() -> str:
    binary = shutil.which("kubectl")
    assert binary, "kubectl is missing: `make test` installs Debian's kubernetes-client"
    return binary


# What ops put in k8s/base/secrets.env (gitignored), for the tests.
TEST_SECRETS = {
    "CHAT_JWT_SECRET": "5f" * 32,
    "CHAT_ADMIN_TOKEN": "ad" * 32,
    "CHAT_SERVICE_TOKEN": "5e" * 32,
    "CHAT_WEBHOOK_URL": "https://backend.example.internal/hubbub/events",
    "CHAT_WEBHOOK_SECRET": "3b" * 32,
    "CHAT_S3_ACCESS_KEY_ID": "hubbub-files",
    "CHAT_S3_SECRET_ACCESS_KEY": "5a" * 20,
    "CHAT_VAPID_PRIVATE_KEY": "h-PbO99X1Qh-iNUsddu7Nq9EsVZSP_1jz12q0XCKYaA",
    "CHAT_REDIS_URL": "redis://:external-redis-password@redis.example.internal:6379/0",
    "REDIS_PASSWORD": "0123456789abcdef0123456789abcdef",
    "CHAT_DATABASE_URL": "postgresql://hubbub:external-pg-password@pg.example.internal:5432/chat",
    "POSTGRES_PASSWORD": "fedcba9876543210fedcba9876543210",
}
SECRETS_EXAMPLE = ROOT / "k8s/base/secrets.env.example"
# Every kustomization that must run under Pod Security "restricted"; node-tuning is opt-in.
RESTRICTED_DIRECTORIES = ["", "base", "monitoring"]
ALL_DIRECTORIES = [*RESTRICTED_DIRECTORIES, "node-tuning"]


def _secrets_env(values: Mapping[str, str]) -> str:
    """secrets.env.example with the keys of ``values`` filled in."""
    lines = []
    for line in SECRETS_EXAMPLE.read_text().splitlines():
        key, sep, _ = line.partition("=")
        if sep and not line.startswith("#") and key in values:
            line = f"{key}={values[key]}"
        lines.append(line)
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def _k8s_tree(secrets: Mapping[str, str] | None) -> Iterator[Path]:
    """A copy of k8s/ with base/secrets.env made from ``secrets`` (without one when None): the
    test never depends on, nor sees, a secrets.env of the working tree."""
    with tempfile.TemporaryDirectory(prefix="hubbub-k8s-") as tmp:
        tree = Path(tmp) / "k8s"
        shutil.copytree(ROOT / "k8s", tree, ignore=shutil.ignore_patterns("secrets.env"))
        if secrets is not None:
            (tree / "base/secrets.env").write_text(_secrets_env(secrets))
        yield tree


async def _build(
    directory: str, secrets: Mapping[str, str] | None = TEST_SECRETS
) -> list[dict[str, Any]]:
    with _k8s_tree(secrets) as tree:
        output = await _run(_kubectl(), "kustomize", str(tree / directory))
    return [doc for doc in yaml.safe_load_all(output) if doc]


async def assert_valid_kubernetes(objects: list[dict[str, Any]], tmp_path: Path) -> None:
    """Every object but the Prometheus Operator's (kubernetes-validate has no schema for CRDs:
    they are checked on their own) passes the Kubernetes schemas, strictly."""
    core = [obj for obj in objects if not obj["apiVersion"].startswith("monitoring.coreos.com")]
    manifest = tmp_path / "manifest.yaml"
    manifest.write_text(yaml.safe_dump_all(core))
    output = await _run(
        str(VENV_BIN / "kubernetes-validate"), "--strict", "-k", KUBERNETES_VERSION, str(manifest)
    )
    assert output.count("passed for resource") == len(core), output


@pytest.mark.parametrize("directory", ALL_DIRECTORIES)
async def test_kustomize_output_is_valid_kubernetes(directory: str, tmp_path: Path) -> None:
    objects = await _build(directory)
    await assert_valid_kubernetes(objects, tmp_path)
    assert all(obj["metadata"].get("namespace", "hubbub") == "hubbub" for obj in objects)


def _one(objects: list[dict[str, Any]], kind: str, name: str = "hubbub") -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def _data(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, str]:
    """A ConfigMap's or Secret's data, decoded."""
    found = _one(objects, kind, name)
    data: dict[str, str] = found.get("data", {})
    if kind == "ConfigMap":
        return dict(data)
    string_data: dict[str, str] = found.get("stringData", {})
    return {k: base64.b64decode(v).decode() for k, v in data.items()} | string_data


def _container_env(objects: list[dict[str, Any]], container: dict[str, Any]) -> dict[str, str]:
    """The environment Kubernetes gives ``container``: its envFrom sources in order, then its
    env entries (taking precedence), with $(VAR) references to earlier variables expanded."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            env |= _data(objects, "ConfigMap", source["configMapRef"]["name"])
        else:
            env |= _data(objects, "Secret", source["secretRef"]["name"])
    for entry in container.get("env", []):
        if "value" in entry:
            value = re.sub(r"\$\((\w+)\)", lambda m: env.get(m[1], m[0]), entry["value"])
        else:
            ref = entry["valueFrom"]
            kind, key = ("Secret", "secretKeyRef") if "secretKeyRef" in ref else (
                "ConfigMap", "configMapKeyRef",
            )  # fmt: skip
            data = _data(objects, kind, ref[key]["name"])
            assert ref[key]["key"] in data, f"{entry['name']}: no {ref[key]} in the {kind}"
            value = data[ref[key]["key"]]
        env[entry["name"]] = value
    return env


async def test_kubernetes_objects_agree_with_each_other_and_the_app() -> None:
    objects = await _build("monitoring")
    deployment = _one(objects, "Deployment")
    pod = deployment["spec"]["template"]
    labels = pod["metadata"]["labels"]
    spec = pod["spec"]
    (container,) = spec["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": DEFAULTS.port, "metrics": 9100}
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    # Grace period above preStop + drain + close timeout: the drain is never cut short.
    config = _one(objects, "ConfigMap", "hubbub-config")["data"]
    pre_stop = int(container["lifecycle"]["preStop"]["sleep"]["seconds"])  # kubelet's own sleep
    drain = float(config["CHAT_DRAIN_WINDOW_S"])
    assert spec["terminationGracePeriodSeconds"] > pre_stop + drain + DEFAULTS.close_timeout_s
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    # Non-root, read-only root, a writable /tmp for gunicorn's metrics files.
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert spec["securityContext"]["runAsUser"] == 10001
    assert {m["mountPath"] for m in container["volumeMounts"]} == {"/tmp"}
    # Limits match the worker count: CPU quotas do not show as fewer CPUs.
    assert int(config["CHAT_WORKERS"]) == int(container["resources"]["limits"]["cpu"])

    service = _one(objects, "Service")
    assert service["spec"]["selector"].items() <= labels.items()
    assert {p["name"]: p["targetPort"] for p in service["spec"]["ports"]} == {
        "http": "http", "metrics": "metrics",
    }  # fmt: skip
    pdb = _one(objects, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    hpa = _one(objects, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    assert {m["type"] for m in hpa["spec"]["metrics"]} == {"Resource", "Pods"}
    (pods_metric,) = [m for m in hpa["spec"]["metrics"] if m["type"] == "Pods"]
    assert pods_metric["pods"]["metric"]["name"] == "hubbub_connections"
    per_pod = int(config["CHAT_MAX_CONNECTIONS"]) * int(config["CHAT_WORKERS"])
    assert int(pods_metric["pods"]["target"]["averageValue"]) < per_pod

    ingress = _one(objects, "Ingress")
    annotations = ingress["metadata"]["annotations"]
    heartbeat = float(config["CHAT_HEARTBEAT_INTERVAL_S"])
    for key in ("proxy-read-timeout", "proxy-send-timeout"):
        assert int(annotations[f"nginx.ingress.kubernetes.io/{key}"]) > 2 * heartbeat
    for path in ingress["spec"]["rules"][0]["http"]["paths"]:  # never the metrics port
        assert path["backend"]["service"] == {"name": "hubbub", "port": {"name": "http"}}

    monitor = _one(objects, "ServiceMonitor")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    # job="hubbub" (what the alerts and the dashboard select) comes from this label.
    assert service["metadata"]["labels"][monitor["spec"]["jobLabel"]] == "hubbub"

    # The app's settings: the ConfigMap and the Secret made from secrets.env.
    env = _container_env(objects, container)
    assert env["CHAT_REDIS_URL"] == TEST_SECRETS["CHAT_REDIS_URL"]
    assert env["CHAT_JWT_SECRET"] == TEST_SECRETS["CHAT_JWT_SECRET"]
    # With the bundled Redis (k8s/), the URL names its Service, with the password.
    dev = await _build("")
    redis_service = _one(dev, "Service", "hubbub-redis")
    (dev_container,) = _one(dev, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert _container_env(dev, dev_container)["CHAT_REDIS_URL"] == (
        f"redis://:{TEST_SECRETS['REDIS_PASSWORD']}@{redis_service['metadata']['name']}:"
        f"{redis_service['spec']['ports'][0]['port']}/0"
    )
    # The store: production's URL from the Secret; the bundled PostgreSQL's built likewise.
    assert env["CHAT_DATABASE_URL"] == TEST_SECRETS["CHAT_DATABASE_URL"]
    postgres_service = _one(dev, "Service", "hubbub-postgres")
    assert _container_env(dev, dev_container)["CHAT_DATABASE_URL"] == (
        f"postgresql://hubbub:{TEST_SECRETS['POSTGRES_PASSWORD']}@"
        f"{postgres_service['metadata']['name']}:{postgres_service['spec']['ports'][0]['port']}"
        "/hubbub"
    )


# Pod Security Standards, "restricted" profile (https://kubernetes.io/docs/concepts/security/
# pod-security-standards/): what Pod Security Admission enforces on a namespace labelled
# pod-security.kubernetes.io/enforce=restricted, as of Kubernetes 1.33 (baseline's controls
# included). Each pod template is checked the way PSA checks the pod it makes.
SAFE_SYSCTLS = frozenset({
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.ip_unprivileged_port_start", "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range",
    "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
})  # fmt: skip
RESTRICTED_VOLUMES = frozenset({
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
    "projected", "secret",
})  # fmt: skip
SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t",
                           "container_engine_t"})  # fmt: skip


def _restricted_violations(spec: dict[str, Any]) -> list[str]:
    """Every way the pod ``spec`` breaks Pod Security "restricted"; empty when it passes."""
    problems: list[str] = []
    pod = spec.get("securityContext") or {}
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key):
            problems.append(f"{key}: true")
    for volume in spec.get("volumes", []):
        if not set(volume) - {"name"} <= RESTRICTED_VOLUMES:
            problems.append(f"volume {volume['name']}: {sorted(set(volume) - {'name'})}")
    for sysctl in pod.get("sysctls", []):
        if sysctl["name"] not in SAFE_SYSCTLS:
            problems.append(f"sysctl {sysctl['name']} is not a safe one")
    if pod.get("runAsUser") == 0:
        problems.append("pod runAsUser: 0")
    if (pod.get("seccompProfile") or {}).get("type", "RuntimeDefault") not in (
        "RuntimeDefault", "Localhost",
    ):  # fmt: skip
        problems.append(f"pod seccompProfile {pod['seccompProfile']}")
    containers = [
        (kind, container)
        for kind in ("initContainers", "containers", "ephemeralContainers")
        for container in spec.get(kind, [])
    ]
    for kind, container in containers:
        where = f"{kind}[{container['name']}]"
        context = container.get("securityContext") or {}
        for level in (pod, context):
            if (level.get("windowsOptions") or {}).get("hostProcess"):
                problems.append(f"{where}: hostProcess")
            selinux = level.get("seLinuxOptions") or {}
            if selinux.get("type", "") not in SELINUX_TYPES or {"user", "role"} & set(selinux):
                problems.append(f"{where}: seLinuxOptions {selinux}")
            if (level.get("appArmorProfile") or {}).get("type") == "Unconfined":
                problems.append(f"{where}: AppArmor unconfined")
        if context.get("privileged"):
            problems.append(f"{where}: privileged")
        if context.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{where}: allowPrivilegeEscalation is not false")
        if context.get("runAsNonRoot", pod.get("runAsNonRoot")) is not True:
            problems.append(f"{where}: runAsNonRoot is not true")
        if context.get("runAsUser") == 0:
            problems.append(f"{where}: runAsUser: 0")
        seccomp = context.get("seccompProfile") or pod.get("seccompProfile") or {}
        if seccomp.get("type") not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{where}: seccompProfile is not RuntimeDefault or Localhost")
        capabilities = context.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            problems.append(f"{where}: capabilities do not drop ALL")
        if set(capabilities.get("add") or []) - {"NET_BIND_SERVICE"}:
            problems.append(f"{where}: adds capabilities {capabilities['add']}")
        if context.get("procMount", "Default") != "Default":
            problems.append(f"{where}: procMount {context['procMount']}")
        for port in container.get("ports", []):
            if port.get("hostPort"):
                problems.append(f"{where}: hostPort {port['hostPort']}")
    return problems


def _pod_templates(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every pod spec the objects make, by kind/name."""
    found = {}
    for obj in objects:
        name = f"{obj['kind']}/{obj['metadata']['name']}"
        spec = obj.get("spec", {})
        if obj["kind"] == "Pod":
            found[name] = spec
        elif obj["kind"] == "CronJob":
            found[name] = spec["jobTemplate"]["spec"]["template"]["spec"]
        elif "template" in spec:
            found[name] = spec["template"]["spec"]
    return found


@pytest.mark.parametrize("directory", RESTRICTED_DIRECTORIES)
async def test_kubernetes_runs_under_pod_security_restricted(directory: str) -> None:
    """The Namespace enforces Pod Security "restricted" (and audits and warns with it), and
    every pod the kustomization makes passes it: non-root, no privilege escalation, all
    capabilities dropped, seccomp RuntimeDefault, no privileged container, no host namespaces,
    paths or ports, only safe sysctls (none at all, in fact). Roots are read-only too."""
    objects = await _build(directory)
    (namespace,) = [o for o in objects if o["kind"] == "Namespace"]
    labels = namespace["metadata"].get("labels", {})
    for mode in ("enforce", "audit", "warn"):
        assert labels.get(f"pod-security.kubernetes.io/{mode}") == "restricted", mode
    assert labels.get("pod-security.kubernetes.io/enforce-version", "latest") == "latest"
    pods = _pod_templates(objects)
    assert "Deployment/hubbub" in pods
    assert ("Deployment/hubbub-redis" in pods) == (directory == "")
    for name, spec in pods.items():
        assert _restricted_violations(spec) == [], name
        assert "sysctls" not in (spec.get("securityContext") or {}), name
        assert spec.get("automountServiceAccountToken") is False, name
        for container in spec.get("initContainers", []) + spec["containers"]:
            assert container["securityContext"]["readOnlyRootFilesystem"] is True, name


async def test_node_tuning_is_an_opt_in_overlay() -> None:
    """k8s/node-tuning is k8s/base plus the kernel tuning (a privileged init container for the
    unsafe sysctls, the safe ones in the pod), and the Namespace's enforce level relaxed to
    privileged, which that needs (audit and warn stay restricted): nothing else differs. The
    restricted check above would refuse it."""
    base, tuned = await _build("base"), await _build("node-tuning")
    (namespace,) = [o for o in tuned if o["kind"] == "Namespace"]
    labels = namespace["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"
    assert labels["pod-security.kubernetes.io/audit"] == "restricted"
    assert labels["pod-security.kubernetes.io/warn"] == "restricted"
    spec = _one(tuned, "Deployment")["spec"]["template"]["spec"]
    (init,) = spec["initContainers"]
    assert init["securityContext"]["privileged"] is True
    script = " ".join(init["command"])
    for key in ("net.core.somaxconn", "net.ipv4.tcp_max_syn_backlog"):
        assert f"sysctl -w {key}=65535" in script
    assert {s["name"] for s in spec["securityContext"]["sysctls"]} <= SAFE_SYSCTLS
    violations = _restricted_violations(spec)
    assert "initContainers[sysctl-tuning]: privileged" in violations
    assert not [v for v in violations if v.startswith("containers[")]  # the app stays restricted
    # Nothing else differs from k8s/base.
    del namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"]
    del spec["initContainers"], spec["securityContext"]["sysctls"]
    for obj in base:
        if obj["kind"] == "Namespace":
            del obj["metadata"]["labels"]["pod-security.kubernetes.io/enforce"]

    def identity(obj: dict[str, Any]) -> tuple[str, str]:
        return obj["kind"], obj["metadata"]["name"]

    assert sorted(tuned, key=identity) == sorted(base, key=identity)


DRYRUN = ROOT / "scripts/k8s-dryrun.sh"
K8S_BIN = ROOT / ".tools/k8s/bin"


def k8s_tool(name: str) -> Path:
    """A tool of scripts/k8s-tools.sh (kube-apiserver, kubectl, helm): `make test` builds them,
    so a missing one fails the test instead of skipping it (CI would never run it)."""
    tool = K8S_BIN / name
    assert tool.exists() and shutil.which("etcd"), (
        f"{tool} or etcd is missing: `make k8s-deps` (part of `make test`) builds them"
    )
    return tool


# A stand-in for the Prometheus Operator's ServiceMonitor CRD (any content), so that the rest
# of k8s/monitoring can be dry-run.
SERVICEMONITOR_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "servicemonitors.monitoring.coreos.com"},
    "spec": {
        "group": "monitoring.coreos.com",
        "names": {"kind": "ServiceMonitor", "listKind": "ServiceMonitorList",
                  "plural": "servicemonitors", "singular": "servicemonitor"},
        "scope": "Namespaced",
        "versions": [{
            "name": "v1", "served": True, "storage": True,
            "schema": {"openAPIV3Schema": {
                "type": "object", "x-kubernetes-preserve-unknown-fields": True,
            }},
        }],
    },
}  # fmt: skip


@pytest.mark.timeout(300)  # etcd and kube-apiserver start in ~3 s, up to 2 min when busy
async def test_kubernetes_server_side_dry_run_under_pod_security_restricted(
    tmp_path: Path,
) -> None:
    """A real kube-apiserver (scripts/k8s-dryrun.sh, on loopback) accepts every object of
    k8s/, k8s/base and k8s/monitoring and a pod made from each pod template, in a namespace
    enforcing Pod Security "restricted", with no PodSecurity warning."""
    k8s_tool("kube-apiserver")
    crd = tmp_path / "servicemonitor-crd.yaml"
    crd.write_text(yaml.safe_dump(SERVICEMONITOR_CRD))
    with _k8s_tree(TEST_SECRETS) as tree:
        code, out, err = await _run_status(
            "bash", str(DRYRUN), "--psa", "restricted", "--crd", str(crd),
            *(str(tree / d) for d in RESTRICTED_DIRECTORIES),
            env=os.environ | {"PYTHON": sys.executable}, timeout=280,
        )  # fmt: skip
    assert code == 0, f"{out}\n{err}"
    assert "every object accepted under PSA restricted" in out
    assert "PodSecurity" not in out + err


def _ingress_backend(ingress: dict[str, Any], path: str) -> dict[str, Any] | None:
    """The backend the Ingress sends a request for ``path`` to (None: the controller's 404),
    by the Ingress rules: Exact matches the whole path, Prefix whole path elements; the
    longest matching path wins, Exact before Prefix."""
    best: tuple[int, bool] | None = None
    backend = None
    for rule in ingress["spec"]["rules"]:
        for entry in rule["http"]["paths"]:
            kind, rule_path = entry["pathType"], entry["path"]
            assert kind in ("Exact", "Prefix"), (
                f"{rule_path}: {kind} matches as the controller likes"
            )
            prefix = rule_path.rstrip("/")
            if kind == "Exact":
                matches = path == rule_path
            else:
                matches = path == prefix or path.startswith(prefix + "/")
            rank = (len(rule_path), kind == "Exact")
            if matches and (best is None or rank > best):
                best, backend = rank, entry["backend"]
    return backend if best is not None else ingress["spec"].get("defaultBackend")


async def test_ingress_routes_only_what_clients_use() -> None:
    """The Ingress routes the chat page, its static files, the socket and room history (what
    app/static/ uses), to the http port; never the moderation API, the metrics, the probes
    or the API schema. Every route of the app is one or the other: a new route fails here
    until the Ingress is decided for it."""
    ingress = _one(await _build(""), "Ingress")
    annotations = ingress["metadata"].get("annotations", {})
    assert not [key for key in annotations if "snippet" in key or "use-regex" in key]
    assert "defaultBackend" not in ingress["spec"]
    app = create_app(DEFAULTS)
    client_paths = {"/", "/rooms/{room}/messages", "/dms/{peer}/messages", "/inbox", "/search",
                    "/mentions", "/static/sw.js", "/me/hidden", "/me/muted/{user}",
                    "/me/blocked/{user}"}  # fmt: skip
    internal_paths = {"/healthz", "/readyz", app.openapi_url, app.docs_url, app.redoc_url}
    app_paths = set(app.openapi()["paths"])
    backend_api = {path for path in app_paths if path.startswith("/api/v1/")}
    assert backend_api, "the backend API is in the OpenAPI schema"
    internal_paths |= backend_api
    app_paths |= {route.path for route in page.router.routes if isinstance(route, APIRoute)}
    # Files on the app's own disk: not in Kubernetes, where pods share no disk and files go
    # to an S3 bucket (configmap.yaml), which browsers reach directly.
    local_files = {route.path for route in files.router.routes if isinstance(route, APIRoute)}
    assert local_files == {"/files/{key}"}
    app_paths |= local_files
    assert app_paths - client_paths - internal_paths - local_files == set(), (
        "route the Ingress ignores"
    )
    assert admin.router.prefix == "/admin"

    routed = ["/", "/ws", "/sse", "/rooms/lobby/messages", "/rooms/team-1/messages"]
    routed += [
        "/dms/alice/messages",
        "/inbox",
        "/search",
        "/mentions",
        "/me/hidden",
        "/me/muted/bob",
        "/me/blocked/bob",
    ]
    routed += [f"/static/{f.name}" for f in (ROOT / "app/static").iterdir()]
    static = (ROOT / "app/static/index.html").read_text()
    assert set(re.findall(r'(?:href|src)="(/[^"]*)"', static)) <= set(routed)
    client = (ROOT / "clients/js/src/client.ts").read_text()  # the page's hubbub.js's source
    assert "/ws`" in client and "`/rooms/${encodeURIComponent(room)}/messages`" in client
    assert '"/sse")' in (ROOT / "clients/js/src/sse.ts").read_text()  # the fallback's path
    for path in routed:
        backend = _ingress_backend(ingress, path)
        assert backend == {"service": {"name": "hubbub", "port": {"name": "http"}}}, path
    refused = [
        "/admin", "/admin/", "/admin/users/troll/kick", "/admin/users/troll/ban",
        DEFAULTS.metrics_path, "/metrics", "/healthz", "/readyz", "/openapi.json", "/redoc",
        "/docs", "/docs/oauth2-redirect", "/index.html", "/wsx", "/ws/x", "/ssex", "/sse/x",
        "/staticx", "/rooms-x",
        "/dmsx", "/inbox/x", "/search/x", "/mentions/x", "/mex", "/api/", "/api/v1/rooms",
        "/api/v1/users/ada/messages",
    ]  # fmt: skip
    for path in refused:
        assert _ingress_backend(ingress, path) is None, path


async def test_kubernetes_secrets_come_from_outside_the_repository(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The Secret is generated from k8s/base/secrets.env, which is gitignored and shipped only
    as secrets.env.example with empty values: `kubectl kustomize` (so `apply -k`) fails without
    it, and with the example copied as is the app refuses to start (jwt without a key). With
    real values the app runs jwt with them."""
    for directory in ALL_DIRECTORIES:
        with _k8s_tree(None) as tree:
            code, out, err = await _run_status(_kubectl(), "kustomize", str(tree / directory))
        assert code != 0 and "secrets.env" in err, (directory, out, err)
    ignored, _, _ = await _run_status("git", "check-ignore", "-q", "k8s/base/secrets.env")
    assert ignored == 0, "k8s/base/secrets.env is not gitignored"
    for manifest in (ROOT / "k8s").rglob("*.yaml"):
        for doc in yaml.safe_load_all(manifest.read_text()):
            assert not (doc and doc.get("kind") == "Secret"), f"{manifest}: a Secret in the repo"

    example = dict(
        line.split("=", 1)
        for line in SECRETS_EXAMPLE.read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert example == dict.fromkeys(TEST_SECRETS, "")  # every key documented, none usable
    for secrets, works in ((example, False), (TEST_SECRETS, True)):
        objects = await _build("base", secrets)
        (container,) = _one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
        env = _container_env(objects, container)
        assert env.get("CHAT_AUTH_MODE") == "jwt"
        if works:
            settings = _settings_from(env, monkeypatch)
            assert settings.jwt_secret is not None and settings.admin_token is not None
            assert settings.jwt_secret.get_secret_value() == TEST_SECRETS["CHAT_JWT_SECRET"]
            assert settings.admin_token.get_secret_value() == TEST_SECRETS["CHAT_ADMIN_TOKEN"]
        else:
            with pytest.raises(SettingsError, match="CHAT_JWT_SECRET"):
                _settings_from(env, monkeypatch)


async def _start_bundled_redis(
    container: dict[str, Any], password: str, directory: Path
) -> tuple[asyncio.subprocess.Process, int]:
    """The bundled Redis's container command, run here on a free loopback port."""
    port = free_port()
    local = ["--port", str(port), "--bind", "127.0.0.1", "--dir", str(directory),
             "--save", "", "--appendonly", "no", "--logfile", ""]  # fmt: skip
    proc = await asyncio.create_subprocess_exec(
        *container["command"], *container["args"], *local,
        env={"PATH": os.environ["PATH"], "REDIS_PASSWORD": password},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    return proc, port


async def test_bundled_redis_requires_the_password_the_app_uses(tmp_path: Path) -> None:
    """k8s/redis.yaml's Redis, its command run for real: it requires REDIS_PASSWORD from the
    Secret (refusing to start without a usable one), its readiness probe authenticates, and
    the app's CHAT_REDIS_URL carries that password."""
    assert shutil.which("redis-server"), "redis-server is missing: `make test` installs it"
    objects = await _build("")
    (redis_pod,) = [s for n, s in _pod_templates(objects).items() if n.endswith("hubbub-redis")]
    (container,) = redis_pod["containers"]
    env = _container_env(objects, container)
    password = TEST_SECRETS["REDIS_PASSWORD"]
    assert env["REDIS_PASSWORD"] == password and env["REDISCLI_AUTH"] == password
    (app_container,) = _one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    app_url = _container_env(objects, app_container)["CHAT_REDIS_URL"]
    assert app_url.startswith(f"redis://:{password}@hubbub-redis:")

    for bad in ("", "short", "has@an/unsafe:char-" + "x" * 16):
        proc, _ = await _start_bundled_redis(container, bad, tmp_path)
        async with asyncio.timeout(10):
            out, _ = await proc.communicate()
        assert proc.returncode != 0 and b"REDIS_PASSWORD" in out, (bad, out)

    proc, port = await _start_bundled_redis(container, password, tmp_path)
    try:
        await wait_for_port(port, proc, "the bundled Redis's command")
        anonymous = Redis(port=port, socket_timeout=2)
        with pytest.raises((AuthenticationError, ResponseError), match=r"(?i)auth"):
            await anonymous.ping()
        await anonymous.aclose()
        local_url = app_url.replace("@hubbub-redis:6379", f"@127.0.0.1:{port}")
        as_app = Redis.from_url(local_url, socket_timeout=2)
        assert await as_app.ping() is True
        await as_app.aclose()
        probe = container["readinessProbe"]["exec"]["command"]
        probe = [part.replace("redis-cli", f"redis-cli -p {port}") for part in probe]
        for auth, ready in ((password, True), ("wrong-password", False)):
            result = await _run_status(
                *probe, env={"PATH": os.environ["PATH"], "REDISCLI_AUTH": auth}
            )
            assert (result[0] == 0) == ready, (auth, result)
    finally:
        if proc.returncode is None:
            proc.terminate()
            async with asyncio.timeout(10):
                await proc.wait()


def _trusted_networks(value: str) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    assert value.strip() and "*" not in value, f"CHAT_TRUSTED_PROXIES={value!r}"
    return [ipaddress.ip_network(part.strip()) for part in value.split(",")]


async def test_no_shipped_file_trusts_every_proxy() -> None:
    """X-Forwarded-For is believed only from the proxy: in compose from nginx's fixed address
    on a fixed subnet; in Kubernetes from private ranges (where the ingress controller's pods
    live), never "*" (any client could name any address) and never a public network."""
    compose = _compose()
    (subnet,) = compose["networks"]["default"]["ipam"]["config"]
    nginx_address = compose["services"]["nginx"]["networks"]["default"]["ipv4_address"]
    assert ipaddress.ip_address(nginx_address) in ipaddress.ip_network(subnet["subnet"])
    trusted = _trusted_networks(compose["services"]["app"]["environment"]["CHAT_TRUSTED_PROXIES"])
    assert trusted == [ipaddress.ip_network(f"{nginx_address}/32")]
    for directory in ALL_DIRECTORIES:
        config = _data(await _build(directory), "ConfigMap", "hubbub-config")
        for network in _trusted_networks(config["CHAT_TRUSTED_PROXIES"]):
            assert network.is_private and network.prefixlen >= 8, (directory, network)
    # Nothing that ships sets it to "*" (the app's default is loopback only).
    shipped = [ROOT / "Dockerfile", ROOT / "docker-compose.yml", *(ROOT / "k8s").rglob("*"),
               *(ROOT / "deploy").rglob("*"), *(ROOT / "scripts").rglob("*")]  # fmt: skip
    for path in shipped:
        if path.is_file() and path.suffix not in (".json", ".png", ".pyc"):
            text = path.read_text()
            assert not re.search(r"TRUSTED_PROXIES\W{0,4}\*", text), path
            assert not re.search(r"forwarded.allow.ips\W{0,4}\*", text, re.IGNORECASE), path


def _mebibytes(quantity: str) -> float:
    units = {"Ki": 2**-10, "Mi": 1, "Gi": 2**10}
    number, unit = quantity[:-2], quantity[-2:]
    return float(number) * units[unit] if unit in units else float(quantity) / 2**20


async def test_kubernetes_is_sized_and_scaled_as_ops_run_it() -> None:
    """The HPA owns the replica count (a `replicas` in the Deployment would reset a scaled-out
    fleet on every apply); memory request = limit, and the limit holds the ConfigMap's caps
    (sockets x ~23 KiB, the worker outbox budget, the workers, gunicorn, the memory /tmp);
    scale-up can double a minute; pods spread over zones and nodes per rollout; a
    NetworkPolicy lets in only the ingress controller (app port) and Prometheus (metrics)."""
    for directory in ALL_DIRECTORIES:
        objects = await _build(directory)
        deployment = _one(objects, "Deployment")
        assert "replicas" not in deployment["spec"], directory
        hpa = _one(objects, "HorizontalPodAutoscaler")
        assert hpa["spec"]["minReplicas"] >= 2
        scale_up = hpa["spec"]["behavior"]["scaleUp"]
        assert scale_up["selectPolicy"] == "Max"
        assert {"type": "Percent", "value": 100, "periodSeconds": 60} in scale_up["policies"]
        spec = deployment["spec"]["template"]["spec"]
        (container,) = spec["containers"]
        resources = container["resources"]
        assert resources["requests"]["memory"] == resources["limits"]["memory"]
        config = _data(objects, "ConfigMap", "hubbub-config")
        workers = int(config["CHAT_WORKERS"])
        per_worker = (
            int(config["CHAT_MAX_CONNECTIONS"]) * 23 / 1024  # MiB, measured per idle socket
            + int(config["CHAT_WORKER_OUTBOX_MAX_BYTES"]) / 2**20
            + 100  # the worker itself
        )
        (tmp,) = [v for v in spec["volumes"] if v["name"] == "tmp"]
        needed = workers * per_worker + 60 + _mebibytes(tmp["emptyDir"]["sizeLimit"])
        limit = _mebibytes(resources["limits"]["memory"])
        assert needed * 1.2 <= limit, (directory, needed, limit)
        keys = {c["topologyKey"] for c in spec["topologySpreadConstraints"]}
        assert keys == {"topology.kubernetes.io/zone", "kubernetes.io/hostname"}
        for constraint in spec["topologySpreadConstraints"]:
            assert constraint["matchLabelKeys"] == ["pod-template-hash"]
        policy = _one(objects, "NetworkPolicy")
        assert policy["spec"]["podSelector"]["matchLabels"].items() <= (
            deployment["spec"]["template"]["metadata"]["labels"].items()
        )
        allowed = [
            (rule["ports"][0]["port"], rule["from"][0].get("namespaceSelector"),
             rule["from"][0].get("podSelector"))
            for rule in policy["spec"]["ingress"]
        ]  # fmt: skip
        assert allowed == [
            ("http", {"matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}, None),
            ("metrics", {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}, None),
            # The application's backend, for the backend API: labelled pods of this namespace.
            ("http", None, {"matchLabels": {"hubbub.io/backend-api": "true"}}),
        ]


# The label Kubernetes itself sets on every namespace (its name): users cannot choose it.
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"


def _namespaces_a_peer_admits(peer: dict[str, Any]) -> set[str] | None:
    """The namespaces a NetworkPolicy ``from`` entry admits pods of, by name: {""} for the
    policy's own namespace (no namespaceSelector), None for any namespace at all (an empty
    selector, or one that names no namespace: any namespace can carry a label users set)."""
    if "namespaceSelector" not in peer:
        return {""}
    selector = peer["namespaceSelector"] or {}
    names: set[str] | None = None
    if NAMESPACE_NAME_LABEL in (selector.get("matchLabels") or {}):
        names = {selector["matchLabels"][NAMESPACE_NAME_LABEL]}
    for expression in selector.get("matchExpressions") or []:
        if expression["key"] == NAMESPACE_NAME_LABEL and expression["operator"] == "In":
            allowed = set(expression["values"])
            names = allowed if names is None else names & allowed
    return names


def test_the_network_policy_admits_no_pod_of_an_unnamed_namespace() -> None:
    """Every ``from`` entry of every NetworkPolicy shipped (k8s/**/*.yaml, as written) admits
    pods of its own namespace or of namespaces it names: never ``namespaceSelector: {}`` nor a
    selector on labels users set, which admit pods of any namespace. Whoever may create a pod
    anywhere in the cluster can label it hubbub.io/backend-api=true: the backend API is open to
    the labelled pods of the app's own namespace only."""
    policies = [
        (manifest, doc)
        for manifest in sorted((ROOT / "k8s").rglob("*.yaml"))
        for doc in yaml.safe_load_all(manifest.read_text())
        if doc and doc.get("kind") == "NetworkPolicy"
    ]
    assert policies, "no NetworkPolicy shipped"
    backend_peers = []
    for manifest, policy in policies:
        for rule in policy["spec"].get("ingress", []):
            assert rule.get("from"), f"{manifest}: a rule admitting every source"
            for peer in rule["from"]:
                assert "ipBlock" not in peer, f"{manifest}: {peer}"
                admitted = _namespaces_a_peer_admits(peer)
                assert admitted is not None, f"{manifest}: {peer} admits any namespace"
                labels = (peer.get("podSelector") or {}).get("matchLabels") or {}
                if labels.get("hubbub.io/backend-api") == "true":
                    backend_peers.append(admitted)
    assert backend_peers == [{""}], "the backend's pods: this namespace only"
    # The check itself: the shapes that admit any namespace are caught.
    label: dict[str, Any] = {"podSelector": {"matchLabels": {"hubbub.io/backend-api": "true"}}}
    selectors: list[dict[str, Any] | None] = [
        {}, None, {"matchLabels": {"team": "backend"}}, {"matchExpressions": []},
    ]  # fmt: skip
    for selector in selectors:
        assert _namespaces_a_peer_admits(label | {"namespaceSelector": selector}) is None
    named = {"matchLabels": {NAMESPACE_NAME_LABEL: "shop"}}
    assert _namespaces_a_peer_admits(label | {"namespaceSelector": named}) == {"shop"}


# -- nginx and hosts ----------------------------------------------------------------------


def test_nginx_limits_fit_ten_thousand_proxied_sockets() -> None:
    conf = (ROOT / "nginx/nginx.conf").read_text()

    def value(directive: str) -> str:
        match = re.search(rf"^\s*{directive}\s+([^;]+);", conf, re.MULTILINE)
        assert match, directive
        return match.group(1)

    # Two connections (client + upstream) per proxied socket, even with a single worker.
    assert int(value("worker_connections")) >= 2 * 10_000
    assert int(value("worker_rlimit_nofile")) >= int(value("worker_connections"))
    assert re.search(r"^\s*least_conn;", conf, re.MULTILINE)
    read_timeout = re.search(r"location = /ws \{[^}]*proxy_read_timeout (\d+)s;", conf)
    assert read_timeout and int(read_timeout.group(1)) > 2 * DEFAULTS.heartbeat_interval_s
    # nginx drops idle upstream connections before gunicorn does (no request on a dead one).
    gunicorn_keepalive = re.search(
        r"^keepalive = (\d+)", (ROOT / "deploy/gunicorn.conf.py").read_text(), re.MULTILINE
    )
    assert gunicorn_keepalive
    assert int(value("keepalive_timeout").removesuffix("s")) < int(gunicorn_keepalive.group(1))


def test_host_sysctls_exist_on_linux() -> None:
    """Every key in deploy/sysctl.d names a real kernel setting (a typo would be ignored by
    ``sysctl --system`` with only a warning)."""
    conf = (ROOT / "deploy/sysctl.d/60-hubbub.conf").read_text()
    keys = [
        line.split("=")[0].strip()
        for line in conf.splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert "net.core.somaxconn" in keys
    for key in keys:
        assert Path("/proc/sys", *key.split(".")).exists(), key
    limits = (ROOT / "deploy/limits.d/hubbub.conf").read_text()
    assert re.search(r"^hubbub\s+hard\s+nofile\s+(\d+)", limits, re.MULTILINE)
