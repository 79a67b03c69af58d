"""Deployment files, validated offline: Dockerfile (hadolint), docker-compose.yml (the compose
specification), k8s/ (kustomize build, then every object against the Kubernetes 1.33 schemas,
strictly), host tuning files — the values that
must agree across them and the app, and that they are secure by default (docs/security.md,
"Attacks and what stops them")."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.settings import Settings, SettingsError, load_settings
from tests.processes import ROOT

KUBERNETES_VERSION = "1.33.0"
DEFAULTS = Settings.model_construct()  # the defaults, unvalidated (jwt needs a key)
VENV_BIN = Path(sys.executable).parent


async def _run_status(
    *command: str, cwd: Path = ROOT, env: Mapping[str, str] | None = None
) -> tuple[int, str, str]:
    """Run ``command`` (in ``env``, when given): its exit status, stdout and stderr."""
    proc = await asyncio.create_subprocess_exec(
        *command, cwd=cwd, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    async with asyncio.timeout(120):
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
    assert docker["HEALTHCHECK"][0].endswith('CMD ["python", "-m", "app.healthcheck"]')
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


async def test_compose_file_follows_the_compose_specification() -> None:
    await _run(
        str(VENV_BIN / "check-jsonschema"),
        "--builtin-schema", "vendor.compose-spec", "docker-compose.yml",
    )  # fmt: skip


def test_compose_stack_is_wired_together() -> None:
    services = _compose()["services"]
    assert set(services) == {"redis", "app", "nginx", "prometheus", "grafana"}
    app = services["app"]
    assert app["deploy"]["replicas"] == 2
    assert app["depends_on"]["redis"]["condition"] == "service_healthy"
    assert "healthcheck" in services["redis"]
    assert app["environment"]["CHAT_REDIS_URL"].startswith("redis://redis:6379")
    assert "ports" not in app  # reachable through nginx only
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
    env = {"CHAT_JWT_SECRET": secret, "GRAFANA_ADMIN_PASSWORD": "g" * 32}
    with pytest.raises(ComposeRefuses, match="GRAFANA_ADMIN_PASSWORD"):
        _interpolate(_compose(), {"CHAT_JWT_SECRET": secret})
    with pytest.raises(ComposeRefuses, match="GRAFANA_ADMIN_PASSWORD"):
        _interpolate(_compose(), {"CHAT_JWT_SECRET": secret, "GRAFANA_ADMIN_PASSWORD": ""})

    services = _interpolate(_compose(), env)["services"]
    app_env = services["app"]["environment"]
    settings = _settings_from(app_env, monkeypatch)
    assert settings.auth_mode == "jwt" and settings.jwt_secret is not None
    assert settings.jwt_secret.get_secret_value() == secret
    assert settings.admin_token is None  # no CHAT_ADMIN_TOKEN: the moderation API is off

    no_secret = _interpolate(_compose(), {"GRAFANA_ADMIN_PASSWORD": "g" * 32})["services"]
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
    # Published ports: the chat (nginx) on every address, the monitoring on loopback only.
    for name, service in services.items():
        for port in service.get("ports", []):
            assert name == "nginx" or port.startswith("127.0.0.1:"), f"{name}: {port}"


# -- Kubernetes ---------------------------------------------------------------------------


def _kubectl() -> str:
    binary = shutil.which("kubectl")
    assert binary, "kubectl is missing: `make test` installs Debian's kubernetes-client"
    return binary


async def _build(directory: str) -> list[dict[str, Any]]:
    output = await _run(_kubectl(), "kustomize", str(ROOT / "k8s" / directory))
    return [doc for doc in yaml.safe_load_all(output) if doc]


@pytest.mark.parametrize("directory", ["", "base", "monitoring"])
async def test_kustomize_output_is_valid_kubernetes(directory: str, tmp_path: Path) -> None:
    objects = await _build(directory)
    # kubernetes-validate has no schema for CRDs (the ServiceMonitor): checked below instead.
    core = [obj for obj in objects if not obj["apiVersion"].startswith("monitoring.coreos.com")]
    manifest = tmp_path / "manifest.yaml"
    manifest.write_text(yaml.safe_dump_all(core))
    output = await _run(
        str(VENV_BIN / "kubernetes-validate"), "--strict", "-k", KUBERNETES_VERSION, str(manifest)
    )
    assert output.count("passed for resource") == len(core), output
    assert all(obj["metadata"].get("namespace", "hubbub") == "hubbub" for obj in objects)


def _one(objects: list[dict[str, Any]], kind: str, name: str = "hubbub") -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


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
    pre_stop = int(container["lifecycle"]["preStop"]["exec"]["command"][1])
    drain = float(config["CHAT_DRAIN_WINDOW_S"])
    assert spec["terminationGracePeriodSeconds"] > pre_stop + drain + DEFAULTS.close_timeout_s
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    # The sysctl init container, and the safe sysctls in the pod's security context.
    (init,) = spec["initContainers"]
    assert init["securityContext"]["privileged"] is True
    script = " ".join(init["command"])
    for key in (
        "net.core.somaxconn",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.tcp_max_syn_backlog",
    ):
        assert f"sysctl -w {key}=" in script
    safe = {s["name"] for s in spec["securityContext"]["sysctls"]}
    assert "net.ipv4.ip_local_port_range" in safe
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
    assert int(pods_metric["pods"]["target"]["averageValue"]) < DEFAULTS.max_connections * int(
        config["CHAT_WORKERS"]
    )

    ingress = _one(objects, "Ingress")
    annotations = ingress["metadata"]["annotations"]
    heartbeat = float(config["CHAT_HEARTBEAT_INTERVAL_S"])
    for key in ("proxy-read-timeout", "proxy-send-timeout"):
        assert int(annotations[f"nginx.ingress.kubernetes.io/{key}"]) > 2 * heartbeat
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": "hubbub", "port": {"name": "http"}}  # never the metrics port

    monitor = _one(objects, "ServiceMonitor")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    # job="hubbub" (what the alerts and the dashboard select) comes from this label.
    assert service["metadata"]["labels"][monitor["spec"]["jobLabel"]] == "hubbub"

    secret = _one(objects, "Secret", "hubbub-secrets")
    dev = await _build("")
    redis_service = _one(dev, "Service", "hubbub-redis")
    assert secret["stringData"]["CHAT_REDIS_URL"] == (
        f"redis://{redis_service['metadata']['name']}:{redis_service['spec']['ports'][0]['port']}/0"
    )


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
