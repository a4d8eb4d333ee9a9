// Sessions that survive a sidecar restart, resumed by the client itself: the sidecar
// is SIGKILLed and another started on its address and Redis (as the kubelet restarts a
// crashed native sidecar in place). Every sidecar here holds its attachment 600 ms
// rather than 3 s, so a killed sidecar's sessions can be resumed that soon.
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { once } from 'node:events';
import { afterEach, beforeEach, describe, it } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { Client, LockLost, NotAcquired, Unavailable } from 'lockside';
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

describe('a sidecar restart', () => {
  let stack;
  const clients = [];
  const client = (options = {}) => {
    const c = new Client(stack.addr, options);
    clients.push(c);
    return c;
  };
  beforeEach(async () => {
    stack = await Stack.start({ sidecarArgs: ['--attachment-ttl', '600ms'] });
  });
  afterEach(async () => {
    await Promise.all(clients.splice(0).map((c) => c.close()));
    await stack.stop();
  });

  /** Waits until the session's record lists `keys` keys (only those resume). */
  const recorded = async (c, keys) => assert.ok(await until(() => stack.recorded(c.sessionId, keys)), 'recorded');

  /** Whether another client finds `key` BUSY. */
  async function busy(key) {
    const other = new Client(stack.addr, { resume: false });
    try {
      await (await other.lock(key, { wait: 0 })).release();
      return false;
    } catch (e) {
      return e instanceof NotAcquired && e.reason === 'BUSY';
    } finally {
      await other.close();
    }
  }

  it('keeps the session, its locks, fencing tokens and hold counts', async () => {
    const key = newKey();
    const c = client();
    const outer = await c.lock(`${key}-1`, { wait: 0 });
    const inner = await c.lock(`${key}-1`, { wait: 0, holder: outer.holder });
    const other = await c.lock(`${key}-2`, { wait: 0 });
    assert.equal(inner.holdCount, 2);
    const session = c.sessionId;
    await recorded(c, 2);
    await stack.restartSidecar();
    assert.ok(await busy(`${key}-1`));
    assert.ok(await busy(`${key}-2`));
    const later = await c.lock(`${key}-3`, { wait: 0 }); // waits for the resume
    assert.equal(c.sessionId, session);
    assert.equal(later.sessionId, session);
    for (const lock of [outer, inner, other]) {
      assert.equal(lock.held, true);
      assert.equal(lock.signal.aborted, false);
    }
    const holder = (await c.describe(`${key}-1`)).holders[0];
    assert.deepEqual([holder.sessionId, holder.holdCount, holder.fencingToken], [session, 2, outer.fencingToken]);
    assert.equal((await c.describe(`${key}-2`)).holders[0].fencingToken, other.fencingToken);
    await inner.release();
    assert.equal((await c.describe(`${key}-1`)).holders[0].holdCount, 1);
    assert.ok(await busy(`${key}-1`));
    await outer.release();
    await other.release();
    await later.release();
    const next = client();
    const taken = await next.lock(`${key}-1`, { wait: 0 });
    assert.ok(taken.fencingToken > outer.fencingToken);
  });

  it('without resume, loses every lock at the break', async () => {
    const key = newKey();
    const c = client({ resume: false, connectTimeout: 5 });
    const locks = await Promise.all([0, 1].map((i) => c.lock(`${key}-${i}`, { wait: 0 })));
    const session = c.sessionId;
    await recorded(c, 2);
    await stack.restartSidecar();
    for (const lock of locks) {
      assert.ok(await within(lock.lost, 2000), 'lost at the break');
      await assert.rejects(lock.release(), LockLost);
    }
    const fresh = await c.lock(`${key}-fresh`, { wait: 0 });
    assert.notEqual(fresh.sessionId, session);
  });

  it('suspends the locks at the break, and loses those not back before their TTL has passed', async () => {
    const key = newKey();
    const c = client({ connectTimeout: 5 });
    const lock = await c.lock(key, { wait: 0, ttl: 2 });
    const session = c.sessionId;
    await recorded(c, 1);
    const suspended = once(lock, 'suspended');
    const broke = performance.now();
    await stack.sidecar.kill();
    assert.ok(await within(suspended, 1000), 'suspended at the break');
    assert.deepEqual([lock.held, lock.suspended, lock.signal.aborted], [false, true, true]);
    const info = await within(lock.lost, 5000);
    // The store has let it go once its TTL has passed since the break, not before.
    assert.ok(info && performance.now() - broke >= 2000, 'lost once the TTL has passed');
    assert.match(info.reason, /not resumed before the lock's TTL passed/);
    assert.deepEqual([lock.held, lock.suspended], [false, false]);
    await assert.rejects(lock.release(), LockLost);
    stack.sidecar = await stack.startSidecar(stack.sidecar.addr);
    const fresh = await c.lock(`${key}-after`, { wait: 0 });
    assert.notEqual(fresh.sessionId, session);
  });

  it('fails a wait in progress with Unavailable; held locks come back', async () => {
    const key = newKey();
    const steady = await stack.startSidecar();
    const holder = new Client(steady.addr);
    clients.push(holder);
    await holder.lock(`${key}-busy`, { wait: 0 });
    const c = client();
    const kept = await c.lock(`${key}-kept`, { wait: 0 });
    await recorded(c, 1);
    const waiting = c.lock(`${key}-busy`, { wait: 30 });
    waiting.catch(() => undefined);
    assert.ok(await until(async () => (await holder.describe(`${key}-busy`)).waiters === 1));
    await stack.restartSidecar();
    const failed = await within(waiting.then(() => 'granted', (e) => e), 10000);
    assert.ok(failed instanceof Unavailable, String(failed));
    assert.match(failed.message, /does not resume waits/);
    const again = await c.lock(`${key}-other`, { wait: 0 });
    assert.equal(again.sessionId, kept.sessionId);
    assert.equal(kept.held, true);
  });

  it('sends a release made during the outage once the session is back', async () => {
    const key = newKey();
    const c = client();
    const first = await c.lock(key, { wait: 0 });
    const second = await c.lock(key, { wait: 0, holder: first.holder });
    await recorded(c, 1);
    await stack.sidecar.kill();
    const released = second.release();
    stack.sidecar = await stack.startSidecar(stack.sidecar.addr);
    await released;
    const holder = (await c.describe(key)).holders[0];
    assert.deepEqual([holder.holdCount, holder.fencingToken], [1, first.fencingToken]);
    assert.ok(await busy(key));
    await first.release();
    assert.deepEqual((await c.describe(key)).holders, []);
  });

  it('a leader keeps leadership', async () => {
    const key = newKey();
    const c = client();
    const lead = await c.campaign(key, 'a:1');
    await recorded(c, 1);
    await stack.restartSidecar();
    await lead.proclaim('a:2'); // waits for the resume
    const leader = (await c.describe(key)).leader;
    assert.deepEqual([leader.value.toString(), leader.fencingToken, leader.sessionId], ['a:2', lead.fencingToken, c.sessionId]);
    assert.equal(lead.signal.aborted, false);
    const candidate = client();
    const next = candidate.campaign(key, 'b:1', { wait: 10 });
    assert.ok(await until(async () => (await c.describe(key)).queue.length === 1));
    await lead.release();
    assert.ok((await next).fencingToken > lead.fencingToken);
  });
});

describe('a session the sidecar does not know (issue 32, item 4)', () => {
  let stack;
  const clients = [];
  beforeEach(async () => {
    stack = await Stack.start({ sidecarArgs: ['--attachment-ttl', '600ms'] });
  });
  afterEach(async () => {
    await Promise.all(clients.splice(0).map((c) => c.close()));
    await stack.stop();
  });

  it('is refused as unknown: its locks are lost at once, the same client locks another key within 1 s, and the outcome is logged once', async () => {
    const key = newKey();
    const c = new Client(stack.addr);
    clients.push(c);
    const lock = await c.lock(`${key}-a`, { wait: 0 });
    const session = c.sessionId;
    assert.ok(await until(() => stack.recorded(session, 1)), 'recorded');
    const lines = [];
    const console_ = { info: console.info, warn: console.warn, error: console.error };
    for (const level of Object.keys(console_)) console[level] = (...args) => lines.push(`${level}: ${args.join(' ')}`);
    try {
      await stack.sidecar.kill();
      // The session's record gone from the store (expired, or never written before the
      // sidecar died): the restarted sidecar refuses to resume it as unknown.
      assert.equal(await stack.redis.command('DEL', `{lockside:session/${session}}:s`), ':1\r\n');
      stack.sidecar = await stack.startSidecar(stack.sidecar.addr);
      const back = performance.now();
      const info = await within(lock.lost, 5000);
      assert.ok(info, 'lost');
      assert.match(info.reason, /does not know the session/);
      const other = await c.lock(`${key}-b`, { wait: 0 });
      const took = performance.now() - back;
      assert.ok(took < 1000, `another key ${took.toFixed(0)} ms after the sidecar was back`);
      assert.notEqual(other.sessionId, session);
      assert.equal(other.held, true);
      await other.release();
    } finally {
      Object.assign(console, console_);
    }
    // The break, the outcome and the lost lock, each once; the retries are at debug.
    assert.equal(lines.filter((l) => /the session cannot be resumed: its locks are lost/.test(l)).length, 1, lines.join("\n"));
    assert.ok(lines.length <= 3, lines.join('\n'));
  });

  it('a sidecar killed right after a grant holds up nothing else', async () => {
    // Killed at once after the grant: the lock has its outcome (back, or lost) and the
    // same client takes another key soon after the sidecar is back (its attachment,
    // 600 ms here, may make the first attempts wait).
    const key = newKey();
    const c = new Client(stack.addr);
    clients.push(c);
    const lock = await c.lock(`${key}-a`, { wait: 0 });
    await stack.sidecar.kill();
    stack.sidecar = await stack.startSidecar(stack.sidecar.addr);
    const back = performance.now();
    const other = await c.lock(`${key}-b`, { wait: 0 });
    const took = performance.now() - back;
    assert.ok(took < 1500, `another key ${took.toFixed(0)} ms after the sidecar was back`);
    assert.ok(await until(() => lock.held || lock.lostReason !== undefined), 'an outcome for the first lock');
    await other.release();
  });

  it('an ordinary resume logs the break and the outcome, nothing alarming', async () => {
    const key = newKey();
    const c = new Client(stack.addr);
    clients.push(c);
    const lock = await c.lock(key, { wait: 0 });
    assert.ok(await until(() => stack.recorded(c.sessionId, 1)), 'recorded');
    const lines = [];
    const console_ = { info: console.info, warn: console.warn, error: console.error };
    for (const level of Object.keys(console_)) console[level] = (...args) => lines.push(`${level}: ${args.join(' ')}`);
    try {
      await stack.restartSidecar();
      await (await c.lock(`${key}-after`, { wait: 0 })).release(); // waits for the resume
      assert.equal(lock.held, true);
    } finally {
      Object.assign(console, console_);
    }
    assert.ok(lines.some((l) => /session resumed/.test(l)), lines.join('\n'));
    assert.ok(!lines.some((l) => l.startsWith('error:') || /malformed|unknown|cannot be resumed/.test(l)), lines.join('\n'));
    assert.ok(lines.length <= 2, lines.join('\n'));
  });
});
