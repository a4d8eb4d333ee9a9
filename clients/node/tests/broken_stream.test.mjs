// A broken stream (DESIGN.md): the moment the client sees its stream break, every lock
// of the session is suspended; it is restored when the resumed session lists it, lost
// otherwise. A live sidecar whose stream broke releases at once (after a 30 ms grace)
// and a waiter on another sidecar is granted within milliseconds, so these tests put a
// waiter there and check the holding intervals for overlaps (TESTING.md): holders stamp
// t_ack when a grant or a restore arrives and t_end when they are told to stop
// (`lock.signal` aborted: suspended or lost) or before they release.
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { once } from 'node:events';
import { afterEach, beforeEach, describe, it } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { Client, LockLost, LockSuspended } from 'lockside';
import { History, TcpProxy, now } from './faults.mjs';
import { Stack } from './servers.mjs';

const newKey = () => `test-${randomUUID().slice(0, 12)}`;

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

/**
 * Follows a held lock as an application would: it uses the lock while `lock.signal` is
 * not aborted, and takes it up again on `'restored'`. Stamps the intervals in `history`.
 * `told` resolves (with when) the first time the holder is told to stop; `events` lists
 * the lock's events in order.
 */
function follow(history, who, lock) {
  let end = history.granted(who, lock.fencingToken);
  const events = [];
  let tellStop;
  const told = new Promise((resolve) => (tellStop = resolve));
  const watch = () => {
    const signal = lock.signal;
    signal.addEventListener('abort', () => {
      end(signal.reason?.name ?? 'aborted');
      tellStop(now());
    }, { once: true });
  };
  watch();
  for (const event of ['suspended', 'restored', 'lost']) lock.on(event, (info) => events.push({ event, info, at: now() }));
  lock.on('restored', () => {
    end = history.start(`${who} (restored)`, lock.fencingToken);
    watch();
  });
  return {
    told,
    events,
    /** Ends the interval, then releases. */
    async release() {
      end('release');
      await lock.release();
    },
  };
}

