#!/usr/bin/env bash
# Builds the Go example client for Lockside with Debian's Go toolchain and gRPC
# packages in GOPATH mode (no Go module proxy):
#   1. installs the Debian packages that are missing (apt-get, as root or via sudo);
#   2. generates the stubs from ../../proto into gopath/ (git-ignored);
#   3. builds bin/lockside-example.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
proto_dir="$(cd "$here/../../proto" && pwd)"
root=lockside.example                      # import path root of this example
gopath="$here/gopath"
src="$gopath/src/$root"

packages=(golang-go protobuf-compiler libprotobuf-dev protoc-gen-go protoc-gen-go-grpc
          golang-google-grpc-dev golang-google-protobuf-dev golang-github-golang-protobuf-1-5-dev
          golang-golang-x-sys-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "build.sh: installing ${missing[*]}" >&2
  sudo=()
  [ "$(id -u)" -eq 0 ] || sudo=(sudo)
  "${sudo[@]}" apt-get update -q
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
fi

# Stubs. The .proto has no go_package option, so map it with M flags.
rm -rf "$src/gen"
mkdir -p "$src/gen" "$src/cmd" "$here/bin"
map="Mlockside/v1/lockside.proto=$root/gen/lockside/v1;locksidev1"
protoc -I "$proto_dir" -I /usr/include \
  --go_out="$src/gen" --go_opt=paths=source_relative --go_opt="$map" \
  --go-grpc_out="$src/gen" --go-grpc_opt=paths=source_relative --go-grpc_opt="$map" \
  "$proto_dir/lockside/v1/lockside.proto"

# The hand-written packages live in this directory; link them into the GOPATH.
ln -sfn ../../../lockside "$src/lockside"
ln -sfn ../../../../cmd/lockside-example "$src/cmd/lockside-example"

export GO111MODULE=off GOPROXY=off GOFLAGS= GOPATH="$gopath:/usr/share/gocode"
[ -n "${HOME:-}${GOCACHE:-}" ] || export GOCACHE="$gopath/cache"
go build -o "$here/bin/lockside-example" "$root/cmd/lockside-example"
echo "built $here/bin/lockside-example"
