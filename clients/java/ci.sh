#!/usr/bin/env bash
# The Java client's build and tests, as CI runs them: `mvn verify` of clients/java
# (compile, the tests of every module against a real sidecar and real redis-server
# processes they start on free loopback ports, the jars).
#
#   LOCKSIDE_BIN=/path/to/lockside bash clients/java/ci.sh
#   bash clients/java/ci.sh build    the jars only, without tests or a sidecar, installed
#                                    into ~/.m2, and each module's compile classpath in
#                                    target/classpath.txt: what tests/client_doc_examples.rs
#                                    compiles the README's Java against, and where the
#                                    README's Maven projects find the artifacts (.ci/run
#                                    runs it before cargo test)
#
# LOCKSIDE_BIN is the sidecar binary the tests run; unset, the repository's
# target/debug/lockside (what `cargo build` / `cargo test` made) is used if it exists.
# Needs Java 17+, Maven 3.8+ and redis-server (installed with apt-get when missing and
# allowed). The first run downloads the dependencies and protoc from Maven Central into
# ~/.m2; later runs reuse them.
set -euo pipefail
mode="${1:-all}"
case "$mode" in
  build | all) ;;
  *) echo "usage: ci.sh [build]" >&2; exit 64 ;;
esac
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}
missing=()
command -v java >/dev/null || missing+=(openjdk-17-jdk-headless)
command -v mvn >/dev/null || missing+=(maven)
command -v redis-server >/dev/null || missing+=(redis-server)
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing ${missing[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [ "$mode" = build ]; then
  cd "$here"
  mvn -B -q install -DskipTests dependency:build-classpath -Dmdep.outputFile=target/classpath.txt
  exit 0
fi

if [ -z "${LOCKSIDE_BIN:-}" ] && [ -x "$repo/target/debug/lockside" ]; then
  LOCKSIDE_BIN="$repo/target/debug/lockside"
fi
if [ -z "${LOCKSIDE_BIN:-}" ]; then
  echo "LOCKSIDE_BIN is not set and $repo/target/debug/lockside does not exist: build the sidecar first" >&2
  exit 1
fi
export LOCKSIDE_BIN
echo "java client: mvn verify with LOCKSIDE_BIN=$LOCKSIDE_BIN"
cd "$here"
mvn -B -q verify
