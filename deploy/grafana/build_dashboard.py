"""Builds ``dashboards/hubbub.json``, the Grafana dashboard of Hubbub (``make dashboard``).

The dashboard is code so that its panels stay consistent (same selector, units, layout) and a
test can check it: ``tests/test_observability.py`` rebuilds it and compares it with the file,
validates it against Grafana's dashboard schema, checks every PromQL expression with promtool
and every metric it names against a live scrape of the app.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

OUTPUT = Path(__file__).parent / "dashboards" / "hubbub.json"
SEL = 'job="hubbub", instance=~"$instance"'
RATE = "$__rate_interval"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}

Panel = dict[str, Any]
STAT_OPTIONS = {
    "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
    "colorMode": "value",
    "graphMode": "area",
}
GRAPH_OPTIONS = {
    "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
    "tooltip": {"mode": "multi", "sort": "desc"},
}


def _q(expr: str, legend: str = "") -> tuple[str, str]:
    return expr, legend


def _quantiles(metric: str, *quantiles: float, by: str = "") -> list[tuple[str, str]]:
    group = f"le, {by}" if by else "le"
    return [
        (
            f"histogram_quantile({q}, sum by ({group}) (rate({metric}_bucket{{{SEL}}}[{RATE}])))",
            f"p{round(q * 100)}" + (f" {{{{{by}}}}}" if by else ""),
        )
        for q in quantiles
    ]


class Layout:
    """Places panels left to right in rows of 24 columns, and numbers them."""

    def __init__(self) -> None:
        self.panels: list[Panel] = []
        self._x = 0
        self._y = 0
        self._row_height = 0
        self._id = 0

    def _next_id(self) -> int:
        self._id += 1
        return self._id

    def row(self, title: str) -> None:
        self._newline()
        self.panels.append(
            {"type": "row", "title": title, "collapsed": False, "id": self._next_id(),
             "gridPos": {"h": 1, "w": 24, "x": 0, "y": self._y}, "panels": []}
        )  # fmt: skip
        self._y += 1

    def _newline(self) -> None:
        self._y += self._row_height
        self._x = 0
        self._row_height = 0

    def panel(
        self,
        kind: str,
        title: str,
        description: str,
        queries: list[tuple[str, str]],
        unit: str,
        width: int,
        height: int = 8,
        options: dict[str, Any] | None = None,
        custom: dict[str, Any] | None = None,
        exemplars: bool = False,
    ) -> None:
        if self._x + width > 24:
            self._newline()
        targets = [
            {"refId": chr(ord("A") + n), "datasource": DATASOURCE, "expr": expr,
             "legendFormat": legend or "__auto", "range": True}
            for n, (expr, legend) in enumerate(queries)
        ]  # fmt: skip
        if exemplars:  # the traces behind the latencies (Prometheus with exemplar storage)
            for target in targets:
                target["exemplar"] = True
        defaults: dict[str, Any] = {"unit": unit, "min": 0}
        if custom:
            defaults["custom"] = custom
        self.panels.append(
            {
                "type": kind,
                "title": title,
                "description": description,
                "id": self._next_id(),
                "datasource": DATASOURCE,
                "gridPos": {"h": height, "w": width, "x": self._x, "y": self._y},
                "targets": targets,
                "fieldConfig": {"defaults": defaults, "overrides": []},
                "options": options or {},
            }
        )
        self._x += width
        self._row_height = max(self._row_height, height)

    def stat(self, title: str, description: str, expr: str, unit: str) -> None:
        self.panel("stat", title, description, [_q(expr)], unit, width=4, height=4,
                   options=STAT_OPTIONS)  # fmt: skip

    def graph(
        self, title: str, description: str, queries: list[tuple[str, str]], unit: str,
        width: int = 8, stacked: bool = False, exemplars: bool = False,
    ) -> None:  # fmt: skip
        custom = {"fillOpacity": 10, "showPoints": "never"}
        if stacked:
            custom["stacking"] = {"mode": "normal", "group": "A"}
        self.panel("timeseries", title, description, queries, unit, width,
                   options=GRAPH_OPTIONS, custom=custom, exemplars=exemplars)  # fmt: skip


def build() -> dict[str, Any]:
    """The dashboard as Grafana's JSON model."""
    d = Layout()
    d.row("Overview")
    d.stat(
        "Connections", "Open WebSockets, all workers.", f"sum(hubbub_connections{{{SEL}}})", "short"
    )
    d.stat(
        "Ready workers",
        "Workers passing /readyz (broker up, not draining).",
        f"sum(hubbub_ready{{{SEL}}})",
        "short",
    )
    d.stat(
        "Messages in",
        "Chat messages accepted per second.",
        f"sum(rate(hubbub_messages_published_total{{{SEL}}}[{RATE}]))",
        "reqps",
    )
    d.stat(
        "Deliveries",
        "Messages queued to recipient sockets per second.",
        f"sum(rate(hubbub_messages_delivered_total{{{SEL}}}[{RATE}]))",
        "reqps",
    )
    d.stat(
        "Fan-out p99",
        "99th percentile, publish to written on the socket.",
        _quantiles("hubbub_fanout_latency_seconds", 0.99)[0][0],
        "s",
    )
    d.stat(
        "Redis lag (max)",
        "Slowest worker's canary round trip through Redis pub/sub.",
        f"max(hubbub_broker_pubsub_lag_seconds{{{SEL}}})",
        "s",
    )

    d.row("Connections")
    d.graph(
        "Open connections",
        "Per instance (pod), all its workers.",
        [_q(f"sum by (instance) (hubbub_connections{{{SEL}}})", "{{instance}}")],
        "short",
        stacked=True,
    )
    d.graph(
        "Connections by transport",
        "WebSockets, and streams of the HTTP fallback (server-sent events + POSTs): a rising "
        "share of `sse` says proxies on users' way block WebSockets.",
        [_q(f"sum by (transport) (hubbub_connections_by_transport{{{SEL}}})", "{{transport}}")],
        "short",
        stacked=True,
    )
    d.graph(
        "Rebalancing",
        "Connections per instance (pod) against the average per instance; the average per "
        "worker that the census in Redis gives the workers (what each sheds down to); and "
        "connections shed with 1012 to move them to emptier workers: after a scale-out the "
        "old pods shed until their workers hold about that average (docs/operations.md).",
        [
            _q(f"sum by (instance) (hubbub_connections{{{SEL}}})", "{{instance}}"),
            _q(
                f"sum(hubbub_connections{{{SEL}}}) "
                f"/ count(count by (instance) (hubbub_connections{{{SEL}}}))",
                "average per instance",
            ),
            _q(
                f"max(hubbub_rebalance_average_connections{{{SEL}}})",
                "census: average per worker",
            ),
            _q(f"sum(rate(hubbub_rebalance_shed_total{{{SEL}}}[{RATE}]))", "shed/s"),
        ],
        "short",
    )
    d.graph(
        "Connects and disconnects",
        "Upgrades accepted, and connections ended, per second.",
        [
            _q(f"sum(rate(hubbub_connections_opened_total{{{SEL}}}[{RATE}]))", "connects"),
            _q(f"sum(rate(hubbub_connections_closed_total{{{SEL}}}[{RATE}]))", "disconnects"),
        ],
        "ops",
    )
    d.graph(
        "Disconnects by close code",
        "1000/1001 normal, 1006 lost, 1008 policy, 1012 drain, 1013 full, 4008 slow "
        "consumer, 4009 heartbeat timeout (docs/protocol.md).",
        [
            _q(
                f"sum by (code) (rate(hubbub_connections_closed_total{{{SEL}}}[{RATE}])) > 0",
                "{{code}}",
            )
        ],
        "ops",
        stacked=True,
    )

    d.graph(
        "Refused and forbidden",
        "Upgrades refused before a socket (HTTP 403: foreign Origin), and sockets closed for "
        "failed authentication (4001), moderation (4003) or per-user and per-address quotas "
        "(4029).",
        [
            _q(f"sum by (reason) (rate(hubbub_upgrades_refused_total{{{SEL}}}[{RATE}]))",
               "403 {{reason}}"),
            _q(f'sum by (code) (rate(hubbub_connections_closed_total{{{SEL}, '
               f'code=~"4001|4003|4029"}}[{RATE}]))', "close {{code}}"),
        ],
        "ops",
    )  # fmt: skip

    d.row("Messages")
    d.graph(
        "Messages in and out",
        "Accepted from clients; queued to recipients; WebSocket frames written (several "
        "messages may share a frame).",
        [
            _q(f"sum(rate(hubbub_messages_published_total{{{SEL}}}[{RATE}]))", "in"),
            _q(f"sum(rate(hubbub_messages_delivered_total{{{SEL}}}[{RATE}]))", "delivered"),
            _q(f"sum(rate(hubbub_frames_sent_total{{{SEL}}}[{RATE}]))", "frames written"),
        ],
        "ops",
    )
    d.graph(
        "Fan-out latency",
        "From publish until written to the recipient's socket (sampled).",
        _quantiles("hubbub_fanout_latency_seconds", 0.5, 0.9, 0.99),
        "s",
    )
    d.graph(
        "Client frames by type",
        "`rate_limited`: dropped by the per-connection limit.",
        [
            _q(
                f"sum by (type) (rate(hubbub_frames_received_total{{{SEL}}}[{RATE}])) > 0",
                "{{type}}",
            )
        ],
        "ops",
        stacked=True,
    )
    d.graph(
        "Error frames by code",
        "Refused frames; the connections stay open.",
        [_q(f"sum by (code) (rate(hubbub_error_frames_total{{{SEL}}}[{RATE}])) > 0", "{{code}}")],
        "ops",
        stacked=True,
    )
    d.graph(
        "Rooms",
        "Rooms with members on each worker (summed), joins held, and joins still catching up "
        "from history (after a join with since, or a lost Redis subscription).",
        [
            _q(f"sum(hubbub_rooms{{{SEL}}})", "rooms (per worker, summed)"),
            _q(f"sum(hubbub_room_memberships{{{SEL}}})", "memberships"),
            _q(f"sum(hubbub_room_memberships_behind{{{SEL}}})", "catching up"),
        ],
        "short",
    )
    d.graph(
        "Room size at join",
        "Users present in the room a connection joins.",
        _quantiles("hubbub_join_room_size", 0.5, 0.99),
        "short",
    )

    d.row("Back-pressure")
    d.graph(
        "Outbox",
        "Bytes waiting for slow sockets: all connections, and the fullest one "
        "(closed with 4008 at CHAT_OUTBOX_MAX_BYTES).",
        [
            _q(f"sum(hubbub_outbox_queued_bytes{{{SEL}}})", "all connections"),
            _q(f"max(hubbub_outbox_max_queued_bytes{{{SEL}}})", "fullest connection"),
        ],
        "bytes",
    )
    d.graph(
        "Slow consumers and rate limits",
        "Connections closed for not reading (4008), "
        "frames dropped by the rate limit, heartbeat timeouts (4009).",
        [
            _q(
                f'sum(rate(hubbub_connections_closed_total{{{SEL}, code="4008"}}[{RATE}]))',
                "slow consumers (4008)",
            ),
            _q(
                f'sum(rate(hubbub_frames_received_total{{{SEL}, type="rate_limited"}}[{RATE}]))',
                "rate-limited frames",
            ),
            _q(
                f'sum(rate(hubbub_connections_closed_total{{{SEL}, code="4009"}}[{RATE}]))',
                "heartbeat timeouts (4009)",
            ),
        ],
        "ops",
    )
    d.graph(
        "Connection duration",
        "How long connections last, when they end.",
        _quantiles("hubbub_connection_duration_seconds", 0.5, 0.9),
        "s",
    )

    d.row("Redis broker")
    d.graph(
        "Broker connected",
        "1 per worker with a live subscription; below the worker "
        "count means some workers lost Redis.",
        [_q(f"sum by (instance) (hubbub_broker_connected{{{SEL}}})", "{{instance}}")],
        "short",
    )
    d.graph(
        "Redis memory",
        "Redis' used memory and its maxmemory (0: none): with noeviction a full Redis refuses "
        "every send.",
        [
            _q(f"max(hubbub_redis_memory_used_bytes{{{SEL}}})", "used"),
            _q(f"max(hubbub_redis_memory_max_bytes{{{SEL}}})", "maxmemory"),
        ],
        "bytes",
    )
    d.graph(
        "Pub/sub lag",
        "Canary round trip through Redis, per worker.",
        [_q(f"hubbub_broker_pubsub_lag_seconds{{{SEL}}}", "{{instance}} pid {{pid}}")],
        "s",
    )
    d.graph(
        "Publish latency",
        "One publish (a Lua script: id, history, publish). The dots are exemplars: traced "
        "messages (CHAT_TRACING_ENDPOINT), each a link to its trace.",
        _quantiles("hubbub_broker_publish_duration_seconds", 0.5, 0.99),
        "s",
        exemplars=True,
    )
    d.graph(
        "Reconnects and failures",
        "Subscription losses by reason (deaf: found by the "
        "canary) and publishes refused while Redis was down.",
        [
            _q(
                f"sum by (reason) (increase(hubbub_broker_reconnects_total{{{SEL}}}[{RATE}]))",
                "reconnects ({{reason}})",
            ),
            _q(
                f"sum(increase(hubbub_broker_publish_failures_total{{{SEL}}}[{RATE}]))",
                "publish failures",
            ),
        ],
        "short",
    )

    d.row("Store")
    d.graph(
        "Archive lag",
        "Age of the oldest message not yet stored in PostgreSQL (alert "
        "HubbubArchiveLagging), and how many wait. Grows while the store is down; chat goes on.",
        [
            _q(f"max(hubbub_archive_lag_seconds{{{SEL}}})", "oldest waiting (s)"),
        ],
        "s",
    )
    d.graph(
        "Archiving",
        "Messages stored per second, batches the store failed to take (each retried), "
        "messages dropped past CHAT_ARCHIVE_BACKLOG_MAX (never stored), and messages the "
        "store refused for their data (left out, alert HubbubArchiveRejected), and stored "
        "rows the search indexer has not reached yet.",
        [
            _q(f"sum(rate(hubbub_archived_total{{{SEL}}}[{RATE}]))", "stored/s"),
            _q(f"sum(rate(hubbub_archive_failures_total{{{SEL}}}[{RATE}]))", "failures/s"),
            _q(f"sum(rate(hubbub_archive_dropped_total{{{SEL}}}[{RATE}]))", "dropped/s"),
            _q(f"sum(rate(hubbub_archive_rejected_total{{{SEL}}}[{RATE}]))", "rejected/s"),
            _q(f"max(hubbub_archive_lag_messages{{{SEL}}})", "waiting"),
            _q(f"sum(hubbub_archive_leader{{{SEL}}})", "archiving workers (should be 1)"),
            _q(f"max(hubbub_search_backlog{{{SEL}}})", "waiting to be indexed for search"),
        ],
        "short",
    )

    d.row("Files")
    d.graph(
        "Files",
        "Uploads started, files sent in messages, and files deleted (with their messages, "
        "by retention, or never sent), per second.",
        [
            _q(f"sum(rate(hubbub_file_uploads_total{{{SEL}}}[{RATE}]))", "uploads/s"),
            _q(f"sum(rate(hubbub_files_attached_total{{{SEL}}}[{RATE}]))", "sent/s"),
            _q(f"sum(rate(hubbub_files_deleted_total{{{SEL}}}[{RATE}]))", "deleted/s"),
        ],
        "short",
    )
    d.graph(
        "File storage errors",
        "Calls to the file storage that failed, by operation: users got storage_unavailable "
        "(upload, attach, link), or a deletion waits for the next sweep (alert "
        "HubbubFileStorageFailing).",
        [
            _q(
                f"sum by (operation) (rate(hubbub_file_storage_errors_total{{{SEL}}}[{RATE}]))",
                "{{operation}}/s",
            ),
        ],
        "short",
    )

    d.row("Webhooks")
    d.graph(
        "Webhook lag",
        "Age of the oldest event waiting in the webhook queue (alert HubbubWebhooksLagging) and "
        "how many wait. Grows while the backend fails or is slow; chat goes on.",
        [
            _q(f"max(hubbub_webhook_lag_seconds{{{SEL}}})", "oldest waiting (s)"),
        ],
        "s",
    )
    d.graph(
        "Webhook deliveries",
        "Attempts per second by outcome: delivered (2xx), failed (retried with backoff), "
        "given_up (failing for CHAT_WEBHOOK_RETRY_MAX_S); events waiting, and events never "
        "queued (the queue was full). Alerts HubbubWebhooksFailing, HubbubWebhooksLost.",
        [
            _q(
                f"sum by (outcome) (rate(hubbub_webhook_deliveries_total{{{SEL}}}[{RATE}]))",
                "{{outcome}}/s",
            ),
            _q(f"max(hubbub_webhook_backlog{{{SEL}}})", "waiting"),
            _q(f"max(hubbub_webhook_events_not_queued{{{SEL}}})", "never queued (total)"),
        ],
        "short",
    )

    d.row("Workers")
    d.graph(
        "CPU per worker",
        "Cores used by each worker process.",
        [_q(f"rate(hubbub_worker_cpu_seconds{{{SEL}}}[{RATE}])", "{{instance}} pid {{pid}}")],
        "percentunit",
    )
    d.graph(
        "Memory per worker",
        "Resident memory of each worker process.",
        [_q(f"hubbub_worker_resident_memory_bytes{{{SEL}}}", "{{instance}} pid {{pid}}")],
        "bytes",
    )
    d.graph(
        "Garbage-collector pauses",
        "p99 pause of Python's cyclic garbage collector by generation; the worker serves "
        "nobody meanwhile (generation 2 walks every open socket's objects).",
        _quantiles("hubbub_gc_pause_seconds", 0.99, by="generation"),
        "s",
    )
    d.graph(
        "Garbage collector: objects found in cycles",
        "Objects the collector found in reference cycles and freed, by generation: serving "
        "should make none; a steady rate is a cycle per connection or message, which objects "
        "frozen out of its sight (CHAT_GC_FREEZE_INTERVAL_S) would leak.",
        [
            _q(
                f"sum by (generation) (rate(hubbub_gc_collected_objects_total{{{SEL}}}[{RATE}]))",
                "generation {{generation}}",
            ),
        ],
        "short",
    )
    d.graph(
        "Fast paths",
        "Each fast path on dependencies' internals: 1 when live on every worker, 0 when off "
        "on some; and connections written through ASGI instead of directly, by reason "
        "(permessage_deflate is expected when compression is on).",
        [
            _q(f"min by (path) (hubbub_fast_path_live{{{SEL}}})", "live: {{path}}"),
            _q(
                f"sum by (reason) (increase(hubbub_transport_fallbacks_total{{{SEL}}}[{RATE}]))",
                "fallbacks ({{reason}})",
            ),
        ],
        "short",
    )
    d.graph(
        "Draining and HTTP",
        "Workers draining (deploys), and HTTP requests by handler.",
        [
            _q(f"sum(hubbub_draining{{{SEL}}})", "draining workers"),
            _q(f"sum by (handler) (rate(http_requests_total{{{SEL}}}[{RATE}]))", "{{handler}}"),
        ],
        "short",
    )

    d.row("Notifications")
    d.graph(
        "Notifications decided",
        "Pending notifications the notifier (on the archiving worker) decided per second: sent "
        "(pushed and/or to the notification.needed webhook), or why not: read (the user read "
        "it first), visible (a visible connection of theirs), unwanted (level or mute), "
        "forbidden (may no longer read the conversation), deleted (the message was), deferred "
        "(within CHAT_NOTIFY_INTERVAL_S of the last, or presence unknown: decided later).",
        [
            _q(
                f"sum by (outcome) (rate(hubbub_notifications_total{{{SEL}}}[{RATE}]))",
                "{{outcome}}/s",
            ),
        ],
        "short",
        stacked=True,
    )
    d.graph(
        "Web Pushes",
        "Requests to the browsers' push services per second, by outcome: delivered (2xx), gone "
        "(404/410: the subscription was removed), failed (an error, a timeout, any other "
        "status; not retried). Alert HubbubWebPushFailing.",
        [
            _q(
                f"sum by (outcome) (rate(hubbub_web_pushes_total{{{SEL}}}[{RATE}]))",
                "{{outcome}}/s",
            ),
        ],
        "short",
    )

    d.row("User safety")
    d.graph(
        "Moderation hook decisions",
        "Users' messages and edits the moderation hook (CHAT_MODERATION_HOOK_URL) decided per "
        "second: accept, reject, replace; failed_accept / failed_reject when it failed or was "
        "slow and CHAT_MODERATION_HOOK_ON_FAILURE decided. Alert HubbubModerationHookFailing.",
        [
            _q(
                f"sum by (decision) (rate(hubbub_moderation_decisions_total{{{SEL}}}[{RATE}]))",
                "{{decision}}/s",
            ),
        ],
        "short",
        stacked=True,
    )
    d.graph(
        "Moderation hook wait",
        "How long messages waited for the hook's decision (p50, p95): every message of a user "
        "waits this before it is published.",
        [
            _q(
                "histogram_quantile(0.5, sum by (le) "
                f"(rate(hubbub_moderation_hook_seconds_bucket{{{SEL}}}[{RATE}])))",
                "p50",
            ),
            _q(
                "histogram_quantile(0.95, sum by (le) "
                f"(rate(hubbub_moderation_hook_seconds_bucket{{{SEL}}}[{RATE}])))",
                "p95",
            ),
        ],
        "s",
    )
    d.graph(
        "Moderation hook requests",
        "Requests to the hook per second and the messages each carried on average: under load "
        "messages wait for a request under way and go together (CHAT_MODERATION_HOOK_BATCH_MAX).",
        [
            _q(
                f"sum(rate(hubbub_moderation_hook_batch_size_count{{{SEL}}}[{RATE}]))",
                "requests/s",
            ),
            _q(
                f"sum(rate(hubbub_moderation_hook_batch_size_sum{{{SEL}}}[{RATE}])) / "
                f"sum(rate(hubbub_moderation_hook_batch_size_count{{{SEL}}}[{RATE}]))",
                "messages per request",
            ),
        ],
        "short",
    )
    d.graph(
        "Reports",
        "Messages reported (a new report in the moderators' queue) and reports resolved "
        "(dismissed, or deleted: the message was) per minute.",
        [
            _q(
                f"sum by (outcome) (rate(hubbub_reports_total{{{SEL}}}[{RATE}])) * 60",
                "{{outcome}}/min",
            ),
        ],
        "short",
    )

    return {
        "uid": "hubbub",
        "title": "Hubbub",
        "description": "Hubbub chat service: connections, messages, fan-out latency, "
        "back-pressure, Redis broker and workers.",
        "tags": ["hubbub", "websocket", "chat"],
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "timezone": "browser",
        "fiscalYearStartMonth": 0,
        "liveNow": False,
        "links": [],
        "annotations": {"list": []},
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Data source",
                    "type": "datasource",
                    "query": "prometheus",
                    "refresh": 1,
                    "hide": 0,
                },
                {
                    "name": "instance",
                    "label": "Instance",
                    "type": "query",
                    "datasource": DATASOURCE,
                    "query": {
                        "query": 'label_values(hubbub_connections{job="hubbub"}, instance)',
                        "refId": "instances",
                    },
                    "definition": 'label_values(hubbub_connections{job="hubbub"}, instance)',
                    "includeAll": True,
                    "multi": True,
                    "allValue": ".*",
                    "refresh": 2,
                    "sort": 1,
                    "current": {"text": ["All"], "value": ["$__all"]},
                },
            ]
        },
        "panels": d.panels,
    }


def render() -> str:
    return json.dumps(build(), indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if the file is stale")
    args = parser.parse_args(argv)
    if args.check:
        if OUTPUT.read_text() != render():
            print(f"{OUTPUT} is stale: run `make dashboard`", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(render())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
