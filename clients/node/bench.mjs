// The Node side of clients/python/bench.py (run that; it starts this):
//   node bench.mjs ADDR KEY [REDIS_PORT PEERS]
// For each line on stdin, `N` (or `lockside N`): N uncontended cycles of the Lockside
// client (lock KEY without waiting, release); `redlock N`: N cycles of npm's `redlock`
// 4 on `ioredis` on the Redis at REDIS_PORT (one Redis; from the node_modules folder
// PEERS, installed by bench.py: neither is a dependency of the package). Then one line
// on stdout: a JSON array of the cycle times in microseconds.
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { Client } from 'lockside';

const [addr, key, redisPort, peers] = process.argv.slice(2);
const client = new Client(addr);
let redlock;
let redis;
if (redisPort && peers) {
  const require = createRequire(join(peers, 'x.js'));
  const Redis = require('ioredis');
  const Redlock = require('redlock');
  redis = new Redis({ host: '127.0.0.1', port: Number(redisPort) });
  redlock = new Redlock([redis], { retryCount: 0 });
}

async function cycles(kind, n) {
  const out = [];
  for (let i = 0; i < n; i++) {
    const t = process.hrtime.bigint();
    if (kind === 'redlock') {
      const lock = await redlock.lock(`${key}-redlock`, 10000);
      await lock.unlock();
    } else {
      const lock = await client.lock(key, { wait: 0 });
      await lock.release();
    }
    out.push(Number(process.hrtime.bigint() - t) / 1000);
  }
  return out;
}

for await (const line of createInterface({ input: process.stdin })) {
  const [kind, n] = line.includes(' ') ? line.split(' ') : ['lockside', line];
  if (kind === 'redlock' && !redlock) throw new Error('redlock: no REDIS_PORT and PEERS given');
  process.stdout.write(JSON.stringify(await cycles(kind, Number(n))) + '\n');
}
await client.close();
if (redis) await redis.quit();
