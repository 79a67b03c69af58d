"""The Helm chart (deploy/helm/hubbub), with a real helm (scripts/k8s-tools.sh): it lints
strictly; with default values it renders the objects of k8s/base, and with its monitoring and
node-tuning options those of k8s/monitoring and k8s/node-tuning (one source of truth: a change
to one that the other lacks fails here); its sizing follows the same arithmetic; and a real
kube-apiserver accepts it under Pod Security "restricted"."""

from __future__ import annotations

import copy
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.processes import ROOT
from tests.test_deploy_files import (
    DRYRUN,
    KUBERNETES_VERSION,
    SERVICEMONITOR_CRD,
    _build,
    _restricted_violations,
    _run_status,
    assert_valid_kubernetes,
    k8s_tool,
)

CHART = ROOT / "deploy/helm/hubbub"
# Labels Helm's conventions add, which k8s/ has no use for.
HELM_LABELS = {
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by",
    "helm.sh/chart",
}
# Every option that adds objects, on (node tuning apart: it is not "restricted").
EVERYTHING = {
    "serviceMonitor.enabled": "true",
    "prometheusRule.enabled": "true",
    "dashboard.enabled": "true",
    "autoscaling.targetConnectionsPerPod": "15000",
}
PROMETHEUSRULE_CRD: dict[str, Any] = copy.deepcopy(SERVICEMONITOR_CRD)
PROMETHEUSRULE_CRD["metadata"]["name"] = "prometheusrules.monitoring.coreos.com"
PROMETHEUSRULE_CRD["spec"]["names"] = {
    "kind": "PrometheusRule",
    "listKind": "PrometheusRuleList",
    "plural": "prometheusrules",
    "singular": "prometheusrule",
}

pytestmark = pytest.mark.timeout(120)


async def _helm_status(*args: str) -> tuple[int, str, str]:
    helm = str(k8s_tool("helm"))
    return await _run_status(helm, *args, env=os.environ | {"HELM_NO_PLUGINS": "1"})