describe('a broken stream', () => {
  let stack;
  const clients = [];
  const client = (addr, options = {}) => {
    const c = new Client(addr, options);
    clients.push(c);
    return c;
  };
  beforeEach(async () => {
    stack = await Stack.start({ sidecarArgs: ['--attachment-ttl', '600ms'] });
  });
  afterEach(async () => {
    for (const sidecar of stack.sidecars) sidecar.child.kill('SIGCONT');
    await Promise.all(clients.splice(0).map((c) => c.close()));
    await stack.stop();
  });

  /** Waits until `key` has `n` waiters, as the store sees it. */
  const waiters = async (c, key, n) => assert.ok(await until(async () => (await c.describe(key)).waiters === n), `${n} waiter(s)`);

  it('reset between client and a live sidecar: suspended before a waiter on another sidecar is granted, 10 rounds', async (t) => {
    const key = newKey();
    const other = await stack.startSidecar();
    const proxy = await TcpProxy.start(stack.addr);
    t.after(() => proxy.close());
    const history = new History();
    const waiter = client(other.addr);
    const gaps = [];
    for (let round = 0; round < 10; round++) {
      const holder = client(proxy.addr);
      const lock = await holder.lock(key, { wait: 5 });
      const followed = follow(history, `holder ${round}`, lock);
      const waiting = waiter.lock(key, { wait: 10 });
      await waiters(waiter, key, 1);
      const reset = now();
      assert.ok(proxy.reset() >= 1, 'the holder connects through the proxy');
      const granted = await waiting;
      const endWaiter = history.granted(`waiter ${round}`, granted.fencingToken);
      // (Told long before, or an overlap: the checker says by how much.)
      const told = await within(followed.told, 15000);
      assert.deepEqual(history.overlaps(), [], `round ${round}`);
      assert.ok(told, `round ${round}: the holder was never told to stop`);
      gaps.push([told - reset, now() - told]);
      assert.equal(lock.suspended, true, `round ${round}: suspended, not yet lost (the session may come back)`);
      assert.deepEqual(followed.events.map((e) => e.event), ['suspended']);
      assert.ok(lock.signal.reason instanceof LockSuspended);
      endWaiter('release');
      await granted.release();
      await holder.close(); // the holder gives up resuming: lost
      assert.equal(lock.held, false);
      assert.deepEqual(followed.events.map((e) => e.event), ['suspended', 'lost']);
    }
    t.diagnostic(`reset -> suspended, suspended -> waiter granted (ms): ${gaps.map(([a, b]) => `${a.toFixed(1)}/${b.toFixed(1)}`).join(' ')}`);
    assert.deepEqual(history.overlaps(), []);
    assert.deepEqual(history.regressions(), []);
    assert.equal(history.intervals.length, 20);
  });

  it('a sidecar stalled (SIGSTOP) past the client keepalive: suspended before a waiter elsewhere is granted, 5 rounds', async (t) => {
    const key = newKey();
    const other = await stack.startSidecar();
    const history = new History();
    const waiter = client(other.addr);
    const noticed = [];
    for (let round = 0; round < 5; round++) {
      const holder = client(stack.addr);
      const lock = await holder.lock(key, { wait: 5 }); // the default TTL, 10 s
      const followed = follow(history, `holder ${round}`, lock);
      const waiting = waiter.lock(key, { wait: 30 });
      await waiters(waiter, key, 1);
      const { child } = stack.sidecar;
      child.kill('SIGSTOP');
      const stopped = now();
      try {
        // The client's keepalive (a ping a second, a second to answer) notices in 1-2 s;
        // the sidecar wakes up after 5 s at the latest, long before the 10 s TTL could
        // let the lock go by itself.
        await within(followed.told, 5000);
      } finally {
        // The sidecar wakes up, sees its stream gone and releases at once.
        child.kill('SIGCONT');
      }
      const granted = await waiting;
      const endWaiter = history.granted(`waiter ${round}`, granted.fencingToken);
      // (Told long before, or an overlap: the checker says by how much.)
      const told = await within(followed.told, 15000);
      assert.deepEqual(history.overlaps(), [], `round ${round}`);
      assert.ok(told, `round ${round}: the holder was never told to stop`);
      noticed.push(told - stopped);
      // Suspended, never restored (the sidecar released it on waking); on a loaded
      // machine the client may already have tried to resume, been refused and called it
      // lost (seen once in CI).
      const seen = followed.events.map((e) => e.event);
      assert.ok(['suspended', 'suspended,lost'].includes(seen.join()), `round ${round}: ${seen}`);
      assert.equal(lock.suspended, seen.length === 1);
      endWaiter('release');
      await granted.release();
      await holder.close();
    }
    t.diagnostic(`SIGSTOP -> suspended (ms): ${noticed.map((ms) => ms.toFixed(0)).join(' ')}`);
    assert.ok(Math.max(...noticed) < 3000, 'within the keepalive interval + timeout (2 s), and some slack');
    assert.deepEqual(history.overlaps(), []);
    assert.deepEqual(history.regressions(), []);
  });

  it('a sidecar killed and restarted in place: suspended at once, restored with the same token; a waiter elsewhere waits', async () => {
    const key = newKey();
    const other = await stack.startSidecar();
    const history = new History();
    const c = client(stack.addr);
    const lock = await c.lock(key, { wait: 0 });
    const session = c.sessionId;
    const followed = follow(history, 'holder', lock);
    assert.ok(await until(() => stack.recorded(session, 1)), 'recorded');
    const waiter = client(other.addr);
    const waiting = waiter.lock(key, { wait: 30 });
    await waiters(waiter, key, 1);
    const suspended = once(lock, 'suspended');
    const restored = once(lock, 'restored');
    const killed = now();
    await stack.sidecar.kill();
    const [info] = await within(suspended, 1000) ?? [];
    assert.ok(info, 'suspended within 1 s of the kill');
    assert.deepEqual([info.key, info.fencingToken], [key, lock.fencingToken]);
    assert.deepEqual([lock.held, lock.suspended], [false, true]);
    assert.ok(lock.signal.aborted && lock.signal.reason instanceof LockSuspended);
    assert.ok(followed.events[0].at - killed < 1000);
    stack.sidecar = await stack.startSidecar(stack.sidecar.addr);
    const [back] = await within(restored, 10000) ?? [];
    assert.ok(back, 'restored once the restarted sidecar resumes the session');
    assert.deepEqual([back.key, back.fencingToken, back.sessionId], [key, lock.fencingToken, session]);
    assert.deepEqual([lock.held, lock.suspended, lock.signal.aborted], [true, false, false]);
    assert.equal(c.sessionId, session);
    const d = await c.describe(key);
    assert.deepEqual(d.holders.map((h) => [h.sessionId, h.holder, h.fencingToken]), [[session, lock.holder, lock.fencingToken]]);
    assert.equal(d.waiters, 1, 'the waiter elsewhere still waits');
    await followed.release();
    const granted = await waiting;
    history.granted('waiter', granted.fencingToken)('done');
    assert.ok(granted.fencingToken > lock.fencingToken);
    assert.deepEqual(followed.events.map((e) => e.event), ['suspended', 'restored']);
    assert.deepEqual(history.overlaps(), []);
    assert.deepEqual(history.regressions(), []);
    await granted.release();
  });

  it('the memory store (no resume token): a sidecar kill loses the lock at once', async () => {
    const key = newKey();
    const memory = await stack.startSidecar('127.0.0.1:0', 'memory');
    const c = client(memory.addr, { connectTimeout: 5 });
    const lock = await c.lock(key, { wait: 0 });
    const session = c.sessionId;
    const events = [];
    for (const event of ['suspended', 'restored', 'lost']) lock.on(event, () => events.push(event));
    const lostEvent = once(lock, 'lost');
    const killed = now();
    await memory.kill();
    const info = await within(lock.lost, 2000);
    assert.ok(info, 'lost within 2 s of the kill');
    assert.ok(now() - killed < 1000, `lost ${now() - killed} ms after the kill`);
    assert.match(info.reason, /cannot resume sessions/);
    assert.deepEqual((await lostEvent)[0], info);
    assert.deepEqual(events, ['lost']);
    assert.deepEqual([lock.held, lock.suspended], [false, false]);
    assert.ok(lock.signal.reason instanceof LockLost);
    await assert.rejects(lock.release(), LockLost);
    await stack.startSidecar(memory.addr, 'memory');
    const fresh = await c.lock(key, { wait: 0 });
    assert.notEqual(fresh.sessionId, session);
    await fresh.release();
  });

  it('four lock() callers of one client: each lock is suspended at the break and comes back on its own', async () => {
    const key = newKey();
    const c = client(stack.addr);
    const keys = [0, 1, 2, 3].map((i) => `${key}-${i}`);
    let ready;
    const allHeld = new Promise((resolve) => (ready = resolve));
    const held = [];
    // Each caller, as an application task: takes its lock, uses it until told to stop,
    // then goes on if it comes back (and releases), or gives up if it is lost.
    const caller = async (k) => {
      const lock = await c.lock(k, { wait: 5 });
      const suspended = once(lock, 'suspended');
      const outcome = Promise.race([
        once(lock, 'restored').then(([info]) => ({ event: 'restored', info })),
        once(lock, 'lost').then(([info]) => ({ event: 'lost', info })),
      ]);
      held.push(lock);
      if (held.length === keys.length) ready();
      const [info] = await suspended;
      assert.deepEqual([info.key, info.fencingToken, lock.suspended], [k, lock.fencingToken, true]);
      const { event, info: after } = await outcome;
      assert.equal(after.fencingToken, lock.fencingToken);
      if (event === 'restored') {
        assert.deepEqual([lock.held, lock.signal.aborted], [true, false]);
        const holders = (await c.describe(k)).holders;
        assert.deepEqual(holders.map((h) => [h.holder, h.fencingToken]), [[lock.holder, lock.fencingToken]]);
        await lock.release();
      } else {
        await assert.rejects(lock.release(), LockLost);
      }
      return [k, event];
    };
    const callers = keys.map(caller);
    await within(allHeld, 5000);
    assert.equal(held.length, 4);
    assert.equal(new Set(held.map((l) => l.holder)).size, 4, 'a holder each');
    assert.ok(await until(() => stack.recorded(c.sessionId, 4)), 'recorded');
    await stack.sidecar.kill();
    // While the sidecar is away, the store loses the lock of the third caller.
    assert.equal(await stack.redis.command('DEL', `{lockside:${keys[2]}}:h`), ':1\r\n');
    stack.sidecar = await stack.startSidecar(stack.sidecar.addr);
    const outcomes = await within(Promise.all(callers), 10000);
    assert.deepEqual(outcomes, [[keys[0], 'restored'], [keys[1], 'restored'], [keys[2], 'lost'], [keys[3], 'restored']]);
    for (const k of keys) assert.deepEqual((await c.describe(k)).holders, []);
  });
});
