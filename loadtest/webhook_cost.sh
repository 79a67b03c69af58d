#!/bin/bash
# Closed-loop rtt (100 clients) through gunicorn (2 workers, core 0) and Redis (core 1), with
# webhooks on (every message.created POSTed to a receiver on core 1; BATCH=N: N events a request at
# most, CHAT_WEBHOOK_BATCH_MAX) vs off, alternating.
set -e
OUT=${OUT:-/tmp/hubbub-webhook-cost}; mkdir -p "$OUT"
cd "$(dirname "$0")/.."
RPORT=$(.venv/bin/python -c "import socket;s=socket.socket();s.bind(('127.0.0.1',0));print(s.getsockname()[1])")
taskset -c 1 redis-server --port $RPORT --save '' --appendonly no --daemonize no > ${OUT:-/tmp/hubbub-webhook-cost}/redis.log 2>&1 &
REDIS=$!
taskset -c 1 .venv/bin/python -m loadtest.webhook_receiver > ${OUT:-/tmp/hubbub-webhook-cost}/receiver.log 2>&1 &
RECV=$!
sleep 2
HOOK=$(head -1 ${OUT:-/tmp/hubbub-webhook-cost}/receiver.log)
for round in 1 2 3; do
  for mode in off on; do
    PORT=$(.venv/bin/python -c "import socket;s=socket.socket();s.bind(('127.0.0.1',0));print(s.getsockname()[1])")
    EXTRA=""
    if [ $mode = on ]; then EXTRA="CHAT_WEBHOOK_URL=$HOOK CHAT_WEBHOOK_SECRET=$(printf 'h%.0s' {1..40}) CHAT_WEBHOOK_EVENTS=message.created CHAT_WEBHOOK_BATCH_MAX=${BATCH:-1}"; fi
    env CHAT_AUTH_MODE=names CHAT_REDIS_URL=redis://127.0.0.1:$RPORT/$round CHAT_USER_MESSAGES_PER_S=100000 CHAT_USER_MESSAGE_BURST=100000 \
      CHAT_RATE_LIMIT_FRAMES_PER_S=100000 CHAT_RATE_LIMIT_BURST=100000 CHAT_IP_CONNECTIONS_PER_S=100000 CHAT_IP_CONNECTION_BURST=100000 \
      CHAT_MAX_CONNECTIONS_PER_USER=100000 CHAT_LOG_LEVEL=warning $EXTRA \
      taskset -c 0 .venv/bin/gunicorn -c deploy/gunicorn.conf.py --bind 127.0.0.1:$PORT --workers 2 > ${OUT:-/tmp/hubbub-webhook-cost}/app-$mode-$round.log 2>&1 &
    APP=$!
    for i in $(seq 50); do curl -fs http://127.0.0.1:$PORT/readyz >/dev/null 2>&1 && break; sleep 0.2; done
    echo "== round $round webhooks $mode"
    taskset -c 1 .venv/bin/python -m loadtest rtt --url ws://127.0.0.1:$PORT/ws --clients 100 --seconds 10 --quiet --json ${OUT:-/tmp/hubbub-webhook-cost}/rtt-$mode-$round.json >/dev/null 2>&1 || echo "loadtest failed"
    .venv/bin/python -c "import json;d=json.load(open('${OUT:-/tmp/hubbub-webhook-cost}/rtt-$mode-$round.json'));print({k:d[k] for k in d if k in ('messages_per_s','rtt_p50_ms','rtt_p99_ms','msgs_per_s','throughput')} or list(d)[:20])"
    kill -TERM $APP; wait $APP 2>/dev/null || true
  done
done
tail -2 ${OUT:-/tmp/hubbub-webhook-cost}/receiver.log
kill $RECV $REDIS