async def _template(values: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """The chart rendered as release "hubbub" in namespace "hubbub" with ``values`` (--set)."""
    sets = [f"--set={key}={value}" for key, value in (values or {}).items()]
    code, out, err = await _helm_status(
        "template", "hubbub", str(CHART), "--namespace", "hubbub",
        "--kube-version", KUBERNETES_VERSION, *sets,
    )  # fmt: skip
    assert code == 0, f"{out}\n{err}"
    return [doc for doc in yaml.safe_load_all(out) if doc]


def _without_helm_labels(node: Any) -> Any:
    """``node`` with Helm's labels and the config checksum taken out (k8s/ has neither)."""
    if isinstance(node, list):
        return [_without_helm_labels(item) for item in node]
    if not isinstance(node, dict):
        return node
    cleaned = {}
    for key, value in node.items():
        if key in HELM_LABELS or key == "checksum/config":
            continue
        value = _without_helm_labels(value)
        if key in ("labels", "annotations") and value == {}:
            continue
        cleaned[key] = value
    return cleaned


def _by_identity(objects: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(obj["kind"], obj["metadata"]["name"]): obj for obj in objects}


async def _kustomized(directory: str) -> dict[tuple[str, str], dict[str, Any]]:
    """k8s/<directory> as the chart would render it: no Namespace (the chart installs into one
    that exists), the Secret not generated but named (``existingSecret``)."""
    objects = await _build(directory)
    secret = next(o["metadata"]["name"] for o in objects if o["kind"] == "Secret")
    rendered = json.dumps([o for o in objects if o["kind"] not in ("Namespace", "Secret")])
    return _by_identity(json.loads(rendered.replace(f'"{secret}"', '"hubbub-secrets"')))


def _assert_same(chart: list[dict[str, Any]], kustomized: dict[tuple[str, str], Any]) -> None:
    """The chart's objects are k8s/'s: the same kinds and names, the same content, labels
    on every object where k8s/ has them on some (a superset of them)."""
    rendered = _by_identity(_without_helm_labels(chart))
    assert sorted(rendered) == sorted(kustomized)
    for identity, expected in kustomized.items():
        mine = copy.deepcopy(rendered[identity])
        labels = mine["metadata"].pop("labels", {})
        expected = copy.deepcopy(expected)
        assert expected["metadata"].pop("labels", {}).items() <= labels.items(), identity
        assert mine == expected, identity


async def test_the_chart_lints_strictly_with_defaults_and_with_every_option() -> None:
    for values in ({}, EVERYTHING, {"nodeTuning.enabled": "true", "autoscaling.enabled": "false"}):
        sets = [f"--set={key}={value}" for key, value in values.items()]
        code, out, err = await _helm_status("lint", "--strict", str(CHART), *sets)
        assert code == 0 and "0 chart(s) failed" in out, f"{values}\n{out}\n{err}"


async def test_default_values_render_k8s_base() -> None:
    _assert_same(await _template(), await _kustomized("base"))


async def test_monitoring_values_render_k8s_monitoring() -> None:
    values = {"serviceMonitor.enabled": "true", "autoscaling.targetConnectionsPerPod": "15000"}
    _assert_same(await _template(values), await _kustomized("monitoring"))


async def test_node_tuning_renders_k8s_node_tuning() -> None:
    _assert_same(await _template({"nodeTuning.enabled": "true"}), await _kustomized("node-tuning"))


async def test_rendered_objects_are_valid_kubernetes_and_restricted(tmp_path: Path) -> None:
    objects = await _template(EVERYTHING)
    await assert_valid_kubernetes(objects, tmp_path)
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    assert _restricted_violations(deployment["spec"]["template"]["spec"]) == []


async def test_pods_are_sized_by_the_arithmetic_of_k8s_base() -> None:
    """Memory = (workers x (maxConnections x 23 KiB + 100 MiB + outbox) + 124 MiB) x 1.4,
    rounded up to 128 MiB, request = limit; CPU limit = workers; the ConfigMap carries the
    same three values the sizing used."""
    cases = [(2, 10_000, 64, 1280), (4, 20_000, 64, 3712), (1, 5_000, 32, 640)]
    for workers, connections, outbox_mib, memory_mib in cases:
        objects = await _template({
            "workers": str(workers), "maxConnections": str(connections),
            "workerOutboxMaxBytes": str(outbox_mib * 1024 * 1024),
        })  # fmt: skip
        (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
        (config,) = [o for o in objects if o["kind"] == "ConfigMap"]
        resources = deployment["spec"]["template"]["spec"]["containers"][0]["resources"]
        memory = f"{memory_mib}Mi"
        assert resources == {
            "requests": {"cpu": str(max(1, workers // 2)), "memory": memory},
            "limits": {"cpu": str(workers), "memory": memory},
        }
        assert config["data"]["CHAT_WORKERS"] == str(workers)
        assert config["data"]["CHAT_MAX_CONNECTIONS"] == str(connections)
        assert config["data"]["CHAT_WORKER_OUTBOX_MAX_BYTES"] == str(outbox_mib * 1024 * 1024)


async def test_explicit_resources_win_over_the_sizing() -> None:
    objects = await _template({"resources.limits.memory": "3Gi", "resources.limits.cpu": "3"})
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    resources = deployment["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert resources == {"limits": {"cpu": 3, "memory": "3Gi"}}


async def test_a_changed_config_rolls_the_pods() -> None:
    def checksum(objects: list[dict[str, Any]]) -> str:
        (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
        return str(deployment["spec"]["template"]["metadata"]["annotations"]["checksum/config"])

    before = checksum(await _template())
    assert checksum(await _template()) == before
    assert checksum(await _template({"config.CHAT_HEARTBEAT_INTERVAL_S": "20"})) != before


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"existingSecret": ""}, "existingSecret: the name of the Secret"),
        ({"config.CHAT_WORKERS": "8"}, "config.CHAT_WORKERS: set it with the chart's own value"),
        ({"workers": "0"}, "workers"),
        ({"maxConnections": "many"}, "maxConnections"),
    ],
)
async def test_wrong_values_are_refused_with_a_clear_message(
    values: dict[str, str], message: str
) -> None:
    sets = [f"--set={key}={value}" for key, value in values.items()]
    code, out, err = await _helm_status("template", "hubbub", str(CHART), *sets)
    assert code != 0, out
    assert message in err, err


async def test_release_names_and_hosts_carry_through() -> None:
    sets = ["--set=ingress.hosts={chat.example.com}", "--set=ingress.tls[0].secretName=chat-tls",
            "--set=ingress.tls[0].hosts={chat.example.com}"]  # fmt: skip
    code, out, err = await _helm_status("template", "team-chat", str(CHART), "-n", "chat", *sets)
    assert code == 0, err
    objects = _by_identity([doc for doc in yaml.safe_load_all(out) if doc])
    ingress = objects[("Ingress", "team-chat-hubbub")]
    assert [rule["host"] for rule in ingress["spec"]["rules"]] == ["chat.example.com"]
    assert ingress["spec"]["tls"] == [{"secretName": "chat-tls", "hosts": ["chat.example.com"]}]
    paths = ingress["spec"]["rules"][0]["http"]["paths"]
    backends = {path["backend"]["service"]["name"] for path in paths}
    assert backends == {"team-chat-hubbub"}
    deployment = objects[("Deployment", "team-chat-hubbub")]
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector == {
        "app.kubernetes.io/name": "hubbub",
        "app.kubernetes.io/instance": "team-chat",
    }
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert {"configMapRef": {"name": "team-chat-hubbub-config"}} in container["envFrom"]
    assert ("ConfigMap", "team-chat-hubbub-config") in objects


def test_the_chart_carries_the_current_dashboard_and_alerts() -> None:
    """Helm reads only files inside the chart: its copies must be today's (`make chart-files`)."""
    for original, copy_ in [
        ("deploy/grafana/dashboards/hubbub.json", "files/hubbub-dashboard.json"),
        ("deploy/prometheus/alerts.yml", "files/alerts.yml"),
    ]:
        assert (CHART / copy_).read_bytes() == (ROOT / original).read_bytes(), (
            f"{CHART / copy_} is stale: run `make chart-files`"
        )


async def test_alerts_and_dashboard_render_as_the_operator_and_grafana_expect() -> None:
    objects = _by_identity(await _template(EVERYTHING))
    rule = objects[("PrometheusRule", "hubbub")]
    assert rule["spec"] == yaml.safe_load((ROOT / "deploy/prometheus/alerts.yml").read_text())
    dashboard = objects[("ConfigMap", "hubbub-dashboard")]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads((ROOT / "deploy/grafana/dashboards/hubbub.json").read_text())
    assert json.loads(dashboard["data"]["hubbub.json"]) == shipped


@pytest.mark.timeout(300)  # etcd and kube-apiserver start in ~3 s, up to 2 min when busy
async def test_helm_chart_server_side_dry_run_under_pod_security_restricted(
    tmp_path: Path,
) -> None:
    """A real kube-apiserver (scripts/k8s-dryrun.sh) accepts the chart with every option but
    node tuning, and a pod from its template, in a namespace enforcing "restricted"."""
    k8s_tool("kube-apiserver")
    tree = tmp_path / "chart"
    tree.mkdir()
    namespace = yaml.safe_load((ROOT / "k8s/base/namespace.yaml").read_text())
    (tree / "namespace.yaml").write_text(yaml.safe_dump(namespace))
    (tree / "chart.yaml").write_text(yaml.safe_dump_all(await _template(EVERYTHING)))
    (tree / "kustomization.yaml").write_text("resources: [namespace.yaml, chart.yaml]\n")
    crds = []
    definitions: list[dict[str, Any]] = [SERVICEMONITOR_CRD, PROMETHEUSRULE_CRD]
    for crd in definitions:
        path = tmp_path / f"{crd['metadata']['name']}.yaml"
        path.write_text(yaml.safe_dump(crd))
        crds += ["--crd", str(path)]
    code, out, err = await _run_status(
        "bash", str(DRYRUN), "--psa", "restricted", *crds, str(tree),
        env=os.environ | {"PYTHON": sys.executable}, timeout=280,
    )  # fmt: skip
    assert code == 0, f"{out}\n{err}"
    assert "every object accepted under PSA restricted" in out
    assert "--- dry run: pod-hubbub.yaml" in out
    assert "PodSecurity" not in out + err
