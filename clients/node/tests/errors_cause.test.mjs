// An error made from a gRPC status (a failed call, a stream that ended) keeps that status
// as its ES2022 `cause`: the grpc-js ServiceError, with its code and details.
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { after, before, describe, it } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { Client, NotAcquired, Rejected, Unavailable } from 'lockside';
import { Stack, freePort } from './servers.mjs';

const newKey = () => `test-${randomUUID().slice(0, 12)}`;
const UNAVAILABLE = 14;

async function until(predicate, timeoutMs = 5000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await predicate();
    if (value || Date.now() > deadline) return value;
    await sleep(10);
  }
}

/** Whether `e` has a gRPC status as its cause, with the code `code`. */
const causedByStatus = (e, code) => e.cause instanceof Error && e.cause.code === code && typeof e.cause.details === 'string';

describe('with no sidecar', () => {
  it('Unavailable keeps the failed stream or call as its cause', async () => {
    const c = new Client(`127.0.0.1:${await freePort()}`);
    try {
      await assert.rejects(c.lock(newKey(), { wait: 0 }), (e) => e instanceof Unavailable && causedByStatus(e, UNAVAILABLE));
      await assert.rejects(c.describe(newKey()), (e) => e instanceof Unavailable && causedByStatus(e, UNAVAILABLE));
    } finally {
      await c.close();
    }
  });
});

describe('with a sidecar', () => {
  let stack;
  before(async () => {
    stack = await Stack.start();
  });
  after(async () => {
    await stack.stop();
  });

  it('a call the sidecar refuses is Rejected with the status as its cause; an answer on the stream has none', async () => {
    const c = new Client(stack.addr);
    try {
      await assert.rejects(c.describe(''), (e) => e instanceof Rejected && e.code === 3 && causedByStatus(e, 3) && e.cause.details === e.details);
      const key = newKey();
      await c.lock(key, { wait: 0 });
      // NotAcquired and Rejected answers on the Lease stream are messages, not statuses.
      await assert.rejects(c.lock(key, { wait: 0 }), (e) => e instanceof NotAcquired && !('cause' in e));
      await assert.rejects(c.lock(key, { wait: 0, limit: 3 }), (e) => e instanceof Rejected && e.code === 9 && !('cause' in e));
    } finally {
      await c.close();
    }
  });

  it('a wait the broken stream ends is Unavailable with the stream\'s status as its cause', async () => {
    const key = newKey();
    const holder = new Client(stack.addr);
    const c = new Client(stack.addr, { resume: false, connectTimeout: 2 });
    try {
      await holder.lock(key, { wait: 0 });
      const waiting = c.lock(key, { wait: 30 });
      waiting.catch(() => undefined);
      assert.ok(await until(async () => (await holder.describe(key)).waiters === 1));
      const addr = stack.addr;
      await stack.sidecar.kill();
      await assert.rejects(waiting, (e) => e instanceof Unavailable && e.code !== undefined && causedByStatus(e, e.code));
      stack.sidecar = await stack.startSidecar(addr);
    } finally {
      await Promise.all([holder.close(), c.close()]);
    }
  });
});
