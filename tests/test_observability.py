"""The files SREs run: alert rules (promtool unit tests), Prometheus configs, the Grafana
dashboard (schema, layout) — and every query in them against what the app really exports."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import re
import tempfile
from types import ModuleType
from typing import Any

import httpx2 as httpx
import jsonschema
import yaml

from app.ops.metrics import Metrics
from tests.helpers import ChatClient, free_port
from tests.processes import ROOT, AppProcess, PrometheusServer, RedisServer
from tests.prom import run_promtool, scrape_until

PROMETHEUS = ROOT / "deploy" / "prometheus"
GRAFANA = ROOT / "deploy" / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "hubbub.json"
# Metric names are the identifiers with our prefixes (PromQL functions and labels have none).
METRIC_NAME = re.compile(r"\b(?:hubbub|http)_[a-z0-9_]+\b")


def _dashboard_builder() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_dashboard", GRAFANA / "build_dashboard.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load((PROMETHEUS / "alerts.yml").read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def _dashboard_queries(dashboard: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs += [
        v["definition"].removeprefix("label_values(").rsplit(",", 1)[0]
        for v in dashboard["templating"]["list"]
        if v["type"] == "query"
    ]
    return exprs


def _as_plain_promql(expr: str) -> str:
    """Grafana's variables replaced by what they expand to."""
    return expr.replace("$__rate_interval", "5m").replace("$instance", ".*")


async def test_alert_rules_pass_their_unit_tests() -> None:
    await run_promtool("check", "rules", "alerts.yml", cwd=str(PROMETHEUS))
    output = await run_promtool("test", "rules", "alerts.test.yml", cwd=str(PROMETHEUS))
    assert "SUCCESS" in output


def test_every_alert_is_tested_firing_and_has_a_runbook() -> None:
    tests = yaml.safe_load((PROMETHEUS / "alerts.test.yml").read_text())["tests"]
    fired = {
        case["alertname"]
        for test in tests
        for case in test["alert_rule_test"]
        if case.get("exp_alerts")
    }
    operations = (ROOT / "docs" / "operations.md").read_text()
    for rule in _alert_rules():
        name = rule["alert"]
        assert name in fired, f"{name}: no promtool test expects it to fire"
        anchor = f"alert-{name.lower()}"
        assert rule["annotations"]["runbook"] == f"docs/operations.md#{anchor}"
        assert f'<a id="{anchor}"></a>' in operations, f"docs/operations.md lacks {anchor}"
        assert rule["labels"]["severity"] in {"critical", "warning"}


async def test_prometheus_configs_are_valid() -> None:
    await run_promtool("check", "config", "prometheus.yml", cwd=str(PROMETHEUS))
    # Debian's promtool is built without Kubernetes discovery: check the rest of the job with
    # a static target in its place.
    config = yaml.safe_load((PROMETHEUS / "kubernetes.yml").read_text())
    (job,) = config["scrape_configs"]
    assert job["job_name"] == "hubbub"
    assert job.pop("kubernetes_sd_configs") == [
        {"role": "pod", "namespaces": {"names": ["hubbub"]}}
    ]
    job["static_configs"] = [{"targets": ["pod:9100"]}]
    with tempfile.NamedTemporaryFile("w", suffix=".yml") as tmp:
        yaml.safe_dump(config, tmp)
        tmp.flush()
        await run_promtool("check", "config", tmp.name)


def test_dashboard_is_generated_and_valid() -> None:
    builder = _dashboard_builder()
    assert DASHBOARD.read_text() == builder.render(), "stale: run `make dashboard`"
    dashboard = json.loads(DASHBOARD.read_text())
    schema = json.loads((GRAFANA / "dashboard.schema.json").read_text())
    jsonschema.validate(dashboard, schema)

    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    taken: set[tuple[int, int]] = set()
    for panel in panels:
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, panel["title"]
        cells = {(x, y) for x in range(pos["x"], pos["x"] + pos["w"])
                 for y in range(pos["y"], pos["y"] + pos["h"])}  # fmt: skip
        assert not cells & taken, f"{panel['title']} overlaps another panel"
        taken |= cells
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert panel["targets"] and panel["description"], panel["title"]
            ref_ids = [t["refId"] for t in panel["targets"]]
            assert len(set(ref_ids)) == len(ref_ids)
    titles = " ".join(p["title"] for p in panels).lower()
    for topic in ("connections", "disconnects by close code", "messages in", "fan-out latency",
                  "outbox", "slow consumers", "broker", "lag", "cpu per worker",
                  "memory per worker"):  # fmt: skip
        assert topic in titles, f"the dashboard has no panel about {topic}"


