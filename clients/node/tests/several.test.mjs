// Several keys at once (DESIGN.md, "Several keys at once"): `client.lockAll()` against
// real sidecars on a real Redis (tests/servers.mjs): all or none, a token per key, no
// deadlock between callers asking in opposite orders, one release for all.
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { after, before, describe, it } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { Client, Lock, Locks, NotAcquired, Rejected } from 'lockside';
import { Stack } from './servers.mjs';

const newKey = () => `test-${randomUUID().slice(0, 12)}`;

/** Opens clients (one per address) for `fn` and closes them after it, whatever happens. */
async function withClients(addrs, fn) {
  const clients = addrs.map((addr) => new Client(addr));
  try {
    return await fn(...clients);
  } finally {
    await Promise.all(clients.map((c) => c.close()));
  }
}

async function until(predicate, timeoutMs = 5000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await predicate();
    if (value || Date.now() > deadline) return value;
    await sleep(10);
  }
}

/** The holders' [sessionId, fencingToken] of each key, as the store says. */
async function held(client, keys) {
  const out = {};
  for (const key of keys) out[key] = (await client.describe(key)).holders.map((h) => [h.sessionId, h.fencingToken]);
  return out;
}

const none = (keys) => Object.fromEntries(keys.map((k) => [k, []]));

