#!/bin/bash
# What waiting for a replica costs an ack: closed-loop rtt (100 clients, each in its own room)
# through gunicorn (2 workers, core 0) on a Redis master with one replica (both on core 1,
# beside the load generator), CHAT_REDIS_WAIT_REPLICAS=1 vs 0, alternating, ROUNDS (3) rounds
# of SECONDS_RUN (10) s; CLIENTS (100) for a smaller run (the test suite's smoke run).
# The replica copies every write in both cases: only the acks' wait differs.
set -e
OUT=${OUT:-/tmp/hubbub-wait-cost}; mkdir -p "$OUT"
cd "$(dirname "$0")/.."
. loadtest/bench_lib.sh
MPORT=$(free_port); RPORT=$(free_port)
mkdir -p "$OUT/master" "$OUT/replica"
taskset -c 1 redis-server --port "$MPORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$OUT/master" \
  --repl-diskless-sync-delay 0 > "$OUT/master.log" 2>&1 &
MASTER=$!
taskset -c 1 redis-server --port "$RPORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$OUT/replica" \
  --replicaof 127.0.0.1 "$MPORT" > "$OUT/replica.log" 2>&1 &
REPLICA=$!
trap 'kill $MASTER $REPLICA 2>/dev/null' EXIT
for _ in $(seq 100); do redis-cli -p "$MPORT" info replication | grep -q 'slave0:.*state=online' && break; sleep 0.1; done
for round in $(seq "${ROUNDS:-3}"); do
  for wait in 0 1; do
    PORT=$(free_port)
    start_app "$PORT" "$OUT/app-$wait-$round.log" \
      CHAT_REDIS_URL="redis://127.0.0.1:$MPORT/0" CHAT_REDIS_WAIT_REPLICAS=$wait
    taskset -c 1 .venv/bin/python -m loadtest rtt --url "ws://127.0.0.1:$PORT/ws" --clients "${CLIENTS:-100}" \
      --seconds "${SECONDS_RUN:-10}" \
      --quiet --json "$OUT/rtt-$wait-$round.json" > /dev/null 2>&1 || echo "loadtest failed"
    .venv/bin/python -c "import json,sys;d=json.load(open(sys.argv[1]));print('round', sys.argv[2], 'wait', sys.argv[3], {k: d.get(k) for k in ('messages_per_s','p50_ms','p99_ms','timeouts','failed','generator_cpu_percent')})" \
      "$OUT/rtt-$wait-$round.json" "$round" "$wait"
    kill -TERM $APP; wait $APP 2>/dev/null || true
  done
done
redis-cli -p "$MPORT" info stats | grep -E 'total_commands|instantaneous' || true