async def test_dashboard_queries_are_valid_promql() -> None:
    queries = _dashboard_queries(json.loads(DASHBOARD.read_text()))
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"dashboard:query_{n}", "expr": _as_plain_promql(expr)}
                    for n, expr in enumerate(queries)
                ],
            }
        ]
    }
    with tempfile.NamedTemporaryFile("w", suffix=".yml") as tmp:
        yaml.safe_dump(rules, tmp)
        tmp.flush()
        await run_promtool("check", "rules", tmp.name)


async def test_queries_and_alerts_work_on_live_data(redis_server: RedisServer) -> None:
    """The production setup (gunicorn, 2 workers, Redis, metrics port) scraped by a real
    Prometheus with the alert rules loaded: every metric the dashboard and the alerts name is
    exported, every query runs (and the unfiltered ones return data), every rule evaluates
    cleanly and none fires on a healthy server."""
    metrics_port = free_port()
    app = AppProcess(
        {"CHAT_REDIS_URL": redis_server.url, "CHAT_METRICS_PORT": str(metrics_port)},
        gunicorn_workers=2,
    )
    prometheus = PrometheusServer([f"127.0.0.1:{metrics_port}"], [PROMETHEUS / "alerts.yml"])
    await app.start()
    try:
        async with ChatClient.connect(app.ws_url("probe")) as client:
            await client.join("r")
            await client.say("r", "hello")
            await client.expect("message")
        async with httpx.AsyncClient() as http:  # for the HTTP instrumentation's series
            await http.get(f"{app.http_url}/rooms/r/messages")
        result = await scrape_until(
            f"http://127.0.0.1:{metrics_port}/metrics",
            lambda s: "http_requests_total" in s.names and len(s.series("hubbub_ready")) == 2,
        )
        _check_names(result.names)

        await prometheus.start()
        async with asyncio.timeout(30):  # enough samples for rate() over the test's window
            while not await prometheus.query('count_over_time(up{job="hubbub"}[1m]) >= 5'):
                await asyncio.sleep(0.5)
        assert (await prometheus.query('up{job="hubbub"}'))[0]["value"][1] == "1"
        for expr in _dashboard_queries(json.loads(DASHBOARD.read_text())):
            rows = await prometheus.query(
                expr.replace("$__rate_interval", "30s").replace("$instance", ".*")
            )
            if "> 0" not in expr:  # filtered queries may rightly be empty
                assert rows, f"no data for {expr!r}"
        async with asyncio.timeout(15):  # until every rule has been evaluated once
            while True:
                groups = (await prometheus.api("rules"))["groups"]
                rules = [rule for group in groups for rule in group["rules"]]
                if rules and not any(r["lastEvaluation"].startswith("0001") for r in rules):
                    break
                await asyncio.sleep(0.5)
        assert len(rules) == len(_alert_rules())
        assert all(rule["health"] == "ok" for rule in rules), rules
        alerts = (await prometheus.api("alerts"))["alerts"]
        firing = [alert for alert in alerts if alert["state"] == "firing"]
        assert not firing, firing
    finally:
        await prometheus.stop()
        await app.stop()


def _check_names(exported: set[str]) -> None:
    queries = _dashboard_queries(json.loads(DASHBOARD.read_text()))
    queries += [rule["expr"] for rule in _alert_rules()]
    used: set[str] = set()
    for expr in queries:
        names = set(METRIC_NAME.findall(expr))
        assert names or re.search(r"\bup\b", expr), f"no metric in {expr!r}"
        missing = names - exported
        assert not missing, f"{expr!r} uses {missing}, which the app does not export"
        used |= names
    # And the other way round: the dashboard or an alert shows each of our metric families.
    families = {re.sub(r"_(bucket|sum|count)$", "", n) for n in exported if n.startswith("hubbub_")}
    unused = {f for f in families if not any(u.startswith(f) for u in used)} - {"hubbub_build_info"}
    assert not unused, f"exported but never shown or alerted on: {unused}"


def test_every_metric_is_documented() -> None:
    operations = (ROOT / "docs" / "operations.md").read_text()
    registry = Metrics().registry
    for family in registry.collect():
        name = family.name + ("_total" if family.type == "counter" else "")
        assert f"`{name}`" in operations, f"docs/operations.md does not describe {name}"
