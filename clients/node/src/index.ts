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
 * - `client.ts`: `Client`, a channel to the sidecar and its session; `describe()`,
 *   `watch()`, `campaign()` (leader election is a fair exclusive lock with a value).
 * - `lock.ts`: `Lock`, a held lock, its options and events (suspended, restored, lost).
 * - `session.ts`: one `Lease` stream: requests matched to answers, events routed to locks.
 * - `resume.ts`: bringing a session back after its stream broke, or losing its locks.
 * - `connect.ts`: opening a session; telling "no sidecar there" from a slow one.
 * - `description.ts`: what `describe()` and `watch()` say of a key.
 * - `errors.ts`: every error thrown, and gRPC statuses made into them.
 * - `limits.ts`: what the client refuses before sending, and the sidecar's limits.
 * - `wire.ts`: the generated wire types (`gen/`, from the .proto at build time; do not
 *   edit) under the names the code uses, and the service client.
 * - `timers.ts`: timers for delays longer than one Node timer takes.
 */
export { Client, type CampaignOptions, type ClientOptions, DEFAULT_ADDR } from './client.js';
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
export { Lock, type LockEvents, type LockOptions, type LostInfo, type RestoredInfo, type SuspendedInfo } from './lock.js';
