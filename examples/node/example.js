#!/usr/bin/env node
'use strict';
// Lockside from Node.js.
//
//   node example.js --addr 127.0.0.1:7420 --key demo [--hold 2] [--wait 30] [--ttl 10]
//       take the lock, print its fencing token, hold it --hold seconds, release it.
//
//   node example.js contend --addr 127.0.0.1:7420 --key demo --iterations 50 --out holds.txt
//       take and release the lock N times (waiting up to 30 s each time), holding it
//       0-2 ms, and append one line per hold to --out: `start_ns end_ns fencing_token`,
//       CLOCK_MONOTONIC nanoseconds taken right after the grant and right before the release.
//
// Exits 0 on success, 1 with a message on any error; gives up after --timeout seconds
// (default 60, not counting --hold).

const fs = require('node:fs');
const { parseArgs } = require('node:util');
const { setTimeout: sleep } = require('node:timers/promises');
const { Client } = require('./lockside');

const USAGE = `usage:
  node example.js [--addr HOST:PORT] --key KEY [--hold SECONDS] [--wait SECONDS] [--ttl SECONDS]
  node example.js contend [--addr HOST:PORT] --key KEY --iterations N --out FILE
options: --timeout SECONDS (default 60); --addr defaults to $LOCKSIDE_ADDR or 127.0.0.1:7420`;

function parse() {
  const { values, positionals } = parseArgs({
    allowPositionals: true,
    options: {
      addr: { type: 'string', default: process.env.LOCKSIDE_ADDR || '127.0.0.1:7420' },
      key: { type: 'string' },
      hold: { type: 'string', default: '2' },
      wait: { type: 'string', default: '30' },
      ttl: { type: 'string' },
      iterations: { type: 'string', default: '1' },
      out: { type: 'string' },
      timeout: { type: 'string', default: '60' },
      help: { type: 'boolean', short: 'h' },
    },
  });
  if (values.help) {
    console.log(USAGE);
    process.exit(0);
  }
  const mode = positionals[0] || 'hold';
  if (positionals.length > 1 || !['hold', 'contend'].includes(mode)) {
    throw new Error(`unexpected argument ${positionals.join(' ')}`);
  }
  if (!values.key) throw new Error('--key is required');
  const num = (name, { integer = false, min = 0 } = {}) => {
    if (values[name] === undefined) return undefined;
    const n = Number(values[name]);
    if (!Number.isFinite(n) || n < min || (integer && !Number.isInteger(n))) {
      throw new Error(`--${name}: bad value ${JSON.stringify(values[name])}`);
    }
    return n;
  };
  const args = {
    mode,
    addr: values.addr,
    key: values.key,
    hold: num('hold'),
    wait: num('wait'),
    ttl: num('ttl'),
    iterations: num('iterations', { integer: true, min: 1 }),
    out: values.out,
    timeout: num('timeout'),
  };
  if (mode === 'contend' && !args.out) throw new Error('contend: --out is required');
  return args;
}

/**
 * CLOCK_MONOTONIC in nanoseconds: one clock shared by every process on the machine
 * (performance.timeOrigin-based wall time was measured ~1 ms off here).
 */
function nowNs() {
  return process.hrtime.bigint();
}

async function holdOnce(client, args) {
  const lock = await client.lock(args.key, {
    wait: args.wait,
    ttl: args.ttl,
    onWaiting: () => console.log(`waiting for ${args.key} ...`),
  });
  console.log(`acquired ${args.key}: fencing token ${lock.fencingToken}`);
  const lost = lock.lost.then((info) => {
    throw new Error(`lock ${info.key} lost: ${info.reason}`);
  });
  await Promise.race([sleep(args.hold * 1000), lost]);
  await lock.release();
  console.log(`released ${args.key}`);
}

async function contend(client, args) {
  for (let i = 0; i < args.iterations; i++) {
    const lock = await client.lock(args.key, { wait: args.wait, ttl: args.ttl });
    const start = nowNs();
    await sleep(Math.random() * 2);
    const end = nowNs();
    if (!lock.held) throw new Error(`lock ${args.key} lost during hold ${i + 1}`);
    await lock.release();
    fs.appendFileSync(args.out, `${start} ${end} ${lock.fencingToken}\n`);
  }
  console.log(`${args.iterations} holds of ${args.key} appended to ${args.out}`);
}

async function main() {
  let args;
  try {
    args = parse();
  } catch (err) {
    console.error(`example.js: ${err.message}\n${USAGE}`);
    process.exit(2);
  }
  const limit = args.timeout + (args.mode === 'hold' ? args.hold : 0);
  const giveUp = setTimeout(() => {
    console.error(`example.js: gave up after ${limit} s`);
    process.exit(1); // ending the process ends its stream: the sidecar releases the lock
  }, limit * 1000);
  const client = new Client(args.addr, { clientName: `example.js pid ${process.pid}` });
  try {
    if (args.mode === 'contend') await contend(client, args);
    else await holdOnce(client, args);
  } catch (err) {
    console.error(`example.js: ${err.message}`);
    process.exitCode = 1;
  } finally {
    clearTimeout(giveUp);
    client.close();
  }
}

main();
