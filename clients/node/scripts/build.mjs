// Builds the package: the addon (the client core and its binding, native/ in Rust),
// then the TypeScript.
//   lockside.linux-x64-gnu.node   the addon: `cargo build --release -p lockside-node` in
//                                 the Lockside checkout above this directory, copied
//                                 here; or, with LOCKSIDE_NODE_ADDON=PATH, that file (a
//                                 build made beforehand, e.g. by CI's one release build
//                                 of the workspace). It is git-ignored, never committed.
//   dist/esm, dist/cjs            tsc: ES modules and CommonJS, each with its .d.ts, and
//                                 the addon's loader (src/addon.cjs) beside them.
//
//   node scripts/build.mjs             both
//   node scripts/build.mjs --addon     the addon only
import { execFileSync } from 'node:child_process';
import { copyFileSync, existsSync, mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const pkg = resolve(here, '..');
const require = createRequire(import.meta.url);
const addon = join(pkg, 'lockside.linux-x64-gnu.node');

if (process.platform !== 'linux' || process.arch !== 'x64') {
  console.error(`build: the addon is built for linux-x64-gnu only, not ${process.platform}-${process.arch}`);
  process.exit(1);
}
let built = process.env.LOCKSIDE_NODE_ADDON;
if (!built) {
  const repo = resolve(pkg, '..', '..');
  if (!existsSync(join(repo, 'crates', 'lockside-client'))) {
    console.error(`build: no Lockside checkout at ${repo} to build the addon in (or set LOCKSIDE_NODE_ADDON)`);
    process.exit(1);
  }
  try {
    execFileSync('cargo', ['build', '--release', '--locked', '-p', 'lockside-node'], { cwd: repo, stdio: 'inherit' });
  } catch {
    console.error('build: cargo build -p lockside-node failed (the addon needs Rust: https://rustup.rs)');
    process.exit(1);
  }
  built = join(process.env.CARGO_TARGET_DIR || join(repo, 'target'), 'release', 'liblockside_node.so');
}
copyFileSync(built, addon);
console.log(`build: ${addon} (from ${built})`);
if (process.argv.includes('--addon')) process.exit(0);

const tsc = require.resolve('typescript/bin/tsc');
rmSync(join(pkg, 'dist'), { recursive: true, force: true });
for (const [config, type] of [['tsconfig.esm.json', 'module'], ['tsconfig.cjs.json', 'commonjs']]) {
  try {
    execFileSync(process.execPath, [tsc, '-p', join(pkg, config)], { stdio: 'inherit' });
  } catch {
    console.error(`build: tsc -p ${config} failed`);
    process.exit(1);
  }
  const out = join(pkg, 'dist', type === 'module' ? 'esm' : 'cjs');
  mkdirSync(out, { recursive: true });
  // Tells Node how to read the .js files below, whatever the package's own "type".
  writeFileSync(join(out, 'package.json'), JSON.stringify({ type }) + '\n');
  // The addon's loader and its types, which tsc does not copy (plain CommonJS).
  for (const file of ['addon.cjs', 'addon.d.cts']) copyFileSync(join(pkg, 'src', file), join(out, file));
}
console.log('build: dist/esm and dist/cjs written');
