#!/usr/bin/env bash
# Builds and installs the client packages the way users get them, for their own tests
# and for tests/client_languages.rs (the cross-language exclusion test):
#   target/clients/venv                     a venv with the wheel `pip wheel` built from
#                                           clients/python (and pytest, for its tests, and
#                                           mypy and grpcio's stubs, for
#                                           tests/client_doc_examples.rs)
#   target/clients/node/node_modules        `npm install` of the tarball `npm pack` made
#                                           from clients/node (tsc --noEmit checked first)
# Needs python3 (with venv), node and npm; reaches PyPI and the npm registry only for
# packages not in their caches. Run from anywhere; .ci/run runs it.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$repo/target/clients"
mkdir -p "$out"

# Python: a fresh venv the first time, the package reinstalled from source every time.
venv="$out/venv"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check --quiet)
rm -rf "$out/wheel"
"${pip[@]}" wheel --no-deps --wheel-dir "$out/wheel" "$repo/clients/python"
wheel=("$out"/wheel/lockside-*.whl)
"${pip[@]}" install "${wheel[0]}" pytest==9.2.0 mypy==2.4.1 types-grpcio==1.85.0.20261028
"${pip[@]}" install --force-reinstall --no-deps "${wheel[0]}"

# Node: dependencies from the committed lock, a type check, then the tarball users get
# (its prepack script builds dist/), installed into a prefix of its own.
npm --prefix "$repo/clients/node" ci --silent --no-audit --no-fund
npm --prefix "$repo/clients/node" run --silent typecheck
tarball="$(cd "$repo/clients/node" && npm pack --silent --pack-destination "$out" | tail -n 1)"
mkdir -p "$out/node"
npm install --silent --no-audit --no-fund --no-save --prefix "$out/node" "$out/$tarball"
echo "clients: $venv, $out/node/node_modules/lockside ($tarball)"
