#!/usr/bin/env bash
# Build the Hubbub image for real and run it: the Dockerfile works, not just lints.
#
#   sudo scripts/docker-smoke.sh          (needs root: it runs its own dockerd)
#
# What it does, on this host only, with loopback traffic only:
#   1. installs docker.io / debootstrap / redis-server / curl if they are missing;
#   2. starts a private dockerd under $HUBBUB_SMOKE_DIR (default /tmp/hubbub-docker) and always
#      stops it again (by its PID), with every container it made;
#   3. builds, once, a local base image (Debian bookworm minbase + python3 3.11, python3-venv,
#      ca-certificates and this host's extra CAs, PIP_CERT set): no registry is needed;
#   4. docker build --build-arg BASE_IMAGE=<that base> -t hubbub:smoke .
#   5. runs it with --network host against a throwaway redis-server, CHAT_WORKERS=2, in the
#      image's default auth mode (jwt): first without a key, where it must refuse to start and
#      name CHAT_JWT_SECRET, then with a throwaway HS256 key (the clients send tokens signed
#      with it);
#   6. waits for the HEALTHCHECK to say healthy and checks every process runs as uid 10001;
#   7. does a WebSocket chat round trip (hello, join, send -> message + ack, fan-out to a second
#      client), checks /metrics on the metrics port (hubbub_connections counts a held socket)
#      and that /metrics on the chat port is 404;
#   8. docker stop -t 40: the container must exit 0 by itself (the drain), the held socket must
#      be closed with 1012 and every worker must log "drained".
#
# Settings (environment): HUBBUB_SMOKE_DIR, HUBBUB_SMOKE_IMAGE (hubbub:smoke),
# HUBBUB_SMOKE_BASE (hubbub-smoke/base:bookworm-py311), HUBBUB_SMOKE_REBUILD_BASE=1 (rebuild the
# base even if it exists), HUBBUB_SMOKE_MIRROR (Debian mirror; default: the host's apt sources),
# HUBBUB_SMOKE_PYTHON (a python with `websockets`; default .venv/bin/python).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WORK=${HUBBUB_SMOKE_DIR:-/tmp/hubbub-docker}
IMAGE=${HUBBUB_SMOKE_IMAGE:-hubbub:smoke}
BASE=${HUBBUB_SMOKE_BASE:-hubbub-smoke/base:bookworm-py311}
CLIENT_PY=${HUBBUB_SMOKE_PYTHON:-$REPO/.venv/bin/python}
WORKERS=2
LABEL=hubbub.smoke=1

DOCKERD_PID=""
REDIS_PID=""
HOLD_PID=""
CONTAINER=""
NOKEY_CONTAINER=""
ROOTFS=""
declare -a TIMINGS=()

log() { printf '[docker-smoke %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() {
    log "FAIL: $*"
    exit 1
}
now_ms() {
    local t=${EPOCHREALTIME/[.,]/}
    echo $((t / 1000))
}
# record NAME START_MS [NOTE]
record() {
    local ms=$(($(now_ms) - $2))
    TIMINGS+=("$(printf '  %-22s %6d.%01d s  %s' "$1" $((ms / 1000)) $((ms % 1000 / 100)) "${3:-}")")
}
alive() { [[ -n $1 ]] && kill -0 "$1" 2>/dev/null; }
# stop_pid PID NAME SECONDS: SIGTERM, wait up to SECONDS, then SIGKILL. Only our own children.
stop_pid() {
    local pid=$1 name=$2 secs=$3 i
    alive "$pid" || return 0
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < secs * 10; i++)); do
        alive "$pid" || break
        sleep 0.1
    done
    if alive "$pid"; then
        log "$name (pid $pid) ignored SIGTERM for ${secs}s: SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
    fi
    wait "$pid" 2>/dev/null || true
}
# Unmount anything left mounted under a directory (an interrupted debootstrap), deepest first.
umount_under() {
    local dir=$1 mnt
    [[ -d $dir ]] || return 0
    awk -v d="$dir/" 'index($2, d) == 1 { print $2 }' /proc/mounts | sort -r | while read -r mnt; do
        umount -l "$mnt" || true
    done
}
remove_rootfs() {
    [[ -n $ROOTFS && -d $ROOTFS ]] || return 0
    umount_under "$ROOTFS"
    rm -rf --one-file-system "$ROOTFS"
}

