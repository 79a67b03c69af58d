#!/usr/bin/env bash
# Ensure .tools/bin/jaeger: the OpenTelemetry collector and trace store the tracing tests send
# spans to and read them back from (Jaeger v2 "all-in-one": OTLP receiver, memory storage,
# query API; its configuration: loadtest/collector.py). Debian does not package it: it is built
# from its Go module once, in a few minutes (scripts/go-program.sh).
set -euo pipefail
exec bash "$(dirname "$0")/go-program.sh" jaeger github.com/jaegertracing/jaeger v1.76.0 ./cmd/jaeger
