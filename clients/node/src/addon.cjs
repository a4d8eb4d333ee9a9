// The addon (the client core, built by napi-rs from native/): the prebuilt binary for
// this platform, shipped at the package's root. Only linux-x64-gnu is built today.
// scripts/build.mjs copies this file beside the compiled code (dist/esm, dist/cjs).
'use strict';
const { join } = require('node:path');

function target() {
  const { platform, arch } = process;
  if (platform !== 'linux') return `${platform}-${arch}`;
  const glibc = process.report?.getReport?.().header?.glibcVersionRuntime;
  return `linux-${arch}-${glibc ? 'gnu' : 'musl'}`;
}

const file = join(__dirname, '..', '..', `lockside.${target()}.node`);
try {
  module.exports = require(file);
} catch (e) {
  const err = new Error(
    `lockside: cannot load its native addon ${file} (${e.message}); this package ships one for ` +
      'linux-x64-gnu: build it for this platform from a Lockside checkout (clients/node/README.md, "Develop")',
    { cause: e },
  );
  throw err;
}
