#!/usr/bin/env bash
# Builds and runs the benchmark: LocksideLock beside Redisson's RLock on one
# redis-server (started here), through one sidecar ($LOCKSIDE_BIN, a release build
# for figures worth quoting).
#   LOCKSIDE_BIN=target/release/lockside bash clients/java/lockside-bench/bench.sh [cycles]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
: "${LOCKSIDE_BIN:?set LOCKSIDE_BIN to a lockside binary}"
export LOCKSIDE_BIN
cd "$here/.."
mvn -B -q -Pbench -pl lockside-bench -am package -DskipTests
exec java -cp "$here/target/classes:$(cat "$here/target/classpath.txt")" io.lockside.bench.Bench "$@"
