// Opening a session: finding a sidecar at the address (or waiting for one to start, if
// the caller allows), and telling "nobody listens there" from a sidecar that is slow.
import * as grpc from '@grpc/grpc-js';
import { Unavailable, causedBy } from './errors.js';
import { Session } from './session.js';
import { MAX_TIMER_MS, later } from './timers.js';
import type { LeaseCall, LockServiceClient } from './wire.js';

/** How long a channel whose last connection attempt failed may take to try again:
 * the longest reconnect backoff (`CHANNEL_OPTIONS`, 1 s) and gRPC's 20 % jitter. */
const RECONNECT_GRACE_MS = 1200;

/** Connection errors that say nobody listens at the address. */
const NOBODY_LISTENS = /ECONNREFUSED|ENOENT|ENOTFOUND|Name resolution failed/;

/** Whether the channel connects within `ms` (false when it is closed meanwhile). */
async function readyWithin(stub: LockServiceClient, ms: number): Promise<boolean> {
  const until = performance.now() + ms;
  for (;;) {
    const left = until - performance.now();
    if (left <= 0) return false;
    // (One step at a time: gRPC arms a Node timer for the whole deadline.)
    const step = Math.min(left, MAX_TIMER_MS);
    const err = await new Promise<Error | undefined>((resolve) => stub.waitForReady(Date.now() + step, resolve));
    if (!err) return true;
    if (stub.getChannel().getConnectivityState(false) === grpc.connectivityState.SHUTDOWN) return false;
  }
}

/** Why a call found no sidecar, from gRPC's "No connection established. Last error:
 * Error: connect ECONNREFUSED 127.0.0.1:7420. Resolution note: ..." */
function connectError(err: grpc.ServiceError): string {
  const cause = String(err.details || err.message)
    .replace(/\s*Resolution note:.*$/s, '')
    .replace(/^No connection established\. Last error: (Error: )?/, '')
    .replace(/\.$/, '');
  return cause === 'null' ? 'the last connection attempt failed' : cause;
}

/**
 * Opens a session on the sidecar at `addr`. With nothing listening there (connection
 * refused, no such socket, a name that does not resolve) it fails at once, naming the
 * address and the cause, unless `waitForSidecar` seconds allow waiting for a sidecar
 * to start: then it says so in one line on the console and connects as soon as one
 * listens. A sidecar that accepts the connection has `connectTimeout` seconds to
 * open the session.
 */
export async function openSession(
  addr: string,
  stub: LockServiceClient,
  metadata: grpc.Metadata,
  timing: { connectTimeout: number; waitForSidecar: number },
  options: { resume: boolean },
): Promise<Session> {
  const channel = stub.getChannel();
  const waitUntil = performance.now() + timing.waitForSidecar * 1000;
  let waited = false;
  for (;;) {
    // Only a refusal seen now means that nobody listens. A channel whose last attempt
    // failed fails new calls at once with that attempt's error until its next attempt
    // (gRPC's reconnect backoff; channels to one address share their connections, so
    // a new client may inherit the failure, without its cause): such an error may be
    // older than a sidecar started since.
    const stale = channel.getConnectivityState(false) === grpc.connectivityState.TRANSIENT_FAILURE;
    const opened = await attempt(addr, stub, metadata, timing.connectTimeout, options);
    if (opened instanceof Session) return opened;
    const refused = !stale && NOBODY_LISTENS.test(opened.noSidecar);
    const left = waitUntil - performance.now();
    if (left > 0) {
      if (!waited) {
        console.warn(`lockside: no sidecar at ${addr} yet (${opened.noSidecar}); waiting up to ${timing.waitForSidecar} s for one`);
      }
      waited = true;
      await readyWithin(stub, left);
      continue;
    }
    if (!refused && !waited) {
      waited = true;
      if (await readyWithin(stub, RECONNECT_GRACE_MS)) continue;
    }
    const hint = timing.waitForSidecar > 0 ? ` (waited ${timing.waitForSidecar} s)` : '; to wait for one, pass { waitForSidecar: seconds }';
    throw new Unavailable(`no sidecar at ${addr}: ${opened.noSidecar}${hint}`, grpc.status.UNAVAILABLE, causedBy(opened.status));
  }
}

/** One Lease stream: the session once it starts; `noSidecar` (why, from `status`) when
 * the stream failed UNAVAILABLE before any sidecar answered; rejects otherwise. */
function attempt(
  addr: string,
  stub: LockServiceClient,
  metadata: grpc.Metadata,
  timeoutS: number,
  options: { resume: boolean },
): Promise<Session | { noSidecar: string; status: grpc.ServiceError }> {
  return new Promise((resolve, reject) => {
    let call: LeaseCall;
    try {
      call = stub.Lease(metadata);
    } catch (e) {
      reject(new Unavailable(`cannot open a session: ${(e as Error).message}`, undefined, causedBy(e))); // the channel is closed
      return;
    }
    let answered = false; // response headers came: a sidecar is there
    call.on('metadata', () => (answered = true));
    const session = new Session(call, stub, metadata, options);
    const timer = later(timeoutS * 1000, () => {
      call.cancel();
      reject(new Unavailable(`no answer from the sidecar at ${addr} within ${timeoutS} s`));
    });
    session.start((err, status) => {
      timer.cancel();
      if (!err) resolve(session);
      else if (status?.code === grpc.status.UNAVAILABLE && !answered) resolve({ noSidecar: connectError(status), status });
      else reject(err);
    });
  });
}