describe('lockAll', () => {
  let stack;
  let second;
  before(async () => {
    stack = await Stack.start();
    second = await stack.startSidecar();
  });
  after(async () => {
    await stack.stop();
  });

  it('gives each key its Lock and fencing token, as describe() shows them; release frees all', async () => {
    const keys = [newKey(), newKey(), newKey()];
    await withClients([stack.addr, second.addr], async (a, b) => {
      const locks = await a.lockAll(keys, { wait: 5 });
      assert.ok(locks instanceof Locks);
      assert.deepEqual(locks.keys, keys, 'in the order asked');
      assert.equal(locks.locks.length, 3);
      assert.ok(locks.held);
      const store = await held(b, keys);
      for (const [i, key] of keys.entries()) {
        const lock = locks.get(key);
        assert.ok(lock instanceof Lock);
        assert.equal(lock, locks.locks[i]);
        assert.equal(lock.key, key);
        assert.equal(typeof lock.fencingToken, 'bigint');
        assert.equal(locks.fencingTokens.get(key), lock.fencingToken);
        assert.deepEqual(store[key], [[a.sessionId, lock.fencingToken]], `the store holds ${key} for a`);
      }
      assert.equal(locks.get('not-asked'), undefined);
      assert.deepEqual([...locks].map((l) => l.key), keys);
      // Another client gets none of them while a holds them all.
      await assert.rejects(b.lockAll([keys[2], keys[0]], { wait: 0 }), (e) => e instanceof NotAcquired && e.reason === 'BUSY');
      await locks.release();
      assert.ok(!locks.held);
      for (const lock of locks) assert.ok(!lock.held);
      assert.deepEqual(await held(b, keys), none(keys), 'release() gave every key back');
      // And at once: b takes them all without waiting, each with a higher token.
      const again = await b.lockAll([...keys].reverse(), { wait: 0 });
      for (const key of keys) assert.ok(again.fencingTokens.get(key) > locks.fencingTokens.get(key));
      await again.release();
      await again.release(); // a second release is nothing
    });
  });

  it('is all or none: busy, timed out and aborted requests hold nothing', async () => {
    const keys = [newKey(), newKey(), newKey()];
    await withClients([stack.addr, second.addr], async (a, b) => {
      const middle = await a.lock(keys[1]);
      const others = [keys[0], keys[2]];
      await assert.rejects(b.lockAll(keys, { wait: 0 }), (e) => e instanceof NotAcquired && e.reason === 'BUSY');
      assert.deepEqual(await held(a, others), none(others), 'busy: nothing held');
      await assert.rejects(b.lockAll(keys, { wait: 0.3 }), (e) => e instanceof NotAcquired && e.reason === 'TIMEOUT');
      assert.deepEqual(await held(a, others), none(others), 'timed out: nothing held');
      const ac = new AbortController();
      const asked = b.lockAll(keys, { wait: 20, signal: ac.signal });
      assert.ok(await until(async () => (await a.describe(keys[1])).waiters === 1), 'b waits for the busy key');
      assert.deepEqual(await held(a, others), none(others), 'a waiting request holds nothing');
      ac.abort(new Error('given up'));
      await assert.rejects(asked, /given up/);
      assert.ok(await until(async () => (await a.describe(keys[1])).waiters === 0), 'the wait is cancelled');
      assert.deepEqual(await held(a, others), none(others), 'aborted: nothing held');
      // The keys were free all along: a takes the others at once, then b waits for all.
      const rest = await a.lockAll(others, { wait: 0 });
      await rest.release();
      const all = b.lockAll(keys, { wait: 20 });
      assert.ok(await until(async () => (await a.describe(keys[1])).waiters === 1));
      await middle.release();
      const locks = await all;
      assert.deepEqual((await held(a, keys))[keys[1]], [[b.sessionId, locks.fencingTokens.get(keys[1])]]);
      await locks.release();
    });
  });

  it('two callers asking for overlapping keys in opposite orders never deadlock', async () => {
    const [x, y, z] = [newKey(), newKey(), newKey()];
    await withClients([stack.addr, second.addr], async (a, b) => {
      let inside = 0;
      let most = 0;
      const tokens = { [x]: [], [y]: [] };
      const caller = async (client, keys) => {
        for (let round = 0; round < 15; round++) {
          const locks = await client.lockAll(keys, { wait: 20 });
          inside++;
          most = Math.max(most, inside);
          tokens[x].push(locks.fencingTokens.get(x));
          tokens[y].push(locks.fencingTokens.get(y));
          await sleep(1);
          inside--;
          await locks.release();
        }
      };
      await Promise.all([caller(a, [x, y]), caller(b, [y, x]), caller(a, [z, y, x])]);
      assert.equal(most, 1, 'never two holders of x and y');
      for (const key of [x, y]) {
        const sorted = [...tokens[key]].sort((p, q) => (p < q ? -1 : p > q ? 1 : 0));
        assert.equal(new Set(sorted).size, 45, `a new grant of ${key} each time`);
      }
      assert.deepEqual(await held(a, [x, y, z]), none([x, y, z]));
    });
  });

  it('shared: readers of the same keys coexist and exclude a writer', async () => {
    const keys = [newKey(), newKey()];
    await withClients([stack.addr, second.addr], async (a, b) => {
      const r1 = await a.lockAll(keys, { shared: true, wait: 0 });
      const r2 = await b.lockAll(keys, { shared: true, wait: 0 });
      assert.equal((await a.describe(keys[0])).holders.length, 2);
      await assert.rejects(b.lockAll(keys, { wait: 0 }), (e) => e instanceof NotAcquired && e.reason === 'BUSY');
      await r1.release();
      await r2.release();
      const w = await b.lockAll(keys, { wait: 0, fair: true });
      await w.release();
    });
  });

  it('bad requests are clear errors and the session goes on', async () => {
    const key = newKey();
    await withClients([stack.addr], async (c) => {
      await assert.rejects(c.lockAll(key), TypeError, 'a string is one key');
      await assert.rejects(c.lockAll([key, 7]), TypeError);
      await assert.rejects(c.lockAll([key, newKey()], { wait: -1 }), RangeError);
      await assert.rejects(c.lockAll([key]), (e) => e instanceof Rejected && e.code === 3, 'one key');
      await assert.rejects(c.lockAll([key, key]), (e) => e instanceof Rejected && e.code === 3, 'a key twice');
      const many = Array.from({ length: 65 }, newKey);
      await assert.rejects(c.lockAll(many), (e) => e instanceof Rejected && e.code === 3, '65 keys');
      await assert.rejects(c.lockAll([key, '']), (e) => e instanceof Rejected, 'a bad key');
      const locks = await c.lockAll([key, newKey()], { wait: 0 });
      await locks.release();
    });
  });
});
