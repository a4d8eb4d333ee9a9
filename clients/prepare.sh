#!/usr/bin/env bash
# Builds and installs the client packages the way users get them, for their own tests
# and for tests/client_languages.rs (the cross-language exclusion test):
#   target/clients/wheel/lockside-*.whl     the Python wheel, built once by maturin
#                                           (`maturin build --release`: the binding and
#                                           the client core, on the workspace's target/,
#                                           so it shares compiled crates with the
#                                           sidecar's release build)
#   target/clients/venv                     a fresh venv with that wheel installed on a
#                                           PATH without cargo (and pytest, grpcio-tools
#                                           for the README recipe's test, mypy for
#                                           tests/client_doc_examples.rs)
#   target/clients/node/node_modules        `npm install` (no cargo on the PATH) of the
#                                           tarball `npm pack` made from clients/node: the
#                                           TypeScript and the prebuilt addon (tsc
#                                           --noEmit checked first)
#   target/clients/node/tests               the Node package's tests, run there
#                                           (`npm --prefix target/clients/node test`) so
#                                           that they import the installed package
# Needs cargo, python3 (with venv), node and npm; reaches crates.io, PyPI and the npm
# registry only for what is not in their caches. Run from anywhere; .ci/run runs it.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$repo/target/clients"
mkdir -p "$out"
MATURIN_VERSION=1.16.0

# Python: maturin in a venv of its own (the build's tools), the wheel built once.
tools="$out/build-tools"
if [ ! -x "$tools/bin/maturin" ]; then
  python3 -m venv "$tools"
  "$tools/bin/python" -m pip --disable-pip-version-check --quiet install "maturin==$MATURIN_VERSION"
fi
rm -rf "$out/wheel"
started=$SECONDS
"$tools/bin/maturin" build --release --locked --quiet \
  --manifest-path "$repo/clients/python/Cargo.toml" --out "$out/wheel"
echo "clients: the wheel built in $((SECONDS - started)) s"
wheel=("$out"/wheel/lockside-*.whl)

# Installed into a fresh venv with cargo off the PATH: the wheel carries everything.
venv="$out/venv"
rm -rf "$venv"
python3 -m venv "$venv"
no_cargo_path="$(printf '%s' "$PATH" | tr ':' '\n' | grep -v -e cargo -e rustup | paste -sd: -)"
PATH="$no_cargo_path" "$venv/bin/python" -m pip --disable-pip-version-check --quiet install \
  "${wheel[0]}" pytest==9.2.0 mypy==2.4.1 types-grpcio==1.85.0.20261028 grpcio==1.85.1 \
  grpcio-tools==1.85.1
if PATH="$no_cargo_path" command -v cargo >/dev/null; then
  echo "clients: cargo is still on the PATH the wheel was installed with" >&2
  exit 1
fi

# Node: dependencies from the committed lock, a type check, then the tarball users get
# (its prepack script builds the addon, `cargo build --release -p lockside-node`, and
# dist/), installed into a prefix of its own with cargo off the PATH. The package's tests
# are copied beside that install (target/clients/node/tests), so that they import it.
npm --prefix "$repo/clients/node" ci --silent --no-audit --no-fund
npm --prefix "$repo/clients/node" run --silent typecheck
started=$SECONDS
tarball="$(cd "$repo/clients/node" && npm pack --silent --pack-destination "$out" | tail -n 1)"
echo "clients: the Node package (its addon and dist/) built in $((SECONDS - started)) s"
tar -tzf "$out/$tarball" >"$out/node-tarball.txt"
if ! grep -qx 'package/lockside.linux-x64-gnu.node' "$out/node-tarball.txt"; then
  echo "clients: $tarball holds no addon (package/lockside.linux-x64-gnu.node)" >&2
  exit 1
fi
rm -rf "$out/node"
mkdir -p "$out/node"
printf '%s\n' '{ "private": true, "scripts": { "test": "node --test tests/" } }' >"$out/node/package.json"
PATH="$no_cargo_path" npm install --silent --no-audit --no-fund --no-save --prefix "$out/node" "$out/$tarball"
cp -r "$repo/clients/node/tests" "$out/node/tests"
echo "clients: $venv (${wheel[0]##*/}), $out/node/node_modules/lockside ($tarball)"
