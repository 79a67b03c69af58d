# Shared by the loadtest/*.sh benchmarks (sourced, from the repository's root).

free_port() {
  .venv/bin/python -c "import socket;s=socket.socket();s.bind(('127.0.0.1',0));print(s.getsockname()[1])"
}

# start_app PORT LOG [VAR=value...]: gunicorn (2 workers) on core 0 in the background, its PID
# in $APP, with the per-user and per-address limits out of the load generator's way; returns
# once /readyz answers (or after 10 s).
start_app() {
  local port=$1 log=$2
  shift 2
  env CHAT_AUTH_MODE=names CHAT_USER_MESSAGES_PER_S=100000 CHAT_USER_MESSAGE_BURST=100000 \
    CHAT_RATE_LIMIT_FRAMES_PER_S=100000 CHAT_RATE_LIMIT_BURST=100000 \
    CHAT_IP_CONNECTIONS_PER_S=100000 CHAT_IP_CONNECTION_BURST=100000 \
    CHAT_MAX_CONNECTIONS_PER_USER=100000 CHAT_USER_JOINS_PER_S=100000 CHAT_USER_JOIN_BURST=100000 \
    CHAT_LOG_LEVEL=warning "$@" \
    taskset -c 0 .venv/bin/gunicorn -c deploy/gunicorn.conf.py --bind "127.0.0.1:$port" --workers 2 \
    > "$log" 2>&1 &
  APP=$!
  .venv/bin/python - "$port" <<'PY' || true
import sys, time, urllib.request
deadline = time.monotonic() + 10
while time.monotonic() < deadline:
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/readyz", timeout=1)
        break
    except OSError:
        time.sleep(0.1)
PY
}
