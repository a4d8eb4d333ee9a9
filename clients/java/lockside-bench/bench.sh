#!/usr/bin/env bash
# Builds and runs the benchmark: LocksideLock beside Redisson's RLock on one
# redis-server (started here), through one sidecar ($LOCKSIDE_BIN, a release build
# for figures worth quoting), and Curator's InterProcessMutex on a standalone ZooKeeper
# on loopback (Debian's zookeeper package, installed here when missing; started by the
# benchmark in a temporary directory).
#   LOCKSIDE_BIN=target/release/lockside bash clients/java/lockside-bench/bench.sh [cycles]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
: "${LOCKSIDE_BIN:?set LOCKSIDE_BIN to a lockside binary}"
export LOCKSIDE_BIN
if [ ! -f /usr/share/java/zookeeper.jar ]; then
  as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
  echo "installing zookeeper (Debian's package; its service is not started)"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends zookeeper >/dev/null
fi
cd "$here/.."
mvn -B -q -Pbench -pl lockside-bench -am package -DskipTests
exec java -cp "$here/target/classes:$(cat "$here/target/classpath.txt")" io.lockside.bench.Bench "$@"
