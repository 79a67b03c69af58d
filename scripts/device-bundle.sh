#!/usr/bin/env bash
# Pack into .device/ what `scripts/device-scale.sh` needs on a lent many-core machine, which
# reaches no package registry and has a Python 3.12 of its own, no Redis and no Centrifugo:
#   .device/wheels/       the locked runtime dependencies (and the load generator's), as
#                         CPython 3.12 manylinux wheels (pure-Python sdists built into wheels);
#   .device/redis.tar.xz  this machine's redis-server with the shared libraries it links
#                         (other than glibc's), behind a wrapper that points it at them;
#   .device/centrifugo-*.xz  the anchor's binary (../shared/anchors/centrifugo/).
# The device tool carries it: `carry: [".device"]` (about 45 MiB with the repo's 7; its limit
# is 64 MiB). Run from anywhere; needs `make install` (uv, pip) and network to PyPI.
set -euo pipefail

cd "$(dirname "$0")/.."
OUT=.device
PY_VERSION=3.12
# Left out to stay well within the tool's 64 MiB: the largest wheels, not imported by the
# server or the benchmarks' tools unless their features are on (files in S3, PostgreSQL), and
# Pillow, which the machine's image has (thumbnails only).
SKIP='^(aiobotocore|botocore|jmespath|aioitertools|python-dateutil|six|asyncpg|pillow)=='
# The load generator's (loadtest/): the dev group's picows, at the version in the lock.
EXTRA=(picows)
PLATFORMS=()
for tag in manylinux1 manylinux2014 manylinux_2_5 manylinux_2_17 manylinux_2_24 \
  manylinux_2_27 manylinux_2_28 manylinux_2_31 manylinux_2_34; do
  PLATFORMS+=(--platform "${tag}_x86_64")
done

rm -rf "$OUT" && mkdir -p "$OUT/wheels"
requirements=$OUT/requirements.txt
# The lock's pins whose markers hold for CPython $PY_VERSION on x86-64 Linux.
.tools/bin/uv export --frozen --no-dev --no-hashes --no-emit-project \
  | .tools/bin/python -c '
import sys
from pip._vendor.packaging.requirements import Requirement
version = sys.argv[1]
target = {"python_version": version, "python_full_version": version + ".3",
          "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
          "implementation_name": "cpython", "platform_python_implementation": "CPython"}
for line in sys.stdin:
    if line[:1].isalnum():
        requirement = Requirement(line)
        if requirement.marker is None or requirement.marker.evaluate(target):
            print(f"{requirement.name}{requirement.specifier}")
' "$PY_VERSION" | grep -Ev "$SKIP" > "$requirements"
for name in "${EXTRA[@]}"; do
  echo "$name==$(.venv/bin/python -c "import importlib.metadata as m; print(m.version('$name'))")" \
    >> "$requirements"
done

while read -r requirement; do
  if ! .tools/bin/pip download --quiet --disable-pip-version-check --no-deps \
      --only-binary=:all: --python-version "$PY_VERSION" --implementation cp "${PLATFORMS[@]}" \
      -d "$OUT/wheels" "$requirement" >/dev/null 2>&1; then
    # No wheel for it: a pure-Python sdist, built here into a wheel any Python takes.
    .tools/bin/pip wheel --quiet --disable-pip-version-check --no-deps -w "$OUT/wheels" \
      "$requirement" >/dev/null
  fi
done < "$requirements"

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib"
cp "$(command -v redis-server)" "$stage/lib/redis-server.bin"
ldd "$(command -v redis-server)" | awk '/=> \// {print $3}' \
  | { grep -Ev '/(libc|libm|libpthread|libdl|librt|ld-linux[^/]*)\.so' || true; } \
  | while read -r library; do cp -L "$library" "$stage/lib/"; done
cat > "$stage/bin/redis-server" <<'EOF'
#!/bin/sh
# This bundle's redis-server, with the libraries it was built against (scripts/device-bundle.sh).
here=$(dirname "$(readlink -f "$0")")/../lib
LD_LIBRARY_PATH=$here exec "$here/redis-server.bin" "$@"
EOF
chmod +x "$stage/bin/redis-server"
tar -cJf "$OUT/redis.tar.xz" -C "$stage" bin lib

cp ../shared/anchors/centrifugo/centrifugo-*-linux-amd64.xz "$OUT/"

echo "$OUT: $(ls "$OUT/wheels" | wc -l) wheels, $(du -sh "$OUT" | cut -f1) in all"
