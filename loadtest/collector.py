"""The OpenTelemetry collector the tracing tests and ``make bench-tracing`` run: Jaeger v2
(``.tools/bin/jaeger``, built by ``make otel-deps``), taking OTLP/HTTP, keeping spans in
memory, with its query API; every port on loopback."""

from __future__ import annotations

from pathlib import Path
from typing import Final

JAEGER: Final = Path(__file__).resolve().parent.parent / ".tools/bin/jaeger"


def jaeger_config(otlp: int, query: int, grpc: int, health: int) -> str:
    """Jaeger's configuration: OTLP/HTTP in on ``otlp``, the query API (HTTP) on ``query``
    and gRPC on ``grpc``, the health check on ``health``; no metrics endpoint of its own."""
    return (
        "service:\n"
        "  extensions: [jaeger_storage, jaeger_query, healthcheckv2]\n"
        "  pipelines:\n"
        "    traces:\n"
        "      receivers: [otlp]\n"
        "      processors: [batch]\n"
        "      exporters: [jaeger_storage_exporter]\n"
        "  telemetry:\n"
        "    metrics:\n"
        "      level: none\n"
        "extensions:\n"
        "  healthcheckv2:\n"
        "    use_v2: true\n"
        "    http:\n"
        f"      endpoint: 127.0.0.1:{health}\n"
        "  jaeger_query:\n"
        "    storage:\n"
        "      traces: memstore\n"
        "    http:\n"
        f"      endpoint: 127.0.0.1:{query}\n"
        "    grpc:\n"
        f"      endpoint: 127.0.0.1:{grpc}\n"
        "  jaeger_storage:\n"
        "    backends:\n"
        "      memstore:\n"
        "        memory:\n"
        "          max_traces: 100000\n"
        "receivers:\n"
        "  otlp:\n"
        "    protocols:\n"
        "      http:\n"
        f"        endpoint: 127.0.0.1:{otlp}\n"
        "processors:\n"
        "  batch:\n"
        "    timeout: 100ms\n"
        "exporters:\n"
        "  jaeger_storage_exporter:\n"
        "    trace_storage: memstore\n"
    )