cleanup() {
    local rc=$?
    set +e
    trap - EXIT INT TERM
    if [[ $rc -ne 0 && -n $CONTAINER ]]; then
        log "container logs (last 200 lines):"
        timeout 20 docker logs --tail 200 "$CONTAINER" >&2 2>&1
        log "container state: $(timeout 10 docker inspect -f '{{json .State}}' "$CONTAINER" 2>&1)"
    fi
    for c in "$CONTAINER" "$NOKEY_CONTAINER"; do
        [[ -n $c ]] && timeout 60 docker rm -f "$c" >/dev/null 2>&1
    done
    stop_pid "$HOLD_PID" "smoke client" 5
    stop_pid "$REDIS_PID" redis-server 10
    if [[ -n $DOCKERD_PID ]]; then
        if [[ $rc -ne 0 ]]; then
            log "dockerd log (last 20 lines, full: $WORK/dockerd.log):"
            tail -n 20 "$WORK/dockerd.log" >&2
        fi
        stop_pid "$DOCKERD_PID" dockerd 30
        # Its containerd, should dockerd have been killed before it could stop it.
        local cpid
        cpid=$(cat "$WORK/exec/containerd/containerd.pid" 2>/dev/null)
        if [[ $cpid =~ ^[0-9]+$ ]] && grep -qF "$WORK/exec/" "/proc/$cpid/cmdline" 2>/dev/null; then
            kill -TERM "$cpid" 2>/dev/null
        fi
        # dockerd leaves the host netns bind-mounted at exec/netns/default: unmount it.
        alive "$DOCKERD_PID" || umount_under "$WORK/exec"
    fi
    remove_rootfs
    [[ $rc -eq 0 ]] || log "FAILED (exit $rc); work dir: $WORK"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Free TCP ports on 127.0.0.1 (bound together, so they differ; released before use).
free_ports() {
    "$CLIENT_PY" - "$1" <<'PY'
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
}

debian_mirror() {
    if [[ -n ${HUBBUB_SMOKE_MIRROR:-} ]]; then
        echo "$HUBBUB_SMOKE_MIRROR"
        return
    fi
    local uri=""
    if [[ -r /etc/apt/sources.list.d/debian.sources ]]; then
        uri=$(awk '$1 == "URIs:" && $2 !~ /security/ { print $2; exit }' \
            /etc/apt/sources.list.d/debian.sources)
    fi
    if [[ -z $uri && -r /etc/apt/sources.list ]]; then
        uri=$(awk '$1 == "deb" && $3 == "bookworm" { print $2; exit }' /etc/apt/sources.list)
    fi
    echo "${uri:-http://deb.debian.org/debian}"
}

# Writes the certificates of the host's bundle that the rootfs's bundle lacks (the proxy's CAs)
# to DIR/host-ca-N.crt; prints how many.
extra_cas() {
    local rootfs_bundle=$1 host_bundle=$2 dir=$3
    awk -v out="$dir" '
        /-----BEGIN CERTIFICATE-----/ { inside = 1; body = ""; pem = ""; }
        inside { pem = pem $0 "\n" }
        /-----END CERTIFICATE-----/ {
            inside = 0
            if (FNR == NR) { seen[body] = 1 }
            else if (!(body in seen)) {
                n++; f = sprintf("%s/host-ca-%d.crt", out, n); printf "%s", pem > f; close(f)
            }
            next
        }
        inside && !/-----BEGIN/ { gsub(/[ \t\r]/, ""); body = body $0 }
        END { print n + 0 }
    ' "$rootfs_bundle" "$host_bundle"
}

build_base() {
    local mirror
    mirror=$(debian_mirror)
    ROOTFS="$WORK/rootfs"
    remove_rootfs
    log "debootstrap bookworm (minbase + python3, python3-venv, ca-certificates) from $mirror"
    timeout 1200 debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
        bookworm "$ROOTFS" "$mirror" >"$WORK/debootstrap.log" 2>&1 ||
        die "debootstrap failed; see $WORK/debootstrap.log (tail: $(tail -n 5 "$WORK/debootstrap.log"))"
    local n
    n=$(extra_cas "$ROOTFS/etc/ssl/certs/ca-certificates.crt" /etc/ssl/certs/ca-certificates.crt \
        "$ROOTFS/usr/local/share/ca-certificates")
    log "installing $n CA certificate(s) of this host that Debian's bundle lacks"
    timeout 120 chroot "$ROOTFS" update-ca-certificates >"$WORK/update-ca.log" 2>&1 ||
        die "update-ca-certificates failed: $(cat "$WORK/update-ca.log")"
    timeout 60 chroot "$ROOTFS" apt-get clean
    rm -rf "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/tmp/* "$ROOTFS"/var/tmp/*
    log "docker import -> $BASE"
    tar -C "$ROOTFS" --numeric-owner -c . | timeout 600 docker import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV LANG=C.UTF-8' \
        --change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' \
        --change 'CMD ["python3"]' \
        --message "hubbub docker-smoke base: debootstrap bookworm minbase + python3 + host CAs" \
        - "$BASE" >/dev/null
    remove_rootfs
}

container_state() { timeout 10 docker inspect -f "$1" "$CONTAINER" 2>/dev/null || echo "?"; }

# ---------------------------------------------------------------------------------------------
T_ALL=$(now_ms)
[[ $EUID -eq 0 ]] || die "needs root (it starts its own dockerd and runs debootstrap)"
[[ -x $CLIENT_PY ]] || die "no python at $CLIENT_PY (set HUBBUB_SMOKE_PYTHON)"
"$CLIENT_PY" -c 'import websockets.asyncio.client' 2>/dev/null ||
    die "$CLIENT_PY has no websockets library (the dev dependencies: uv sync)"

t=$(now_ms)
missing=()
command -v dockerd >/dev/null || missing+=(docker.io)
command -v docker >/dev/null || missing+=(docker.io)
command -v debootstrap >/dev/null || missing+=(debootstrap)
command -v redis-server >/dev/null || missing+=(redis-server)
command -v curl >/dev/null || missing+=(curl)
if ((${#missing[@]})); then
    log "installing: ${missing[*]}"
    timeout 300 apt-get update -qq
    DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null
fi
record prerequisites "$t" "${missing[*]:+installed ${missing[*]}}"

# -- private dockerd --------------------------------------------------------------------------
t=$(now_ms)
mkdir -p "$WORK/data" "$WORK/exec" "$WORK/redis"
chmod 700 "$WORK"
if [[ -s $WORK/dockerd.pid ]] && kill -0 "$(cat "$WORK/dockerd.pid")" 2>/dev/null; then
    die "a dockerd (pid $(cat "$WORK/dockerd.pid")) already runs on $WORK; stop it or set HUBBUB_SMOKE_DIR"
fi
rm -f "$WORK/docker.sock" "$WORK/dockerd.pid"
export DOCKER_HOST="unix://$WORK/docker.sock"
dockerd --data-root "$WORK/data" --exec-root "$WORK/exec" --pidfile "$WORK/dockerd.pid" \
    -H "$DOCKER_HOST" --bridge=none --iptables=false --ip6tables=false --ip-masq=false \
    >"$WORK/dockerd.log" 2>&1 &
DOCKERD_PID=$!
for ((i = 0; ; i++)); do
    timeout 5 docker version >/dev/null 2>&1 && break
    alive "$DOCKERD_PID" || die "dockerd exited at start"
    ((i < 60)) || die "dockerd not answering on $DOCKER_HOST after 30 s"
    sleep 0.5
done
server_version=$(timeout 10 docker version -f '{{.Server.Version}}')
record "dockerd up" "$t" "pid $DOCKERD_PID, dockerd $server_version, $WORK"
# Containers left by an earlier, killed run of this script (only this private daemon's).
stale=$(timeout 30 docker ps -aq --filter "label=$LABEL")
if [[ -n $stale ]]; then
    log "removing containers left by an earlier run: $stale"
    # shellcheck disable=SC2086 # one id per word
    timeout 60 docker rm -f $stale >/dev/null
fi

# -- base image -------------------------------------------------------------------------------
t=$(now_ms)
if [[ ${HUBBUB_SMOKE_REBUILD_BASE:-0} != 1 ]] &&
    timeout 30 docker image inspect "$BASE" >/dev/null 2>&1; then
    record "base image" "$t" "cached $BASE"
else
    build_base
    record "base image" "$t" "built $BASE"
fi

# -- the image --------------------------------------------------------------------------------
t=$(now_ms)
previous=$(timeout 30 docker image inspect -f '{{.Id}}' "$IMAGE" 2>/dev/null || true)
log "docker build --build-arg BASE_IMAGE=$BASE -t $IMAGE $REPO"
DOCKER_BUILDKIT=0 timeout 1500 docker build --network host --build-arg "BASE_IMAGE=$BASE" \
    -t "$IMAGE" "$REPO" 2>&1 | tee "$WORK/build.log" | sed 's/^/  | /' >&2 ||
    die "docker build failed (log: $WORK/build.log)"
record "docker build" "$t" "$IMAGE"
image_id=$(timeout 30 docker image inspect -f '{{.Id}}' "$IMAGE")
# The image this run replaced (not `docker image prune`: that would drop the build stage's cache).
if [[ -n $previous && $previous != "$image_id" ]]; then
    timeout 60 docker rmi "$previous" >/dev/null 2>&1 || true
fi
user=$(timeout 30 docker image inspect -f '{{.Config.User}}' "$IMAGE")
[[ $user == 10001:10001 ]] || die "image USER is '$user', not 10001:10001"

# -- run it -----------------------------------------------------------------------------------
t=$(now_ms)
ports=$(free_ports 3)
read -r CHAT_PORT METRICS_PORT REDIS_PORT <<<"$ports"
[[ -n $REDIS_PORT ]] || die "could not pick free ports"
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no --daemonize no \
    --dir "$WORK/redis" --logfile "$WORK/redis.log" &
REDIS_PID=$!
for ((i = 0; ; i++)); do
    [[ $(timeout 2 redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping 2>/dev/null) == PONG ]] && break
    alive "$REDIS_PID" || die "redis-server exited (see $WORK/redis.log)"
    ((i < 50)) || die "redis-server not answering after 10 s"
    sleep 0.2
done
RUN_ENV=(-e CHAT_HOST=127.0.0.1 -e CHAT_PORT="$CHAT_PORT"
    -e CHAT_METRICS_HOST=127.0.0.1 -e CHAT_METRICS_PORT="$METRICS_PORT"
    -e CHAT_REDIS_URL="redis://127.0.0.1:$REDIS_PORT/0" -e CHAT_WORKERS="$WORKERS")
# The image sets no auth mode: the app's default, jwt, needs a key and refuses to start
# without one, saying which variable is missing.
nokey_rc=0
NOKEY_CONTAINER="hubbub-smoke-nokey-$$"
nokey=$(timeout 60 docker run --rm --name "$NOKEY_CONTAINER" --label "$LABEL" --network host \
    "${RUN_ENV[@]}" "$IMAGE" 2>&1) || nokey_rc=$?
((nokey_rc != 0 && nokey_rc != 124)) || die "without CHAT_JWT_SECRET: exit $nokey_rc, not a refusal"
grep -q CHAT_JWT_SECRET <<<"$nokey" || die "without CHAT_JWT_SECRET, the refusal does not name it: $nokey"
record "refused without key" "$t" "exit $nokey_rc, names CHAT_JWT_SECRET"
# A throwaway HS256 key, passed through the environment (not on a command line).
t=$(now_ms)
HUBBUB_SMOKE_JWT_SECRET=$("$CLIENT_PY" -c 'import secrets; print(secrets.token_hex(32))')
export HUBBUB_SMOKE_JWT_SECRET
CONTAINER="hubbub-smoke-$$" # set first: a container created but not started is removed too
cid=$(CHAT_JWT_SECRET=$HUBBUB_SMOKE_JWT_SECRET timeout 60 docker run -d --name "$CONTAINER" \
    --label "$LABEL" --network host "${RUN_ENV[@]}" -e CHAT_JWT_SECRET "$IMAGE")
log "container ${cid:0:12} ($CONTAINER): chat 127.0.0.1:$CHAT_PORT, metrics :$METRICS_PORT, redis :$REDIS_PORT"
health=""
for ((i = 0; ; i++)); do
    health=$(container_state '{{.State.Health.Status}}')
    [[ $health == healthy ]] && break
    # (A stopped container's health reads "unhealthy" too: say which it is.)
    [[ $(container_state '{{.State.Running}}') == true ]] ||
        die "container stopped (exit $(container_state '{{.State.ExitCode}}')) before it was healthy"
    [[ $health == unhealthy ]] && die "HEALTHCHECK says unhealthy"
    ((i < 120)) || die "not healthy after 60 s (health: $health)"
    sleep 0.5
done
record "healthy" "$t" "HEALTHCHECK python -m app.ops.healthcheck"

# Every process of the container (gunicorn master + workers) runs as uid 10001.
procs=$(timeout 10 docker top "$CONTAINER" -eo uid,pid,args)
uids=$(awk 'NR > 1 { print $1 }' <<<"$procs")
nproc_c=$(grep -c . <<<"$uids" || true)
if [[ -z $uids ]] || grep -qvx 10001 <<<"$uids"; then
    die "processes not all uid 10001:"$'\n'"$procs"
fi
((nproc_c >= WORKERS + 1)) || die "expected gunicorn + $WORKERS workers, saw $nproc_c processes"

# -- chat round trip, metrics -----------------------------------------------------------------
cat >"$WORK/smoke_client.py" <<'PY'
"""WebSocket client for scripts/docker-smoke.sh: `roundtrip PORT` or `hold PORT READY_FILE`.
Users are tokens signed with $HUBBUB_SMOKE_JWT_SECRET (the server runs in jwt mode)."""

import asyncio
import json
import os
import sys
import time

import jwt
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

SKIP = {"ping", "pong", "presence", "typing"}


def url(port, user):
    now = int(time.time())
    claims = {"sub": user, "iat": now, "exp": now + 600}
    token = jwt.encode(claims, os.environ["HUBBUB_SMOKE_JWT_SECRET"], algorithm="HS256")
    return f"ws://127.0.0.1:{port}/ws?token={token}"


class Peer:
    """Reads frames one JSON object at a time (a text frame may hold several, joined by \\n)."""

    def __init__(self, ws, name):
        self.ws, self.name, self.queue = ws, name, []

    async def frame(self):
        while not self.queue:
            raw = await self.ws.recv()
            for line in (raw if isinstance(raw, str) else raw.decode()).split("\n"):
                if not line.strip():
                    continue
                f = json.loads(line)
                if f.get("type") == "ping":
                    await self.ws.send('{"type":"pong"}')
                if f.get("type") == "error":
                    sys.exit(f"{self.name}: error frame {f}")
                if f.get("type") not in SKIP:
                    self.queue.append(f)
        return self.queue.pop(0)

    async def expect(self, kind, **fields):
        f = await self.frame()
        if f.get("type") != kind or any(f.get(k) != v for k, v in fields.items()):
            sys.exit(f"{self.name}: expected {kind} {fields or ''}, got {f}")
        return f


async def roundtrip(port):
    async with (
        connect(url(port, "a"), open_timeout=5) as wa,
        connect(url(port, "b"), open_timeout=5) as wb,
    ):
        a, b = Peer(wa, "a"), Peer(wb, "b")
        hello_a = await a.expect("hello")
        hello_b = await b.expect("hello")
        for peer in (a, b):
            await peer.ws.send(json.dumps({"type": "join", "room": "smoke"}))
            await peer.expect("joined", room="smoke")
        await wa.send(json.dumps({"type": "send", "room": "smoke", "text": "hi", "cid": "1"}))
        got = {}
        while len(got) < 2:
            f = await a.frame()
            if f["type"] not in ("message", "ack") or f["type"] in got:
                sys.exit(f"a: expected the message and its ack, got {f}")
            got[f["type"]] = f
        msg, ack = got["message"], got["ack"]
        if hello_a["user"] != "a":
            sys.exit(f"a: hello says user {hello_a['user']!r}, not the token's sub 'a'")
        want = {"room": "smoke", "text": "hi", "user": hello_a["user"]}
        if any(msg.get(k) != v for k, v in want.items()):
            sys.exit(f"a: message {msg} is not {want}")
        if ack.get("cid") != "1" or ack.get("id") != msg.get("id"):
            sys.exit(f"a: ack {ack} does not match message id {msg.get('id')}")
        await b.expect("message", id=msg["id"], **want)
        print(f"message id {msg['id']}: a on {hello_a['node']}, b on {hello_b['node']}")


async def hold(port, ready_file):
    async with connect(url(port, "held"), open_timeout=5) as ws:
        await Peer(ws, "held").expect("hello")
        with open(ready_file, "w") as f:
            f.write("ready\n")
        try:
            while True:
                await ws.recv()
        except ConnectionClosed:
            pass
        print(f"closed {ws.close_code} {ws.close_reason}")


async def main():
    async with asyncio.timeout(20 if sys.argv[1] == "roundtrip" else 90):
        if sys.argv[1] == "roundtrip":
            await roundtrip(int(sys.argv[2]))
        else:
            await hold(int(sys.argv[2]), sys.argv[3])


asyncio.run(main())
PY

t=$(now_ms)
roundtrip=$(timeout 30 "$CLIENT_PY" "$WORK/smoke_client.py" roundtrip "$CHAT_PORT") ||
    die "chat round trip failed: $roundtrip"
record "chat round trip" "$t" "$roundtrip"

# A socket held open through the stop: counted by the metrics, then closed by the drain.
rm -f "$WORK/held.ready" "$WORK/held.out"
"$CLIENT_PY" "$WORK/smoke_client.py" hold "$CHAT_PORT" "$WORK/held.ready" >"$WORK/held.out" 2>&1 &
HOLD_PID=$!
for ((i = 0; ; i++)); do
    [[ -e $WORK/held.ready ]] && break
    alive "$HOLD_PID" || die "held client failed: $(cat "$WORK/held.out")"
    ((i < 100)) || die "held client not connected after 10 s"
    sleep 0.1
done

# The workers sample their gauges once a second: poll for a few seconds.
t=$(now_ms)
for ((i = 0; ; i++)); do
    metrics=$(curl -fsS --max-time 5 "http://127.0.0.1:$METRICS_PORT/metrics") ||
        die "GET /metrics on the metrics port failed"
    conns=$(awk '$1 ~ /^hubbub_connections($|\{)/ { n += $NF; seen = 1 } END { if (seen) print n }' \
        <<<"$metrics")
    [[ -n $conns ]] || die "no hubbub_connections sample on :$METRICS_PORT/metrics"
    awk -v n="$conns" 'BEGIN { exit !(n >= 1) }' && break
    ((i < 20)) || die "hubbub_connections = $conns after 5 s with a socket open"
    sleep 0.25
done
code=$(curl -sS -o /dev/null -w '%{http_code}' --max-time 5 "http://127.0.0.1:$CHAT_PORT/metrics")
[[ $code == 404 ]] || die "GET /metrics on the chat port gave $code, not 404"
record "metrics" "$t" "hubbub_connections=$conns; chat port /metrics: 404"

# -- stop: drain ------------------------------------------------------------------------------
t=$(now_ms)
timeout 60 docker stop -t 40 "$CONTAINER" >/dev/null || die "docker stop failed"
stop_ms=$(($(now_ms) - t))
exit_code=$(container_state '{{.State.ExitCode}}')
[[ $exit_code == 0 ]] ||
    die "exit code $exit_code after docker stop (137: killed at the 40 s deadline, no clean drain)"
for ((i = 0; i < 100; i++)); do
    alive "$HOLD_PID" || break
    sleep 0.1
done
alive "$HOLD_PID" && die "held socket still open after the container stopped"
wait "$HOLD_PID" || die "held client failed: $(cat "$WORK/held.out")"
HOLD_PID=""
held=$(cat "$WORK/held.out")
[[ $held == "closed 1012"* ]] || die "held socket: expected close 1012 from the drain, got: $held"
drained=$(timeout 20 docker logs "$CONTAINER" 2>&1 | grep -c '"msg":"drained"' || true)
((drained >= WORKERS)) || die "$drained worker(s) logged \"drained\", expected $WORKERS"
record "stop (drain)" "$t" "exit 0 in $((stop_ms / 1000)).$((stop_ms % 1000 / 100)) s; $held; $drained x drained"

size=$(timeout 30 docker image inspect -f '{{.Size}}' "$IMAGE" | awk '{ printf "%.0f MB", $1 / 1e6 }')
base_size=$(timeout 30 docker image inspect -f '{{.Size}}' "$BASE" |
    awk '{ printf "%.0f MB", $1 / 1e6 }')
record total "$T_ALL"
printf 'PASS docker smoke: %s (%s, base %s %s)\n' "$IMAGE" "$size" "$BASE" "$base_size"
printf '%s\n' "${TIMINGS[@]}"
