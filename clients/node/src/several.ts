// Several keys taken together (`client.lockAll()`): `Locks`, one ordinary `Lock` per
// key in the order asked, each key's fencing token, and giving them all back. No I/O
// of its own: each key is a `Lock`.
import { checkText } from './limits.js';
import type { Lock } from './lock.js';

/** How to take several keys at once (`client.lockAll()`): the options of `lock()` that
 * apply to every key. */
export interface LockAllOptions {
  /** Seconds to wait while a key is busy; 0 fails at once; undefined waits as long as
   * the sidecar allows (24 h). A waiting request holds none of the keys. */
  wait?: number;
  /** Seconds the store keeps each lock if the sidecar stops renewing it; undefined:
   * the sidecar's default (10 s). */
  ttl?: number;
  /** Reader locks on every key. */
  shared?: boolean;
  /** Wait in arrival order: not overtaken by later requests for any of the keys. */
  fair?: boolean;
  /** Aborting it gives up a pending request (nothing is held afterwards). */
  signal?: AbortSignal;
  /** Who in the session asks (see `LockOptions.holder`); undefined: a holder of its own. */
  holder?: string;
}

/** `lockAll()`'s keys checked as far as they cannot be sent: an array of strings (a
 * single string is a key, not keys). How many (2 to 64), distinct, and each a valid
 * key: the sidecar's to say (`Rejected`), as for every client. */
export function checkKeys(keys: unknown): string[] {
  if (typeof keys === 'string' || !Array.isArray(keys)) {
    throw new TypeError(`keys must be an array of strings, not ${typeof keys === 'string' ? 'a string' : typeof keys}`);
  }
  for (const key of keys) checkText('key', key);
  return [...(keys as string[])];
}

/**
 * Several locks taken at once, all or none (`client.lockAll()`): one `Lock` per key,
 * in the order asked. Each is a lock of its own once granted, with its own
 * `fencingToken`, `signal`, events and `lost`: pass each resource its own key's token
 * (`fencingTokens.get(key)`); one may be lost while the others are held. `release()`
 * gives every one back.
 */
export class Locks implements Iterable<Lock> {
  /** The locks, in the order asked. */
  readonly locks: readonly Lock[];
  /** Each key's fencing token, in the order asked. */
  readonly fencingTokens: ReadonlyMap<string, bigint>;

  /** @internal */
  constructor(locks: Lock[]) {
    this.locks = Object.freeze([...locks]);
    this.fencingTokens = new Map(locks.map((lock) => [lock.key, lock.fencingToken]));
  }

  /** The keys, in the order asked. */
  get keys(): string[] {
    return this.locks.map((lock) => lock.key);
  }

  /** True while every lock is held (none released, lost or suspended). */
  get held(): boolean {
    return this.locks.every((lock) => lock.held);
  }

  /** The lock of `key`; undefined for a key not asked for. */
  get(key: string): Lock | undefined {
    return this.locks.find((lock) => lock.key === key);
  }

  [Symbol.iterator](): Iterator<Lock> {
    return this.locks[Symbol.iterator]();
  }

  /** Gives every lock back (see `Lock.release`), each once its `Release` is on the
   * stream; rejects with the first failure (`LockLost` for a lock lost before) after
   * releasing the others. */
  async release(): Promise<void> {
    let first: unknown;
    for (const lock of this.locks) {
      try {
        await lock.release();
      } catch (e) {
        first ??= e;
      }
    }
    if (first !== undefined) throw first;
  }

  toString(): string {
    return `Locks { ${this.locks.map((l) => `${l.key}: ${l.fencingToken}`).join(', ')} }`;
  }
}

/** What `lockAll()` names in its errors: the keys asked for. */
export const keysNamed = (keys: string[]): string => keys.join(', ');
