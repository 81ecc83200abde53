#!/usr/bin/env bash
# Create latency with and without team admission and metering, in one run: a baseline binary
# (BASELINE, e.g. a build of main), then this tree (BIN) with the default metering interval and
# with a 0.2 s interval plus quotas, a rate limit and credits on the default team. Each server
# gets its own data dir, port and uid range; its sandboxes are killed through the API before it
# stops. The client is this tree's bulkhead-bench (BENCH) against every server.
# Usage: BASELINE=/path/to/old/bulkhead bench/bench-metering.sh
set -u
BIN="${BIN:-$(cd "$(dirname "$0")/.." && pwd)/target/debug/bulkhead}"
BENCH="${BENCH:-$(dirname "$BIN")/bulkhead-bench}"
BASELINE="${BASELINE:?set BASELINE to a bulkhead binary without teams (e.g. a build of main)}"
run() { # run LABEL BIN PORT UIDBASE EXTRA...
  local label=$1 bin=$2 port=$3 uid=$4; shift 4
  local dir; dir=$(mktemp -d /var/tmp/bench-metering-XXXX); chmod 711 "$dir"
  local key="e2b_$(openssl rand -hex 20)"
  BULKHEAD_API_KEY=$key "$bin" serve --listen 127.0.0.1:$port --data-dir "$dir/data" \
     --image-cache /var/cache/bulkhead/images --templates base --pool-size 2 --uid-base $uid \
     --log-level warn "$@" >"$dir/server.log" 2>&1 &
  local pid=$!
  for i in $(seq 1 240); do curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:$port/health | grep -q 204 && break; sleep 0.5; done
  if [ -n "${SETQ:-}" ]; then
    "$bin" teams set-quota default --max-sandboxes 1000 --max-vcpus 64 --max-memory-mb 65536 \
       --max-timeout 86400 --creates-per-second 1000 --data-dir "$dir/data" >/dev/null
    "$bin" teams credit default +1000000 --data-dir "$dir/data"
  fi
  sleep 5
  echo "=== $label"
  E2B_API_URL=http://127.0.0.1:$port E2B_API_KEY=$key "$BENCH" --n 60 --burst 10 --no-baselines --server-pid $pid 2>&1 | tail -25
  # Kill anything left through the API, then stop the server.
  for id in $(curl -s -H "X-API-Key: $key" "http://127.0.0.1:$port/v2/sandboxes?limit=100" | python3 -c 'import sys,json; print(" ".join(s["sandboxID"] for s in json.load(sys.stdin)))'); do
    curl -s -X DELETE -H "X-API-Key: $key" http://127.0.0.1:$port/sandboxes/$id >/dev/null; done
  kill $pid; wait $pid
  rm -rf "$dir"
}
run "baseline ($BASELINE)" "$BASELINE" 39611 310000000
run "this tree, metering every 15 s (default)" "$BIN" 39612 320000000
SETQ=1 run "this tree, metering every 0.2 s, team quotas, rate limit and credits set" "$BIN" 39613 330000000 --metering-interval 0.2 --price-vcpu-hour 1
