#!/bin/sh
# Runs the benchmark against a throwaway redis-server on a free loopback port, stopped
# at the end (also on failure or Ctrl-C); the bench's flags follow, e.g.
#   benches/lockside/with-redis.sh                       # phases 1-10
#   benches/lockside/with-redis.sh --phases cost,idle,scale
#   benches/lockside/with-redis.sh --phases fleet --fleet-svg docs/fleet.svg
# Redis runs on this machine, so the Redis CPU figures are measured (README "Benchmark").
set -eu
dir=$(mktemp -d)
port=
for candidate in $(shuf -i 20000-50000 -n 20); do
    if [ -z "$(ss -Hltn "sport = :$candidate")" ]; then
        port=$candidate
        break
    fi
done
[ -n "$port" ] || { echo "with-redis: no free port" >&2; exit 1; }
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
    --dir "$dir" --logfile "$dir/redis.log" --daemonize yes --pidfile "$dir/redis.pid"
stop() {
    redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
    rm -rf "$dir"
}
trap stop EXIT INT TERM
tries=0
until redis-cli -p "$port" ping >/dev/null 2>&1; do
    tries=$((tries + 1))
    [ "$tries" -lt 50 ] || { echo "with-redis: redis-server did not start" >&2; exit 1; }
    sleep 0.1
done
cargo bench --bench lockside --locked -- --redis "redis://127.0.0.1:$port" "$@"
