#!/usr/bin/env bash
# Ensure .tools/bin/weed: the SeaweedFS server the tests run as their S3 store (file attachments).
# SeaweedFS because it is Apache-2.0 and its S3 gateway checks SigV4 signatures, presigned URLs'
# expiry and presigned POST policies (content-length-range included); the MinIO server is AGPL,
# and Ceph's radosgw needs a whole cluster. Debian does not package it: it is built from its Go
# module (which go checks against the Go checksum database), once, in a few minutes; the Go
# toolchain is fetched from the Go module proxy when the machine has no recent enough go
# (scripts/go-toolchain.sh).
set -euo pipefail

# The module version (a pseudo-version: SeaweedFS 4.53); scripts/go-toolchain.sh gives a Go
# recent enough for it (its go.mod wants go >= 1.26.6).
WEED_MODULE=github.com/seaweedfs/seaweedfs
WEED_VERSION=v0.0.0-20261109003541-7506e5f91cd6

cd "$(dirname "$0")/.."
TOOLS=$PWD/.tools
WEED=$TOOLS/bin/weed
# weed.version records the version built: bumping WEED_VERSION rebuilds.
[ -x "$WEED" ] && [ "$(cat "$WEED.version" 2>/dev/null)" = "$WEED_VERSION" ] && exit 0

echo "seaweedfs.sh: building SeaweedFS $WEED_VERSION into .tools/bin/weed (once, a few minutes)"
GO=$(bash scripts/go-toolchain.sh)

# The module's go.mod has a replace directive, so `go install module@version` refuses it: build
# a copy of it as the main module (-mod=mod lets go fill in go.sum's missing entries).
export GOTOOLCHAIN=local GO111MODULE=on
mkdir -p "$TOOLS/bin"
work=$(mktemp -d "$TOOLS/weed-build.XXXXXX")
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
log=$work/build.log
if ! (
  cd "$work" &&
  dir=$("$GO" mod download -json "$WEED_MODULE@$WEED_VERSION" | python3 -c \
        'import json, sys; d = json.load(sys.stdin); print(d.get("Dir") or sys.exit(d.get("Error")))') &&
  cp -r "$dir" src && chmod -R u+w src && cd src &&
  GOFLAGS="-mod=mod -buildvcs=false" nice -n 10 "$GO" build -trimpath -ldflags="-s -w" -o "$work/weed" ./weed
) >"$log" 2>&1; then
  tail -n 30 "$log" >&2
  echo "seaweedfs.sh: building SeaweedFS failed (the lines above are the end of its log)" >&2
  exit 1
fi
"$work/weed" version >/dev/null 2>&1
install -m 0755 "$work/weed" "$WEED.tmp"
mv "$WEED.tmp" "$WEED"
echo "$WEED_VERSION" >"$WEED.version"
