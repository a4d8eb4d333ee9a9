// The Node client against a real sidecar on a real Redis (tests/servers.mjs).
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { after, before, describe, it } from 'node:test';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { Client, LockLost, NotAcquired, Rejected, Unavailable } from 'lockside';
import { Stack, freePort } from './servers.mjs';

const newKey = () => `test-${randomUUID().slice(0, 12)}`;

/** Opens clients for `fn` and closes them after it, whatever happens. */
async function withClients(addr, n, fn, options = {}) {
  const clients = Array.from({ length: n }, () => new Client(addr, options));
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

describe('on a shared sidecar', () => {
  let stack;
  before(async () => {
    stack = await Stack.start();
  });
  after(async () => {
    await stack.stop();
  });

  it('grants with a bigint fencing token that describe() shows', async () => {
    const key = newKey();
    await withClients(stack.addr, 1, async (c) => {
      const lock = await c.lock(key, { wait: 0, ttl: 10 });
      assert.equal(typeof lock.fencingToken, 'bigint');
      assert.ok(lock.fencingToken > 0n && lock.ttl > 0 && lock.ttl <= 10);
      const d = await c.describe(key);
      assert.equal(d.fencingToken, lock.fencingToken);
      assert.deepEqual(d.holders.map((h) => [h.sessionId, h.clientName]), [[c.sessionId, 'node-test']]);
      await lock.release();
      assert.equal(lock.held, false);
      assert.deepEqual((await c.describe(key)).holders, []);
    }, { clientName: 'node-test' });
  });

  it('rejects a busy key with NotAcquired BUSY, and TIMEOUT after a wait', async () => {
    const key = newKey();
    await withClients(stack.addr, 2, async (a, b) => {
      const lock = await a.lock(key, { wait: 0 });
      await assert.rejects(b.lock(key, { wait: 0 }), (e) => e instanceof NotAcquired && e.reason === 'BUSY');
      await assert.rejects(b.lock(key, { wait: 0.1 }), (e) => e instanceof NotAcquired && e.reason === 'TIMEOUT');
      await lock.release();
      const next = await b.lock(key, { wait: 0 });
      assert.ok(next.fencingToken > lock.fencingToken);
      await next.release();
    });
  });

  it('grants a waiter when the holder releases; an aborted wait is cancelled', async () => {
    const key = newKey();
    await withClients(stack.addr, 2, async (a, b) => {
      const first = await a.lock(key, { wait: 0 });
      const waiting = b.lock(key, { wait: 10 });
      assert.ok(await until(async () => (await a.describe(key)).waiters === 1));
      await first.release();
      const second = await waiting;
      assert.ok(second.fencingToken > first.fencingToken);
      const abort = new AbortController();
      const late = a.lock(key, { wait: 10, signal: abort.signal });
      assert.ok(await until(async () => (await a.describe(key)).waiters === 1));
      abort.abort(new Error('gave up'));
      await assert.rejects(late, /gave up/);
      assert.ok(await until(async () => (await a.describe(key)).waiters === 0));
      await second.release();
      await (await a.lock(key, { wait: 0 })).release();
    });
  });

  it('is reentrant for one holder: same token, holds counted, released one by one', async () => {
    const key = newKey();
    await withClients(stack.addr, 2, async (c, other) => {
      const outer = await c.lock(key, { wait: 0 });
      const inner = await c.lock(key, { wait: 0, holder: outer.holder });
      assert.equal(inner.holdCount, 2);
      assert.equal(inner.fencingToken, outer.fencingToken);
      await inner.release();
      assert.equal((await c.describe(key)).holders[0].holdCount, 1);
      await assert.rejects(other.lock(key, { wait: 0 }), NotAcquired);
      await outer.release();
      assert.deepEqual((await c.describe(key)).holders, []);
    });
  });

  it('withLock releases when the function throws', async () => {
    const key = newKey();
    await withClients(stack.addr, 1, async (c) => {
      await assert.rejects(c.withLock(key, { wait: 0 }, () => {
        throw new Error('boom');
      }), /boom/);
      assert.deepEqual((await c.describe(key)).holders, []);
      assert.equal(await c.withLock(key, { wait: 0 }, (lock) => lock.holdCount), 1);
    });
  });

  it('holds many locks on one session at once', async () => {
    const key = newKey();
    await withClients(stack.addr, 1, async (c) => {
      const keys = Array.from({ length: 50 }, (_, i) => `${key}-${i}`);
      const locks = await Promise.all(keys.map((k) => c.lock(k, { wait: 0 })));
      assert.deepEqual(locks.map((l) => l.key), keys);
      assert.deepEqual(new Set(locks.map((l) => l.sessionId)), new Set([c.sessionId]));
      await Promise.all(locks.map((l) => l.release()));
      for (const k of keys) assert.deepEqual((await c.describe(k)).holders, []);
    });
  });

  it('shared holders coexist; a semaphore counts permits', async () => {
    const key = newKey();
    await withClients(stack.addr, 3, async (a, b, x) => {
      const ra = await a.lock(key, { wait: 0, shared: true });
      const rb = await b.lock(key, { wait: 0, shared: true });
      assert.equal((await a.describe(key)).holders.length, 2);
      await assert.rejects(x.lock(key, { wait: 0 }), NotAcquired);
      await ra.release();
      await rb.release();
      const sem = `${key}-sem`;
      const pa = await a.lock(sem, { wait: 0, limit: 2 });
      const pb = await b.lock(sem, { wait: 0, limit: 2, fair: true });
      await assert.rejects(x.lock(sem, { wait: 0, limit: 2 }), NotAcquired);
      await pa.release();
      await pb.release();
    });
  });

  it('bad input is a clear error and the session goes on', async () => {
    const key = newKey();
    await withClients(stack.addr, 1, async (c) => {
      const held = await c.lock(key, { wait: 0 });
      await assert.rejects(c.lock('', { wait: 0 }), (e) =>
        e instanceof Rejected && e.code === 3 && e.codeName === 'INVALID_ARGUMENT' && /empty/.test(e.details));
      await assert.rejects(c.lock('k'.repeat(600), { wait: 0 }), (e) => e instanceof Rejected && e.code === 3);
      await assert.rejects(c.lock('k'.repeat(100_000), { wait: 0 }), (e) =>
        e instanceof Rejected && e.code === 8 && e.message.length < 500);
      await assert.rejects(c.lock(`${key}-ttl`, { wait: 0, ttl: 0.5 }), (e) => e instanceof Rejected && e.code === 3);
      const reader = await c.lock(`${key}-rw`, { wait: 0, shared: true });
      await assert.rejects(c.lock(`${key}-rw`, { wait: 0, holder: reader.holder }), (e) => e instanceof Rejected && e.code === 9);
      await assert.rejects(c.lock(key, { wait: -1 }), RangeError);
      await assert.rejects(c.lock(key, { ttl: Number.NaN }), RangeError);
      await assert.rejects(c.lock(key, { limit: 1.5 }), RangeError);
      await assert.rejects(c.lock(undefined), TypeError);
      await assert.rejects(c.describe(''), (e) => e instanceof Rejected && e.code === 3);
      assert.equal(held.held, true);
      assert.equal((await c.describe(key)).holders[0].sessionId, c.sessionId);
    });
  });

  it('a key or holder that is not UTF-8, or too large to send, is refused and the session goes on', async () => {
    const key = newKey();
    await withClients(stack.addr, 1, async (c) => {
      const precious = await c.lock(`${key}-precious`, { wait: 0 });
      const session = c.sessionId;
      await assert.rejects(c.lock('a\ud800b', { wait: 0 }), (e) =>
        e instanceof RangeError && /^key "a\\ud800b" cannot be encoded as UTF-8: .*lone surrogate.*512 bytes/.test(e.message));
      await assert.rejects(c.lock('\udc00', { wait: 5 }), /key .* lone surrogate/);
      await assert.rejects(c.lock(key, { wait: 0, holder: 'me\ud83d' }), (e) =>
        e instanceof RangeError && /^holder "me\\ud83d" cannot be encoded as UTF-8/.test(e.message));
      await assert.rejects(c.lock('k'.repeat(5_000_000), { wait: 0 }), (e) =>
        e instanceof RangeError && /more than the 4 MiB the sidecar reads/.test(e.message) && e.message.length < 500);
      await assert.rejects(precious.proclaim('v'.repeat(5_000_000)), /more than the 4 MiB/);
      await assert.rejects(c.describe('a\ud800b'), RangeError);
      await assert.rejects(c.watch('a\ud800b').next(), RangeError);
      // A pair is a character, not a lone surrogate.
      await (await c.lock(`${key}-\ud83d\udd12`, { wait: 0 })).release();
      assert.equal(precious.held, true);
      assert.equal(c.sessionId, session);
      assert.deepEqual((await c.describe(`${key}-precious`)).holders.map((h) => [h.sessionId, h.holder]), [[session, precious.holder]]);
      await precious.proclaim('still mine');
      assert.equal((await c.describe(`${key}-precious`)).holders[0].value.toString(), 'still mine');
      await precious.release();
    });
  });

  it('a wait over 2**31 ms is the sidecar\'s clear INVALID_ARGUMENT, with no timer overflow', async () => {
    const key = newKey();
    const warnings = [];
    const onWarning = (w) => warnings.push(w);
    process.on('warning', onWarning);
    try {
      await withClients(stack.addr, 2, async (c, other) => {
        const held = await c.lock(key, { wait: 0 });
        const started = Date.now();
        await assert.rejects(c.lock(`${key}-long`, { wait: 3_000_000 }), (e) =>
          e instanceof Rejected && e.codeName === 'INVALID_ARGUMENT' && /wait.*3000000.*maximum.*86400/.test(e.details));
        assert.ok(Date.now() - started < 2000, 'answered at once');
        // The longest wait the sidecar allows is still waited for (and given up here).
        const abort = new AbortController();
        const waiting = other.lock(key, { signal: abort.signal }); // 24 h
        assert.ok(await until(async () => (await c.describe(key)).waiters === 1));
        abort.abort(new Error('gave up'));
        await assert.rejects(waiting, /gave up/);
        assert.equal(held.held, true);
        await held.release();
      }, { connectTimeout: 3_000_000 }); // a session opened with a timer that long too
      await new Promise((resolve) => setImmediate(resolve)); // warnings are emitted on the next tick
    } finally {
      process.off('warning', onWarning);
    }
    assert.deepEqual(warnings.map((w) => `${w.name}: ${w.message}`), []);
  });

  it('close() ends the session: its locks are lost and released', async () => {
    const key = newKey();
    const c = new Client(stack.addr);
    const lock = await c.lock(key, { wait: 0 });
    await c.close();
    assert.equal((await lock.lost).reason, 'client closed');
    await withClients(stack.addr, 1, async (other) => (await other.lock(key, { wait: 5 })).release());
    await assert.rejects(c.lock(key, { wait: 0 }), /closed/);
  });
});

describe('when something dies', () => {
  it('loses the lock when Redis dies, and release() rejects with LockLost', async () => {
    const stack = await Stack.start();
    try {
      await withClients(stack.addr, 1, async (c) => {
        const key = newKey();
        const lock = await c.lock(key, { wait: 0, ttl: 1 });
        await stack.redis.stop();
        const info = await Promise.race([lock.lost, sleep(5000).then(() => null)]);
        assert.ok(info, 'no Lost within 5 s of Redis dying');
        assert.equal(lock.signal.aborted, true);
        await assert.rejects(lock.release(), (e) => e instanceof LockLost && e.fencingToken === lock.fencingToken);
        await lock.release(); // reported once
        await assert.rejects(c.lock(`${key}-2`, { wait: 0 }), (e) => e instanceof Rejected && e.code === 14);
      });
    } finally {
      await stack.stop();
    }
  });

  it('without resume, loses every lock when the stream breaks; the next lock opens a new session', async () => {
    const stack = await Stack.start();
    try {
      await withClients(stack.addr, 1, async (c) => {
        const key = newKey();
        const locks = await Promise.all([0, 1, 2].map((i) => c.lock(`${key}-${i}`, { wait: 0 })));
        const first = c.sessionId;
        const port = stack.addr.split(':').pop();
        await stack.sidecar.kill();
        for (const lock of locks) {
          assert.ok(await Promise.race([lock.lost, sleep(5000).then(() => null)]), 'a broken stream loses the lock');
        }
        await assert.rejects(c.lock(`${key}-x`, { wait: 0 }), Unavailable);
        stack.sidecar = await stack.startSidecar(`127.0.0.1:${port}`);
        const fresh = await c.lock(`${key}-new`, { wait: 0 });
        assert.notEqual(c.sessionId, first);
        await fresh.release();
      }, { connectTimeout: 2, resume: false }); // (resume.test.mjs resumes)
    } finally {
      await stack.stop();
    }
  });

  it('no sidecar: Unavailable', async () => {
    await withClients(`127.0.0.1:${await freePort()}`, 1, async (c) => {
      await assert.rejects(c.lock('nobody-listens', { wait: 0 }), Unavailable);
    }, { connectTimeout: 0.5 });
  });

  it('no sidecar: fails at once naming the address and the cause', { timeout: 20000 }, async () => {
    const addr = `127.0.0.1:${await freePort()}`;
    await withClients(addr, 1, async (c) => {
      const started = performance.now();
      await assert.rejects(c.lock('nobody-listens', { wait: 0 }), (e) =>
        e instanceof Unavailable && e.message.startsWith(`no sidecar at ${addr}: connect ECONNREFUSED ${addr}`) &&
        /waitForSidecar/.test(e.message));
      assert.ok(performance.now() - started < 1000, `failed after ${performance.now() - started} ms`);
      // Again on the same client, whose channel has failed before: still within ~1 s.
      const again = performance.now();
      await assert.rejects(c.lock('nobody-listens', { wait: 0 }), /no sidecar at/);
      assert.ok(performance.now() - again < 1500, `failed after ${performance.now() - again} ms`);
    });
    const socket = join(tmpdir(), `lockside-none-${process.pid}.sock`);
    await withClients(`unix:${socket}`, 1, async (c) => {
      await assert.rejects(c.lock('nobody-listens', { wait: 0 }), new RegExp(`no sidecar at unix:${socket}: connect ENOENT`));
    });
    await withClients(addr, 1, async (c) => {
      await assert.rejects(c.lock('nobody-listens', { wait: 0 }), /no sidecar at .* \(waited 0.3 s\)$/);
    }, { waitForSidecar: 0.3 });
  });

  it('waitForSidecar: says so once, and connects when a sidecar starts there', { timeout: 20000 }, async () => {
    const stack = await Stack.start();
    const warn = console.warn;
    const lines = [];
    let warned;
    const firstLine = new Promise((resolve) => (warned = resolve));
    console.warn = (...args) => {
      lines.push(args.join(' '));
      warned();
    };
    try {
      const addr = `127.0.0.1:${await freePort()}`;
      await withClients(addr, 1, async (c) => {
        const locking = c.lock(newKey(), { wait: 0 });
        await firstLine;
        assert.match(lines[0], new RegExp(`^lockside: no sidecar at ${addr} yet \\(connect ECONNREFUSED .*\\); waiting up to 30 s`));
        await stack.startSidecar(addr);
        const lock = await locking;
        assert.equal(lock.sessionId, c.sessionId);
        await lock.release();
      }, { waitForSidecar: 30 });
      assert.equal(lines.length, 1, lines.join('\n'));
    } finally {
      console.warn = warn;
      await stack.stop();
    }
  });
});

describe('leader election', () => {
  let stack;
  let addr;
  before(async () => {
    stack = await Stack.start();
    addr = stack.sidecar.addr;
  });
  after(async () => {
    await stack.stop();
  });

  /** The next state of a watch, or a failure after 5 s. */
  async function next(states) {
    let timer;
    const timeout = new Promise((_, reject) => {
      timer = setTimeout(() => reject(new Error('no state within 5 s')), 5000);
    });
    try {
      const { value, done } = await Promise.race([states.next(), timeout]);
      assert.equal(done, false, 'the watch ended');
      return value;
    } finally {
      clearTimeout(timer);
    }
  }

  it('campaigns, proclaims and watches the leader', async () => {
    const key = newKey();
    await withClients(addr, 2, async (c, follower) => {
      const states = follower.watch(key);
      assert.equal((await next(states)).leader, undefined);
      const lead = await c.campaign(key, 'web-1:8080', { ttl: 5 });
      let state = await next(states);
      assert.equal(state.leader.value.toString(), 'web-1:8080');
      assert.equal(state.leader.fencingToken, lead.fencingToken);
      assert.equal(state.leader.clientName, 'node-elect');
      await lead.proclaim(Buffer.from('web-1:9090'));
      assert.equal((await next(states)).leader.value.toString(), 'web-1:9090');
      await lead.release();
      state = await next(states);
      assert.equal(state.leader, undefined);
      assert.equal(state.fencingToken, lead.fencingToken);
      await states.return(); // ends the watch
    }, { clientName: 'node-elect' });
  });

  it('candidates lead in the order they campaigned', async () => {
    const key = newKey();
    await withClients(addr, 3, async (a, b, w) => {
      const first = await a.campaign(key, 'a');
      const second = b.campaign(key, 'b', { wait: 10 });
      assert.ok(await until(async () => (await w.describe(key)).queue.length === 1));
      await first.release();
      const lead = await second;
      assert.ok(lead.fencingToken > first.fencingToken);
      assert.equal((await w.describe(key)).leader.value.toString(), 'b');
      await lead.release();
    });
  });

  it('refuses bad keys, big values, and proclaims after the end', async () => {
    const key = newKey();
    await withClients(addr, 1, async (c) => {
      await assert.rejects(next(c.watch('')), (e) => e instanceof Rejected && e.code === 3);
      await assert.rejects(c.campaign(key, 'x'.repeat(4097)), (e) => e instanceof Rejected && e.code === 3);
      const lead = await c.campaign(key, 'a');
      await assert.rejects(lead.proclaim('x'.repeat(4097)), (e) => e instanceof Rejected && e.code === 3);
      await assert.rejects(lead.proclaim(42), TypeError);
      await lead.release();
      await assert.rejects(lead.proclaim('late'), /released/);
      const ac = new AbortController();
      const states = c.watch(key, { signal: ac.signal });
      await next(states);
      ac.abort();
      assert.deepEqual(await states.next(), { value: undefined, done: true });
    });
  });
});
