#!/usr/bin/env bash
# Ensure .tools/bin/weed: the SeaweedFS server the tests run as their S3 store (file attachments).
# SeaweedFS because it is Apache-2.0 and its S3 gateway checks SigV4 signatures, presigned URLs'
# expiry and presigned POST policies (content-length-range included); the MinIO server is AGPL,
# and Ceph's radosgw needs a whole cluster. Debian does not package it: it is built from its Go
# module (which go checks against the Go checksum database), once, in a few minutes; the Go
# toolchain is fetched from the Go module proxy when the machine has no recent enough go.
set -euo pipefail

# The module version (a pseudo-version: SeaweedFS 4.53) and the Go release that builds it (its
# go.mod wants go >= 1.26.6; an older go on PATH is not used, this one is fetched instead).
WEED_MODULE=github.com/seaweedfs/seaweedfs
WEED_VERSION=v0.0.0-20261109003541-7506e5f91cd6
GO_MIN=1.26.6
GO_VERSION=1.26.8

cd "$(dirname "$0")/.."
TOOLS=$PWD/.tools
WEED=$TOOLS/bin/weed
# weed.version records the version built: bumping WEED_VERSION rebuilds.
[ -x "$WEED" ] && [ "$(cat "$WEED.version" 2>/dev/null)" = "$WEED_VERSION" ] && exit 0

echo "seaweedfs.sh: building SeaweedFS $WEED_VERSION into .tools/bin/weed (once, a few minutes)"

go_ok() {  # is "$1" a go binary whose version is >= GO_MIN?
  local v
  v=$("$1" env GOVERSION 2>/dev/null) || return 1
  v=${v#go}
  printf '%s\n%s\n' "$GO_MIN" "${v%%[!0-9.]*}" | sort -V -C
}

GO=$(command -v go || true)
if [ -z "$GO" ] || ! go_ok "$GO"; then
  GO=$TOOLS/go/bin/go
  if ! go_ok "$GO"; then
    case $(uname -m) in
      x86_64) arch=amd64 ;;
      aarch64 | arm64) arch=arm64 ;;
      *) echo "seaweedfs.sh: no Go toolchain for $(uname -m)" >&2; exit 1 ;;
    esac
    name=v0.0.1-go$GO_VERSION.linux-$arch
    echo "seaweedfs.sh: fetching Go $GO_VERSION into .tools/go"
    rm -rf "$TOOLS/go"
    # python3 rather than curl + unzip, which a bare Debian lacks; ZipFile.extractall drops the
    # file modes, so they are restored from each member's Unix attributes.
    python3 - "https://proxy.golang.org/golang.org/toolchain/@v/$name.zip" \
      "golang.org/toolchain@$name/" "$TOOLS/go" <<'EOF'
import os, shutil, sys, tempfile, urllib.request, zipfile

url, prefix, dest = sys.argv[1:]
with tempfile.TemporaryFile() as tmp:
    with urllib.request.urlopen(url, timeout=60) as response:
        shutil.copyfileobj(response, tmp)
    with zipfile.ZipFile(tmp) as archive:
        for member in archive.infolist():
            if not member.filename.startswith(prefix) or member.is_dir():
                continue
            target = os.path.join(dest, member.filename[len(prefix):])
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with archive.open(member) as src, open(target, "wb") as out:
                shutil.copyfileobj(src, out)
            os.chmod(target, (member.external_attr >> 16) & 0o777 or 0o644)
EOF
    go_ok "$GO" || { echo "seaweedfs.sh: the fetched Go does not run" >&2; exit 1; }
  fi
fi

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
