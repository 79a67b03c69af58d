#!/bin/bash
# One publisher, fan-out through Redis: 1,000 subscribers in one room, one client sending
# RATE (default 100) messages/s, to gunicorn (2 workers, core 0) on Redis (core 1, beside the
# load generator), with a connection's sends pipelined (CHAT_SENDS_IN_FLIGHT_MAX=16, the
# default) vs one at a time (=1, the behaviour before), alternating, ROUNDS (3) rounds of
# SECONDS_RUN (10) s; SUBSCRIBERS (1000) for a smaller run (the test suite's smoke run).
set -e
OUT=${OUT:-/tmp/hubbub-lone-publisher}; mkdir -p "$OUT"
cd "$(dirname "$0")/.."
. loadtest/bench_lib.sh
RPORT=$(free_port)
taskset -c 1 redis-server --port "$RPORT" --bind 127.0.0.1 --save '' --appendonly no > "$OUT/redis.log" 2>&1 &
REDIS=$!
trap 'kill $REDIS 2>/dev/null' EXIT
sleep 1
for round in $(seq "${ROUNDS:-3}"); do
  for inflight in 1 16; do
    PORT=$(free_port)
    start_app "$PORT" "$OUT/app-$inflight-$round.log" \
      CHAT_REDIS_URL="redis://127.0.0.1:$RPORT/$round" CHAT_SENDS_IN_FLIGHT_MAX=$inflight
    taskset -c 1 .venv/bin/python -m loadtest fanout --url "ws://127.0.0.1:$PORT/ws" --subscribers "${SUBSCRIBERS:-1000}" \
      --publishers 1 --rate "${RATE:-100}" --seconds "${SECONDS_RUN:-10}" --grace 3 --sample-every 10 --quiet \
      --json "$OUT/fanout-$inflight-$round.json" > /dev/null 2>&1 || echo "loadtest failed"
    .venv/bin/python -c "import json,sys;d=json.load(open(sys.argv[1]));print('round', sys.argv[2], 'in flight', sys.argv[3], {k: d.get(k) for k in ('offered_deliveries_per_s','deliveries_per_s','p50_ms','p99_ms','missing','duplicates','out_of_order','generator_cpu_percent')})" \
      "$OUT/fanout-$inflight-$round.json" "$round" "$inflight"
    kill -TERM $APP; wait $APP 2>/dev/null || true
  done
done
