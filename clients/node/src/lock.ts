// A held lock: what `client.lock()` and `client.campaign()` resolve with, its options and
// its events. The session it belongs to does the talking (src/session.ts).
import { EventEmitter } from 'node:events';
import { LockLost, LockSuspended } from './errors.js';
import type { Session } from './session.js';
import type { GrantedMsg } from './wire.js';
import { seconds } from './wire.js';

/** How to take a lock. */
export interface LockOptions {
  /** Seconds to wait while the key is busy; 0 fails at once; undefined waits as long as
   * the sidecar allows (24 h). */
  wait?: number;
  /** Seconds the store keeps the lock if the sidecar stops renewing it (1 s to the
   * sidecar's maximum); undefined: the sidecar's default (10 s). */
  ttl?: number;
  /** A reader lock: shared holders coexist and exclude exclusive ones. */
  shared?: boolean;
  /** N > 1 makes the key a semaphore of N permits (not with `shared`). */
  limit?: number;
  /** Wait in arrival order. */
  fair?: boolean;
  /** The holder's value, shown by `describe()` and `watch()` (a string is sent as
   * UTF-8; at most 4 KiB). On a key the session already holds, a non-empty value
   * replaces its value (as `proclaim`). */
  value?: Uint8Array | string;
  /** Aborting it gives up a pending acquire (the wait is cancelled on the sidecar). */
  signal?: AbortSignal;
  /** Who in the session asks (at most 128 bytes of UTF-8 without control characters).
   * Undefined: a holder of its own for this call (`'1'`, `'2'`, ... per client), so a
   * second `lock()` of a held key waits like anyone else. Pass `lock.holder` of a lock
   * this caller holds to take the key again reentrantly (`holdCount` 2, the same
   * fencing token). Names of your own should not be plain numbers: those are the
   * client's. */
  holder?: string;
}

/** What `lock.lost` resolves with, and the `'lost'` event carries. */
export interface LostInfo {
  key: string;
  reason: string;
  fencingToken: bigint;
}

/** What the `'suspended'` event carries: `reason` says how the stream broke. */
export interface SuspendedInfo {
  key: string;
  reason: string;
  fencingToken: bigint;
}

/** What the `'restored'` event carries: the same fencing token, in the same session. */
export interface RestoredInfo {
  key: string;
  fencingToken: bigint;
  sessionId: string;
}

/** The events of a `Lock`, with their arguments. */
export type LockEvents = {
  /** The session's stream broke: stop using the lock now (`lock.suspended`). */
  suspended: [SuspendedInfo];
  /** The resumed session lists the lock: nobody else held it in between; use it again. */
  restored: [RestoredInfo];
  /** The lock is gone: never use it again (`lock.lost` resolves too). */
  lost: [LostInfo];
};

/** Where a session keeps what concerns one holder's grant of one key: reentrancy is per
 * (session, holder, key), and every event names both. */
export function slot(holder: string, key: string): string {
  return JSON.stringify([holder, key]);
}

/**
 * A held lock, from `client.lock()`. Use it while `held` is true: from the moment the
 * session's stream breaks it is *suspended* (`held` false, `suspended` true, `signal`
 * aborted, a `'suspended'` event), because a live sidecar releases a broken stream's
 * locks at once and a waiter elsewhere may hold it within milliseconds. It is then
 * either *restored* (`'restored'`: the resumed session listed it with the same fencing
 * token, nobody else held it in between) or *lost* (`'lost'`, `lost` resolves).
 */
export class Lock extends EventEmitter<LockEvents> {
  /** The lock's name. */
  readonly key: string;
  /** Pass it to the resource you protect; it must reject writes with lower tokens. */
  readonly fencingToken: bigint;
  /** Seconds of validity the sidecar reported with the grant (it renews the lock for as
   * long as the session lives). */
  readonly ttl: number;
  /** How many times this lock's holder held the key after this grant (reentrancy). */
  readonly holdCount: number;
  /** The session shown by `describe()`. */
  readonly sessionId: string;
  /** The holder inside the session (`describe()` shows it): each `lock()` call is one
   * of its own unless it passed `holder`. */
  readonly holder: string;
  /** Resolves when the lock is lost (the sidecar sent `Lost`, or the session's stream
   * broke and the lock did not come back): never use the resource again. Never
   * rejects; never settles after a clean release. */
  readonly lost: Promise<LostInfo>;
  /** Why the lock was lost, once it is. */
  lostReason?: string;

