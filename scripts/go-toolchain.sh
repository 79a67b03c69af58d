#!/usr/bin/env bash
# Print the path of a Go toolchain able to build the tests' tools (SeaweedFS, kube-apiserver,
# kubectl, helm): the `go` on PATH when it is recent enough, else Go $GO_VERSION fetched once
# from the Go module proxy into .tools/go (a bare Debian has none; Debian's is too old).
# Messages go to stderr; stdout is only the path.
set -euo pipefail

# SeaweedFS's go.mod wants go >= 1.26.6; an older go on PATH is not used, this one is fetched.
GO_MIN=1.26.6
GO_VERSION=1.26.8

cd "$(dirname "$0")/.."
TOOLS=$PWD/.tools

go_ok() {  # is "$1" a go binary whose version is >= GO_MIN?
  local v
  v=$("$1" env GOVERSION 2>/dev/null) || return 1
  v=${v#go}
  printf '%s\n%s\n' "$GO_MIN" "${v%%[!0-9.]*}" | sort -V -C
}

GO=$(command -v go || true)
if [ -n "$GO" ] && go_ok "$GO"; then
  echo "$GO"
  exit 0
fi
GO=$TOOLS/go/bin/go
if go_ok "$GO"; then
  echo "$GO"
  exit 0
fi
case $(uname -m) in
  x86_64) arch=amd64 ;;
  aarch64 | arm64) arch=arm64 ;;
  *) echo "go-toolchain.sh: no Go toolchain for $(uname -m)" >&2; exit 1 ;;
esac
name=v0.0.1-go$GO_VERSION.linux-$arch
echo "go-toolchain.sh: fetching Go $GO_VERSION into .tools/go" >&2
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
go_ok "$GO" || { echo "go-toolchain.sh: the fetched Go does not run" >&2; exit 1; }
echo "$GO"
