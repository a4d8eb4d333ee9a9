// Holders inside a session (DESIGN.md): each `lock()` call is a holder of its own, so
// callers sharing one client exclude each other exactly as separate clients would. A
// sidecar that ignores `Acquire.holder` grants them all at once (reentrantly): these
// tests fail against it.
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { after, afterEach, before, beforeEach, describe, it } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { Client, NotAcquired } from 'lockside';
import { Stack } from './servers.mjs';

const newKey = () => `test-${randomUUID().slice(0, 12)}`;

async function withClient(addr, fn, options = {}) {
  const client = new Client(addr, options);
  try {
    return await fn(client);
  } finally {
    await client.close();
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

/** Resolves with what `promise` resolves, or null after `ms`. */
const within = (promise, ms) => Promise.race([promise, sleep(ms).then(() => null)]);

/** [sessionId, holder, holdCount] of each holder of `key`, sorted. */
async function holders(client, key) {
  const d = await client.describe(key);
  return d.holders.map((h) => [h.sessionId, h.holder, h.holdCount]).sort((a, b) => a[1].localeCompare(b[1]));
}

/** The strings of a RESP array reply (HGETALL). */
function respStrings(reply) {
  const lines = reply.split('\r\n');
  assert.match(lines[0], /^\*\d+$/, reply);
  const out = [];
  for (let i = 1; i < lines.length - 1; i += 2) out.push(lines[i + 1]);
  return out;
}

describe('holders inside one client', () => {
  let stack;
  before(async () => {
    stack = await Stack.start();
  });
  after(async () => {
    await stack.stop();
  });

  it('four callers of one key on one client are inside one at a time, all in turn', async () => {
    const key = newKey();
    await withClient(stack.addr, async (c) => {
      let inside = 0;
      let most = 0;
      const tokens = [];
      const caller = async () => {
        for (let round = 0; round < 3; round++) {
          const lock = await c.lock(key, { wait: 20 });
          inside++;
          most = Math.max(most, inside);
          tokens.push(lock.fencingToken);
          // While inside, the store agrees: one holder, this call's.
          assert.deepEqual(await holders(c, key), [[c.sessionId, lock.holder, 1]]);
          inside--;
          await lock.release();
        }
      };
      await Promise.all([caller(), caller(), caller(), caller()]);
      assert.equal(most, 1);
      assert.equal(tokens.length, 12);
      for (let i = 1; i < tokens.length; i++) assert.ok(tokens[i] > tokens[i - 1], 'a new grant each time');
      assert.deepEqual(await holders(c, key), []);
    });
  });

  it('a second lock() of a held key is BUSY or waits; the same holder is reentrant', async () => {
    const key = newKey();
    await withClient(stack.addr, async (c) => {
      const held = await c.lock(key, { wait: 0 });
      await assert.rejects(c.lock(key, { wait: 0 }), (e) => e instanceof NotAcquired && e.reason === 'BUSY');
      const waiting = c.lock(key, { wait: 10 });
      assert.ok(await until(async () => (await c.describe(key)).waiters === 1), 'the second call waits');
      const again = await c.lock(key, { wait: 0, holder: held.holder });
      assert.deepEqual([again.holdCount, again.fencingToken], [2, held.fencingToken]);
      await again.release();
      assert.deepEqual(await holders(c, key), [[c.sessionId, held.holder, 1]]);
      await held.release();
      const next = await waiting;
      assert.notEqual(next.holder, held.holder);
      assert.ok(next.fencingToken > held.fencingToken);
      assert.deepEqual(await holders(c, key), [[c.sessionId, next.holder, 1]]);
      await next.release();
    });
  });

  it('a semaphore of 2 lets two of four callers in, never three', async () => {
    const key = newKey();
    await withClient(stack.addr, async (c) => {
      let inside = 0;
      let most = 0;
      const entered = [];
      let twoIn;
      const bothIn = new Promise((resolve) => (twoIn = resolve));
      const calls = Array.from({ length: 4 }, () =>
        c.lock(key, { wait: 10, limit: 2 }).then((lock) => {
          inside++;
          most = Math.max(most, inside);
          entered.push(lock);
          if (entered.length === 2) twoIn();
          return lock;
        }));
      await bothIn;
      const d = await c.describe(key);
      assert.deepEqual([d.holders.length, d.waiters], [2, 2]);
      assert.equal(entered.length, 2, 'the other two wait');
      for (const lock of entered.slice(0, 2)) {
        inside--;
        await lock.release();
      }
      const all = await Promise.all(calls);
      assert.equal(most, 2);
      assert.equal(new Set(all.map((l) => l.holder)).size, 4);
      assert.equal(new Set(all.map((l) => l.fencingToken)).size, 4, 'a permit and a token each');
      assert.deepEqual(await holders(c, key), entered.slice(2).map((l) => [c.sessionId, l.holder, 1]).sort((a, b) => a[1].localeCompare(b[1])));
      await Promise.all(entered.slice(2).map((l) => l.release()));
    });
  });

  it('two lock() calls of a shared key both hold; a writer on the same client is excluded', async () => {
    const key = newKey();
    await withClient(stack.addr, async (c) => {
      const a = await c.lock(key, { wait: 0, shared: true });
      const b = await c.lock(key, { wait: 0, shared: true });
      assert.notEqual(a.holder, b.holder);
      assert.equal(b.holdCount, 1);
      assert.deepEqual(await holders(c, key), [[c.sessionId, a.holder, 1], [c.sessionId, b.holder, 1]]);
      await assert.rejects(c.lock(key, { wait: 0 }), (e) => e instanceof NotAcquired && e.reason === 'BUSY');
      await a.release();
      assert.deepEqual(await holders(c, key), [[c.sessionId, b.holder, 1]]);
      await b.release();
      await (await c.lock(key, { wait: 0 })).release();
    });
  });

  it('a caller that gives up cancels its own wait, not another caller\'s', async () => {
    const key = newKey();
    await withClient(stack.addr, async (c) => {
      const held = await c.lock(key, { wait: 0 });
      const abort = new AbortController();
      const gaveUp = c.lock(key, { wait: 10, signal: abort.signal });
      const patient = c.lock(key, { wait: 10 });
      assert.ok(await until(async () => (await c.describe(key)).waiters === 2));
      abort.abort(new Error('gave up'));
      await assert.rejects(gaveUp, /gave up/);
      assert.ok(await until(async () => (await c.describe(key)).waiters === 1));
      await held.release();
      const lock = await patient;
      assert.deepEqual(await holders(c, key), [[c.sessionId, lock.holder, 1]]);
      await lock.release();
    });
  });

  it('Lost reaches only the holder whose grant was lost', async () => {
    const key = newKey();
    await withClient(stack.addr, async (c) => {
      const a = await c.lock(key, { wait: 0, limit: 2, ttl: 1 });
      const b = await c.lock(key, { wait: 0, limit: 2, ttl: 1 });
      // A semaphore is a hash in the store: one field per grant, 'count|token|expiry'
      // (src/store/lua/core.lua). Deleting a's makes its next renewal fail.
      const hash = `{lockside:${key}}:h`;
      const fields = respStrings(await stack.redis.command('HGETALL', hash));
      let owner;
      for (let i = 0; i < fields.length; i += 2) {
        if (fields[i + 1].split('|')[1] === String(a.fencingToken)) owner = fields[i];
      }
      assert.ok(owner, `a's grant in ${fields}`);
      assert.equal(await stack.redis.command('HDEL', hash, owner), ':1\r\n');
      const info = await within(a.lost, 5000);
      assert.ok(info, 'a is lost');
      assert.equal(info.fencingToken, a.fencingToken);
      assert.deepEqual([b.held, b.signal.aborted], [true, false]);
      assert.deepEqual(await holders(c, key), [[c.sessionId, b.holder, 1]]);
      await b.release();
      assert.deepEqual(await holders(c, key), []);
    });
  });
});

describe('holders across a sidecar restart', () => {
  let stack;
  const clients = [];
  beforeEach(async () => {
    stack = await Stack.start({ sidecarArgs: ['--attachment-ttl', '600ms'] });
  });
  afterEach(async () => {
    await Promise.all(clients.splice(0).map((c) => c.close()));
    await stack.stop();
  });

  it('a resumed session gives each holder its own grant back', async () => {
    const key = newKey();
    const c = new Client(stack.addr);
    clients.push(c);
    const a = await c.lock(`${key}-sem`, { wait: 0, limit: 2 });
    const b = await c.lock(`${key}-sem`, { wait: 0, limit: 2 });
    const x = await c.lock(`${key}-x`, { wait: 0 });
    const x2 = await c.lock(`${key}-x`, { wait: 0, holder: x.holder });
    // The session's record lists each holder's grant (tests/servers.mjs `recorded`).
    assert.ok(await until(() => stack.recorded(c.sessionId, 3)), 'recorded');
    await stack.restartSidecar();
    const later = await c.lock(`${key}-later`, { wait: 0 }); // waits for the resume
    assert.equal(later.sessionId, a.sessionId);
    for (const lock of [a, b, x, x2]) assert.deepEqual([lock.held, lock.signal.aborted], [true, false]);
    const sem = (await c.describe(`${key}-sem`)).holders.map((h) => [h.holder, h.fencingToken]).sort();
    assert.deepEqual(sem, [[a.holder, a.fencingToken], [b.holder, b.fencingToken]].sort());
    assert.deepEqual(await holders(c, `${key}-x`), [[c.sessionId, x.holder, 2]]);
    await a.release();
    assert.deepEqual(await holders(c, `${key}-sem`), [[c.sessionId, b.holder, 1]]);
    // a's permit is free again, b's is not.
    await withClient(stack.addr, async (other) => {
      const permit = await other.lock(`${key}-sem`, { wait: 0, limit: 2 });
      await assert.rejects(other.lock(`${key}-sem`, { wait: 0, limit: 2 }), NotAcquired);
      await permit.release();
    });
    await x2.release();
    assert.deepEqual(await holders(c, `${key}-x`), [[c.sessionId, x.holder, 1]]);
    await Promise.all([b, x, later].map((l) => l.release()));
  });
});