  /** @internal */ _state: 'held' | 'suspended' | 'lost' | 'released' = 'held';
  /** @internal The TTL (s) the store keeps the lock for without renewals (asked, else
   * the sidecar's default): once it has passed since a break, the store has let the
   * lock go. */
  readonly _ttlAsked: number;
  private readonly session: Session;
  private readonly resolveLost: (info: LostInfo) => void;
  /** Aborted when the lock is suspended or lost; a new one after each restore. */
  private controller = new AbortController();

  /** @internal */
  constructor(session: Session, key: string, holder: string, granted: GrantedMsg, ttlAsked: number) {
    super();
    this.session = session;
    this._ttlAsked = ttlAsked;
    this.key = key;
    this.holder = holder;
    this.fencingToken = BigInt(granted.fencingToken);
    this.ttl = seconds(granted.ttl);
    this.holdCount = granted.holdCount;
    this.sessionId = session.sessionId;
    let resolve!: (info: LostInfo) => void;
    this.lost = new Promise<LostInfo>((r) => (resolve = r));
    this.resolveLost = resolve;
  }

  /** True while the lock is held and may be used: false while it is suspended, and
   * for good once it is released or lost. */
  get held(): boolean {
    return this._state === 'held';
  }

  /** True from the moment the session's stream broke until the lock is restored or
   * lost: do not use it meanwhile. */
  get suspended(): boolean {
    return this._state === 'suspended';
  }

  /** Hand it to the work that uses the resource: aborted when the lock is suspended
   * (reason `LockSuspended`) or lost (`LockLost`). A restored lock has a new signal,
   * not aborted: read `lock.signal` again for work started after `'restored'`. */
  get signal(): AbortSignal {
    return this.controller.signal;
  }

  /** @internal The session's stream broke: stop using the lock. */
  _suspend(reason: string): void {
    if (this._state !== 'held') return;
    this._state = 'suspended';
    this.controller.abort(new LockSuspended(this.key, reason, this.fencingToken));
    this.tell('suspended', { key: this.key, reason, fencingToken: this.fencingToken });
  }

  /** @internal The resumed session listed the lock with its token. */
  _restore(): void {
    if (this._state !== 'suspended') return;
    this._state = 'held';
    this.controller = new AbortController();
    this.tell('restored', { key: this.key, fencingToken: this.fencingToken, sessionId: this.sessionId });
  }

  /** @internal */
  _markLost(reason: string): void {
    if (this._state !== 'held' && this._state !== 'suspended') return;
    this._state = 'lost';
    this.lostReason = reason;
    const info = { key: this.key, reason, fencingToken: this.fencingToken };
    this.resolveLost(info);
    // (A suspended lock's signal is aborted already: its reason then turns to LockLost
    // in a new signal.)
    if (this.controller.signal.aborted) this.controller = new AbortController();
    this.controller.abort(new LockLost(info.key, info.reason, info.fencingToken));
    this.tell('lost', info);
  }

  /** Emits `event`. A listener that throws does so on its own tick (an uncaught
   * exception, as from any emitter), not inside the session's bookkeeping. */
  private tell<K extends keyof LockEvents>(event: K, ...args: LockEvents[K]): void {
    try {
      // (TypeScript cannot narrow the emitter's conditional argument type for a generic K.)
      (this.emit as (event: K, ...args: LockEvents[K]) => boolean)(event, ...args);
    } catch (e) {
      process.nextTick(() => {
        throw e;
      });
    }
  }

  /**
   * Gives the lock back and waits for the sidecar to confirm. Resolves at once if
   * already released; rejects with `LockLost` (once) if the lock was lost before.
   */
  release(): Promise<void> {
    return this.session.release(this);
  }

  /**
   * Replaces the lock's value (what `describe()` and `watch()` show of this holder): a
   * leader telling its followers where it now is, without giving up leadership. At
   * most 4 KiB. Rejects with `LockLost` if the lock is no longer held, `Rejected` for
   * a value too large or a store the sidecar cannot reach.
   */
  proclaim(value: Uint8Array | string): Promise<void> {
    return this.session.proclaim(this, value);
  }
}
