// The Node side of clients/python/bench.py (run that; it starts this):
//   node bench.mjs ADDR KEY
// For each line N on stdin: N uncontended cycles (lock KEY without waiting, release),
// then one line on stdout: a JSON array of the cycle times in microseconds.
import { createInterface } from 'node:readline';
import { Client } from 'lockside';

const [addr, key] = process.argv.slice(2);
const client = new Client(addr);
for await (const line of createInterface({ input: process.stdin })) {
  const n = Number(line);
  const out = [];
  for (let i = 0; i < n; i++) {
    const t = process.hrtime.bigint();
    const lock = await client.lock(key, { wait: 0 });
    await lock.release();
    out.push(Number(process.hrtime.bigint() - t) / 1000);
  }
  process.stdout.write(JSON.stringify(out) + '\n');
}
await client.close();
