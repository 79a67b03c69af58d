#!/bin/sh
# Issue 34's many-core figures on a lent machine (the session tool `device`: 16 cores, no
# package registry, its own Python 3.12), from the bundle `scripts/device-bundle.sh` packs:
#
#   device run, carry [".device"]:  sh scripts/device-scale.sh smoke   (~1 min: it all works)
#                                   sh scripts/device-scale.sh curve   (~6 min, estimated: W = 1, 2, 4, 8)
#                                   sh scripts/device-scale.sh pairs   (~3 min, estimated: rooms of 2)
#
#   smoke  W=1, 200 clients in rooms of 10 for 2 s, Hubbub and Centrifugo.
#   curve  `make bench-scale`: 10,000 clients in rooms of 10 at saturation, W = 1, 2, 4, 8 on
#          one Redis, Hubbub beside Centrifugo (GOMAXPROCS=W): deliveries/s, speed-up, p99.
#   pairs  10,000 clients in rooms of 2 on all 16 cores (8 workers, Redis, 7 generators),
#          50,000 messages a second offered (open loop): the round trips' p50 and p99 there;
#          then the same at saturation.
#
# The JSON reports go to $OUT (the tool brings them back); everything else to /tmp. Locally
# (to try the bundle as that machine will use it): OUT=/tmp/x PYTHON=python3.12 sh ... smoke;
# CLIENTS, RATE and WORKERS scale `curve` and `pairs` down for such a try (defaults 10000,
# 50000 and, for `pairs`, 8).
set -eu

phase=${1:-smoke}
out=${OUT:-/tmp/hubbub-device}
python=${PYTHON:-python3}
clients=${CLIENTS:-10000}
rate=${RATE:-50000}
workers=${WORKERS:-8}
mkdir -p "$out"
cd "$(dirname "$0")/.."

site=/tmp/hubbub-site
if [ ! -d "$site" ]; then
  "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" \
    .device/wheels/*.whl
fi
redis=/tmp/hubbub-redis
if [ ! -d "$redis" ]; then
  "$python" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
    .device/redis.tar.xz "$redis"
fi
# Where loadtest/centrifugo.py looks for the anchor's binary once it is unpacked.
"$python" - .device/centrifugo-*-linux-amd64.xz <<'EOF'
import lzma, os, shutil, sys, tempfile
from pathlib import Path
packed = Path(sys.argv[1])
binary = Path(tempfile.gettempdir()) / ("hubbub-" + packed.name.split("-linux")[0])
if not binary.exists():
    with lzma.open(packed) as source, open(f"{binary}.partial", "wb") as target:
        shutil.copyfileobj(source, target)
    os.chmod(f"{binary}.partial", 0o755)
    os.replace(f"{binary}.partial", binary)
EOF
for tool in taskset nproc; do
  command -v "$tool" >/dev/null || { echo "$tool is missing: loadtest.scale pins with it" >&2; exit 1; }
done
# 10,000 sockets: a generator holds some 1,400, the server all of them (it raises its own).
ulimit -n "$(ulimit -H -n)" 2>/dev/null || true
export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}" PATH="$redis/bin:$site/bin:$PATH" PYTHONUNBUFFERED=1

echo "== $(nproc) cores; $("$python" --version); $(command -v redis-server):" \
  "$(redis-server --version | cut -d' ' -f1-3)"
scale() {
  "$python" -m loadtest.scale "$@"
}
case $phase in
  smoke)
    scale --workers 1 --clients 200 --warm 1 --seconds 2 --json "$out/smoke.json" ;;
  curve)
    scale --workers 1,2,4,8 --clients "$clients" --json "$out/scale.json" ;;
  pairs)
    scale --workers "$workers" --clients "$clients" --room-size 2 --rate "$rate" \
      --json "$out/pairs-offered.json"
    scale --workers "$workers" --clients "$clients" --room-size 2 \
      --json "$out/pairs-saturated.json" ;;
  *)
    echo "usage: $0 smoke|curve|pairs" >&2
    exit 2 ;;
esac
