/**
 * Lockside: distributed locks held by a live gRPC stream to the sidecar in your pod.
 *
 * ```ts
 * import { Client } from 'lockside';
 * const client = new Client();                       // $LOCKSIDE_ADDR or 127.0.0.1:7420
 * const lock = await client.lock('orders', { wait: 5, ttl: 10 });
 * try {
 *   await write(data, { fencingToken: lock.fencingToken, signal: lock.signal });
 * } finally {
 *   await lock.release();                            // rejects with LockLost if it was lost
 * }
 * client.close();
 * ```
 *
 * One client is one session (one `Lease` stream) holding any number of locks; the
 * sidecar releases them all when the stream ends, whatever ends it. When the stream
 * breaks, every lock is *suspended* at once (`lock.suspended`, a `'suspended'` event,
 * `lock.signal` aborted): stop using it. The client resumes the session, and each lock
 * is *restored* (`'restored'`) if the resumed session lists it, *lost* (`'lost'`,
 * `lock.lost`) otherwise (`{ resume: false }`: lost at once).
 *
 * Leader election: `await client.campaign(key, value)` resolves once this client leads
 * (a `Lock`: `proclaim(value)` changes what followers see, `release()` resigns);
 * followers read `for await (const state of client.watch(key))`, `state.leader` being
 * undefined while nobody leads.
 *
 * # Layout
 *
 * Every rule of the session (holders, suspension, resume, loss, waiting for the
 * sidecar) is the Lockside client core's, in Rust (`native/`, a Node-API addon); this
 * package is its binding and Node's idioms:
 *
 * - `client.ts`: `Client`, the core's client; `describe()`, `watch()`, `campaign()`
 *   (leader election is a fair exclusive lock with a value).
 * - `lock.ts`: `Lock`, a held lock, its options and events (suspended, restored, lost).
 * - `several.ts`: `Locks`, several keys taken at once (`client.lockAll()`), all or none.
 * - `native.ts`: the addon, loaded once; the core's news routed to locks and the console.
 * - `description.ts`: what `describe()` and `watch()` say of a key.
 * - `errors.ts`: every error thrown, and the core's errors made into them.
 * - `limits.ts`: what the client refuses before sending, and the sidecar's limits.
 */
export { Client, type CampaignOptions, type ClientOptions, DEFAULT_ADDR, type TlsOptions } from './client.js';
export type { Description, Holder } from './description.js';
export {
  LockLost,
  LockSuspended,
  LocksideError,
  NotAcquired,
  type NotAcquiredReason,
  Rejected,
  Unavailable,
} from './errors.js';
export { MAX_VALUE_BYTES, MAX_WAIT_SECONDS } from './limits.js';
export { type LockAllOptions, Locks } from './several.js';
export { Lock, type LockEvents, type LockOptions, type LostInfo, type RestoredInfo, type SuspendedInfo } from './lock.js';
