#!/usr/bin/env bash
# The Go client's checks, as .ci/run calls them:
#
#   bash clients/go/ci.sh build     gofmt, go vet, the stubs up to date (when buf is
#                                   installed), bin/lockside-example (which
#                                   tests/client_languages.rs runs) and bin/bench; no
#                                   sidecar needed.
#   LOCKSIDE_BIN=$PWD/target/debug/lockside bash clients/go/ci.sh
#                                   all of the above, then go test against that
#                                   sidecar binary and redis-server processes the
#                                   tests start on free loopback ports (~15 s).
#
# Needs Go (on PATH or in /usr/local/go) and the Go module proxy (go.sum is committed).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mode="${1:-all}"
case "$mode" in
  build | all) ;;
  *) echo "usage: ci.sh [build]" >&2; exit 64 ;;
esac

if ! command -v go >/dev/null; then
  if [ -x /usr/local/go/bin/go ]; then
    PATH="/usr/local/go/bin:$PATH"
  else
    echo "ci.sh: Go is required (https://go.dev/dl/)" >&2
    exit 1
  fi
fi
if [ "$mode" = all ]; then
  if [ -z "${LOCKSIDE_BIN:-}" ]; then
    echo "ci.sh: set LOCKSIDE_BIN to the sidecar binary (e.g. LOCKSIDE_BIN=\$PWD/target/debug/lockside)" >&2
    exit 1
  fi
  # Absolute: the tests run in clients/go.
  LOCKSIDE_BIN="$(cd "$(dirname "$LOCKSIDE_BIN")" && pwd)/$(basename "$LOCKSIDE_BIN")"
  export LOCKSIDE_BIN
fi

cd "$here"
unformatted="$(gofmt -l .)"
if [ -n "$unformatted" ]; then
  echo "ci.sh: not gofmt-ed: $unformatted" >&2
  exit 1
fi
go vet ./...
buf="${XDG_CACHE_HOME:-$HOME/.cache}/lockside/buf-1.75.0/node_modules/.bin/buf"
if [ -x "${BUF:-$buf}" ]; then
  bash generate.sh --check
else
  echo "ci.sh: buf is not installed (.ci/run installs it): the stubs were not compared with the proto"
fi
go build -o bin/lockside-example ./cmd/lockside-example
echo "built $here/bin/lockside-example"
# The benchmark is a module of its own (go-redis stays out of the library's): kept
# building, not run.
(cd cmd/bench && go vet ./... && go build -o ../../bin/bench .)

if [ "$mode" = all ]; then
  go test -count=1 -timeout 3m ./...
fi
