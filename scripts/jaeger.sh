#!/usr/bin/env bash
# Ensure .tools/bin/jaeger: the OpenTelemetry collector and trace store the tracing tests send
# spans to and read them back from (Jaeger v2 "all-in-one": OTLP receiver, memory storage,
# query API), built once from its Go module (checked against the Go checksum database), a few
# minutes; the Go toolchain comes from scripts/go-toolchain.sh. Debian does not package it.
set -euo pipefail
JAEGER_MODULE=github.com/jaegertracing/jaeger
JAEGER_VERSION=v1.76.0

cd "$(dirname "$0")/.."
TOOLS=$PWD/.tools
JAEGER=$TOOLS/bin/jaeger
# jaeger.version records the version built: bumping JAEGER_VERSION rebuilds.
[ -x "$JAEGER" ] && [ "$(cat "$JAEGER.version" 2>/dev/null)" = "$JAEGER_VERSION" ] && exit 0

echo "jaeger.sh: building Jaeger $JAEGER_VERSION into .tools/bin/jaeger (once, a few minutes)"
GO=$(bash scripts/go-toolchain.sh)
# Its go.mod has a replace directive, so `go install module@version` refuses it: build a copy
# of it as the main module (-mod=mod lets go fill in go.sum's missing entries).
export GOTOOLCHAIN=local GO111MODULE=on
mkdir -p "$TOOLS/bin"
work=$(mktemp -d "$TOOLS/jaeger-build.XXXXXX")
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
log=$work/build.log
if ! (
  cd "$work" &&
  dir=$("$GO" mod download -json "$JAEGER_MODULE@$JAEGER_VERSION" | python3 -c \
        'import json, sys; d = json.load(sys.stdin); print(d.get("Dir") or sys.exit(d.get("Error")))') &&
  cp -r "$dir" src && chmod -R u+w src && cd src &&
  GOFLAGS="-mod=mod -buildvcs=false" nice -n 10 "$GO" build -trimpath -ldflags="-s -w" \
    -o "$work/jaeger" ./cmd/jaeger
) >"$log" 2>&1; then
  tail -n 30 "$log" >&2
  echo "jaeger.sh: building Jaeger failed (the lines above are the end of its log)" >&2
  exit 1
fi
install -m 0755 "$work/jaeger" "$JAEGER.tmp"
mv "$JAEGER.tmp" "$JAEGER"
echo "$JAEGER_VERSION" >"$JAEGER.version"
