#!/usr/bin/env bash
# Regenerates the gRPC stubs in locksidepb/ from ../../proto (commit the result).
# `generate.sh --check` only compares: it fails when the committed stubs are stale.
#
# The proto has no go_package option (it is shared by every language), so buf's
# managed mode gives it this module's import path. The code generators are pinned
# here and installed with `go install` into a cache directory; buf compiles the
# proto itself (no protoc). buf is the one .ci/run installs (npm, pinned), or $BUF.
set -euo pipefail

PROTOC_GEN_GO_VERSION=v1.36.12       # google.golang.org/protobuf/cmd/protoc-gen-go
PROTOC_GEN_GO_GRPC_VERSION=v1.6.2    # google.golang.org/grpc/cmd/protoc-gen-go-grpc
BUF_VERSION=1.75.0

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/lockside"

buf="${BUF:-$cache/buf-$BUF_VERSION/node_modules/.bin/buf}"
if [ ! -x "$buf" ]; then
  npm install --silent --no-audit --no-fund --prefix "$cache/buf-$BUF_VERSION" "@bufbuild/buf@$BUF_VERSION"
fi

bin="$cache/go-plugins/protoc-gen-go-$PROTOC_GEN_GO_VERSION-grpc-$PROTOC_GEN_GO_GRPC_VERSION"
if [ ! -x "$bin/protoc-gen-go" ] || [ ! -x "$bin/protoc-gen-go-grpc" ]; then
  GOBIN="$bin" go install "google.golang.org/protobuf/cmd/protoc-gen-go@$PROTOC_GEN_GO_VERSION"
  GOBIN="$bin" go install "google.golang.org/grpc/cmd/protoc-gen-go-grpc@$PROTOC_GEN_GO_GRPC_VERSION"
fi

out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
cd "$root"
PATH="$bin:$PATH" "$buf" generate --template "$here/buf.gen.yaml" --output "$out" proto
if [ "${1:-}" = "--check" ]; then
  if ! diff -r "$out/clients/go/locksidepb" "$here/locksidepb"; then
    echo "clients/go/locksidepb is stale: run bash clients/go/generate.sh and commit" >&2
    exit 1
  fi
  echo "clients/go/locksidepb is up to date"
  exit 0
fi
rm -f "$here"/locksidepb/*.pb.go
cp "$out"/clients/go/locksidepb/*.pb.go "$here/locksidepb/"
echo "generated $(cd "$here" && ls locksidepb/*.pb.go | tr '\n' ' ')"
