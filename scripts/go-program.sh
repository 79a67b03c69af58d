#!/usr/bin/env bash
# Ensure .tools/bin/NAME: the program in directory PACKAGE of Go module MODULE at VERSION,
# built once (the module is checked against the Go checksum database) with the Go toolchain of
# scripts/go-toolchain.sh; NAME.version records VERSION, so bumping it rebuilds.
#
#   scripts/go-program.sh NAME MODULE VERSION PACKAGE
#
# Built from a copy of the module as the main module: `go install module@version` refuses a
# module whose go.mod has replace directives (SeaweedFS's, Jaeger's), and -mod=mod lets go
# fill in go.sum's missing entries. On failure, the end of the build's log goes to stderr.
set -euo pipefail
NAME=$1 MODULE=$2 VERSION=$3 PACKAGE=$4

cd "$(dirname "$0")/.."
TOOLS=$PWD/.tools
OUT=$TOOLS/bin/$NAME
[ -x "$OUT" ] && [ "$(cat "$OUT.version" 2>/dev/null)" = "$VERSION" ] && exit 0

echo "go-program.sh: building $NAME ($MODULE $VERSION) into .tools/bin (once, a few minutes)"
GO=$(bash scripts/go-toolchain.sh)
export GOTOOLCHAIN=local GO111MODULE=on
mkdir -p "$TOOLS/bin"
work=$(mktemp -d "$TOOLS/$NAME-build.XXXXXX")
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
log=$work/build.log
if ! (
  cd "$work" &&
  dir=$("$GO" mod download -json "$MODULE@$VERSION" | python3 -c \
        'import json, sys; d = json.load(sys.stdin); print(d.get("Dir") or sys.exit(d.get("Error")))') &&
  cp -r "$dir" src && chmod -R u+w src && cd src &&
  GOFLAGS="-mod=mod -buildvcs=false" nice -n 10 "$GO" build -trimpath -ldflags="-s -w" \
    -o "$work/$NAME" "$PACKAGE"
) >"$log" 2>&1; then
  tail -n 30 "$log" >&2
  echo "go-program.sh: building $NAME failed (the lines above are the end of its log)" >&2
  exit 1
fi
install -m 0755 "$work/$NAME" "$OUT.tmp"
mv "$OUT.tmp" "$OUT"
echo "$VERSION" >"$OUT.version"
